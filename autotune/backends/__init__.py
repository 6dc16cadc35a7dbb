"""Backends start a server for an EngineConfig and measure workloads on it: the simulated engine in
process, `vllm serve` as a subprocess, or the vllm/vllm-openai image in Docker."""

from autotune.backends.base import Backend, Session
from autotune.backends.factory import make_backend

__all__ = ["Backend", "Session", "make_backend"]
