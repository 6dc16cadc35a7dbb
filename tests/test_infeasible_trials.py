"""Trials that are not feasible: the verdict names the failure the trials share (shortened at a sentence
end), a capacity search that confirmed no rate is no config meeting the SLOs, and trials.csv gives each
its reason and no margin where nothing was measured."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

from test_recommendation import MAXIMIZE, capacity, decision
from test_study import MODEL, OBJECTIVES, build_run, ok

from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind
from autotune.core.values import brief
from autotune.measure.result import TrialResult
from autotune.measure.slo import parse_slos
from autotune.outputs import report
from autotune.outputs.cost import sizing
from autotune.outputs.outcome import outcome
from autotune.tune.objectives import constraints, is_feasible
from autotune.tune.study import records


def test_no_feasible_config_names_the_failure_its_trials_share(tmp_path: Path) -> None:
    """With nothing feasible, the verdict names the failure most launched trials share, and none when
    each failure is its own config's."""
    crash = "server exited with code 1: ImportError: libcuda.so.1: cannot open shared object file"

    def failed(kind: FailureKind, message: str, seqs: int) -> tuple[dict, TrialResult]:
        config = EngineConfig(model=MODEL).replace(max_num_seqs=seqs)
        return {"max_num_seqs": seqs}, TrialResult(config=config, failure=kind, message=message)

    shared = [failed(FailureKind.CRASHED, crash, s) for s in (64, 128)]
    d = decision(tmp_path / "shared", [*shared, failed(FailureKind.KV_CACHE_OOM, "No available memory", 256)])
    assert d.candidate is None and f"2 of 3 launched failed alike: crashed ({crash})" in d.text
    own = [failed(FailureKind.CRASHED, f"server exited with code {code}", 64 * code) for code in (1, 2)]
    assert "alike" not in decision(tmp_path / "own", own).text


def test_a_long_shared_failure_is_shortened_at_a_sentence_end_not_mid_word(tmp_path: Path) -> None:
    too_long = (
        "User-specified max_model_len (1000000) is greater than the derived max_model_len "
        "(max_position_embeddings=131072 or model_max_length=None in model's config.json). This may lead "
        "to incorrect model outputs or CUDA errors. To allow overriding this maximum, set the env var "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
    )
    trials = [
        (
            {"max_num_seqs": s},
            TrialResult(
                config=EngineConfig(model=MODEL).replace(max_num_seqs=s),
                failure=FailureKind.INVALID_CONFIG,
                message=too_long,
            ),
        )
        for s in (64, 128)
    ]
    first = too_long.split(". ")[0]
    assert f"2 of 2 launched failed alike: invalid_config ({first}.) (see" in decision(tmp_path, trials).text
    # no sentence end within the limit: whole words, then "..."
    assert brief(first, 60) == "User-specified max_model_len (1000000) is greater than..."


def test_a_capacity_search_that_confirmed_no_rate_is_no_config_meeting_the_slos(tmp_path: Path) -> None:
    """Its lowest window read p99 TTFT 1.7 s under a 2 s limit, too close to call: the search reported
    capacity 0. It is not recommended as meeting the SLOs, and nothing is sized from it."""
    unconfirmed = ok(1200, 1732, 30)
    unconfirmed.capacity = dataclasses.replace(capacity(1200, 0.03).capacity, rate=0.0, bracket=None)
    cons = constraints(unconfirmed, parse_slos("ttft_p99=2s"))
    assert cons["ttft_p99"] < 0 and not is_feasible(cons)  # the window's margin kept, the trial infeasible
    d = decision(tmp_path, [({"max_num_seqs": 1024, "baseline": True}, unconfirmed)])
    assert d.candidate is None and "No feasible config" in d.text
    assert sizing(records(build_run(tmp_path / "size", [({"max_num_seqs": 64}, unconfirmed)]))[0], 10) is None


def test_a_capacity_search_that_confirmed_no_rate_says_so_not_violates_slo(tmp_path: Path) -> None:
    """Its margin reads under the limit, so "violates SLO" would contradict trials.csv's own column."""
    unconfirmed = ok(1200, 1732, 30)
    unconfirmed.capacity = dataclasses.replace(capacity(1200, 0.03).capacity, rate=0.0, bracket=None)
    over = ok(1000, 2500, 30)  # its window missed the SLO
    good = ok(1500, 1000, 30)  # a front, so the summary shows the baseline's row
    outcomes = [
        ({"max_num_seqs": 1024, "baseline": True}, unconfirmed),
        ({}, over),
        ({"max_num_seqs": 64}, good),
    ]
    recs = records(build_run(tmp_path, outcomes))
    out = outcome(recs, OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"])
    report.write_all(tmp_path / "out", out)
    with (tmp_path / "out" / "trials.csv").open() as f:
        rows = {row["trial"]: row for row in csv.DictReader(f)}
    assert rows["0"]["reason"] == "no rate confirmed (its lowest rate too close to the SLOs to call)"
    assert float(rows["0"]["margin_ttft_p99"]) < 0
    assert rows["1"]["reason"] == "violates SLO" and float(rows["1"]["margin_ttft_p99"]) > 0
    assert "baseline (no rate confirmed" in report.summary_text(out)


def test_a_config_that_failed_before_any_measurement_has_empty_margins_in_trials_csv(tmp_path: Path) -> None:
    """Its constraints are told as 100 (a placeholder that ranks it below any measured config): trials.csv
    writes no margin for it, as it writes no objective value."""
    outcomes = [
        ({"max_num_seqs": 1024, "baseline": True}, ok(1500, 1000, 30)),
        ({"max_num_seqs": 4096}, None),
    ]
    out = outcome(records(build_run(tmp_path, outcomes)), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"])
    assert out.records[1].margins == {"ttft_p99": 100.0}  # what the sampler reads is unchanged
    report.write_all(tmp_path / "out", out)
    with (tmp_path / "out" / "trials.csv").open() as f:
        rows = {row["trial"]: row for row in csv.DictReader(f)}
    assert rows["1"]["reason"] == "kv_cache_oom" and rows["1"]["margin_ttft_p99"] == ""
    assert rows["1"]["output_throughput"] == "" and float(rows["0"]["margin_ttft_p99"]) < 0
