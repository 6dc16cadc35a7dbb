"""A run where requests failed is never feasible, on the simulator as on a real server; a workload that
cannot fit max_model_len at all is an input error before any trial."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.backends.sim import SimBackend
from autotune.core.atomic import atomic_write_text
from autotune.core.config import EngineConfig
from autotune.core.errors import AutotuneError, FailureKind
from autotune.measure.slo import parse_slos
from autotune.tune.objectives import constraints, is_feasible
from autotune.workloads.spec import LengthDist, WorkloadSpec, check_fits

LONG = WorkloadSpec(
    name="long",
    num_requests=8,
    prompt_len=LengthDist("uniform", mean=1500, range_ratio=0.5),
    output_len=LengthDist("fixed", mean=16),
)


def test_requests_longer_than_max_model_len_make_the_trial_infeasible() -> None:
    config = EngineConfig(model="meta-llama/Llama-3.1-8B-Instruct", max_model_len=1024)
    result = SimBackend("H100").evaluate(config, LONG, slos=parse_slos("ttft_p99=10s"))
    assert result.benchmark is not None and 0 < result.benchmark.failed < LONG.num_requests
    assert result.failure is FailureKind.REQUESTS_FAILED
    assert "requests failed: This model's maximum context length is 1024 tokens" in result.message
    assert not is_feasible(constraints(result, parse_slos("ttft_p99=10s")))


def test_a_workload_no_config_can_serve_is_an_input_error() -> None:
    with pytest.raises(AutotuneError, match="more than max_model_len 1024"):
        check_fits(LONG, seed=0, max_model_len=1024)
    check_fits(LONG, seed=0, max_model_len=4096)
    check_fits(LONG, seed=0, max_model_len=None)  # unknown (a real model outside the catalog): vLLM checks


def test_an_atomic_write_that_fails_leaves_the_old_file(tmp_path: Path) -> None:
    """A write past the file size limit (as on a full disk) fails; the old content and no temp file remain."""
    target = tmp_path / "best.json"
    target.write_text("old")
    child = (
        "import resource, signal; from pathlib import Path\n"
        "from autotune.core.atomic import atomic_write_text\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        f"atomic_write_text(Path({str(target)!r}), 'x' * 100_000)\n"
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "File too large" in done.stderr
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["best.json"]
    atomic_write_text(target, "new", mode=0o755)
    assert target.read_text() == "new" and os.stat(target).st_mode & 0o777 == 0o755
