"""Backends start a server for an EngineConfig and measure workloads on it: the simulated engine in
process, `vllm serve` as a subprocess, or the vllm/vllm-openai image in Docker; or attach to a server
that is already running (autotune/backends/remote.py, `autotune bench --url`)."""

from autotune.backends.base import Backend, Session
from autotune.backends.factory import make_backend

__all__ = ["Backend", "Session", "make_backend"]
