"""`autotune bench`: the full config it measured, the same max_model_len as run, JSON errors, --url."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.sim_server.server import start_sim_server

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SMALL = """name: small
num_requests: 12
load: fixed
request_rate: 20
prompt_len: {dist: fixed, mean: 64}
output_len: {dist: fixed, mean: 8}
"""


@pytest.fixture
def workload(tmp_path: Path) -> str:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    return str(path)


def test_bench_prints_the_resolved_config_with_runs_max_model_len(
    workload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["bench", "--workload", workload, "--set", "max_num_seqs=128", "--gpu", "h100-sxm", "--json"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["gpu"] == "H100"  # the catalog's name, whatever alias was typed
    config = report["config"]
    # the default space's fixed max_model_len (8192, as `run` uses), not the model's 131072
    assert config["max_model_len"] == 8192 and config["max_num_seqs"] == 128
    assert config["max_num_batched_tokens"] == 8192  # vLLM's H100 default, resolved and shown
    assert report["completed"] == 12


def test_set_takes_the_pass_through_flags_a_space_may_set(
    workload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--set` builds the config as a space's flags do: vLLM's pass-through flags too, modelled by the
    simulator (eager steps are slower) or refused by it in one line."""
    itl = {}
    for flags in ([], ["--set", "enforce_eager=true", "--set", "long_prefill_token_threshold=512"]):
        assert main(["bench", "--workload", workload, *flags, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        itl[bool(flags)] = report["median_itl_ms"]
    config = report["config"]
    assert config["enforce_eager"] is True and config["long_prefill_token_threshold"] == 512
    assert itl[True] > itl[False]
    assert main(["bench", "--workload", workload, "--set", "pipeline_parallel_size=2"]) == 2
    assert "does not model pipeline_parallel_size=2" in capsys.readouterr().err


def test_a_failed_config_with_json_prints_a_json_error(
    workload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--workload", workload, "--set", "gpu_memory_utilization=0.2", "--json"]) == 1
    captured = capsys.readouterr()
    error = json.loads(captured.out)
    assert error["error"] == "kv_cache_oom" and "No available memory" in error["message"]
    assert error["config"]["gpu_memory_utilization"] == 0.2
    assert "kv_cache_oom" in captured.err


def test_bench_url_measures_a_running_server_without_launching(
    workload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with start_sim_server([MODEL, "--max-model-len", "4096"]) as server:
        assert main(["bench", "--url", server.base_url, "--workload", workload, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["server"] == server.base_url and report["model_id"] == MODEL  # from /v1/models
        assert report["completed"] == 12 and report["total_output_tokens"] == 12 * 8
        assert report["num_gpu_blocks"] > 0  # read from the server's /metrics
        assert server.process.poll() is None  # still running: bench did not own it
    assert main(["bench", "--url", "http://127.0.0.1:9", "--workload", workload]) == 2


def test_bench_capacity_says_what_its_brackets_unmeasured_top_is(capsys: pytest.CaptureFixture[str]) -> None:
    """A TTFT SLO caps the probed rates below the saturation throughput (a queue must settle within a
    probe): the capacity line names that ceiling, the progress names the burst's saturation figure,
    and --json's capacity holds the figures the line was drawn from."""
    assert main(["bench", "--capacity", "--slo", "ttft_p99=2s"]) == 0
    out, err = capsys.readouterr()
    line = next(x for x in out.splitlines() if x.startswith("Capacity: "))
    assert "its top is the highest rate whose queue settles within a probe" in line, line
    sat = float(next(x for x in out.splitlines() if x.startswith("Saturation throughput")).split()[-2])
    assert f"{sat:.2f} while its batch was full (the saturation throughput)" in err
    assert main(["bench", "--capacity", "--slo", "ttft_p99=2s", "--json"]) == 0
    capacity = json.loads(capsys.readouterr().out)["capacity"]
    assert not capacity["bound_measured"] and capacity["bracket"][1] < 1.1 * capacity["saturation_throughput"]


def test_a_probes_progress_line_names_what_each_figure_is_over() -> None:
    """The line said "0.00 req/s; p99 TTFT 0 ms" for an abort before a measured request completed,
    "served 180.88 of 179.95 req/s (its backlog grew)" (completions in the window include warm-up ones;
    the backlog is the trend of the requests in the server), and a p99 of 1370 ms beside "199 of 4508
    requests already over 2000 ms" (the p99 is over the completed ones, the abort counts waiting ones)."""
    from test_study import bench

    from autotune.commands.bench_progress import outcome
    from autotune.core.config import EngineConfig
    from autotune.core.errors import FailureKind
    from autotune.measure.load_report import LoadReport, SteadyState
    from autotune.measure.metrics import compute_metrics
    from autotune.measure.result import TrialResult

    config = EngineConfig(model=MODEL)
    reason = "p99_ttft_ms cannot be met: 54 of 4498 requests already over 2000 ms"
    nothing = TrialResult(config, compute_metrics([], 8.0), FailureKind.EARLY_ABORT, reason)
    line = outcome(nothing)
    assert line == f"no measured request completed; early_abort: {reason}", line
    steady = SteadyState(179.95, 180.88, 0.031, 0.02, 0.0, kept_up=False)
    grew = TrialResult(config, bench(4000, 1370, 20), load=LoadReport(steady=steady))
    line = outcome(grew)
    assert "served 180.88 of 179.95" not in line
    assert line.startswith(
        "window: 179.95 req/s sent, 180.88 req/s finished (warm-up requests included), its backlog grew by "
        "3.1% of arrivals (2.0% allowed); p99 TTFT 1370 ms, p99 ITL 20 ms over its 100 completed"
    ), line
    cut = dataclasses.replace(grew, failure=FailureKind.EARLY_ABORT, message=reason)
    assert outcome(cut) == f"p99 TTFT 1370 ms, p99 ITL 20 ms over its 100 completed; early_abort: {reason}"


def test_a_probe_the_search_kept_up_says_so_beside_its_backlog(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The probe at 20.17 req/s (saturation 20.79) PASSed, yet its line read "its backlog grew by 10.1% of
    arrivals (7.1% allowed)", like a failure: at or below saturation the search fails a window only on a
    gross shortfall, and the line now says that rule kept it up."""
    path = tmp_path / "p24.yaml"
    path.write_text(
        "name: p24\nnum_requests: 2000\nload: fixed\nrequest_rate: 60\n"
        "prompt_len: {dist: lognormal, mean: 1000, sigma: 0.8, min: 16, max: 6000}\n"
        "output_len: {dist: lognormal, mean: 250, sigma: 0.7, min: 8, max: 1024}\n"
    )
    assert main(["bench", "--capacity", "--workload", str(path)]) == 0
    out, err = capsys.readouterr()
    verdicts = {x.split()[0]: x.split()[-1] for x in out.splitlines() if x.endswith(("PASS", "FAIL"))}
    lines = [x.removeprefix("autotune bench: ").split("]", 1)[1].strip() for x in err.splitlines()]
    probed = {}  # each probe's rate (as the table shows it) -> its outcome line
    for before, line in zip(lines, lines[1:], strict=False):
        if before.startswith("probe at "):
            probed[before.split()[2]] = line
    grew = {rate: line for rate, line in probed.items() if "its backlog grew" in line}
    assert grew, probed
    for rate, line in grew.items():
        passed = verdicts[rate] == "PASS"
        assert (
            "allowed for the count; kept up by the probe's rule: at or below the saturation" in line
        ) is passed
    assert any(verdicts[rate] == "PASS" for rate in grew), (grew, verdicts)


def test_a_bracket_topped_by_the_saturation_margin_says_so() -> None:
    from autotune.commands.bench_report import capacity_lines
    from autotune.measure.capacity_report import CapacityReport

    report = CapacityReport(
        rate=20.0,
        kept_up=True,
        bracket=(20.0, 22.0),
        resolution=0.1,
        bound_measured=False,
        saturation_throughput=20.0,
        goodput=None,
    )
    line = capacity_lines({**dataclasses.asdict(report), "probes": []}, [])[0]
    assert line.endswith(
        "(bracket 20.00-22.00 req/s, 10.0%; its top is 1.1x the saturation throughput, not a measured rate)"
    )
    measured = dataclasses.replace(report, bound_measured=True)
    assert capacity_lines({**dataclasses.asdict(measured), "probes": []}, [])[0].endswith("10.0%)")


def test_one_request_is_not_judged_on_keeping_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One request at 1 req/s: its window ends at its only arrival, which defines no rate and finishes
    after it. The verdict said "yes (...; 0.00 of 1.00 req/s served)"; it now says it cannot tell."""
    path = tmp_path / "one.yaml"
    path.write_text(SMALL.replace("num_requests: 12", "num_requests: 1").replace("rate: 20", "rate: 1"))
    assert main(["bench", "--workload", str(path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("Kept up with the load"))
    assert line.split(None, 5)[-1].startswith("not judged (the run is too short to tell"), line
    assert main(["bench", "--workload", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["completed"] == 1 and "load_verdict" not in report


def test_a_trace_replayed_at_its_own_times_is_said_not_judged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace's arrival times make its request_rate inf: the report took it for no fixed-rate run and
    left the keep-up row out, reading as a run that passed unjudged. Its arrivals decide it."""
    path = tmp_path / "t.yaml"
    path.write_text("name: t\nnum_requests: 40\ntrace: {name: conv, arrivals: trace, time_scale: 4}\n")
    assert main(["bench", "--workload", str(path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("Kept up with the load"))
    assert line.split(None, 5)[-1].startswith("not judged (the run is too short to tell"), line
    assert main(["bench", "--workload", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["request_rate"] == "inf" and report["load_kind"] == "open"


def test_a_capacity_search_says_which_window_its_metrics_are(capsys: pytest.CaptureFixture[str]) -> None:
    """No rate meets a 5 ms p99 TTFT: the metrics are the lowest probe's window, not one "at that rate"
    (there is none); with a capacity, the window at it; with no probe at all, the saturation burst."""
    from autotune.commands.bench_report import metrics_source

    assert main(["bench", "--capacity", "--slo", "ttft_p99=5ms"]) == 1
    lines = capsys.readouterr().out.splitlines()
    rates = [float(x.split()[0]) for x in lines if x.endswith(" FAIL")]
    assert rates and not any("at that rate" in x for x in lines)
    said = (
        f"No rate passed: the metrics below are the window at the lowest rate probed, {min(rates):.2f} req/s"
    )
    assert any(x.startswith(said) for x in lines), lines
    assert metrics_source({"rate": 19.2, "probes": []}).startswith(
        "The metrics below are the window at the capacity, 19.20 req/s"
    )
    assert metrics_source({"rate": 0.0, "probes": []}).startswith("No rate was probed")


def test_in_process_bench_reports_the_prefix_cache_hit_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Shared prefixes: the simulated engine's hit rate under the key `bench --url` reads from a server's
    /metrics, for a fixed load and a capacity search alike."""
    path = tmp_path / "shared.yaml"
    path.write_text(SMALL + "shared_prefix: {num_prefixes: 2, prefix_len: 512}\n")
    for extra in ([], ["--capacity"]):
        main(["bench", "--workload", str(path), *extra, "--json"])
        report = json.loads(capsys.readouterr().out)
        assert 0.5 < report["prefix_cache_hit_rate"] <= 1.0, extra


def test_text_prompts_share_the_prefix_cache_in_process_as_on_the_sim_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """JSONL text prompts, repeated or sharing their start: the in-process engine finds the prefixes the
    sim-server finds in what it is sent (it found none: hit rate 0 against the server's 0.97)."""
    words = "the quick brown fox jumps over the lazy dog " * 100
    rows = [{"prompt": words + ("" if i % 2 else f"question {i}"), "output_len": 8} for i in range(4)]
    (tmp_path / "texts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "texts.yaml"
    path.write_text("num_requests: 12\nrequest_rate: 10\njsonl: texts.jsonl\n")
    rates = []
    with start_sim_server([MODEL, "--max-model-len", "8192"]) as server:
        for where in (["--set", "max_model_len=8192"], ["--url", server.base_url]):
            assert main(["bench", "--workload", str(path), *where, "--json"]) == 0
            rates.append(json.loads(capsys.readouterr().out)["prefix_cache_hit_rate"])
    assert rates[0] > 0.8 and rates[0] == pytest.approx(rates[1], abs=0.01)


def test_bench_url_twice_on_one_server_shares_no_prefix_cache(
    workload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each run salts its prompts from a random base: a second run on the same server misses the first
    one's cache (salts restarted at 0 in every process, so it hit every prompt)."""
    with start_sim_server([MODEL, "--max-model-len", "4096"]) as server:
        for _ in range(2):
            assert main(["bench", "--url", server.base_url, "--workload", workload, "--json"]) == 0
            assert json.loads(capsys.readouterr().out)["prefix_cache_hit_rate"] == 0


def test_concurrency_sets_a_fixed_load_on_a_capacity_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --capacity bench measures one load, so --concurrency sets it as --rate does, even on a
    workload file whose load is capacity (it was refused as a capacity search with a concurrency cap)."""
    path = tmp_path / "capacity.yaml"
    path.write_text(SMALL.replace("load: fixed", "load: capacity"))
    assert main(["bench", "--workload", str(path), "--concurrency", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["max_concurrency"] == 4 and report["completed"] == 12


def _strict(constant: str) -> None:
    raise ValueError(f"not JSON: {constant}")


def test_json_has_no_infinity_an_infinite_rate_is_inf_as_vllm_writes_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`vllm bench serve` writes request_rate "inf"; Python's json wrote Infinity, which RFC 8259 lacks."""
    assert main(["bench", "--workload", "concurrency", "--json"]) == 0
    report = json.loads(capsys.readouterr().out, parse_constant=_strict)
    assert report["request_rate"] == "inf" and report["max_concurrency"] == 64


def test_a_capacity_results_top_level_keys_are_its_windows_as_vllm_defines_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """request_rate is the rate the window was offered (not the file's 24), num_prompts its requests (not
    the file's 400), request_throughput completed / duration; the sustained figures `run` reports stay
    in the capacity block."""
    assert main(["bench", "--capacity", "--slo", "ttft_p99=2s", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    capacity, done = report["capacity"], report["completed"]
    assert report["request_rate"] == capacity["rate"] and report["num_prompts"] == done + report["failed"]
    assert report["request_throughput"] == pytest.approx(done / report["duration"])
    assert report["output_throughput"] == pytest.approx(report["total_output_tokens"] / report["duration"])
    sustained = capacity["sustained"]
    assert sustained["request_throughput"] == pytest.approx(capacity["rate"], abs=1e-4)
    per_request = report["total_output_tokens"] / done
    assert sustained["output_throughput"] == pytest.approx(sustained["request_throughput"] * per_request)
