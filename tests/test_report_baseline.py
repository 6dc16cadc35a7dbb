"""The baseline (vLLM's defaults) in the results: a failed one is not compared with, and one the space
moved off vLLM's defaults says so wherever it is named."""

from __future__ import annotations

import json
from pathlib import Path

from cli import autotune
from test_report import MAXIMIZE
from test_study import OBJECTIVES, build_run, ok

from autotune.outputs import report
from autotune.outputs.outcome import outcome
from autotune.tune.study import records


def test_a_baseline_that_crashed_before_anything_completed_shows_nothing_as_measured(tmp_path: Path) -> None:
    """Its server was killed mid-trial with no request done: its metrics are placeholders (vLLM's 0 for
    percentiles of nothing, 0 req/s), so trials.csv leaves them empty, the front's title stays true to
    "feasible" (the crashed row sits under its own heading, with "-"), and the verdict says the defaults
    failed and why instead of comparing with zeros ("p99_ttft_ms 45.53 (baseline 0)")."""
    import csv

    from autotune.core.errors import FailureKind
    from autotune.measure.metrics import compute_metrics
    from autotune.measure.result import TrialResult

    crashed = TrialResult(config=ok(0, 0, 0).config, failure=FailureKind.CRASHED)
    crashed.message, crashed.benchmark = "server exited with code 137", compute_metrics([], 30.0)
    study = build_run(
        tmp_path,
        [({"max_num_seqs": 1024, "baseline": True}, crashed), ({"max_num_seqs": 256}, ok(4800, 45.53, 9))],
    )
    out = outcome(records(study), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"])
    report.write_all(tmp_path, out)
    with (tmp_path / "trials.csv").open() as f:
        base = next(csv.DictReader(f))
    assert base["reason"] == "crashed"
    unmeasured = ["output_throughput", "p99_ttft_ms", "p99_itl_ms", "p99_tpot_ms", "margin_ttft_p99"]
    assert [base[name] for name in unmeasured] == [""] * len(unmeasured), base
    title, _, first, *rest = report.front_table(out).splitlines()
    assert title.startswith("Feasible Pareto front") and first.startswith("*  #1")
    assert rest[0].startswith("Not feasible") and "#0" in rest[1] and "baseline (crashed)" in rest[1]
    assert " 0 " not in rest[1] and rest[1].split()[1:4] == ["-", "-", "-"], rest
    verdict = out.verdict()
    assert "(trial #0) failed: crashed (server exited with code 137)" in verdict, verdict
    assert "baseline 0" not in verdict and "vs the defaults" not in verdict
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["verdict"] == verdict


def test_a_baseline_cut_short_mid_run_is_not_compared_with(tmp_path: Path) -> None:
    """Its server was killed after 35 of 41 requests: the partial run's throughput, a fraction of what it
    served, made the recommendation "+27.5% vs the defaults". A failed run's figures are not a
    measurement of the config: the verdict says it failed, and no "vs baseline" is given."""
    import dataclasses

    from autotune.core.errors import FailureKind

    cut = dataclasses.replace(ok(3900, 40, 9), failure=FailureKind.REQUESTS_FAILED)
    cut.message = "6 of 41 requests failed: server disconnected"
    study = build_run(
        tmp_path,
        [({"max_num_seqs": 1024, "baseline": True}, cut), ({"max_num_seqs": 256}, ok(4970, 45.53, 9))],
    )
    out = outcome(records(study), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"])
    report.write_all(tmp_path, out)
    verdict = out.verdict()
    assert "(trial #0) failed: requests_failed (6 of 41 requests failed" in verdict, verdict
    assert "vs the defaults" not in verdict and "+27" not in verdict
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["trial"] == 1 and best["gain_vs_baseline"] is None


def test_a_baseline_the_space_moved_off_vllms_defaults_says_so_wherever_it_is_named(tmp_path: Path) -> None:
    """max_num_seqs 64 or 256 on an H100, whose vLLM default is 1024: trial #0 runs at 256, and the
    start line, the verdict, best.json and the report call it vLLM's defaults at max_num_seqs=256."""
    (tmp_path / "space.yaml").write_text(
        "fixed: {model: meta-llama/Llama-3.1-8B-Instruct, gpu: H100, max_model_len: 4096}\n"
        "params:\n  max_num_seqs: {type: categorical, choices: [64, 256]}\n"
    )
    (tmp_path / "tiny.yaml").write_text(
        "name: tiny\nnum_requests: 40\nload: fixed\nrequest_rate: 10\nprompt_len: {dist: fixed, mean: 64}\n"
        "output_len: {dist: fixed, mean: 16}\n"
    )
    args = ["--space", "space.yaml", "--workload", "tiny.yaml", "--n-trials", "2", "--study", "m", "--quiet"]
    done = autotune(tmp_path, "run", *args, "--slo", "ttft_p99=2s")
    said = (
        "the baseline is vLLM's defaults at max_num_seqs=256: vLLM's own default, max_num_seqs=1024, is "
        "outside this space (the nearest value it allows stands in)"
    )
    assert f"autotune: {said}" in done.stderr
    best = json.loads((tmp_path / "runs/m/best.json").read_text())
    assert (
        best["baseline"]["label"] == "vLLM's defaults at max_num_seqs=256" and said in best["flags_to_know"]
    )
    assert "vLLM's defaults at max_num_seqs=256" in best["verdict"]
    html = (tmp_path / "runs/m/report.html").read_text()
    assert "<th>vLLM&#x27;s defaults at max_num_seqs=256 (baseline)</th>" in html
