"""The simulator's calibration: the record and its YAML, --sim-calibration on the commands, the fit, and
`autotune calibrate` against a perturbed sim-server over HTTP (the recovery evidence)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import httpx
import optuna
import pytest
import yaml

from autotune.backends.sim import SimBackend
from autotune.calibrate.design import ConfigUnderTest, designed_points
from autotune.calibrate.fit import fit_calibration
from autotune.calibrate.points import Replay, load_points, points_yaml
from autotune.calibrate.report import warnings
from autotune.catalog.gpus import get_gpu
from autotune.catalog.models import get_model
from autotune.cli import main
from autotune.core.config import EngineConfig
from autotune.sim.calibration import (
    DEFAULT_CALIBRATION,
    calibration_fields,
    calibration_yaml,
    load_calibration,
)
from autotune.sim.costs import CostModel
from autotune.sim_server.parsing import RequestParser
from autotune.sim_server.server import free_port, start_sim_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import calibration_recovery as recovery  # noqa: E402

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
TINY_WORKLOAD = "name: tiny\nnum_requests: 24\nrequest_rate: inf\nprompt_len: 200\noutput_len: 32\n"


def _bench(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["bench", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_defaults_yaml_names_every_constant_and_reads_back(tmp_path: Path) -> None:
    text = calibration_yaml(DEFAULT_CALIBRATION, "header")
    for info in calibration_fields():
        assert f"\n# {info.describe()}\n{info.name}: " in text, info.name
    path = tmp_path / "cal.yaml"
    path.write_text(text)
    assert load_calibration(path) == DEFAULT_CALIBRATION
    assert DEFAULT_CALIBRATION.is_default and not DEFAULT_CALIBRATION.changed()


def test_every_calibration_file_rounds_its_constants_to_four_digits() -> None:
    """The guided run's calibration.yaml wrote `gemm_eff: 0.4300899999999999` (a scaled constant) while
    calibrate's were rounded: both go through calibration_yaml, which rounds."""
    text = calibration_yaml(DEFAULT_CALIBRATION.replace(gemm_eff=0.4300899999999999, bw_eff=2 / 3))
    assert "\ngemm_eff: 0.4301\n" in text and "\nbw_eff: 0.6667\n" in text, text


def test_printed_defaults_are_what_sim_calibration_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["calibrate", "--print-defaults"]) == 0
    printed = tmp_path / "defaults.yaml"
    printed.write_text(capsys.readouterr().out)
    workload = tmp_path / "tiny.yaml"
    workload.write_text(TINY_WORKLOAD)
    plain = _bench(["--workload", str(workload)], capsys)
    same = _bench(["--workload", str(workload), "--sim-calibration", str(printed)], capsys)
    assert same == plain  # the built-in values: the same simulator, byte for byte


def test_a_partial_file_overrides_only_its_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    partial = tmp_path / "slow-hbm.yaml"
    partial.write_text("bw_eff: 0.4  # half the built-in bandwidth efficiency\ninit_s: 1.0e+2\n")
    calibration = load_calibration(partial)
    assert calibration.changed() == {"bw_eff": 0.4, "init_s": 100.0}
    workload = tmp_path / "tiny.yaml"
    workload.write_text(TINY_WORKLOAD)
    plain = _bench(["--workload", str(workload)], capsys)
    slow = _bench(["--workload", str(workload), "--sim-calibration", str(partial)], capsys)
    assert slow["sim_calibration"] == {"bw_eff": 0.4, "init_s": 100.0}
    assert slow["mean_tpot_ms"] > 1.5 * plain["mean_tpot_ms"]  # decode streams the weights at half the rate
    config = EngineConfig(model=LLAMA_8B, max_model_len=4096)
    started = SimBackend("H100", calibration=calibration).evaluate(config, _Tiny()).startup_s
    assert started - SimBackend("H100").evaluate(config, _Tiny()).startup_s == pytest.approx(88.0)


class _Tiny:
    """Four short requests at t=0."""

    max_concurrency = None
    measure_from = 0.0

    def requests(self, seed: int = 0) -> list:
        from autotune.workloads.spec import Request

        return [Request(i, 64, 8) for i in range(4)]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("gemm_eff: 0.5\nflops_eff: 0.7\n", "unknown constant 'flops_eff'"),
        ("bw_eff: fast\n", "bw_eff must be a number (fraction), got 'fast'"),
        ("bw_eff: true\n", "bw_eff must be a number"),
        ("gemm_eff: 2.0\n", "gemm_eff = 2.0 is outside its range 0.01 to 1 (fraction)"),
        ("step_base_s: -1.0e-3\n", "step_base_s = -0.001 is outside its range"),
        ("bw_eff: [0.5\n", "malformed YAML in calibration file"),
        ("- 0.5\n", "expected a mapping of constant: value, got list"),
        # a truncated fitted file ran on the built-in constants without a word
        ("", "names no constant (an empty file"),
        ("# fitted by hand\n", "names no constant (an empty file"),
        (None, "calibration file not found"),
    ],
)
@pytest.mark.parametrize("command", ["bench", "run", "sim-server", "calibrate"])
def test_bad_calibration_files_are_one_line_exit_2_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, needle: str, command: str
) -> None:
    path = tmp_path / "cal.yaml"
    if content is not None:
        path.write_text(content)
    runs = tmp_path / "runs"
    extra = {
        "bench": [],
        "run": ["--runs-dir", str(runs)],
        "sim-server": [LLAMA_8B, "--port", str(free_port())],
        "calibrate": ["--points", "benchmarks/fidelity_points.yaml", "-o", str(runs / "c.yaml")],
    }[command]
    assert main([command, *extra, "--sim-calibration", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not runs.exists()


@pytest.mark.usefixtures("ray_cluster")
def test_a_run_records_its_calibration_and_resume_refuses_another(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fast = tmp_path / "fast.yaml"
    fast.write_text("gemm_eff: 0.9\n")
    args = [
        "run",
        "--space",
        "small",
        "--n-trials",
        "2",
        "--runs-dir",
        str(tmp_path),
        "--study",
        "cal",
        "--quiet",
    ]
    assert main([*args, "--sim-calibration", str(fast)]) == 0
    recorded = json.loads((tmp_path / "cal" / "run.json").read_text())["sim_calibration"]
    assert recorded == {**DEFAULT_CALIBRATION.to_dict(), "gemm_eff": 0.9}  # the values, not the path
    study = optuna.load_study(study_name="cal", storage=f"sqlite:///{tmp_path / 'cal' / 'study.db'}")
    assert study.user_attrs["autotune"]["sim_calibration"] == recorded
    assert (
        "simulator calibration: gemm_eff 0.9 (--sim-calibration)"
        in (tmp_path / "cal" / "report.html").read_text()
    )
    capsys.readouterr()
    assert main([*args, "--n-trials", "3", "--resume"]) == 2  # the built-in one now
    err = capsys.readouterr().err.strip()
    assert "was simulated with gemm_eff = 0.9, not 0.6" in err and len(err.splitlines()) == 1, err
    assert main([*args, "--n-trials", "3", "--resume", "--sim-calibration", str(fast)]) == 0


def _synthetic_points(truth_factors: dict[str, float]) -> tuple[list[dict], object]:
    """Designed points (small) with what the simulator gives under a perturbed calibration."""
    truth = DEFAULT_CALIBRATION.replace(
        **{k: getattr(DEFAULT_CALIBRATION, k) * f for k, f in truth_factors.items()}
    )
    config = ConfigUnderTest(
        "a", {"max_model_len": 8192}, 8192, ("light-c1", "light-c4", "prefill-c1", "burst")
    )
    points = [p for p in designed_points(LLAMA_8B, "H100", [config]) if p["kind"] == "serve"]
    for point in points:
        point["requests"] = {"burst": 120}.get(point["run"], point["requests"])
    replay = Replay(points)
    for i, point in enumerate(points):
        simulated = replay.simulate(i, truth)
        point["measured"] = {m: simulated[m] for m in point["measured"]}
    return points, truth


def test_the_fit_recovers_what_in_process_points_pin() -> None:
    points, truth = _synthetic_points({"bw_eff": 0.75, "step_base_s": 1.5, "completions_fixed_s": 1.4})
    result = fit_calibration(points)
    assert max(abs(e.signed) for e in result.before) > 0.2
    assert max(abs(e.signed) for e in result.after) < 0.02
    # Four short runs of one config pin the moved latency to within 10 %. The step's fixed costs
    # (step_base_s, per_layer_s x layers) and its weight streaming (bw_eff) move a one-model decode step
    # together: the data pins that step's time, not each constant (the fit says they are confounded).
    fitted, wanted = result.fitted.completions_fixed_s, truth.completions_fixed_s
    assert fitted == pytest.approx(wanted, rel=0.10)
    model, gpu = get_model(LLAMA_8B), get_gpu("H100")
    step = [CostModel(model, gpu, 1, model.kv_bytes_per_token(1), cal).step_time(1, 1, 1, 512, 0, 0)
            for cal in (result.fitted, truth)]  # fmt: skip
    assert step[0] == pytest.approx(step[1], rel=0.02)
    assert ("per_layer_s", "step_base_s") in result.confounded
    assert "gemm_eff" in result.free and "init_s" in result.unseen  # no point times a startup
    assert ("gemm_eff", "compute_scale_hopper") in result.confounded  # one GPU: only their product shows
    # The constants the data barely pins are named with how far the fit moved them anyway.
    loose = next(w for w in warnings(result) if w.startswith("the data barely constrains"))
    for name in result.prior_bound:
        moved = getattr(result.fitted, name) / getattr(DEFAULT_CALIBRATION, name) - 1
        assert f"{name} ({moved:+.1%})" in loose


def test_calibrate_points_writes_the_calibration_and_its_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    points, truth = _synthetic_points({"bw_eff": 0.75, "intake_per_request_s": 1.5})
    measured = tmp_path / "measured.yaml"
    measured.write_text(points_yaml(points, {"synthetic": "in-process, perturbed"}))
    assert load_points(measured) == [yaml.safe_load(yaml.safe_dump(p)) for p in points]
    out = tmp_path / "out" / "fitted.yaml"
    assert main(["calibrate", "--points", str(measured), "-o", str(out), "--quiet"]) == 0
    report = capsys.readouterr().out
    fitted = load_calibration(out)
    assert fitted.bw_eff == pytest.approx(truth.bw_eff, rel=0.05)
    assert (tmp_path / "out" / "fitted-report.txt").read_text() == report
    assert "bw_eff" in report and "median |error| by class: throughput" in report
    assert "init_s" in report.split("stayed at their prior")[1].splitlines()[0]
    assert main(["calibrate", "--points", str(measured), "-o", str(out)]) == 2  # never overwritten
    assert "exists" in capsys.readouterr().err


@pytest.fixture
def not_openai() -> Iterator[str]:
    """A plain HTTP server on 127.0.0.1 that answers 404 to everything."""

    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--points", "{missing}"], "points file not found"),
        (["--points", "{malformed}"], "malformed YAML in points file"),
        (["--points", "{no_points}"], "expected a non-empty list under 'points:'"),
        (["--points", "{bad_point}"], "point 1 (p): unknown serve metric 'ttft'"),
        (["--url", "http://127.0.0.1:{port}", "--gpu", "H100"], "cannot reach http://127.0.0.1:"),
        (["--url", "{not_openai}", "--gpu", "H100"], "is not an OpenAI-compatible server"),
        (["--url", "http://127.0.0.1:{port}"], "--gpu: which GPU the server runs on"),
        (["--backend", "vllm", "--gpu", "H100"], "--backend needs --model"),
        ([], "give exactly one of --points FILE, --url URL or --backend"),
        (["--points", "{missing}", "--gpu-minutes", "0"], "--gpu-minutes must be in (0, 600]"),
    ],
)
def test_calibrate_bad_inputs_are_one_line_exit_2_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], not_openai: str, args: list[str], needle: str
) -> None:
    (tmp_path / "malformed.yaml").write_text("points: [unclosed\n")
    (tmp_path / "no_points.yaml").write_text("sources: {}\n")
    bad = "points:\n  - {id: p, kind: serve, model: %s, gpu: H100, requests: 4, prompt: 8, output: 8,\n"
    (tmp_path / "bad_point.yaml").write_text(bad % LLAMA_8B + "     measured: {ttft: 5}}\n")
    names = {"missing": tmp_path / "nope.yaml", "port": free_port(), "not_openai": not_openai}
    names.update({n: tmp_path / f"{n}.yaml" for n in ("malformed", "no_points", "bad_point")})
    out = tmp_path / "runs" / "cal.yaml"
    argv = ["calibrate", *[a.format(**names) for a in args], "-o", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


def test_text_and_token_prompts_never_share_a_prefix_group() -> None:
    """The engine caches blocks by (prefix_id, i): a chat prompt and a token-id prompt must not get the
    same id, or one hits the other's cached blocks."""
    parser = RequestParser((LLAMA_8B,), 4096, 128256, 16)
    (token_prompt,) = parser.parse({"prompt": list(range(1000, 1100)), "max_tokens": 4}, chat=False)
    (chat,) = parser.parse({"messages": [{"role": "user", "content": "x" * 400}]}, chat=True)
    tokens, text = token_prompt.prefix[0], chat.prefix[0]
    assert tokens is not None and text is not None and tokens != text


def test_a_time_scaled_sim_server_keeps_the_simulated_clock() -> None:
    """--time-scale 4: a burst over HTTP takes a quarter of the time, and on the simulated clock
    (autotune:sim_time_scale on /metrics) it measures what the in-process simulator gives."""
    from autotune.calibrate.measure import measure_serve, probe_server

    point = {"id": "b", "kind": "serve", "model": LLAMA_8B, "gpu": "H100", "flags": {"max_model_len": 4096}}
    # 256 output tokens: about 2 s of wall time at 4x, so that a stall of the loaded test machine's CPU
    # (tens of ms) stays well inside the 5 % a metric may differ by
    point.update(requests=64, prompt=512, output=256, measured={"output_throughput": 0, "mean_tpot_ms": 0})
    with start_sim_server([LLAMA_8B, "--max-model-len", "4096", "--time-scale", "4"]) as server:
        info = probe_server(server.base_url)
        measured, gpu_s = measure_serve(info, point, salt=1)
    assert info.time_scale == 4.0 and info.kv_tokens and info.flags()["block_size"] == 16
    simulated = Replay([measured]).simulate(0)
    for metric in ("output_throughput", "mean_tpot_ms"):
        assert measured["measured"][metric] == pytest.approx(simulated[metric], rel=0.05), metric
    assert gpu_s == pytest.approx(64 * 256 / simulated["output_throughput"], rel=0.05)
    with start_sim_server([LLAMA_8B, "--max-model-len", "4096"]) as server:
        assert "autotune:" not in httpx.get(server.base_url + "/metrics").text  # vLLM's names only


def test_calibrate_over_http_recovers_a_perturbed_server(tmp_path: Path) -> None:
    """`autotune calibrate --url` against a sim-server whose constants were moved 20-50 % (P1), at 2x
    real time: on a config and loads the designed set did not use, measured over HTTP, the fitted
    simulator is within 5 % (burst throughput; p99 TTFT and TPOT at half that rate), the built-in one
    is not. (At 4x it failed once in a full-suite run where it passed alone: at 2x the HTTP path's own
    delays are half as large a share of each simulated latency, docs/simulator.md "Recovery".)"""
    setup = recovery.Setup(scale=2.0)
    truth_file = tmp_path / "perturbed.yaml"
    truth_file.write_text(calibration_yaml(recovery.perturbed("P1"), "P1"))
    out = tmp_path / "fitted.yaml"
    with start_sim_server(setup.server_args(truth_file), gpu=setup.gpu) as server:
        cmd = [
            sys.executable,
            "-m",
            "autotune.cli",
            "calibrate",
            "--url",
            server.base_url,
            "--gpu",
            setup.gpu,
        ]
        # 1.2 GPU-minutes, the least designed set here (the benchmark: 2): docs/simulator.md
        cmd += ["--model", setup.model, "--gpu-minutes", "1.2", "-o", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "calibrate: [9/9]" in done.stderr  # progress lines
    assert len(load_points(tmp_path / "fitted-points.yaml")) == 10  # saved to refit with --points
    fitted = load_calibration(out)
    rows = recovery.held_out(
        setup, truth_file, fitted, configs=["budget4096-seqs64"], n_burst=80, n_half=60, tolerance=0.05
    )
    table = "\n".join(f"{r.metric}: measured {r.measured:.1f} before {r.error('before'):+.1%} "
                      f"after {r.error('after'):+.1%} truth {r.truth / r.measured - 1:+.1%}"
                      for r in rows)  # fmt: skip
    # The half-load draw is one whose p99 TTFT a 2 % error in any one speed constant moves by at most 5 %
    # (recovery.steady_half_load): on a draw where one request's wait flips, that p99 says nothing of the fit.
    for r in rows:
        assert abs(r.error("after")) <= 0.05, table
    assert max(abs(r.error("before")) for r in rows) > 0.15, table
