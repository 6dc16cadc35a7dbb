"""`autotune calibrate --url` as a campaign on a real sim-server: what a rerun, a failure or an
interrupt leaves (tests/test_calibration.py has the fit's recovery over HTTP)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from autotune.calibrate.measure import measure_points, probe_server
from autotune.calibrate.points import load_points
from autotune.cli import main
from autotune.core.errors import RunFailure
from autotune.sim_server.server import start_sim_server

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
QWEN_14B = "Qwen/Qwen3-14B"


def test_a_second_campaign_on_one_server_misses_the_first_ones_prefix_cache() -> None:
    """A rerun (after an interrupted calibrate, say) sends other prompts: the server's prefix cache
    must not serve the second campaign's long prompts from the first's (TTFT 123 -> 21 ms did)."""
    point = {"id": "p", "kind": "serve", "model": LLAMA_8B, "gpu": "H100", "flags": {"max_model_len": 4096}}
    point.update(requests=3, prompt=3072, output=4, concurrency=1, measured={"mean_ttft_ms": 0.0})
    with start_sim_server([LLAMA_8B, "--max-model-len", "4096", "--time-scale", "4"]) as server:
        info = probe_server(server.base_url)
        first = measure_points(info, [point])[0][0]["measured"]["mean_ttft_ms"]
        second = measure_points(info, [point])[0][0]["measured"]["mean_ttft_ms"]
    assert second == pytest.approx(first, rel=0.25)


def test_a_campaign_nothing_could_be_fitted_to_is_refused_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another catalog model than the served one, or a GPU on which the prior says the served config
    does not start: one line, exit 2, before any run (it measured, then crashed in the fit)."""
    out = tmp_path / "out"
    with start_sim_server([QWEN_14B, "--max-model-len", "4096", "--time-scale", "4"]) as server:
        argv = ["calibrate", "--url", server.base_url, "-o", str(out / "cal.yaml")]
        assert main([*argv, "--gpu", "H100", "--model", "Qwen/Qwen3-8B"]) == 2
        err = capsys.readouterr().err.strip()
        assert f"the server at {server.base_url} serves {QWEN_14B}, another model" in err, err
        assert main([*argv, "--gpu", "L4"]) == 2  # 28 GiB of weights on a 22 GiB GPU
        err = capsys.readouterr().err.strip().splitlines()
        assert "does not start on L4" in err[-1] and "nothing was measured" in err[-1], err
        assert not any("[1/" in line for line in err), err
    assert not out.exists()


def test_a_set_the_server_contradicts_is_refused_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--set block_size=32 on a server reporting 16: the server's value won, silently. One equal to the
    server's (block_size=16) is fine."""
    out = tmp_path / "out"
    with start_sim_server([LLAMA_8B, "--max-model-len", "4096", "--time-scale", "4"]) as server:
        argv = ["calibrate", "--url", server.base_url, "--gpu", "H100", "-o", str(out / "cal.yaml")]
        assert main([*argv, "--set", "block_size=16", "--set", "max_model_len=2048"]) == 2
        said = [capsys.readouterr().err.strip()]
        assert main([*argv, "--set", "block_size=32"]) == 2
        said.append(capsys.readouterr().err.strip())
    where = f"autotune calibrate: error: --set {{}}: the server at {server.base_url} reports {{}} (drop the "
    where += "--set, or restart the server with it; nothing was measured)"
    assert said == [
        where.format("max_model_len=2048", "max_model_len 4096"),
        where.format("block_size=32", "block_size 16"),
    ]
    assert not out.exists()


def test_a_password_in_the_url_is_masked_wherever_the_url_is_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--url http://user:secretpw@host: the password was in the progress line, the points file's header,
    the report and the calibration's header."""
    out = tmp_path / "cal.yaml"
    with start_sim_server([LLAMA_8B, "--max-model-len", "4096", "--time-scale", "4"]) as server:
        url = server.base_url.replace("http://", "http://user:secretpw@")
        argv = ["calibrate", "--url", url, "--gpu", "H100", "--gpu-minutes", "0.5", "-o", str(out)]
        assert main([*argv, "--max-evaluations", "2"]) == 0
    said = capsys.readouterr()
    shown = server.base_url.replace("http://", "http://user:***@")
    written = [f.read_text() for f in (out, tmp_path / "cal-report.txt", tmp_path / "cal-points.yaml")]
    for text in (said.out, said.err, *written):
        assert "secretpw" not in text and shown in text, text[:2000]


def _calibrate_until(url: str, out: Path, start: str) -> subprocess.Popen:
    """`autotune calibrate --url` in a subprocess, returned once it printed a line starting `start`."""
    cmd = [sys.executable, "-m", "autotune.cli", "calibrate", "--url", url, "--gpu", "H100"]
    cmd += ["--gpu-minutes", "0.5", "-o", str(out)]  # the least designed set: 0.41
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith(start):
            return proc
    raise AssertionError(f"no line {start!r}; exit {proc.wait()}")


@pytest.mark.parametrize("stop", ["server dies", "ctrl-c", "sigterm"])
def test_the_runs_measured_before_a_failure_or_ctrl_c_are_kept(tmp_path: Path, stop: str) -> None:
    """They were thrown away; now the points file has them and the last line says how to refit. SIGTERM
    (a scheduler's stop) is a Ctrl-C: it lost them all."""
    out = tmp_path / "cal.yaml"
    with start_sim_server([LLAMA_8B, "--max-model-len", "4096", "--time-scale", "4"]) as server:
        proc = _calibrate_until(server.base_url, out, "calibrate: [2/")
        if stop != "server dies":
            proc.send_signal(signal.SIGINT if stop == "ctrl-c" else signal.SIGTERM)
        else:
            server.process.kill()
        _, err = proc.communicate(timeout=60)
    last = err.strip().splitlines()[-1]
    points = tmp_path / "cal-points.yaml"
    assert proc.returncode == (1 if stop == "server dies" else 130), err
    assert f"measured points are in {points}: refit them with autotune calibrate --points {points}" in last
    assert ("interrupted while measuring" in last) == (stop != "server dies"), last
    measured = load_points(points)
    assert [p["run"] for p in measured if p["kind"] == "serve"][:2] == ["light-c1", "light-c4"]
    assert not out.exists()


def test_a_server_that_stops_answering_fails_its_run_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A frozen server (SIGSTOP) kept a run waiting for its 600 s request timeout, silently, with the
    run's other requests behind it; now the run fails once the server has been silent STALL_S."""
    monkeypatch.setattr("autotune.calibrate.measure.STALL_S", 2.0)
    point = {"id": "p", "kind": "serve", "model": LLAMA_8B, "gpu": "H100", "flags": {"max_model_len": 4096}}
    point.update(requests=200, prompt=512, output=400, concurrency=8, measured={"mean_ttft_ms": 0.0})
    with start_sim_server([LLAMA_8B, "--max-model-len", "4096"]) as server:
        info = probe_server(server.base_url)
        freeze = threading.Timer(1.0, os.kill, (server.process.pid, signal.SIGSTOP))
        freeze.start()
        try:
            with pytest.raises(RunFailure) as failed:
                measure_points(info, [point])
        finally:
            freeze.cancel()
            os.kill(server.process.pid, signal.SIGCONT)
    said = str(failed.value)
    assert said.startswith("run p failed: the server sent nothing for 2 s with 8 requests in flight: it hung")
    assert said.endswith(" of 200 requests answered)"), said


def test_ctrl_c_in_the_fit_says_how_to_refit_and_the_refit_may_take_that_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said only "interrupted", and `--points X-points.yaml -o X.yaml` was refused because
    X-points.yaml exists, though --points writes no points file."""
    out = tmp_path / "cal.yaml"
    with start_sim_server([LLAMA_8B, "--max-model-len", "4096", "--time-scale", "4"]) as server:
        proc = _calibrate_until(server.base_url, out, "calibrate: fitting ")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    points = tmp_path / "cal-points.yaml"
    assert proc.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("autotune calibrate: interrupted during the fit; ") and str(points) in last, last
    refit = ["calibrate", "--points", str(points), "-o", str(out), "--max-evaluations", "2", "--quiet"]
    assert last.endswith(f"refit them with autotune {' '.join(refit[:5])}"), last
    assert main(refit) == 0, capsys.readouterr().err
    assert out.exists() and (tmp_path / "cal-report.txt").exists()
