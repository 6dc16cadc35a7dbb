"""`autotune calibrate --url` against a server started with scheduler flags /metrics does not show:
the fewer requests it ran at once are noticed, and the report names unstated flags as a cause (with
--points: the points' `flags`, not --set)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autotune.backends.server_metrics import KvSampler
from autotune.calibrate.campaign import Measured, Target, fewer_running, on_url
from autotune.calibrate.fit import FitResult
from autotune.calibrate.measure import probe_server
from autotune.calibrate.points import Error
from autotune.calibrate.report import UNSTATED_FLAGS, warnings
from autotune.cli import main
from autotune.sim.calibration import DEFAULT_CALIBRATION
from autotune.sim_server.server import start_sim_server

QWEN_14B = "Qwen/Qwen3-14B"


def test_a_server_started_with_fewer_max_num_seqs_is_warned_about() -> None:
    """--max-num-seqs 16 on the server, 256 assumed: the fit was 43 % off with gemm_eff at its bound,
    exit 0, silent. The peak of vllm:num_requests_running during the runs says it."""
    args = [QWEN_14B, "--time-scale", "4", "--max-num-seqs", "16", "--max-num-batched-tokens", "1024"]
    lines: list[str] = []
    out = Measured()
    with start_sim_server(args, gpu="A100") as server:
        info = probe_server(server.base_url)
        on_url(info, Target(None, "A100"), 1.2, DEFAULT_CALIBRATION, lines.append, out)
    expected = (
        "the server ran at most 16 requests at once, below the max_num_seqs 256 assumed: was it started "
        "with --max-num-seqs 16? pass --set max_num_seqs=16"
    )
    assert any(line.startswith(f"warning: {expected}") for line in lines), lines
    assert any(note.startswith(expected) for note in out.notes), out.notes


def _sampler(running: int, kv: float) -> KvSampler:
    sampler = KvSampler("http://127.0.0.1:1")
    sampler.peak_running, sampler.peak_kv = running, kv
    return sampler


def test_a_server_at_its_default_or_with_a_full_kv_cache_is_not_warned_about() -> None:
    """A default server's burst peaks near its request count; a full KV cache caps the batch too."""
    burst = {"id": "b", "kind": "serve", "requests": 170}
    assert fewer_running([burst], {"b": _sampler(164, 0.2)}, 256) is None
    assert fewer_running([burst], {"b": _sampler(40, 0.95)}, 256) is None
    assert fewer_running([burst], {}, 256) is None  # no gauge: nothing to say
    assert "at most 16 requests" in (fewer_running([burst], {"b": _sampler(16, 0.1)}, 256) or "")


def test_a_constant_at_its_bound_with_a_class_still_off_names_unstated_flags() -> None:
    """Without the gauge, the report's warnings name flags /metrics does not show as a likely cause."""
    error = Error("server-burst", "train", "output_throughput", 1.43, 1.0)
    cal = DEFAULT_CALIBRATION
    result = FitResult(cal, cal, [error], [error], ["gemm_eff"], [], [], [], [])
    assert UNSTATED_FLAGS not in warnings(result)
    result.at_bound.append("gemm_eff")
    assert UNSTATED_FLAGS in warnings(result)
    assert "max_num_seqs" in UNSTATED_FLAGS and "--set" in UNSTATED_FLAGS


def test_with_points_the_unstated_flags_advice_names_the_points_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--points refuses --set, yet the advice said to pass the flags with --set. A KV cache a tenth of
    the simulated one: a memory term ends at its bound, the class still off."""
    point = {"id": "m", "kind": "memory", "model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "H100"}
    path = tmp_path / "points.yaml"
    path.write_text(yaml.safe_dump({"points": [{**point, "measured": {"kv_gib": 5.0}}]}))
    argv = ["calibrate", "--points", str(path), "-o", str(tmp_path / "cal.yaml"), "--max-evaluations", "10"]
    assert main([*argv, "--quiet"]) == 0
    report = capsys.readouterr().out
    assert "warning: a likely cause: the measured servers ran flags the points do not say" in report, report
    assert "to the points' `flags`" in report and "--set" not in report, report
