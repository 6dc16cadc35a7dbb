"""What limits each config's capacity, said wherever the results go: a capacity search records it (an
SLO the rate above missed, or keeping up with arrivals), the study keeps it, and report.html, best.json,
the summary and the probe plot show it; the plot draws every probe, passing and failing."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from test_capacity import CONFIG, QUICK, WORKLOAD
from test_probe_verdicts import _ran, _window
from test_study import OBJECTIVES, build_run

from autotune.backends.sim import SimBackend
from autotune.measure.capacity_report import KEEPING_UP, ProbeSummary
from autotune.measure.evidence import FAIL, UNSURE, Criterion
from autotune.measure.metrics import RequestRecord, compute_metrics
from autotune.measure.slo import parse_slos
from autotune.outputs import report
from autotune.outputs.capacity_words import capacity_text, limited_by
from autotune.outputs.outcome import outcome
from autotune.outputs.plots import _PROBE_LATENCIES, probe_points
from autotune.trial.capacity import _limited_by, find_capacity
from autotune.trial.probe import Probe, judge_probes
from autotune.tune.study import TrialRecord, records

MAXIMIZE = [o.maximize for o in OBJECTIVES.objectives]
TIGHT = "ttft_p99=300ms"  # binds below what the tiny config keeps up with (about 16 req/s)
LOOSE = "ttft_p99=60s"  # never binds: only keeping up does


def test_a_search_records_what_limits_capacity() -> None:
    sim = SimBackend("H100")
    bound = find_capacity(sim, CONFIG, WORKLOAD, parse_slos(TIGHT), search=QUICK).capacity
    free = find_capacity(sim, CONFIG, WORKLOAD, parse_slos(LOOSE), search=QUICK).capacity
    assert bound.limited_by == (TIGHT,) and free.limited_by == (KEEPING_UP,)
    assert bound.rate < free.rate
    # each failed or unsure probe says what it fell short of; a passed one, nothing
    for probe in (*bound.probes, *free.probes):
        assert (probe.short_of is None) == (probe.verdict == "pass")
    above = next(p for p in free.probes if p.rate == free.bracket[1])
    assert above.short_of == (KEEPING_UP,) and above.p99_ttft_ms < 60_000  # not its latency


def test_the_results_say_what_limits_each_config(tmp_path: Path) -> None:
    sim = SimBackend("H100")
    slos = parse_slos(TIGHT)
    limited = find_capacity(sim, CONFIG, WORKLOAD, slos, search=QUICK)
    roomy = find_capacity(sim, CONFIG.replace(max_num_seqs=8), WORKLOAD, slos, search=QUICK)
    trials = [({"max_num_seqs": 2, "baseline": True}, limited), ({"max_num_seqs": 8}, roomy)]
    study = build_run(tmp_path, trials)
    out = outcome(records(study), OBJECTIVES.names, MAXIMIZE, [TIGHT])
    report.write_all(tmp_path, out)
    by_trial = {r.number: r.capacity.limited_by for r in out.records}
    assert by_trial[0] == (TIGHT,)  # read back from the study as the search recorded it

    html = (tmp_path / "report.html").read_text()
    column = limited_by(next(r for r in out.records if r.number == 0))
    assert column.startswith(TIGHT)  # "(not confirmed)" after it when the rate above was unsure
    assert "<th>limited by</th>" in html and f"<td>{column}</td>" in html
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["capacity"]["limited_by"] == list(out.best.capacity.limited_by)
    assert "limited by" in best["capacity"]["text"] and "p99_ttft_ms" in best["capacity"]["text"]
    summary = report.summary_text(out)
    assert "limited by" in summary.splitlines()[1]  # the front table's header: a column
    assert f"Capacity {out.best.capacity.rate:.2f} req/s per replica, limited by" in summary


def test_the_probe_plot_draws_every_probe_failing_ones_too(tmp_path: Path) -> None:
    result = find_capacity(SimBackend("H100"), CONFIG, WORKLOAD, parse_slos(TIGHT), search=QUICK)
    crashed = ProbeSummary(rate=30.0, failure="crashed", short_of=("crashed",))  # no latencies
    result.capacity = dataclasses.replace(result.capacity, probes=(*result.capacity.probes, crashed))
    (record,) = records(build_run(tmp_path, [({"max_num_seqs": 2, "baseline": True}, result)]))
    for _, latency in _PROBE_LATENCIES:
        points = probe_points(record, latency)
        assert [rate for rate, _, _ in points] == sorted(p.rate for p in record.capacity.probes)
        assert any(not passed for _, value, passed in points if value is not None)  # a missed rate
        assert (30.0, None, False) in points  # and the one that ended without latencies


def test_a_probe_shows_the_p99_its_verdict_rests_on_and_the_capacity_line_names_its_rate(
    tmp_path: Path,
) -> None:
    """Windows at 1,240, 1,197 and 287 ms p99 TTFT, pooled, too close to call: the probe shows 1,240
    (its worst), not its last window's 287. The capacity line's latency is the window at the capacity
    (15.60 req/s), named so, not "at that rate" after the unconfirmed 16.03 req/s."""
    windows = []
    for ttft in (1.240, 1.197, 0.287):
        window = _window(16.03, -0.002, 0.0015)
        window.benchmark = compute_metrics([RequestRecord(100, 10, 0.0, ttft=ttft, latency=ttft + 1)], 1.0)
        windows.append(window)
    probe = Probe(16.03, windows, UNSURE, UNSURE, short_of=("ttft_p99=2s",)).summary()
    assert (probe.p99_ttft_ms, probe.windows, probe.short_of) == (1240.0, 3, ("ttft_p99=2s",))
    result = find_capacity(SimBackend("H100"), CONFIG, WORKLOAD, parse_slos(TIGHT), search=QUICK)
    (record,) = records(build_run(tmp_path, [({"max_num_seqs": 2, "baseline": True}, result)]))
    c = record.capacity
    text = capacity_text(record, [TIGHT])
    assert f"; at {c.rate:.2f} req/s p99_ttft_ms " in text and "at that rate" not in text


def _probe(rate: float, ttft: Criterion, itl: Criterion) -> Probe:
    """A probe of one window that kept up, with these p99 TTFT and ITL criteria."""
    window = _ran(_window(rate, 0.0, 0.001))
    assert window.load is not None
    window.load = dataclasses.replace(window.load, slo_evidence=(ttft, itl))
    return Probe(rate, [window])


def _bracketed(tmp_path: Path, low: Probe, high: Probe) -> TrialRecord:
    """A trial whose capacity search ended between the probes `low` and `high`, read back from a study."""
    result = find_capacity(SimBackend("H100"), CONFIG, WORKLOAD, parse_slos(TIGHT), search=QUICK)
    result.capacity = dataclasses.replace(
        result.capacity,
        rate=low.rate,
        bracket=(low.rate, high.rate),
        probes=(low.summary(), high.summary()),
        limited_by=_limited_by([low, high], low, high.rate),
    )
    (record,) = records(build_run(tmp_path, [({"max_num_seqs": 2, "baseline": True}, result)]))
    return record


def test_a_rate_that_missed_one_slo_and_left_another_unsure_names_each_as_it_was(tmp_path: Path) -> None:
    """At 18.33 req/s p99 ITL missed its limit with confidence while p99 TTFT was too close to call:
    the capacity is limited by the ITL SLO, missed there; the TTFT one was not confirmed, not missed."""
    slos = ["ttft_p99=1s", "itl_p99=50ms"]
    sure = Criterion("ttft_p99", -0.008, 0.001, 1000)
    low = _probe(17.83, sure, Criterion("itl_p99", -0.008, 0.001, 1000))
    high = _probe(18.33, Criterion("ttft_p99", -0.001, 0.001, 1000), Criterion("itl_p99", 0.02, 0.001, 1000))
    judge_probes([low, high], parse_slos(slos), saturation=100.0)
    assert (low.verdict, high.verdict, high.short_of) == ("pass", FAIL, tuple(slos))
    record = _bracketed(tmp_path, low, high)
    text = capacity_text(record, slos)
    assert "limited by itl_p99=50ms: missed at 18.33 req/s (ttft_p99=1s not confirmed there);" in text
    assert limited_by(record) == "itl_p99=50ms"  # the front table's column, the probe plot's legend
    assert record.capacity.probes[1].unconfirmed == ("ttft_p99=1s",)  # read back from the study
    # an older study's probe stored no `unconfirmed`: it reads back, and its limits keep their words
    old = dataclasses.replace(record.capacity.probes[1], unconfirmed=None)
    probes = (low.summary(), old)
    record.capacity = dataclasses.replace(record.capacity, probes=probes, limited_by=tuple(slos))
    assert "limited by ttft_p99=1s and itl_p99=50ms: missed at 18.33 req/s;" in capacity_text(record, slos)


def test_a_rate_only_too_close_to_call_is_not_confirmed_in_the_column_too(tmp_path: Path) -> None:
    """The front table's "limited by" and the probe plot's legend say what the capacity line says: an
    SLO left unsure at the rate above is "not confirmed", not missed (the column named it bare)."""
    slos = ["ttft_p99=1s"]
    itl = Criterion("itl_p99", -0.008, 0.001, 1000)
    low = _probe(17.83, Criterion("ttft_p99", -0.008, 0.001, 1000), itl)
    high = _probe(18.33, Criterion("ttft_p99", 0.0005, 0.001, 1000), itl)
    judge_probes([low, high], parse_slos(slos), saturation=100.0)
    assert (low.verdict, high.verdict) == ("pass", UNSURE)
    record = _bracketed(tmp_path, low, high)
    assert "limited by ttft_p99=1s: not confirmed at 18.33 req/s" in capacity_text(record, slos)
    assert limited_by(record) == "ttft_p99=1s (not confirmed)"
