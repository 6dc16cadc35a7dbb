"""A discrete-event model of vLLM V1's engine: scheduler, paged KV cache, prefix cache, virtual clock.

Scheduling follows `vllm/v1/core/sched/scheduler.py` (docs/vllm.md, "Scheduler"): RUNNING requests
first (decodes take one token each; a request mid-prefill its next chunk), then WAITING requests FCFS
when no preemption happened this step, while running < max_num_seqs and the token budget lasts. A
prefill chunk is at most `long_prefill_token_threshold` tokens when that is set (sim/flags.py); without
it at most one request is mid-prefill, the newest. KV blocks are allocated per block; when they run
out the newest running request is preempted (recompute: it loses its blocks and computed tokens and
goes to the front of the queue). Full blocks are hashed (shared-prefix blocks by (prefix_id, i), the
rest per request) and stay cached after they are freed until the LRU allocation evicts them. An
aborted request (its client went away) frees its blocks like a finished one, at once, between steps.

The engine does no Python work per decoded token: the decodes' bookkeeping is sim/decodes.py's.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

import numpy as np

from autotune.catalog.gpus import GpuSpec, get_gpu
from autotune.catalog.models import ModelSpec, get_model
from autotune.core.config import EngineConfig
from autotune.measure.metrics import RequestRecord
from autotune.sim.calibration import DEFAULT_CALIBRATION, Calibration
from autotune.sim.context import context_problem
from autotune.sim.costs import CostModel
from autotune.sim.decodes import DecodeEvents, Events
from autotune.sim.flags import long_prefill_cap
from autotune.sim.frontend import FrontendModel
from autotune.sim.kv_cache import KvCache
from autotune.sim.kv_pool import BlockPool
from autotune.sim.memory import MemoryPlan, plan_memory
from autotune.sim.noise import StepNoise
from autotune.sim.state import EngineRequest, EngineStats, StepOutput, client_record
from autotune.workloads.spec import Request


class SimEngine(DecodeEvents):
    """The simulated vLLM V1 engine with a virtual clock. Raises EngineStartupError like vLLM.

    Every fitted constant of its cost, memory and API-server models comes from `calibration`.
    """

    def __init__(
        self,
        config: EngineConfig,
        gpu: str | GpuSpec,
        noise: StepNoise | None = None,
        calibration: Calibration = DEFAULT_CALIBRATION,
        allow_long_max_model_len: bool = False,  # VLLM_ALLOW_LONG_MAX_MODEL_LEN (plan_memory)
    ) -> None:
        self.calibration = calibration
        self.gpu: GpuSpec = get_gpu(gpu)
        self.model: ModelSpec = get_model(config.model)
        self.config: EngineConfig = config.with_vllm_defaults(
            self.gpu.memory_gib, self.gpu.name, self.model.max_position_embeddings
        )
        self.memory: MemoryPlan = plan_memory(
            self.config, self.model, self.gpu, calibration, allow_long_max_model_len
        )
        self.costs = CostModel(
            self.model,
            self.gpu,
            self.config.tensor_parallel_size,
            self.memory.kv_bytes_per_token,
            calibration,
            self.memory.largest_cuda_graph,  # none captured (--enforce-eager): every step eager
        )
        self.noise = noise  # None: every step takes exactly its modelled time
        self.now = 0.0
        self.frontend = FrontendModel.of(calibration)
        self.stats = EngineStats()
        self.step_times: list[float] = []  # end time of every step, indexed by step number
        self._bs = self.config.block_size
        assert self.config.max_num_batched_tokens is not None and self.config.max_num_seqs is not None
        assert self.config.max_model_len is not None
        self._budget = self.config.max_num_batched_tokens
        self._max_seqs = self.config.max_num_seqs
        self._max_len = self.config.max_model_len
        self._chunked = self.config.enable_chunked_prefill
        self._chunk_cap = long_prefill_cap(self.config)
        self._caching = self.config.enable_prefix_caching
        self._pool = BlockPool(self.memory.num_gpu_blocks)
        self._kv = KvCache(self._pool, self._bs, self._caching)
        self._waiting: deque[EngineRequest] = deque()
        self._last_added: EngineRequest | None = None  # its further choices share its intake wave
        self._running: dict[int, EngineRequest] = {}  # admission order; the last one is the newest
        # the running requests mid-prefill, in admission order (without a chunk cap: at most one, the newest)
        self._prefilling: dict[int, EngineRequest] = {}
        self._block_events: Events = {}
        self._finish_events: Events = {}
        self._decode_context = 0  # sum of decoding requests' KV tokens before the current step
        self._done: dict[int, EngineRequest] = {}
        self._admitted = 0
        self._waited_for_blocks = False  # an admission stopped because the pool was short (_admit)

    # -- public API ------------------------------------------------------------------------------
    def add_request(
        self, request: Request, chat: bool = False, send_time: float | None = None, choice: bool = False
    ) -> None:
        """Queue a request sent at `send_time` (default: now) through the API server (`chat`: chat API).

        It joins the first step that starts once the frontend has handed it over (frontend.py). A
        `choice` is a further choice (n > 1) of the request added just before: the API server parsed
        and tokenized that request once, so it is ready with it, at no intake cost of its own.
        ValueError (vLLM's HTTP 400 text) if it is too long.
        """
        self._enqueue(request, self.now if send_time is None else send_time, chat, choice)

    def abort_request(self, request_id: int) -> bool:
        """Drop an unfinished request, as vLLM does when its HTTP client disconnects (`abort_requests`).
        Returns False (and does nothing) when the request is unknown or already finished."""
        return self.abort_requests([request_id]) == 1

    def abort_requests(self, request_ids: Iterable[int]) -> int:
        """Drop unfinished requests in one pass; how many there were. Their KV blocks are freed (full ones
        stay cached) and the gauges updated at once: an idle engine runs no further step for them."""
        wanted = set(request_ids)
        aborted = [self._running.pop(rid) for rid in wanted & self._running.keys()]
        for r in aborted:
            self._kv.free(r, self._drop_running(r, len(self.step_times)) // self._bs)
        if len(aborted) < len(wanted) and self._waiting:
            kept: deque[EngineRequest] = deque()
            for r in self._waiting:
                (aborted if r.rid in wanted else kept).append(r)
            self._waiting = kept
        for r in aborted:
            r.gen += 1  # its pending block and finish events go stale
        self.stats.num_aborted += len(aborted)
        if aborted:
            self._update_gauges()
        return len(aborted)

    def has_unfinished(self) -> bool:
        """True while any request is waiting or running."""
        return bool(self._running or self._waiting)

    def next_start(self) -> float:
        """When the next step starts: now, or, while nothing runs, when the API server hands the first
        waiting request over (the end of its intake wave, which moves while later requests join it).

        A driver adds every request sent before this time ahead of `step`, as the engine core takes in
        whatever the server handed over before it starts a step (vllm/v1/engine/core.py, the busy loop).
        """
        if self._running or not self._waiting:
            return self.now
        return max(self.now, self._waiting[0].ready)

    def step(self) -> StepOutput:
        """Run one engine step; advance `now` by its duration."""
        return self._step(emit=True)

    def advance(self, until: float = math.inf) -> StepOutput:
        """Run engine steps without listing their new tokens (a replay reads them at the end): one, then
        more while requests remain, none finished and the next step starts before `until` (when the
        driver sends its next request). Returns their summed duration and what the last one finished."""
        duration = 0.0
        while True:
            if self._decodes_only():  # the same step as `_step`'s, with less work
                step_s, finished = self._decode_step(len(self.step_times))
            else:
                out = self._step(emit=False)
                step_s, finished = out.duration, out.finished
            duration += step_s
            if finished or not self.has_unfinished() or self.next_start() >= until:
                return StepOutput(duration=duration, finished=finished)

    def finished_records(self) -> dict[int, RequestRecord]:
        """The record of every finished request, by request id."""
        times = np.asarray(self.frontend.delivery())
        return {rid: self.record(rid, times) for rid in self._done}

    @property
    def num_free_blocks(self) -> int:
        """KV blocks not referenced by any request (cached-but-free blocks count as free, as in vLLM)."""
        return self._pool.num_free

    @property
    def min_free_blocks(self) -> int:
        """The fewest free KV blocks there were so far: a run never short of blocks would have run the same
        on any pool of at least num_gpu_blocks - min_free_blocks blocks (tune/guide_estimate.py)."""
        return self._pool.low

    @property
    def waited_for_blocks(self) -> bool:
        """Whether a waiting request was ever held back because the KV pool was short (min_free_blocks)."""
        return self._waited_for_blocks

    @property
    def num_steps(self) -> int:
        """Steps run so far."""
        return len(self.step_times)

    def record(self, request_id: int, times: np.ndarray | None = None) -> RequestRecord:
        """The client-side record of a finished request (`times`: `frontend.delivery()`, passed in when
        building many records)."""
        if times is None:
            times = np.asarray(self.frontend.delivery())
        return client_record(self._done[request_id], times)

    # -- internals -------------------------------------------------------------------------------
    def _enqueue(self, request: Request, send_time: float, chat: bool = False, choice: bool = False) -> None:
        too_long = context_problem(self._max_len, request.prompt_len, request.output_len)
        if too_long is not None:
            raise ValueError(too_long)
        r = EngineRequest(request, send_time, self._bs)
        last = self._last_added
        if choice and last is not None:  # taken in with the request it is a choice of
            r.wave, r.latency = last.wave, last.latency
        else:
            r.wave, r.latency = self.frontend.take_in(send_time, chat)
        self._last_added = r
        self._waiting.append(r)

    def _step(self, emit: bool) -> StepOutput:
        if not self.has_unfinished():
            return StepOutput(duration=0.0)
        start = self.next_start()
        idle = start - self.now  # until the API server hands the next request over
        self.now = start
        step = len(self.step_times)
        running = self._running
        preempted = self._grow_decodes(step)
        num_decode = len(running) - len(self._prefilling)
        budget = self._budget - num_decode
        chunks: list[tuple[EngineRequest, int]] = []  # (request, tokens) prefill work this step
        budget, cut = self._continue_prefills(step, budget, chunks)
        if cut:
            preempted = True
            num_decode = len(running) - len(self._prefilling)  # a newer decode may have gone too
        prefilling = self._prefilling
        decoders = [rid for rid in running if rid not in prefilling] if emit else []
        if not preempted:
            budget = self._admit(budget, chunks)
        if not chunks and num_decode == 0:
            if preempted:  # everything running was preempted: an empty step, admission resumes next step
                return StepOutput(duration=0.0)
            raise RuntimeError("simulated engine stalled: nothing schedulable")
        # -- cost of the step ---------------------------------------------------------------------
        num_tokens = num_decode + sum(c for _, c in chunks)
        completing = [r for r, c in chunks if r.computed + c == r.prompt_len + r.outputs]
        pairs = 0.0
        prefill_ctx = 0
        for r, c in chunks:
            pairs += c * (r.computed + (c + 1) / 2)
            prefill_ctx += r.computed + c
        duration = self.costs.step_time(
            num_tokens,
            num_decode + len(chunks),
            num_decode + len(completing),
            self._decode_context + num_decode,
            pairs,
            prefill_ctx,
        )
        duration = self._run(step, duration, num_decode + len(completing))
        # -- effects ------------------------------------------------------------------------------
        self._decode_context += num_decode
        self.stats.generation_tokens += num_decode
        new_tokens = [(rid, 1) for rid in decoders]
        finished: list[int] = []
        for r, c in chunks:
            r.computed += c
            if r.computed < r.prompt_len + r.outputs:
                prefilling[r.rid] = r  # a request admitted this step joins after the earlier ones
                continue
            prefilling.pop(r.rid, None)
            self._emit_first(r, step)
            if emit:
                new_tokens.append((r.rid, 1))
            if r.outputs >= r.output_len:
                finished.append(self._finish(r, step))
            else:
                self._start_decode(r, step + 1)
        self._finish_due(step, finished)
        self._update_gauges()
        # A real-time driver sleeps the idle wait too.
        return StepOutput(duration=idle + duration, new_tokens=new_tokens if emit else [], finished=finished)

    def _decodes_only(self) -> bool:
        """Whether the next step can only decode: requests run, none is mid-prefill, and none waiting can
        be admitted (none waits, the first is still in the API server, or the batch is full)."""
        if not self._running or self._prefilling:
            return False
        waiting = self._waiting
        return not waiting or waiting[0].ready > self.now or len(self._running) >= self._max_seqs

    def _decode_step(self, step: int) -> tuple[float, list[int]]:
        """`_step` where it can only decode (`_decodes_only`), without its prefill and admission work:
        the same blocks, cost, clock and finishes (a low-load window is mostly such steps). Returns its
        duration and the requests it finished."""
        self._grow_decodes(step)  # a preemption here stops admission in `_step` too
        num_decode = len(self._running)
        if num_decode == 0:  # everything running was preempted: an empty step
            return 0.0, []
        cost = self.costs.decode_step_time(num_decode, self._decode_context + num_decode)
        duration = self._run(step, cost, num_decode)
        self._decode_context += num_decode
        self.stats.generation_tokens += num_decode
        finished: list[int] = []
        self._finish_due(step, finished)
        self._update_gauges()
        return duration, finished

    def _run(self, step: int, duration: float, tokens: int) -> float:
        """Step `step` takes `duration` (with noise, when on): the clock moves, its `tokens` go to the API
        server; returns the duration."""
        if self.noise is not None:
            duration *= self.noise.factor()
        self.now += duration
        # The core hands the step's outputs to the API server and goes on: the server delays what the
        # client sees, never the next step (frontend.py).
        self.frontend.stream(step, self.now, tokens)
        self.step_times.append(self.now)
        return duration

    def _continue_prefills(
        self, step: int, budget: int, chunks: list[tuple[EngineRequest, int]]
    ) -> tuple[int, bool]:
        """The next chunk of every running request mid-prefill, oldest first, while the budget lasts.
        Where the KV pool is short the newest running request is preempted until the chunk fits or the
        request itself was the newest. Returns the budget left and whether anything was preempted."""
        running, preempted = self._running, False
        for p in list(self._prefilling.values()):
            if budget <= 0:
                break
            if p.rid not in running:
                continue  # preempted for an older prefill's chunk
            chunk = min(p.prompt_len + p.outputs - p.computed, self._chunk_cap, budget)
            while not self._kv.allocate_for(p, p.computed + chunk):
                preempted = True
                if self._preempt_newest(step) is p:
                    break
            if p.rid in running:
                chunks.append((p, chunk))
                budget -= chunk
        return budget, preempted

    def _admit(self, budget: int, chunks: list[tuple[EngineRequest, int]]) -> int:
        """Admit waiting requests FCFS; stop at the first that does not fit (head-of-line blocking)."""
        waiting, running, pool, bs = self._waiting, self._running, self._pool, self._bs
        stats = self.stats
        now = self.now
        while waiting and budget > 0 and len(running) < self._max_seqs:
            r = waiting[0]
            if r.ready > now:
                break  # still in the API server
            num_tokens = r.prompt_len + r.outputs
            hits: list[int] = []
            if self._caching:
                hits = pool.lookup(r, (num_tokens - 1) // bs)
            cached = len(hits) * bs
            new = num_tokens - cached
            if not self._chunked and min(new, self._chunk_cap) > budget:
                break
            chunk = min(new, self._chunk_cap, budget)
            need = -(-(cached + chunk) // bs) - len(hits)
            revived = sum(1 for b in hits if pool.ref[b] == 0)
            if need + revived > pool.num_free:
                self._waited_for_blocks = True
                break
            if self._caching:
                stats.prefix_cache_queries += num_tokens
                stats.prefix_cache_hits += cached
            waiting.popleft()
            pool.touch(hits)
            r.blocks = hits + pool.allocate(need)
            r.cached_upto = len(hits)
            r.computed = cached
            self._kv.cache(r, (cached + chunk) // bs)
            self._admitted += 1
            r.seq = self._admitted
            running[r.rid] = r
            chunks.append((r, chunk))
            budget -= chunk
        return budget

    def _emit_first(self, r: EngineRequest, step: int) -> None:
        """A prefill caught up: it samples a token, opening a new emission segment."""
        r.outputs += 1
        self.stats.generation_tokens += 1
        r.segments.append((step, step))
        if not r.prompt_counted:
            r.prompt_counted = True
            self.stats.prompt_tokens += r.prompt_len

    def _update_gauges(self) -> None:
        pool, stats = self._pool, self.stats
        usage = 1.0 - pool.num_free / max(pool.num_blocks, 1)
        stats.kv_cache_usage = usage
        stats.peak_kv_cache_usage = max(stats.peak_kv_cache_usage, usage)
        stats.num_running = len(self._running)
        stats.num_waiting = len(self._waiting)
