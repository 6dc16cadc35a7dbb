"""The recommendation keeps vLLM's defaults unless a gain clears the measurement's resolution or noise."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import pytest
from test_study import MODEL, OBJECTIVES, build_run, ok

from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind
from autotune.core.values import brief
from autotune.measure.capacity_report import CapacityReport
from autotune.measure.result import TrialResult
from autotune.measure.slo import parse_slos
from autotune.outputs import report
from autotune.outputs.cost import sizing
from autotune.outputs.outcome import outcome
from autotune.tune.objectives import constraints, is_feasible, load_objectives, objectives_from_dict
from autotune.tune.recommendation import decide, tie_clause
from autotune.tune.study import records

MAXIMIZE = [o.maximize for o in OBJECTIVES.objectives]


def capacity(throughput: float, resolution: float, ttft_ms: float = 1500, itl_ms: float = 30) -> TrialResult:
    """A capacity trial's result: its value and how finely its bracket knows it."""
    result = ok(throughput, ttft_ms, itl_ms)
    result.capacity = CapacityReport(
        rate=1.0,
        kept_up=True,
        bracket=(1.0, 1.0 + resolution),
        resolution=resolution,
        bound_measured=True,
        saturation_throughput=None,
        goodput=None,
    )
    return result


def decision(tmp_path: Path, outcomes: list, remeasured: dict | None = None):
    study = build_run(tmp_path, outcomes)
    return decide(records(study), MAXIMIZE, OBJECTIVES.names, remeasured)


def test_a_gain_within_the_capacity_resolution_keeps_the_defaults(tmp_path: Path) -> None:
    d = decision(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, capacity(5000, 0.03)),
            ({"max_num_seqs": 256}, capacity(5100, 0.03)),
        ],
    )
    assert d.keeps_defaults and d.trial is d.baseline and d.candidate.number == 1
    assert d.gain is not None and not d.gain.significant and d.gain.how == "capacity brackets"
    assert "Keep vLLM's defaults" in d.text and "a tie, not a gain" in d.text
    # trial #1 is the tie rule's pick (the lowest latencies among near-ties), not "the best config found"
    assert "The lowest-latency near-tie (trial #1) differs by +2.0 %" in d.text


def test_each_trial_ties_by_its_own_bracket_not_the_coarsest(tmp_path: Path) -> None:
    """A 5 % loss measured to 2 % is no tie with the defaults, even when another trial's bracket is 6 %
    wide: the defaults stay, with no lower-latency "near-tie" put forward in their place."""
    outcomes = [
        ({"max_num_seqs": 1024, "baseline": True}, capacity(5000, 0.02, ttft_ms=1500)),
        ({"max_num_seqs": 256}, capacity(4750, 0.02, ttft_ms=900)),
        ({"max_num_seqs": 128}, capacity(4000, 0.06, ttft_ms=1600)),
    ]
    d = decision(tmp_path / "a", outcomes)
    assert d.keeps_defaults and d.candidate.number == 0 and d.gain is None
    # the same trial measured to 6 %: its bracket reaches the defaults' value, so it ties and wins on TTFT
    outcomes[1] = ({"max_num_seqs": 256}, capacity(4750, 0.06, ttft_ms=900))
    tied = decision(tmp_path / "b", outcomes)
    assert tied.keeps_defaults and tied.candidate.number == 1 and "a tie, not a gain" in tied.text


def test_a_gain_beyond_the_margin_on_average_but_not_in_every_pair_says_so(tmp_path: Path) -> None:
    """+5.5 % on average over three paired runs, the lowest +2 % (under the 3 % margin): the defaults
    stay, and the text does not call +5.5 % "within the margin"."""
    outcomes = [
        ({"max_num_seqs": 1024, "baseline": True}, capacity(5000, 0.03)),
        ({"max_num_seqs": 256}, capacity(5100, 0.03)),
    ]
    d = decision(tmp_path, outcomes, {"1": {"1": 5500, "2": 5220}, "0": {"1": 5000, "2": 5000}})
    assert d.keeps_defaults and d.gain is not None and not d.gain.significant
    assert d.gain.ratio > 1.03 and d.gain.low < 1.03
    assert "lowest paired run, +2.0 %" in d.text and "not a sure gain" in d.text
    assert "a tie" not in d.text


def test_a_near_tie_that_every_repeat_puts_below_is_called_a_loss(tmp_path: Path) -> None:
    """Tied on its first run, picked for its latency, and below the defaults in every repeat: the text
    says so, not "a tie"."""
    outcomes = [
        ({"max_num_seqs": 1024, "baseline": True}, capacity(5000, 0.03, ttft_ms=1500)),
        ({"max_num_seqs": 256}, capacity(4950, 0.03, ttft_ms=900)),
    ]
    d = decision(tmp_path, outcomes, {"1": {"1": 4900, "2": 4880}, "0": {"1": 5000, "2": 5010}})
    assert d.keeps_defaults and d.trial is d.baseline and d.candidate.number == 1
    assert d.gain is not None and d.gain.high < 1
    assert "no config found beats them" in d.text and "every repeat" in d.text and "a tie" not in d.text


def test_a_gain_beyond_both_brackets_is_recommended(tmp_path: Path) -> None:
    d = decision(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, capacity(5000, 0.03)),
            ({"max_num_seqs": 256}, capacity(5400, 0.03)),
        ],
    )
    assert not d.keeps_defaults and d.trial.number == 1 and d.gain.significant
    assert d.gain.low > 1 and d.gain.low < d.gain.ratio < d.gain.high  # +8 % known to +4.9 .. +11.2 %
    assert "Recommended: trial #1" in d.text and "interval" in d.text


def test_repeats_give_the_gain_an_interval_and_can_undo_a_lucky_first_run(tmp_path: Path) -> None:
    outcomes = [
        ({"max_num_seqs": 1024, "baseline": True}, capacity(5000, 0.03)),
        ({"max_num_seqs": 256}, capacity(5400, 0.03)),
    ]
    # the first runs said +8 %; repeats say +1 % and -2 %: the lowest pair does not clear the margin
    lucky = decision(tmp_path / "a", outcomes, {"1": {"1": 5050, "2": 4900}, "0": {"1": 5000, "2": 5000}})
    assert lucky.keeps_defaults and lucky.gain.how == "3 paired runs"
    assert lucky.gain.low < 1 < lucky.gain.high
    # consistent repeats: every pair clears the margin
    real = decision(tmp_path / "b", outcomes, {"1": {"1": 5450, "2": 5380}, "0": {"1": 5020, "2": 4990}})
    assert not real.keeps_defaults and real.gain.significant and real.gain.low > 1.03


def test_an_infeasible_baseline_makes_any_feasible_config_the_recommendation(tmp_path: Path) -> None:
    d = decision(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, capacity(5000, 0.03, ttft_ms=2500)),
            ({"max_num_seqs": 256}, capacity(5010, 0.03)),
        ],
    )
    assert d.trial.number == 1 and not d.keeps_defaults and "do not meet the SLOs" in d.text


def test_fixed_load_ties_are_judged_at_one_percent(tmp_path: Path) -> None:
    d = decision(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, ok(5000, 1500, 30)),
            ({"max_num_seqs": 256}, ok(5030, 1400, 30)),
        ],
    )
    assert d.keeps_defaults and d.gain.margin == 0.01


def test_the_config_the_recommendation_picks_is_re_measured(tmp_path: Path) -> None:
    """Ties on throughput go to the lowest latencies: that pick can be 4th by throughput, and it is the
    one whose gain needs repeats."""
    from autotune.tune.remeasure import TOP_CANDIDATES, targets

    study = build_run(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, capacity(4000, 0.03)),
            ({"max_num_seqs": 512}, capacity(5100, 0.03, ttft_ms=1900, itl_ms=90)),
            ({"max_num_seqs": 256}, capacity(5090, 0.03, ttft_ms=1800, itl_ms=80)),
            ({"max_num_seqs": 128}, capacity(5080, 0.03, ttft_ms=1700, itl_ms=70)),
            ({"max_num_seqs": 64}, capacity(5070, 0.03, ttft_ms=500, itl_ms=10)),
        ],
    )
    recs = records(study)
    pick = decide(recs, MAXIMIZE, OBJECTIVES.names).candidate
    assert pick is not None and pick.number == 4  # the lowest latencies among the tied
    chosen = [r.number for r in targets(recs, MAXIMIZE)]
    assert chosen[0] == 4 and len(chosen) == TOP_CANDIDATES + 1 and chosen[-1] == 0  # and the baseline


def test_the_runner_up_by_throughput_is_re_measured_even_off_the_pareto_front(tmp_path: Path) -> None:
    """Trial 2 measured 1 % below trial 1 with higher latencies (dominated), trial 3 far below with the
    lowest: the runner-up by throughput is the one that may truly be best, so it is re-measured."""
    from autotune.tune.remeasure import targets

    study = build_run(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, capacity(5000, 0.03)),
            ({"max_num_seqs": 512}, capacity(5600, 0.03, ttft_ms=900, itl_ms=20)),
            ({"max_num_seqs": 256}, capacity(5550, 0.03, ttft_ms=1500, itl_ms=60)),
            ({"max_num_seqs": 32}, capacity(4000, 0.03, ttft_ms=200, itl_ms=5)),
        ],
    )
    assert [r.number for r in targets(records(study), MAXIMIZE)] == [1, 2, 0]


def test_with_repeats_the_pick_is_the_best_mean_not_the_luckiest_first_run(tmp_path: Path) -> None:
    """Trial 1 measured highest once and trial 2 higher in both repeats: trial 2 is picked (by its mean
    over three runs), and the text says why the highest single run lost."""
    outcomes = [
        ({"max_num_seqs": 1024, "baseline": True}, capacity(5000, 0.03)),
        ({"max_num_seqs": 256}, capacity(5600, 0.03)),
        ({"max_num_seqs": 128}, capacity(5500, 0.03)),
        ({"max_num_seqs": 64}, capacity(5650, 0.03)),  # measured highest once, never re-measured
    ]
    repeats = {
        "1": {"1": 5200, "2": 5150},
        "2": {"1": 5550, "2": 5600},
        "0": {"1": 5000, "2": 4990},
    }
    d = decision(tmp_path / "a", outcomes, repeats)
    assert d.candidate.number == 2 and d.trial.number == 2 and d.gain.significant
    assert "Mean output_throughput of 3 runs each: #2 5,550, #1 5,317, #0 (the defaults) 4,997." in d.text
    # the same runs without repeats pick the highest single run
    assert decision(tmp_path / "b", outcomes).candidate.number == 3


def test_repeats_run_round_by_round_the_pick_and_baseline_first(tmp_path: Path) -> None:
    """A budget that stops the repeats early still leaves the gain a paired run and every candidate as
    many repeats as it affords."""
    from autotune.tune.remeasure import plan

    outcomes = [
        ({"max_num_seqs": 1024, "baseline": True}, capacity(5000, 0.03)),
        ({"max_num_seqs": 256}, capacity(5600, 0.03)),
        ({"max_num_seqs": 128}, capacity(5500, 0.03)),
    ]
    recs = {r.number: r for r in records(build_run(tmp_path, outcomes))}
    chosen = [recs[1], recs[2], recs[0]]  # as remeasure.targets orders them: the baseline last
    order = [(r.trial.number, r.index) for r in plan(chosen, 2)]
    assert order == [(1, 1), (0, 1), (2, 1), (1, 2), (0, 2), (2, 2)]


def test_runs_of_the_pick_far_apart_are_flagged_as_sensitive_to_noise(tmp_path: Path) -> None:
    """The pick's three runs 24 % apart (a capacity near a flat p99 ITL SLO): the summary and the report's
    flags say so; the same config measured 2 % apart is not flagged."""
    from autotune.outputs.outcome import outcome
    from autotune.outputs.report import summary_text
    from autotune.tune.remeasure import StoredRepeats

    outcomes = [
        ({"max_num_seqs": 1024, "baseline": True}, capacity(4000, 0.03)),
        ({"max_num_seqs": 256}, capacity(5300, 0.03)),
    ]
    recs = records(build_run(tmp_path, outcomes))

    def flagged(repeats: dict) -> str:
        out = outcome(recs, OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"], repeats=StoredRepeats(repeats))
        assert out.best is not None and out.best.number == 1
        note = out.spread_note()
        assert (note in out.flags()) if note else all("Sensitive" not in f for f in out.flags())
        assert ("Sensitive to noise" in summary_text(out)) == bool(note)
        return note

    note = flagged({"1": {"1": 4600, "2": 5700}, "0": {"1": 4050, "2": 3990}})
    assert "Sensitive to noise: trial #1's 3 runs measured 4,600 to 5,700 (24% apart)" in note
    assert "#0" not in note  # the defaults' runs agree within 2 %
    assert flagged({"1": {"1": 5250, "2": 5350}, "0": {"1": 4050, "2": 3990}}) == ""


def test_a_latency_gain_and_its_interval_read_as_reductions(tmp_path: Path) -> None:
    """Minimized, the gain is (baseline - value) / baseline, its paired-run interval too, and a loss is
    "higher": not the inverse ratio (369 / 250 = +47.6 %)."""
    latency = objectives_from_dict({"objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"}]})
    outcomes = [
        ({"max_num_seqs": 1024, "baseline": True}, capacity(5000, 0.03, ttft_ms=400)),
        ({"max_num_seqs": 256}, capacity(5000, 0.03, ttft_ms=300)),
    ]
    study = build_run(tmp_path, outcomes, latency)
    repeats = {"1": {"1": 320.0, "2": 280.0}, "0": {"1": 400.0, "2": 400.0}}
    d = decide(records(study), [False], latency.names, repeats)
    assert d.gain is not None and d.gain.significant and not d.gain.maximize
    assert d.gain.percent() == "25.0 % lower (interval 20.0 % to 30.0 % lower, 3 paired runs)"
    assert d.text == (
        f"Recommended: trial #1: p99_ttft_ms {d.gain.percent()} vs vLLM's defaults. Mean p99_ttft_ms of 3 "
        "runs each: #1 300, #0 (the defaults) 400."
    )
    worse = dataclasses.replace(d.gain, ratio=0.8, low=0.75, high=1.25)
    assert worse.percent() == "25.0 % higher (interval 33.3 % higher to 20.0 % lower, 3 paired runs)"
    assert worse.figure(0.8) == "25.0 % higher" and d.gain.figure(1.25) == "20.0 % lower"


def test_keeping_the_defaults_mentions_latency_only_when_a_latency_breaks_ties(tmp_path: Path) -> None:
    """Throughput alone: no lower-latency config could have won a tie, so the sentence does not say so."""
    outcomes = [
        ({"max_num_seqs": 1024, "baseline": True}, capacity(5000, 0.03)),
        ({"max_num_seqs": 256}, capacity(4000, 0.03)),
    ]
    alone = load_objectives("throughput")
    study = build_run(tmp_path / "a", outcomes, alone)
    d = decide(records(study), [True], alone.names)
    assert d.keeps_defaults and d.text == (
        "Keep vLLM's defaults (trial #0): no config found beats their output_throughput by more than the "
        "measurement's resolution."
    )
    default = decision(tmp_path / "b", outcomes)  # the default run's sentence is unchanged
    assert default.keeps_defaults
    assert default.text.endswith("the measurement's resolution with lower latency.")


def test_a_run_that_measured_nothing_says_so_and_re_measures_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A budget below one trial's cost launches nothing: there is nothing to recommend nor to repeat
    (no "re-measuring the top 3" line), and the verdict does not blame failed trials that never ran."""
    from autotune.tune.remeasure import remeasure
    from autotune.tune.run_records import TunerOptions

    study = build_run(tmp_path, [])
    assert (
        decide(records(study), MAXIMIZE, OBJECTIVES.names).text == "No trial finished: nothing to recommend."
    )
    assert remeasure(study, None, OBJECTIVES, TunerOptions(n_trials=1, repeats=2), budget_s=36.0) == 0  # type: ignore[arg-type]
    assert "re-measuring" not in capsys.readouterr().err


def test_a_near_tie_below_in_every_repeat_is_named_by_what_broke_the_tie(tmp_path: Path) -> None:
    """p99 TTFT first, output throughput breaking its ties: the near-tie is not "the lowest-latency"
    one (throughput picked it), and the default objectives' sentence keeps its words."""
    objectives = objectives_from_dict(
        {
            "objectives": [
                {"metric": "p99_ttft_ms", "direction": "minimize"},
                {"metric": "output_throughput", "direction": "maximize"},
            ]
        }
    )
    outcomes = [
        ({"max_num_seqs": 1024, "baseline": True}, capacity(4000, 0.1, ttft_ms=1000)),
        ({"max_num_seqs": 256}, capacity(5000, 0.1, ttft_ms=1005)),  # within 1 %, more throughput
    ]
    study = build_run(tmp_path, outcomes, objectives)
    repeats = {"1": {"1": 1100.0, "2": 1080.0}, "0": {"1": 1000.0, "2": 1000.0}}
    d = decide(records(study), [False, True], objectives.names, repeats)
    assert d.keeps_defaults and d.candidate.number == 1 and d.gain is not None and d.gain.high < 1
    assert (
        "The near-tie by the mean of its runs with the best output_throughput (trial #1) measured" in d.text
    )
    assert "latency" not in d.text


def test_a_tie_clause_names_a_throughput_that_breaks_ties_with_a_latency(tmp_path: Path) -> None:
    """A latency and a throughput break ties: "with lower latency" would leave the throughput out."""
    mixed = ["output_throughput", "p99_ttft_ms", "request_throughput"]
    assert tie_clause(mixed) == " or ties with them with a better p99_ttft_ms, request_throughput"
    assert tie_clause(OBJECTIVES.names) == " with lower latency"


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
