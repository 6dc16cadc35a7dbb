"""Shared fixtures. Ray is started once per test session (each ray.init costs seconds and memory)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.core.api_keys import CLIENT_KEY_VARS

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def ctrl_c_enabled() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt here and in the runs the tests start, as in a terminal: a suite
    started in the background (`pytest &` from a script) inherits SIGINT ignored, and the Ctrl-C tests
    would then test the shell, not autotune."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session", autouse=True)
def no_api_key() -> Iterator[None]:
    """No API key from the developer's shell: with VLLM_API_KEY set, every sim-server a test starts would
    require it and the tests that send requests without one would fail (tests/test_api_keys.py sets keys
    itself)."""
    saved = {name: os.environ.pop(name) for name in CLIENT_KEY_VARS if name in os.environ}
    yield
    os.environ.update(saved)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A real local Ray cluster with 2 CPUs and 2 fake GPUs, shared by the whole session."""
    import ray

    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=2,
            num_gpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    yield
    ray.shutdown()


@pytest.fixture
def repo() -> Path:
    """The repository root (for workloads/, search_spaces/, objectives/)."""
    return REPO
