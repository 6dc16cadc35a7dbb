"""What `autotune calibrate` spends: --gpu-minutes is a cap, and a config's GPU time counts its GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cli import main
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
