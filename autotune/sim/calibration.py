"""The simulator's calibration: every fitted constant of the engine model, as one typed record.

The cost model (costs.py), the API-server model (frontend.py), the memory model's fitted terms
(memory.py), the Hopper compute scale and the simulated startup time (backends/sim.py) read their
constants from the `Calibration` they are given; `DEFAULT_CALIBRATION` holds the values fitted on the
train split of benchmarks/fidelity_points.yaml (docs/simulator.md). vLLM's own rules (block-size
choices, CUDA-graph sizes) are not constants to fit and stay in their modules.

Each field carries its unit, its valid range and a one-line meaning (field metadata): the YAML that
`autotune calibrate --print-defaults` writes, the errors `--sim-calibration FILE` gives, and the
bounds `autotune calibrate` fits within all come from here. Adding a constant is one field line here
and its use in the model.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.core.errors import AutotuneError

_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
GROUPS = {
    "costs": "step costs (autotune/sim/costs.py)",
    "frontend": "API server (autotune/sim/frontend.py)",
    "memory": "startup memory (autotune/sim/memory.py)",
    "startup": "simulated startup time (autotune/backends/sim.py)",
    "reality": "reality-only mechanisms the model lacks: off by default, never fitted",
}


@dataclass(frozen=True)
class FieldInfo:
    """What a calibration constant is: its group, unit, valid range and meaning."""

    name: str
    default: float
    group: str
    unit: str
    low: float
    high: float
    meaning: str

    def describe(self) -> str:
        """`unit, low-high: meaning` for comments and messages."""
        return f"{self.unit}, {self.low:g} to {self.high:g}: {self.meaning}"


def _c(group: str, default: float, unit: str, low: float, high: float, meaning: str) -> Any:
    """A calibration field: its default and its metadata (group, unit, inclusive range, meaning)."""
    assert group in GROUPS and low <= default <= high
    info = {"group": group, "unit": unit, "low": low, "high": high, "meaning": meaning}
    return field(default=default, metadata=info)


def _costs(*args: Any) -> Any:
    return _c("costs", *args)


def _frontend(*args: Any) -> Any:
    return _c("frontend", *args)


def _memory(*args: Any) -> Any:
    return _c("memory", *args)


def _startup(*args: Any) -> Any:
    return _c("startup", *args)


def _reality(*args: Any) -> Any:
    return _c("reality", *args)


@dataclass(frozen=True)
class Calibration:
    """The engine model's fitted constants (defaults: the built-in calibration).

    Each field: default, unit, valid range (inclusive), meaning.
    """

    gemm_eff: float = _costs(0.60, "fraction", 0.01, 1.0, "achieved / peak bf16 of large GEMMs")
    gemm_half_m: float = _costs(
        32.0, "tokens", 0.1, 4096.0, "batch tokens at which a GEMM reaches half of gemm_eff"
    )
    attn_eff: float = _costs(0.60, "fraction", 0.01, 1.0, "achieved / peak bf16 of prefill attention")
    bw_eff: float = _costs(0.80, "fraction", 0.05, 1.0, "achieved / peak HBM bandwidth for weights and KV")
    per_layer_s: float = _costs(
        20e-6, "s", 0.0, 1e-3, "per layer and step: kernels that do not shrink with the batch"
    )
    step_base_s: float = _costs(
        2.2e-3, "s", 1e-5, 0.1, "CPU time of every step: scheduling, inputs, sampling"
    )
    per_seq_s: float = _costs(6.5e-6, "s", 1e-8, 1e-3, "CPU time per request scheduled in a step")
    eager_per_layer_s: float = _costs(
        40e-6, "s", 1e-8, 1e-3, "launch cost per layer of a step past the CUDA graphs"
    )
    compute_scale_hopper: float = _costs(
        1.0, "fraction", 0.05, 3.0, "Hopper's tensor throughput relative to the effs"
    )
    completions_fixed_s: float = _frontend(
        0.006, "s", 1e-6, 1.0, "send to schedulable of a lone completions request"
    )
    chat_extra_s: float = _frontend(
        0.032, "s", 1e-6, 1.0, "extra latency of a chat request (template, messages)"
    )
    intake_per_request_s: float = _frontend(
        0.0036, "s", 1e-6, 0.2, "serial API-server intake work per request (a burst waits for all)"
    )
    chat_intake_extra_s: float = _frontend(0.0034, "s", 1e-6, 0.2, "extra intake work per chat request")
    output_per_step_s: float = _frontend(
        50e-6, "s", 1e-8, 1e-2, "API-server output work per engine step (one ZMQ message)"
    )
    output_per_token_s: float = _frontend(
        10e-6, "s", 1e-8, 1e-2, "API-server output work per token (detokenize, RequestOutput)"
    )
    output_per_chunk_s: float = _frontend(30e-6, "s", 1e-8, 1e-2, "API-server output work per SSE chunk sent")
    non_torch_gib_tp1: float = _memory(0.13, "GiB", 0.0, 16.0, "non-torch memory per GPU at TP=1")
    non_torch_gib_tp: float = _memory(
        0.55, "GiB", 0.0, 16.0, "non-torch memory per GPU at TP>1 (NCCL buffers)"
    )
    profile_base_gib: float = _memory(0.43, "GiB", 0.0, 32.0, "profiled activation peak: fixed part")
    profile_hidden_bytes: float = _memory(
        2.0, "bytes", 0.0, 256.0, "profiled peak per budget token x hidden unit"
    )
    profile_sampler_bytes_per_logit: float = _memory(
        35.0, "bytes", 0.0, 256.0, "profiled dummy sampler per logit"
    )
    sampler_warmup_bytes_per_logit: float = _memory(
        8.0, "bytes", 0.0, 256.0, "sampler warm-up after KV, per logit"
    )
    cuda_graph_mib_per_layer: float = _memory(
        0.2, "MiB", 0.0, 64.0, "CUDA graphs per captured size and layer"
    )
    graph_mlp_factor: float = _memory(
        14.0, "elements", 0.0, 256.0, "largest graph's live elements per MLP unit"
    )
    init_s: float = _startup(12.0, "s", 0.0, 3600.0, "interpreter, imports, engine-core process, NCCL init")
    load_s_per_gib: float = _startup(0.8, "s/GiB", 0.0, 600.0, "weight loading per GiB per rank")
    profile_s: float = _startup(8.0, "s", 0.0, 3600.0, "profile run and torch.compile (cached)")
    graph_capture_s: float = _startup(0.25, "s", 0.0, 60.0, "per captured CUDA-graph batch size")
    failed_capture_s: float = _startup(5.0, "s", 0.0, 3600.0, "into capture when a config dies of OOM there")
    # Mechanisms the engine model lacks, switched on only to play a reality that differs from the model
    # in structure (benchmarks/guided_search.py); `autotune calibrate` never fits them (no point sees them).
    reality_seq_pair_s: float = _reality(
        0.0, "s", 0.0, 1e-4, "CPU time per scheduled request per other scheduled request in a step"
    )
    reality_attn_per_seq: float = _reality(
        0.0, "fraction", 0.0, 0.1, "attention slowdown per scheduled request (kernel efficiency falls)"
    )

    def __post_init__(self) -> None:
        for info in calibration_fields():
            check_value(info, getattr(self, info.name))

    def compute_scale(self, gpu: Any) -> float:
        """The GPU architecture's tensor-throughput scale (`compute_scale_<arch>`; 1.0 when none)."""
        return float(getattr(self, f"compute_scale_{gpu.arch}", 1.0))

    def replace(self, **values: float) -> Calibration:
        """A copy with some constants changed (checked against their ranges)."""
        return dataclasses.replace(self, **values)

    def to_dict(self) -> dict[str, float]:
        """Every constant by name (JSON-able: the study and run.json record these)."""
        return {info.name: float(getattr(self, info.name)) for info in calibration_fields()}

    def changed(self, reference: Calibration | None = None) -> dict[str, float]:
        """The constants that differ from `reference` (default: the built-in calibration)."""
        base = (reference or DEFAULT_CALIBRATION).to_dict()
        return {k: v for k, v in self.to_dict().items() if v != base[k]}

    @property
    def is_default(self) -> bool:
        """True for the built-in calibration's values."""
        return not self.changed()


def calibration_fields() -> list[FieldInfo]:
    """Every constant of Calibration with its metadata, in declaration order."""
    return [
        FieldInfo(f.name, f.default, **f.metadata)  # type: ignore[arg-type]
        for f in dataclasses.fields(Calibration)
    ]


def check_value(info: FieldInfo, value: Any, where: str = "") -> float:
    """`value` as a float for constant `info`; AutotuneError (one line) when wrong type or out of range."""
    prefix = f"{where}: " if where else ""
    if isinstance(value, str) and _EXPONENT.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AutotuneError(f"{prefix}{info.name} must be a number ({info.unit}), got {value!r}")
    number = float(value)
    if not math.isfinite(number) or not info.low <= number <= info.high:
        raise AutotuneError(
            f"{prefix}{info.name} = {value!r} is outside its range {info.low:g} to {info.high:g} "
            f"({info.unit})"
        )
    return number


def calibration_from_mapping(data: Any, where: str, base: Calibration | None = None) -> Calibration:
    """`base` (default: built-in) with the constants `data` names; one AutotuneError line per problem.
    An empty file is one: a truncated fitted file would run on the built-in constants without a word."""
    if data is None or data == {}:
        raise AutotuneError(
            f"{where}: names no constant (an empty file; autotune calibrate --print-defaults lists them)"
        )
    if not isinstance(data, Mapping):
        raise AutotuneError(f"{where}: expected a mapping of constant: value, got {type(data).__name__}")
    known = {info.name: info for info in calibration_fields()}
    values = {}
    for key, value in data.items():
        info = known.get(str(key))
        if info is None:
            raise AutotuneError(
                f"{where}: unknown constant {key!r} (autotune calibrate --print-defaults lists them)"
            )
        values[info.name] = check_value(info, value, where)
    return (base or DEFAULT_CALIBRATION).replace(**values)


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration YAML (a partial file overrides only the constants it names)."""
    from autotune.core.inputs import not_a_directory, read_yaml

    path = Path(path)
    not_a_directory(path, "calibration file")
    if not path.is_file():
        raise AutotuneError(f"calibration file not found: {path}")
    return calibration_from_mapping(read_yaml(path, "calibration file"), f"calibration file {path}")


SIGNIFICANT_DIGITS = 4  # of a written or fitted constant: measurements do not pin them closer


def calibration_yaml(calibration: Calibration, header: str = "") -> str:
    """The calibration as YAML that load_calibration reads back, a comment line per constant."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    group = None
    for info in calibration_fields():
        if info.group != group:
            group = info.group
            lines += ["", f"# --- {GROUPS[group]}"]
        lines.append(f"# {info.describe()}")
        lines.append(f"{info.name}: {yaml_number(rounded(getattr(calibration, info.name)))}")
    return "\n".join(lines).lstrip("\n") + "\n"


def add_calibration_argument(parser: Any) -> None:
    """The `--sim-calibration FILE` option of the commands that run the simulator."""
    parser.add_argument(
        "--sim-calibration",
        metavar="FILE",
        help="the simulator's constants from this YAML (autotune calibrate writes one; "
        "--print-defaults lists them); a partial file overrides only the keys it names",
    )


def calibration_option(path: str | None) -> Calibration:
    """`--sim-calibration`'s value as a Calibration (the built-in one when not given)."""
    return DEFAULT_CALIBRATION if path is None else load_calibration(path)


def rounded(value: float) -> float:
    """A constant to SIGNIFICANT_DIGITS: what every calibration file holds (no float noise)."""
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def yaml_number(value: float) -> str:
    """A float as YAML 1.1 reads it back as a float (its exponent form needs a dot: 1.0e-05)."""
    text = repr(float(value))
    mantissa, sep, exponent = text.partition("e")
    if sep and "." not in mantissa:
        text = f"{mantissa}.0e{exponent}"
    return text


DEFAULT_CALIBRATION = Calibration()
