"""`autotune sim-server`: the simulated engine behind vLLM's OpenAI-compatible HTTP endpoints."""

from autotune.sim_server.process import SimServerProcess, start_sim_server
from autotune.sim_server.server import serve

__all__ = ["SimServerProcess", "serve", "start_sim_server"]
