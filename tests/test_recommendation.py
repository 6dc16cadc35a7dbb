"""The recommendation keeps vLLM's defaults unless a gain clears the measurement's resolution or noise,
and says why in words. Which configs are re-measured: tests/test_remeasure.py; the verdict when no
config is feasible: tests/test_infeasible_trials.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from test_study import OBJECTIVES, build_run, ok

from autotune.measure.capacity_report import CapacityReport
from autotune.measure.result import TrialResult
from autotune.tune.objectives import load_objectives, objectives_from_dict
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
    outcomes = [
        ({"max_num_seqs": 1024, "baseline": True}, ok(5000, 1500, 30)),
        ({"max_num_seqs": 256}, ok(5030, 1400, 30)),
    ]
    d = decision(tmp_path / "once", outcomes)
    assert d.keeps_defaults and d.gain.margin == 0.01
    # re-measured, the same: 0.6 % up in every pair is within the 1 %, not a gain at a margin of 0.0 %
    again = {"1": {"1": 5030, "2": 5030}, "0": {"1": 5000, "2": 5000}}
    d = decision(tmp_path / "again", outcomes, again)
    assert d.keeps_defaults and d.gain.how == "3 paired runs" and d.gain.margin == 0.01


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


def test_at_a_fixed_load_clearly_lower_latencies_win_over_the_defaults(tmp_path: Path) -> None:
    """At a fixed load every config that keeps up serves the offered rate, so the throughputs tie and the
    defaults were always kept, however much lower a config's latencies (p99 ITL 42 ms against 163). A
    config no slower on any latency and 10 % faster on one is recommended; at capacity a tie still keeps
    the defaults, and so does a fixed-load config that is slower on one latency."""
    base = ({"max_num_seqs": 1024, "baseline": True}, ok(5000, 1500, 163))
    d = decision(tmp_path / "fixed", [base, ({"max_num_seqs": 256}, ok(5010, 1400, 42))])
    assert not d.keeps_defaults and d.trial.number == 1
    assert "at the fixed load its output_throughput ties with vLLM's defaults'" in d.text
    assert "p99_ttft_ms 6.7% lower, p99_itl_ms 74.2% lower" in d.text
    slower = decision(tmp_path / "slower", [base, ({"max_num_seqs": 256}, ok(5010, 1600, 42))])
    assert slower.keeps_defaults
    at_capacity = [
        ({"max_num_seqs": 1024, "baseline": True}, capacity(5000, 0.03, 1500, 163)),
        ({"max_num_seqs": 256}, capacity(5010, 0.03, 1400, 42)),
    ]
    assert decision(tmp_path / "capacity", at_capacity).keeps_defaults
