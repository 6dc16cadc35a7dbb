"""What `autotune calibrate` spends: --gpu-minutes is a cap, and a config's GPU time counts its GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.calibrate import measure
from autotune.calibrate.design import predicted_seconds
from autotune.calibrate.points import Replay
from autotune.cli import main
from autotune.sim.calibration import DEFAULT_CALIBRATION
from autotune.sim_server.server import start_sim_server

QWEN_14B = "Qwen/Qwen3-14B"


def test_gpu_minutes_below_the_least_designed_set_is_refused_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--gpu-minutes 0.1 ran a 1.2 GPU-minute set (each run's least request count won): a cap it is not.
    One line, exit 2, naming the least it takes; nothing measured or written."""
    out = tmp_path / "out"
    with start_sim_server([QWEN_14B, "--time-scale", "4"], gpu="A100") as server:
        argv = ["calibrate", "--url", server.base_url, "--gpu", "A100", "-o", str(out / "cal.yaml")]
        assert main([*argv, "--gpu-minutes", "0.1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "the designed set needs at least" in err[-1] and "give --gpu-minutes" in err[-1], err
    assert "--gpu-minutes 0.1 affords none of it" in err[-1], err
    assert not any("[1/" in line for line in err), err
    assert not out.exists()


def test_a_tp2_configs_gpu_time_counts_both_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A TP=2 run's duration was counted once: its GPU time (measured, and as sized) is twice it."""
    point = {"id": "tp2-burst", "run": "burst", "kind": "serve", "model": QWEN_14B, "gpu": "H100"}
    point.update(requests=8, prompt=256, output=32, measured={"output_throughput": 0.0})
    tp1, tp2 = {**point, "flags": {}}, {**point, "flags": {"tensor_parallel_size": 2}}
    monkeypatch.setattr(measure, "_warm_up", lambda info: None)
    monkeypatch.setattr(measure, "measure_serve", lambda info, p, salt, sampler=None: (p, 10.0))
    kept: list[float] = []
    info = measure.ServerInfo("http://127.0.0.1:1", QWEN_14B, 4096, {})
    _, seconds = measure.measure_points(info, [tp2], keep=lambda p, s: kept.append(s))
    assert seconds == kept[0] == 20.0
    replay = Replay([tp2])
    duration = tp2["requests"] / replay.simulate(0, DEFAULT_CALIBRATION)["request_throughput"]
    assert predicted_seconds([tp2], DEFAULT_CALIBRATION) == pytest.approx([2 * duration])
    assert predicted_seconds([tp1], DEFAULT_CALIBRATION)[0] > 0
