"""`--backend NAME` -> a Backend object (the real ones are imported only when asked for)."""

from __future__ import annotations

import inspect
from typing import Any

from autotune.core.errors import AutotuneError

BACKENDS = ("sim", "vllm", "docker")


def make_backend(name: str, gpu: str, **options: Any) -> Any:
    """The backend `name` for GPU type `gpu`.

    `options` go to its constructor; None values and options of other backends (e.g. `image` for the
    vllm backend) are dropped, so a command can pass all of its backend options unconditionally.
    """
    if name == "sim":
        from autotune.backends.sim import SimBackend as cls
    elif name == "vllm":
        from autotune.backends.process import ProcessBackend as cls
    elif name == "docker":
        from autotune.backends.docker import DockerBackend as cls
    else:
        raise AutotuneError(f"unknown backend {name!r} (use {', '.join(BACKENDS)})")
    accepted = inspect.signature(cls).parameters
    return cls(gpu, **{k: v for k, v in options.items() if v is not None and k in accepted})
