"""A probe's verdict (trial/probe.py): an unsure rate pooled with the windows near it (scaled to its own
rate, or read off the line through the rates on both sides), TTFT queueing episodes seen just above a
clean window, keeping up judged by the saturation run below it; and a trial's constraint says what the
search decided."""

from __future__ import annotations

import dataclasses

from test_capacity import CONFIG, LLAMA_8B, SLOS

from autotune.backends.sim import SimBackend
from autotune.core.config import EngineConfig
from autotune.measure.evidence import FAIL, PASS, UNSURE, Criterion, judge, pool
from autotune.measure.load_report import LoadReport, SteadyState
from autotune.measure.metrics import RequestRecord, compute_metrics
from autotune.measure.result import TrialResult
from autotune.measure.slo import parse_slos
from autotune.measure.steady_state import MAX_BACKLOG_GROWTH
from autotune.trial.capacity import find_capacity
from autotune.trial.probe import Probe, judge_probes, pool_nearby, probe_verdict
from autotune.tune.objectives import KEPT_UP_KEY, constraints, is_feasible
from autotune.workloads.files import load_workload

SATURATION = 100.0  # far above every probe below: no excursion scaling in the pooling tests


def _window(rate: float, share_margin: float, error: float, samples: int = 1000) -> TrialResult:
    """A probe window at `rate` whose p99 TTFT criterion has this margin and error, and which kept up."""
    steady = SteadyState(
        offered_rate=rate,
        served_rate=rate,
        backlog_growth=0.0,
        backlog_allowed=MAX_BACKLOG_GROWTH,
        backlog_filling=0.0,
        kept_up=True,
    )
    evidence = (Criterion("ttft_p99", share_margin, error, samples),)
    return TrialResult(config=CONFIG, load=LoadReport(steady=steady, slo_evidence=evidence))


def _steady(result: TrialResult, **changes: object) -> LoadReport:
    """`result`'s load report with its window's steadiness changed."""
    assert result.load is not None and result.load.steady is not None
    return dataclasses.replace(result.load, steady=dataclasses.replace(result.load.steady, **changes))


def _ran(window: TrialResult) -> TrialResult:
    """`window` with the benchmark of a window that ran to its end (probe_verdict judges those)."""
    record = RequestRecord(prompt_len=100, output_len=10, start_time=0.0, ttft=0.1, latency=0.5)
    window.benchmark = compute_metrics([record], 1.0)
    return window


def test_an_unsure_rate_passes_on_the_evidence_of_the_rates_just_above_it() -> None:
    """Margins grow with the rate, so windows just above an unsure rate, pooled with its own, overstate
    its margin: when even they pass with confidence, it passes. Rates further up are not pooled."""
    unsure = Probe(10.0, [_window(10.0, -0.002, 0.0015)], UNSURE, UNSURE)  # -0.002 + 1.645 x 0.0015 > 0
    # a longer window 4 % above, sure on its own (-0.0015 + 1.645 x 0.0008 < 0)
    above = Probe(10.4, [_window(10.4, -0.0015, 0.0008, samples=3000)], PASS, PASS)
    far = Probe(12.5, [_window(12.5, -0.0015, 0.0008, samples=3000)], PASS, PASS)
    pool_nearby([unsure, far], SLOS, SATURATION)
    assert unsure.verdict == UNSURE  # 12.5 is more than NEAR_SPAN (1.2x) above
    pool_nearby([unsure, above, far], SLOS, SATURATION)
    assert unsure.verdict == PASS and unsure.pooled == [10.4]
    failing = Probe(10.4, [_window(10.4, 0.004, 0.0015)], FAIL, FAIL)
    lone = Probe(10.0, [_window(10.0, -0.002, 0.0015)], UNSURE, UNSURE)
    pool_nearby([lone, failing], SLOS, SATURATION)
    assert lone.verdict == UNSURE  # a failing neighbour's evidence does not make it pass


def test_an_unsure_rate_pools_the_shares_above_it_scaled_to_its_own_rate() -> None:
    """A share over the limit grows at least in proportion to the rate: one measured 10 % higher,
    scaled by 1 / 1.1, still bounds it. Unscaled, the same two windows could not tell."""
    unsure = Probe(10.0, [_window(10.0, -0.001, 0.001)], UNSURE, UNSURE)  # share 0.9 % +- 0.1 %
    above = Probe(11.0, [_window(11.0, 0.0, 0.0005)], UNSURE, UNSURE)  # share 1.0 % +- 0.05 %
    pool_nearby([unsure, above], SLOS, SATURATION)
    assert unsure.verdict == PASS and unsure.pooled == [11.0]
    assert above.verdict == UNSURE  # nothing above it
    # the unscaled pool: margin -0.05 % +- 0.056 % is unsure at 1.645 errors
    windows = [[Criterion("ttft_p99", -0.001, 0.001, 1000)], [Criterion("ttft_p99", 0.0, 0.0005, 1000)]]
    assert judge(pool(windows)) == UNSURE


def test_an_unsure_rate_between_probes_is_read_off_the_line_through_their_windows() -> None:
    """With rates on both sides, the windows tell by a line through their margins: a share that grows
    from 0.8 % at 9.5 to 1.0 % at 10.5 is 0.9 % at 10, surely under 1 %, where the windows above alone
    cannot tell. A line that falls with the rate is noise: then only the rates above count."""
    below = Probe(9.5, [_window(9.5, -0.002, 0.0006)], PASS, PASS)
    unsure = Probe(10.0, [_window(10.0, -0.001, 0.001)], UNSURE, UNSURE)
    above = Probe(10.5, [_window(10.5, 0.0, 0.0006)], UNSURE, UNSURE)
    pool_nearby([unsure, above], SLOS, SATURATION)
    assert unsure.verdict == UNSURE  # the scaled windows above: -0.07 % +- 0.06 %
    pool_nearby([below, unsure, above], SLOS, SATURATION)
    assert unsure.verdict == PASS and unsure.pooled == [9.5, 10.5]
    # a lucky window below cannot lift a rate whose neighbour above is over the limit
    falling = Probe(9.5, [_window(9.5, 0.002, 0.0006)], FAIL, FAIL)
    lone = Probe(10.0, [_window(10.0, -0.001, 0.001)], UNSURE, UNSURE)
    pool_nearby([falling, lone, above], SLOS, SATURATION)
    assert lone.verdict == UNSURE


def test_a_clean_ttft_window_counts_the_episodes_seen_just_above_it() -> None:
    """Near a threshold most TTFT windows hold no queueing episode: one that held none passes alone,
    but once a window just above shows episodes (15 requests over the limit that scatter like 10 per
    event), the clean one is judged as if its samples came in such episodes too, and is unsure. A
    standing queue further over the limit says nothing of episodes."""
    clean = Probe(10.0, [_ran(_window(10.0, -0.01, 0.00315))])
    judge_probes([clean], SLOS, saturation=20.0)
    assert clean.verdict == PASS
    queue = Probe(11.0, [_ran(_window(11.0, 0.09, 0.03))])
    judge_probes([clean, queue], SLOS, saturation=20.0)
    assert clean.verdict == PASS and queue.verdict == FAIL
    episodic = Probe(11.0, [_ran(_window(11.0, 0.005, 0.012))])
    judge_probes([clean, episodic], SLOS, saturation=20.0)
    assert clean.verdict == UNSURE


def test_episodes_seen_near_saturation_are_scaled_down_to_a_lower_rate() -> None:
    """An episode holds about rate x relaxation time requests: the same window just above a clean one
    keeps it unsure when both are far from saturation (relaxation times alike), and not when the one
    above is at 96 % of saturation, where a queue excursion lasts ten times longer than at 87 %
    (an 8B config's one 46-request episode at 10.4 req/s kept 8.9 and 9.1 unsure: 3,000 clean requests
    each, where the long-run reference is 10.1)."""

    def clean_verdict(saturation: float) -> str:
        clean = Probe(10.0, [_ran(_window(10.0, -0.01, 0.00315))])
        episodic = Probe(11.0, [_ran(_window(11.0, 0.005, 0.012))])  # ~10 requests per event
        judge_probes([clean, episodic], SLOS, saturation=saturation)
        return clean.verdict

    assert clean_verdict(saturation=20.0) == UNSURE
    assert clean_verdict(saturation=11.5) == PASS


def test_below_saturation_only_a_gross_shortfall_fails_a_rate() -> None:
    """The saturation run shows a rate below it is sustainable; a window's backlog count, which wanders
    for minutes near saturation, fails it only when it served less than 90 %. Above saturation the
    window must have kept up with the rate asked for, not with the arrivals it happened to draw."""
    wandering = _ran(_window(10.0, -0.005, 0.001))
    wandering.load = _steady(wandering, served_rate=9.4, kept_up=False, backlog_growth=0.05)
    assert probe_verdict([wandering], SLOS, rate=10.0, saturation=11.0) == PASS
    assert probe_verdict([wandering], SLOS, rate=10.0, saturation=9.0) == FAIL
    wandering.load = _steady(wandering, served_rate=8.8)
    assert probe_verdict([wandering], SLOS, rate=10.0, saturation=11.0) == FAIL
    # 5 % over saturation, 5 % fewer arrivals than asked for, all of them served: not kept up
    lucky = _window(9.5, -0.005, 0.001)
    lucky.benchmark = wandering.benchmark
    assert probe_verdict([lucky], SLOS, rate=10.0, saturation=10.0) == PASS  # at saturation
    assert probe_verdict([lucky], SLOS, rate=10.0, saturation=9.2) == FAIL


def test_a_rate_that_passed_below_saturation_is_a_feasible_trial() -> None:
    """The trial carries its reported window, whose backlog count may have wandered past the window's
    own allowance: below saturation the search judged keeping up by the saturation run, and the
    trial's constraint says what the search decided, not what the window's trend alone would."""
    config = EngineConfig(model=LLAMA_8B, max_model_len=8192, max_num_seqs=256, max_num_batched_tokens=8192)
    slos = parse_slos("ttft_p99=2s")
    result = find_capacity(SimBackend("H100"), config, load_workload("chat"), slos)
    assert result.kept_up is True and is_feasible(constraints(result, slos))
    wandered = {"backlog_growth": 0.05, "backlog_allowed": 0.02}  # what such a window may show
    result.load = _steady(result, **wandered)
    assert constraints(result, slos)[KEPT_UP_KEY] <= 0 and is_feasible(constraints(result, slos))
    fixed_load = dataclasses.replace(result, capacity=None, load=_steady(result, **wandered, kept_up=False))
    assert constraints(fixed_load, slos)[KEPT_UP_KEY] > 0  # a fixed-load run is judged on its trend
