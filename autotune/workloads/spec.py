"""Workloads: a YAML spec -> a reproducible list of Requests (lengths, arrival times, shared prefixes).

A `WorkloadSpec` says where the lengths come from (synthetic distributions, the shipped Azure 2023
traces, or a JSONL file), how requests arrive (all at once, Poisson/gamma at a rate exactly like
`vllm bench serve`, trace timestamps), an optional client-side concurrency cap, and an optional shared
prefix for prefix-caching workloads. `requests(seed)` turns it into the same list every time for the
same seed. Traces: workloads/traces.py; JSONL files: workloads/jsonl.py; reading a YAML file:
workloads/files.py (its schema is documented at the top of workloads/chat.yaml).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autotune.core.errors import AutotuneError
from autotune.workloads.jsonl import read_jsonl
from autotune.workloads.lengths import LengthDist, stratified_uniforms
from autotune.workloads.traces import TraceSource

LOADS = ("fixed", "capacity")
# Requests per load: at ~200 output tokens a request, 100,000 took 0.8 GB and 12 s in `bench` (so 1M:
# ~8 GB, minutes of simulation)
MAX_REQUESTS = 1_000_000

# Independent random streams, so that changing the rate keeps the same lengths and vice versa.
_PROMPT_STREAM, _OUTPUT_STREAM, _ARRIVAL_STREAM, _PREFIX_STREAM, _TRACE_STREAM = range(5)
# Seeds of prompt_token_ids: a prefix group's shared tokens and a request's own tokens.
_PREFIX_TOKENS, _OWN_TOKENS = 11, 12


@dataclass(frozen=True)
class Request:
    """One request to send: its lengths, its arrival time and the prefix it shares with others.

    Requests with the same `prefix_id` share their first `prefix_len` prompt tokens (prefix caching);
    the rest of each prompt is unique to the request. `prompt` holds the text of a JSONL text prompt
    (its `prompt_len` is then an estimate unless the file gave one); None means "send token ids".
    """

    request_id: int
    prompt_len: int
    output_len: int
    arrival_time: float = 0.0  # seconds after the start of the run
    prefix_id: int | None = None
    prefix_len: int = 0
    prompt: str | None = None


@dataclass(frozen=True)
class WorkloadSpec:
    """What to send and when. Exactly one length source: prompt_len + output_len, trace or jsonl.

    With `jsonl`, rows without an output length take `output_len`. With a shared prefix, each request
    belongs to one of `num_prefixes` groups and its prompt is `prefix_len` shared tokens followed by
    its own sampled prompt length (like vLLM's --random-prefix-len).
    """

    name: str
    num_requests: int
    request_rate: float = math.inf  # req/s; inf = all at t=0 (trace replay: the trace's own times)
    burstiness: float = 1.0  # gamma shape; 1 = Poisson
    max_concurrency: int | None = None  # cap on requests in flight (client side, like --max-concurrency)
    load: str = "fixed"  # "fixed" (measure at this load) or "capacity" (search the highest rate meeting SLOs)
    prompt_len: LengthDist | None = None
    output_len: LengthDist | None = None
    trace: TraceSource | None = None
    jsonl: Path | None = None
    num_prefixes: int = 0
    prefix_len: int = 0
    seed: int = 0
    description: str = ""
    # Requests sent before this time (s on the run's clock) are a warm-up: served, not measured. A
    # capacity probe sets it so that the queue a config builds up is measured, not its empty start.
    measure_from: float = 0.0

    def __post_init__(self) -> None:
        if not self.name:
            raise AutotuneError("a workload needs a name")
        checks = [
            (self.num_requests >= 1, f"num_requests must be >= 1, got {self.num_requests}"),
            (self.request_rate > 0, f"request_rate must be > 0 (or inf), got {self.request_rate:g}"),
            (self.burstiness > 0, f"burstiness must be > 0, got {self.burstiness:g}"),
            (
                self.max_concurrency is None or self.max_concurrency >= 1,
                f"max_concurrency must be >= 1, got {self.max_concurrency}",
            ),
            (self.load in LOADS, f"load must be one of {', '.join(LOADS)}, got {self.load!r}"),
            # a capacity search measures open-loop arrivals at the rates it picks: a cap would close the loop
            (
                self.load != "capacity" or self.max_concurrency is None,
                f"max_concurrency {self.max_concurrency} with a capacity load: a capacity search chooses the "
                "request rate and measures open-loop Poisson arrivals, a concurrency cap makes it a closed "
                "loop; use the fixed load, or drop max_concurrency",
            ),
            (
                self.num_prefixes >= 0 and self.prefix_len >= 0,
                "num_prefixes and prefix_len must be >= 0",
            ),
            (
                (self.num_prefixes > 0) == (self.prefix_len > 0),
                "a shared prefix needs both num_prefixes and prefix_len > 0",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise AutotuneError(f"workload {self.name}: {message}")
        self._check_sources()

    def _check_sources(self) -> None:
        synthetic = self.prompt_len is not None
        sources = [
            s for s, used in (("prompt_len", synthetic), ("trace", self.trace), ("jsonl", self.jsonl)) if used
        ]
        if len(sources) != 1:
            raise AutotuneError(
                f"workload {self.name}: give exactly one length source (prompt_len + output_len, trace or "
                f"jsonl), got {', '.join(sources) or 'none'}"
            )
        if synthetic and self.output_len is None:
            raise AutotuneError(f"workload {self.name}: prompt_len needs an output_len too")
        if self.trace is not None and self.output_len is not None:
            raise AutotuneError(
                f"workload {self.name}: a trace gives its own output lengths; drop output_len"
            )

    def requests(self, seed: int = 0) -> list[Request]:
        """The requests in arrival order; the same list for the same (spec, seed)."""

        def rng(stream: int) -> np.random.Generator:
            return np.random.default_rng([self.seed, seed, stream])

        n = self.num_requests
        prompts: list[str | None] = [None] * n
        if self.trace is not None:
            prompt_lens, output_lens, arrivals = self._trace_requests(rng(_TRACE_STREAM))
        elif self.jsonl is not None:
            prompt_lens, output_lens, prompts = self._jsonl_requests(rng(_OUTPUT_STREAM))
            arrivals = None
        else:
            assert self.prompt_len is not None and self.output_len is not None
            prompt_lens = self.prompt_len.sample(rng(_PROMPT_STREAM), n)
            output_lens = self.output_len.sample(rng(_OUTPUT_STREAM), n)
            arrivals = None
        if arrivals is None:
            arrivals = rate_arrivals(n, self.request_rate, self.burstiness, rng(_ARRIVAL_STREAM))
        prefix_ids: list[int | None] = [None] * n
        if self.num_prefixes:
            if any(p is not None for p in prompts):
                raise AutotuneError(f"workload {self.name}: a shared prefix cannot be added to text prompts")
            groups = rng(_PREFIX_STREAM).permutation(np.arange(n) % self.num_prefixes)
            prefix_ids = [int(g) for g in groups]
            prompt_lens = np.asarray(prompt_lens) + self.prefix_len
        return [
            Request(
                request_id=i,
                prompt_len=int(prompt_lens[i]),
                output_len=int(output_lens[i]),
                arrival_time=float(arrivals[i]),
                prefix_id=prefix_ids[i],
                prefix_len=self.prefix_len if prefix_ids[i] is not None else 0,
                prompt=prompts[i],
            )
            for i in range(n)
        ]

    def _trace_requests(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        assert self.trace is not None
        seconds, prompt, output = self.trace.read()
        n = self.num_requests
        first = int(np.searchsorted(seconds, self.trace.start))
        if self.trace.arrivals == "rate":
            stop = len(prompt) if self.trace.rows is None else min(len(prompt), first + self.trace.rows)
            # Stratified by total length, like synthetic lengths (lengths.py): any window of a few
            # blocks holds the long rows in their share, so probes of a capacity search see one mix.
            by_length = first + np.argsort(prompt[first:stop] + output[first:stop], kind="stable")
            if len(by_length) == 0:
                raise AutotuneError(f"workload {self.name}: the trace has no rows {self.trace.kept()}")
            picks = (stratified_uniforms(rng, n) * len(by_length)).astype(np.int64)
            rows = by_length[np.minimum(picks, len(by_length) - 1)]
            return prompt[rows], output[rows], None
        if len(seconds) - first < n:
            raise AutotuneError(
                f"workload {self.name}: the trace has {len(seconds) - first} requests {self.trace.kept()}, "
                f"fewer than num_requests={n}"
            )
        window = slice(first, first + n)
        arrivals = (seconds[window] - seconds[first]) / self.trace.time_scale
        if math.isfinite(self.request_rate) and arrivals[-1] > 0:
            # A rate given with a trace keeps the trace's burst shape and sets its mean rate, the same
            # normalisation vLLM applies to its gamma arrivals (last arrival at N / rate).
            arrivals = arrivals * (n / self.request_rate) / arrivals[-1]
        return prompt[window], output[window], arrivals

    def _jsonl_requests(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
        assert self.jsonl is not None
        rows = read_jsonl(self.jsonl, needs_output_len=self.output_len is None)
        n = self.num_requests
        picked = [rows[i % len(rows)] for i in range(n)]  # in file order, cycled
        # without a default every row has its own (read_jsonl checked): the zeros are never read
        fallback = self.output_len.sample(rng, n) if self.output_len is not None else np.zeros(n, np.int64)
        output_lens = [
            output_len if output_len is not None else int(fallback[i])
            for i, (_, output_len, _) in enumerate(picked)
        ]
        return (
            np.array([p for p, _, _ in picked], dtype=np.int64),
            np.array(output_lens, dtype=np.int64),
            [text for _, _, text in picked],
        )

    @functools.cached_property  # the guide asks once per config: the JSONL is read once
    def shares_prefixes(self) -> bool:
        """Whether prompts can share a prefix a server could cache: a shared-prefix group, or text
        prompts (their content may repeat). Token-id prompts, JSONL token counts too, are random and
        salted per run: they never do."""
        if self.num_prefixes > 0:
            return True
        return self.jsonl is not None and any(text is not None for _, _, text in read_jsonl(self.jsonl))

    def with_rate_arrivals(self) -> WorkloadSpec:
        """This workload with arrivals drawn from its rate: a trace replay becomes the rows of the
        stretch it replays, sampled stratified by length (a capacity search offers Poisson rates, and
        its probes and saturation run all see that stretch's length mix); others are unchanged."""
        trace = self.trace
        if trace is None or trace.arrivals != "trace":
            return self
        rows = dataclasses.replace(trace, arrivals="rate", time_scale=1.0, rows=self.num_requests)
        return dataclasses.replace(self, trace=rows)

    def burst(self, num_requests: int) -> WorkloadSpec:
        """`num_requests` of this workload's requests, all at t=0 (a trace's own times dropped, see
        `with_rate_arrivals`)."""
        return dataclasses.replace(
            self.with_rate_arrivals(), request_rate=math.inf, num_requests=num_requests, measure_from=0.0
        )

    def with_load(
        self,
        request_rate: float | None = None,
        max_concurrency: int | None = None,
        num_requests: int | None = None,
        measure_from: float | None = None,
    ) -> WorkloadSpec:
        """A copy at another load (the arguments given replace the spec's; length distributions stay)."""
        changes: dict[str, Any] = {}
        if request_rate is not None:
            changes["request_rate"] = float(request_rate)
        if max_concurrency is not None:
            changes["max_concurrency"] = int(max_concurrency)
        if num_requests is not None:
            changes["num_requests"] = int(num_requests)
        if measure_from is not None:
            changes["measure_from"] = float(measure_from)
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """One line for progress output, e.g. "chat: 400 requests, prompt lognormal(...), ..., 12 req/s"."""
        if self.trace is not None:
            lengths = self.trace.describe()
        elif self.jsonl is not None:
            lengths = f"prompts from {self.jsonl.name}"
        else:
            assert self.prompt_len is not None and self.output_len is not None
            lengths = f"prompt {self.prompt_len.describe()}, output {self.output_len.describe()}"
        parts = [f"{self.name}: {self.num_requests} requests", lengths]
        if self.num_prefixes:
            parts.append(f"{self.num_prefixes} shared prefixes of {self.prefix_len} tokens")
        parts.append(self._describe_load())
        return ", ".join(parts)

    def _describe_load(self) -> str:
        if self.load == "capacity":
            load = "capacity search"
        elif self.trace is not None and self.trace.arrivals == "trace":
            load = (
                "trace arrivals" if math.isinf(self.request_rate) else f"trace at {self.request_rate:g} req/s"
            )
        elif math.isinf(self.request_rate):
            load = "all at t=0"
        else:
            process = "Poisson" if self.burstiness == 1 else f"gamma(burstiness {self.burstiness:g})"
            load = f"{process} {self.request_rate:g} req/s"
        if self.max_concurrency is not None:
            load += f", max concurrency {self.max_concurrency}"
        return load


def rate_arrivals(n: int, request_rate: float, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times as `vllm bench serve` makes them (vllm/benchmarks/serve.py get_request).

    Rate inf: all at 0. Otherwise gaps ~ Gamma(shape=burstiness, scale=1/(rate*burstiness)) (burstiness
    inf: constant gaps), accumulated from the first gap and rescaled so the last arrival is at n / rate.
    """
    if math.isinf(request_rate):
        return np.zeros(n)
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / request_rate)
    else:
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n)
    times = np.cumsum(gaps)
    return times * (n / request_rate) / times[-1] if times[-1] > 0 else times


def prompt_token_ids(request: Request, vocab_size: int = 32000, salt: int = 0) -> list[int]:
    """Deterministic prompt token ids of length `request.prompt_len`.

    Requests with the same prefix_id get the same first `prefix_len` ids; the rest depends only on the
    request id, and its first id is chosen from the request id so two requests share exactly their prefix.
    Ids avoid the low range where tokenizers keep special tokens. A non-zero `salt` gives other ids with
    the same lengths and sharing, so a load repeated on one server misses the prefix cache of the last.
    """
    low = min(1000, vocab_size // 4)
    span = vocab_size - low
    shared = request.prefix_len if request.prefix_id is not None else 0
    salted = [salt] if salt else []  # salt 0 keeps the unsalted ids
    ids: list[int] = []
    if shared:
        prefix_rng = np.random.default_rng([_PREFIX_TOKENS, request.prefix_id, *salted])
        ids = prefix_rng.integers(low, vocab_size, size=shared).tolist()
    own = request.prompt_len - shared
    if own > 0:
        own_rng = np.random.default_rng([_OWN_TOKENS, request.request_id, *salted])
        rest = own_rng.integers(low, vocab_size, size=own)
        rest[0] = low + request.request_id % span
        ids += rest.tolist()
    return ids


def salt_base() -> int:
    """A random first salt for a series of loads (their salts count up from it): a series on a server an
    earlier one used (another process, a rerun) misses its prefix cache. In 2**62, two series' few salts
    overlap with negligible probability; from 10**7 on, never a fixed salt such as a warm-up's 10**6."""
    return secrets.randbelow(2**62) + 10**7


def check_fits(workload: WorkloadSpec, seed: int, max_model_len: int | None) -> None:
    """A workload with a request longer than `max_model_len` is an input error: vLLM answers such a
    request 400, so every trial would fail it (None: the limit is unknown, vLLM checks)."""
    if max_model_len is None:
        return
    requests = workload.requests(seed)
    longest = max(requests, key=lambda r: r.prompt_len + r.output_len)
    total = longest.prompt_len + longest.output_len
    if total > max_model_len:
        raise AutotuneError(
            f"workload {workload.name}: a request needs {total} tokens ({longest.prompt_len} prompt + "
            f"{longest.output_len} output), more than max_model_len {max_model_len}: no config could "
            "serve it; shorten the workload's lengths (max:) or raise max_model_len"
        )
