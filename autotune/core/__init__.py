"""Core records and services every layer uses: engine configs, errors and failure kinds, checked
values and YAML, atomic writes, processes, interrupts, secret masking."""

from autotune.core.atomic import atomic_path, atomic_write_text
from autotune.core.config import EngineConfig, check_flags, parse_value
from autotune.core.errors import AutotuneError, EngineStartupError, FailureKind, RunFailure
from autotune.core.inputs import read_yaml
from autotune.core.secrets import masked, scrub, scrub_args

__all__ = [
    "AutotuneError",
    "EngineConfig",
    "EngineStartupError",
    "FailureKind",
    "RunFailure",
    "atomic_path",
    "atomic_write_text",
    "check_flags",
    "masked",
    "parse_value",
    "read_yaml",
    "scrub",
    "scrub_args",
]
