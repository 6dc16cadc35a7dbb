"""The all-infeasible summary names its reasons by count, not one sentence for every run."""

from __future__ import annotations

from pathlib import Path

from test_recommendation import MAXIMIZE
from test_study import OBJECTIVES, build_run, ok

from autotune.measure.load_report import LoadReport, SteadyState
from autotune.measure.result import TrialResult
from autotune.tune.recommendation import decide
from autotune.tune.study import records


def behind(offered: float, served: float) -> TrialResult:
    """A fixed-load trial within its SLOs whose window fell behind its arrivals."""
    result = ok(3000, 500, 20)
    steady = SteadyState(offered, served, 0.6, 0.02, 0.0, kept_up=False)
    result.load = LoadReport(steady=steady)
    return result


def test_trials_that_only_fell_behind_a_fixed_load_are_said_so_by_count(tmp_path: Path) -> None:
    """Every trial met its SLOs yet did not keep up, one failed to start: the summary said "every trial
    failed or violated the SLOs", which none of them did."""
    outcomes = [
        ({"max_num_seqs": 256, "baseline": True}, behind(60.3, 16.3)),
        ({"max_num_seqs": 128}, behind(60.1, 21.3)),
        ({"max_num_seqs": 64}, behind(60.3, 9.0)),
        ({"max_num_seqs": 512}, behind(60.3, 18.4)),
        ({"max_num_seqs": 1024}, None),  # build_run's default: a KV-cache OOM at startup
    ]
    text = decide(records(build_run(tmp_path, outcomes)), MAXIMIZE, OBJECTIVES.names).text
    assert text.startswith(
        "No feasible config: 4 did not keep up with 60.1-60.3 req/s (the most served 21.3), 1 failed to "
        "start (see trials.csv for reasons)."
    ), text
