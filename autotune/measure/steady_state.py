"""Steady state: did a server keep up with the load it was offered, over the window that was measured?

A benchmark that offers a rate a server cannot sustain still finishes: the requests queue up and are
served late. A short run hides it (its arrivals end before the queue has grown), so a rate is only
known to be sustainable when, over a measured window after a warm-up, the requests in the server
(sent, not finished) did not grow by more than `MAX_BACKLOG_GROWTH` of the window's arrivals (the
served rate kept up with the offered one: >= 98 %), or by no more than the count's own noise when a
short window makes that larger. Counting every unfinished request, not only the
waiting queue, matters: with a large max_num_seqs an overloaded server admits the excess into its
running batch, which grows and slows every step while its waiting queue stays empty.

A server that keeps up holds about rate x request lifetime requests at both ends of the window; one
that does not adds (offered - served) x window of them. That needs the batch to have filled before the
window starts, which is what the warm-up is for: `plan_window` derives it and the window from the
config's own request lifetime; what the longest requests still add after it is expected, and
subtracted (`steadiness`). A fixed-load run has no warm-up, so its window starts two lifetimes in
(measured from its own records) and after its first MIN_WARMUP_REQUESTS sends, and what its filling
expects follows each request's own output length (a trace's stretch drifts); a run shorter than that
cannot tell from the count, nor can a window with a single arrival. Its queue can: the trend of the
wait before the first token shows a backlog with no lifetimes to estimate (`queue_trend`), and a
fixed-load run that did not keep up by either is judged so.
`measure_window` computes a window's metrics and this verdict from the records of either backend
(`start_time` is the send time on the run's clock, from 0).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.measure.evidence import slo_criteria
from autotune.measure.load_report import DIGITS, LoadReport, Saturation, SteadyState
from autotune.measure.metrics import BenchmarkResult, RequestRecord, compute_metrics
from autotune.measure.slo import Slo, goodput_bounds

# The requests in the server may grow by 2 % of the window's arrivals (served >= 98 %): a queue that
# grows by 5 % still meets a 2 s p99 TTFT over a 30 s window and breaks it 6x over 4,000 requests.
MAX_BACKLOG_GROWTH = 0.02
NOISE_SIGMAS = 3.0  # ... or by its own noise, when a short window makes that larger
TREND_SAMPLES = 200
# At most this share of a window's arrivals is credited to filling: a server that keeps up, judged two
# lifetimes in, fills by a few % (6 % on the shipped workloads at a fixed load). An overload's warm-up
# lifetimes hold its queue, and its filling then explains any backlog (97 % at max_num_seqs=1 on chat).
MAX_FILLING = 0.5
WARMUP_RESIDENCES = 2.0  # warm-up: two request lifetimes, so the running batch has filled and turned over
WINDOW_RESIDENCES = 4.0  # window: four more, so a queue growing by a few % shows in TTFT and the backlog
MIN_WARMUP_S = 10.0
MIN_WINDOW_S = 30.0  # at least 30 s of arrivals: p99 over several hundred requests at typical rates
# A window ends at its last arrival: one arrival alone defines no rate (its "offered rate" is the window's
# length), and it cannot finish inside the window, so a verdict needs two.
MIN_WINDOW_ARRIVALS = 2
# A fixed-load run's warm-up holds at least this many sends: the filling a server that keeps up shows is
# expected from their lifetimes, and a handful of them misjudges it (a 50-request trace replay at 9 req/s
# on an idle H100: 9 warm-up lifetimes of 0.6 s against 1.7 s later, judged "did not keep up").
MIN_WARMUP_REQUESTS = 30
# The queue's witness judges a gross overload only: a queue that starts empty near saturation still
# fills for its relaxation time (a FIFO server at 90 % of 10 req/s, its wait rising over 20 s, read 19 %).
# A fixed-load count allows no more, however bursty its arrivals (a code-trace replay at 20 req/s that
# served 14.3, p99 TTFT 44 s, was within its 60 % allowance).
QUEUE_MIN_GROWTH = 0.25
# A fixed-load count that grew by more than this share of its noise allowance (1.5 standard errors) and
# by more than MAX_BACKLOG_GROWTH is neither kept up nor shown to have fallen behind: not judged
# (benchmarks/fixed_load_verdicts.py counts what that takes from overloads and from light loads).
UNSURE_SHARE = 0.5


@dataclass(frozen=True)
class Window:
    """A probe's timing: warm-up requests are sent in [0, start), measured ones in [start, end]."""

    start: float
    end: float

    @property
    def length(self) -> float:
        """Seconds of measured arrivals."""
        return self.end - self.start


def plan_window(
    residence_s: float,
    scale: float = 1.0,
    min_warmup_s: float = MIN_WARMUP_S,
    min_window_s: float = MIN_WINDOW_S,
) -> Window:
    """The warm-up and window of a capacity probe for a config whose requests live `residence_s`.

    A request's lifetime at full batch (its decode time, measured in the saturation run) is the time
    constant of the server's queue: the running batch fills and turns over in about one lifetime, so
    the warm-up is two of them; a rate slightly over capacity adds a fixed number of waiting requests
    per second, which takes a few lifetimes to stand out from the batch's own churn, so the window is
    four more, and never less than 30 s (10 s of warm-up). `scale` lengthens both (the long-run
    reference uses 10).
    """
    life = residence_s if math.isfinite(residence_s) and residence_s > 0 else 0.0
    warmup = max(min_warmup_s, WARMUP_RESIDENCES * life) * scale
    window = max(min_window_s, WINDOW_RESIDENCES * life) * scale
    return Window(warmup, warmup + window)


@dataclass(frozen=True)
class Steadiness:
    """How a measured window kept up with its offered load."""

    offered_rate: float  # requests sent in the window per second
    served_rate: float  # requests finished (successfully) in the window per second
    backlog_growth: float  # (in the server at the end - at the start, beyond filling) / requests sent
    allowed_growth: float  # MAX_BACKLOG_GROWTH, or the count's own noise when that is larger
    filling: float = 0.0  # what a server that keeps up still adds over the window as it fills, same unit

    @property
    def kept_up(self) -> bool:
        """The requests in the server did not grow by more than the allowed share of those offered."""
        return self.backlog_growth <= self.allowed_growth

    def stored(self) -> SteadyState:
        """The record a trial's result carries: rounded as stored, with the verdict judged before."""
        return SteadyState(
            offered_rate=round(self.offered_rate, DIGITS),
            served_rate=round(self.served_rate, DIGITS),
            backlog_growth=round(self.backlog_growth, DIGITS),
            backlog_allowed=round(self.allowed_growth, DIGITS),
            backlog_filling=round(self.filling, DIGITS),
            kept_up=self.kept_up,
        )


def steadiness(records: Sequence[RequestRecord], window: Window, by_length: bool = False) -> Steadiness:
    """The steadiness of `records` over `window` (times on the run's clock).

    The growth is the trend of the requests in the server over the window beyond what filling adds (a
    least-squares line through the difference, sampled at TREND_SAMPLES times, times the window's
    length), not the difference of its two ends: the ends carry the count's whole fluctuation, the line
    averages it out. Filling: a server that keeps up holds, at time t, each request sent before t with
    the probability that a request of the warm-up lived longer than t minus its send time (an infinite-
    server queue that started empty). After a warm-up of two mean lifetimes the run's long requests are
    still joining (on the chat mix at 90-95 % of saturation, by 0.3-1.2 % of the window's arrivals).
    Subtracting that expectation, request by request, also takes out the noise of the Poisson arrivals.
    At most MAX_FILLING of the arrivals is credited: an overloaded server's warm-up lifetimes already
    hold its queue, and a filling computed from them would pass any backlog as filling. `by_length`: each
    request's lifetime follows its own output length (`_filled_by_length`), for runs whose lengths drift.

    What is allowed: MAX_BACKLOG_GROWTH, or NOISE_SIGMAS standard errors of that trend when the window
    is too short to tell less (a capacity probe judges keeping up with its own rules as well, see
    autotune/trial/probe.py). The standard error comes from the count's own scatter around the line and
    its memory (autocorrelation), so a server whose batch is capped (little scatter) is judged as
    finely as its data allows, and a queue near saturation (long memory) is not judged on noise alone.
    """
    starts, ends = _sends_and_ends(records)
    length = max(window.length, 1e-9)
    sent, served = _sent_and_served(starts, ends, window)
    times = np.linspace(window.start, window.end, TREND_SAMPLES)
    counts = np.array([np.count_nonzero((starts <= t) & (ends > t)) for t in times], dtype=float)
    # Lifetimes of the warm-up's requests: those of the window would make an overload's growth look
    # like filling (its latencies grow with the backlog, and so would the expected count).
    warm = [r for r in records if r.success and r.start_time < window.start]
    if by_length:
        filled = _filled_by_length(starts, np.array([r.output_len for r in records]), warm, times)
    else:
        filled = _filled_counts(starts, np.sort([r.latency for r in warm]), times)
    filling = float(filled[-1] - filled[0]) / sent
    if filling > MAX_FILLING:  # credit the capped share: scale the expected curve's rise down to it
        filled = filled[0] + (filled - filled[0]) * (MAX_FILLING / filling)
        filling = MAX_FILLING
    excess = counts - filled
    centered = times - times.mean()
    slope = float(np.dot(centered, excess - excess.mean()) / max(np.dot(centered, centered), 1e-12))
    residuals = excess - excess.mean() - slope * centered
    scatter = float(np.std(residuals))
    slope_error = scatter / (float(np.std(times)) * math.sqrt(_independent_samples(residuals)))
    allowed = max(MAX_BACKLOG_GROWTH, NOISE_SIGMAS * slope_error * length / sent)
    return Steadiness(sent / length, served / length, slope * length / sent, allowed, filling)


def queue_trend(records: Sequence[RequestRecord], window: Window) -> Steadiness | None:
    """The queue's witness over `window`: the trend of the wait before the first token (None with
    fewer than MIN_WARMUP_REQUESTS sends in it).

    A FIFO queue offered lambda by a server serving mu < lambda makes each request wait longer than the
    one before it: a request sent at t waits about t (lambda / mu - 1), so the slope s of TTFT against
    send time gives the share of arrivals left unserved, 1 - mu / lambda = s / (1 + s), the backlog's
    growth in `steadiness`' unit. It needs no request lifetimes, so it judges an overload whose slowed
    decodes stretch two lifetimes past the run. A server that admits the excess into its running batch
    shows it in the count instead (`steadiness`): a fixed-load verdict takes both. Allowed:
    QUEUE_MIN_GROWTH, whatever the waits' scatter: a quarter of the arrivals unserved is a wait growing
    by a third of a second per second, which no burst of a server that keeps up sustains over a run.
    """
    done = sorted(
        (r.start_time, r.ttft) for r in records if r.success and window.start <= r.start_time <= window.end
    )
    if len(done) < MIN_WARMUP_REQUESTS:
        return None
    times = np.array([t for t, _ in done])
    waits = np.array([w for _, w in done])
    centered = times - times.mean()
    slope = float(np.dot(centered, waits - waits.mean()) / max(np.dot(centered, centered), 1e-12))
    starts, ends = _sends_and_ends(records)
    sent, served = _sent_and_served(starts, ends, window)
    length = max(window.length, 1e-9)
    unserved = slope / (1 + slope) if slope > 0 else slope  # below 0 the wait only shrinks: no backlog
    return Steadiness(sent / length, served / length, unserved, QUEUE_MIN_GROWTH)


def _sends_and_ends(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """Each record's send and finish time; a failed request never finishes (it stays in the server)."""
    starts = np.array([r.start_time for r in records], dtype=float)
    ends = np.array([r.start_time + r.latency if r.success else math.inf for r in records], dtype=float)
    return starts, ends


def _sent_and_served(starts: np.ndarray, ends: np.ndarray, window: Window) -> tuple[int, int]:
    """Requests sent in the window (at least 1) and those finished in it."""
    sent = max(int(np.count_nonzero((starts >= window.start) & (starts <= window.end))), 1)
    return sent, int(np.count_nonzero((ends >= window.start) & (ends <= window.end)))


def _filled_counts(starts: np.ndarray, lifetimes: np.ndarray, times: np.ndarray) -> np.ndarray:
    """The expected requests in a server that keeps up at each of `times`: the sum, over requests
    sent before t, of the share of `lifetimes` (sorted) longer than t minus the send time."""
    if len(lifetimes) == 0:
        return np.zeros(len(times))
    out = np.empty(len(times))
    for k, t in enumerate(times):
        ages = t - starts[starts <= t]
        out[k] = len(ages) - np.searchsorted(lifetimes, ages, side="right").sum() / len(lifetimes)
    return out


def _filled_by_length(
    starts: np.ndarray, lengths: np.ndarray, warm: Sequence[RequestRecord], times: np.ndarray
) -> np.ndarray:
    """`_filled_counts` with each request's lifetime made of the warm-up's median first-token wait and its
    own output length times a warm-up request's time per output token: a trace's stretch whose outputs
    grow over the run (97 tokens in its first 8 s, 297 in its last 8, Azure's conversation trace)
    fills a server that keeps up by more than the warm-up's lifetimes say."""
    if not warm:
        return np.zeros(len(times))
    first_token = float(np.median([r.ttft for r in warm]))
    per_token = np.sort([r.tpot for r in warm])
    decodes = np.maximum(lengths - 1, 0)
    out = np.empty(len(times))
    for k, t in enumerate(times):
        sent = starts <= t
        decoding = t - starts[sent] - first_token  # time spent past the first token so far
        tokens = decodes[sent]
        # alive while first_token + tokens x per_token > age: a per-token time above decoding / tokens
        # (a one-token output lives only until its first token)
        bound = np.where(decoding < 0, -np.inf, np.inf)
        np.divide(decoding, tokens, out=bound, where=tokens > 0)
        alive = len(per_token) - np.searchsorted(per_token, bound, side="right")
        out[k] = alive.sum() / len(per_token)
    return out


def _independent_samples(residuals: np.ndarray) -> float:
    """How many independent values a correlated series is worth (AR(1): n (1 - r) / (1 + r), r its
    lag-1 autocorrelation). A queue near saturation remembers its state far longer than one request
    lifetime, so the memory is measured, not assumed."""
    a, b = residuals[:-1], residuals[1:]
    spread = float(np.std(a) * np.std(b))
    r = float(np.mean((a - a.mean()) * (b - b.mean())) / spread) if spread > 0 else 0.0
    r = min(max(r, 0.0), 0.99)
    return max(2.0, len(residuals) * (1 - r) / (1 + r))


def lifetime(records: Sequence[RequestRecord]) -> float:
    """Mean decode time (E2EL - TTFT) of the successful requests: how long one holds a batch slot."""
    done = [r.latency - r.ttft for r in records if r.success]
    return float(np.mean(done)) if done else 0.0


def saturation(records: Sequence[RequestRecord]) -> Saturation | None:
    """Throughput and request lifetime of an all-at-once run (None with fewer than 8 completions).

    Throughput is the completion rate between the 25th and 75th percentile completion: the batch is
    full there, while the start (prefills) and the end (the last long requests) are not saturated.
    The lifetime is the mean decode time (E2EL - TTFT): how long a request holds its batch slot.
    """
    done = [r for r in records if r.success]
    if len(done) < 8:
        return None
    ends = np.sort([r.start_time + r.latency for r in done])
    q1, q3 = np.percentile(ends, [25, 75])
    middle = int(np.count_nonzero((ends >= q1) & (ends <= q3)))
    throughput = middle / (q3 - q1) if q3 > q1 else len(done) / max(float(ends[-1]), 1e-9)
    return Saturation(round(float(throughput), DIGITS), round(lifetime(done), DIGITS))


def load_kind(requests: Sequence[Any], max_concurrency: int | None) -> str:
    """ "closed" (a concurrency cap: no offered rate), "burst" (all at t=0) or "open" (arrivals over time)."""
    if max_concurrency is not None:
        return "closed"
    return "open" if any(r.arrival_time > 0 for r in requests) else "burst"


def measure_window(
    records: Sequence[RequestRecord],
    duration: float,
    measure_from: float,
    slos: Sequence[Slo] = (),
    server: Mapping[str, Any] | None = None,
    kind: str = "open",
) -> tuple[BenchmarkResult, LoadReport | None]:
    """The metrics of the requests sent from `measure_from` on, and what the run says about the load.

    With a warm-up (`measure_from` > 0) throughputs are over the window (its arrivals' span). The
    report has the steadiness and each SLO's evidence (autotune/measure/evidence.py) for an open-loop
    run, the saturation figures for a burst, and there is none for a closed loop (no offered rate to
    keep up with); `kind` is `load_kind(...)` of the run. The SLOs also give the goodput's per-request
    bounds.
    """
    measured = [r for r in records if r.start_time >= measure_from] if measure_from > 0 else list(records)
    last_send = max((r.start_time for r in records), default=0.0)
    window = Window(measure_from, last_send)
    span = window.length if measure_from > 0 else duration
    metrics = compute_metrics(measured, span, goodput_bounds(slos), server=server)
    if kind == "closed" or (kind == "open" and window.length <= 0):
        return metrics, None
    if kind == "burst":
        return metrics, LoadReport(burst=True, saturation=saturation(records))
    steady = _fixed_load_steadiness(records, last_send) if measure_from <= 0 else _judged(records, window)
    if steady is None:
        return metrics, None  # too short to tell
    evidence = tuple(c.stored() for c in slo_criteria(measured, slos))
    return metrics, LoadReport(steady=steady.stored(), slo_evidence=evidence)


def _judged(records: Sequence[RequestRecord], window: Window, by_length: bool = False) -> Steadiness | None:
    """`steadiness` over the window, None when it has fewer than MIN_WINDOW_ARRIVALS arrivals."""
    if sum(window.start <= r.start_time <= window.end for r in records) < MIN_WINDOW_ARRIVALS:
        return None
    return steadiness(records, window, by_length)


def _fixed_load_steadiness(records: Sequence[RequestRecord], last_send: float) -> Steadiness | None:
    """A run without warm-up: the count's verdict from two request lifetimes in, once the batch has
    filled, and after its first MIN_WARMUP_REQUESTS sends, whose lifetimes give `steadiness` the filling
    to expect; the queue's (`queue_trend`) from those sends on. Either one that did not keep up decides;
    with no count verdict (the window too short) and a queue that kept up, none; nor with a count that
    kept up only within the far half of its noise allowance (`_unsure`). A window that served
    at least what it was offered kept up whatever the count's line says (its growth is then the one of
    its ends)."""
    sends = sorted(r.start_time for r in records)
    if len(sends) < MIN_WARMUP_REQUESTS:
        return None
    first = sends[MIN_WARMUP_REQUESTS - 1]
    window = Window(max(WARMUP_RESIDENCES * lifetime(records), first), last_send)
    count = _judged(records, window, by_length=True) if window.length >= 0.5 * last_send else None
    if count is not None and count.allowed_growth > QUEUE_MIN_GROWTH:
        # the count's noise excuses no more backlog than the queue's witness judges on its own: a
        # quarter of the arrivals unserved is an overload whatever bursts the arrivals had
        count = dataclasses.replace(count, allowed_growth=QUEUE_MIN_GROWTH)
    if count is not None and not count.kept_up and count.served_rate >= count.offered_rate:
        # the window's ends contradict its line: it finished as many requests as were sent, so the
        # server held no more at its end than at its start, and the line rose on a fluctuation
        count = dataclasses.replace(count, backlog_growth=1 - count.served_rate / count.offered_rate)
    queue = queue_trend(records, window if count is not None else Window(first, last_send))
    if queue is not None and not queue.kept_up and (count is None or count.kept_up):
        return queue
    if count is not None and count.kept_up and _unsure(count):
        return None  # within the window's noise, but too far into it to call kept up
    return count


def _unsure(count: Steadiness) -> bool:
    """A backlog that grew by more than UNSURE_SHARE of the count's noise allowance (and beyond
    MAX_BACKLOG_GROWTH): a short window near saturation whose noise hides an overload of that size
    (a 70B at 1.1x its capacity grew 9 % in 300 requests, 15 % allowed)."""
    return count.backlog_growth > max(MAX_BACKLOG_GROWTH, UNSURE_SHARE * count.allowed_growth)


def relaxation_s(rate: float, saturation: float) -> float:
    """How long a queue offered `rate` by a server that completes `saturation` per second takes to
    forget its state: 1 / (mu (1 - sqrt(rho))^2), the relaxation time of an M/M/1 queue (Morse 1955).
    It grows as 4 / (mu (1 - rho)^2) when rho -> 1: a window shorter than it sees a TTFT tail that is
    still growing (a config passed 99.5 % of its saturation rate with p99 TTFT 1.1 s over 1,000
    requests; 10,000 gave 4.9 s). Infinite at or above saturation."""
    rho = rate / saturation if saturation > 0 else math.inf
    return 1.0 / (saturation * (1.0 - math.sqrt(rho)) ** 2) if rho < 1 else math.inf
