"""The running batch's decodes without Python work per token (docs/simulator.md, "Scheduler").

A decoding request's computed tokens follow from the step index since it entered decode, so the engine
touches it only at its block boundaries (an event every block_size steps: it gets a block, or the newest
running request is preempted) and at its finish step, known when it starts decoding. The batch's decode
context (the KV tokens its decodes read) is kept as one sum, moved at those events.
"""

from __future__ import annotations

from collections import deque

from autotune.sim.kv_cache import KvCache
from autotune.sim.kv_pool import ANONYMOUS, BlockPool
from autotune.sim.state import EngineRequest, EngineStats, by_admission

Events = dict[int, list[tuple[EngineRequest, int]]]  # step -> (request, its generation when scheduled)


class DecodeEvents:
    """SimEngine's (sim/engine.py) decode bookkeeping: the running requests' block and finish events,
    their decode context, finishing and preemption. A mixin: the engine holds the state below."""

    stats: EngineStats
    _bs: int
    _caching: bool
    _pool: BlockPool
    _kv: KvCache
    _waiting: deque[EngineRequest]
    _running: dict[int, EngineRequest]  # admission order; the last one is the newest
    _prefilling: dict[int, EngineRequest]  # mid-prefill, by request id, in admission order
    _block_events: Events
    _finish_events: Events
    _decode_context: int
    _done: dict[int, EngineRequest]

    def _start_decode(self, r: EngineRequest, first_step: int) -> None:
        r.decode_start = first_step
        r.decode_outputs = r.outputs
        r.finish_step = first_step + r.output_len - r.outputs - 1
        self._decode_context += r.prompt_len + r.outputs - 1
        self._finish_events.setdefault(r.finish_step, []).append((r, r.gen))
        self._schedule_block_event(r, first_step + len(r.blocks) * self._bs - r.computed)

    def _schedule_block_event(self, r: EngineRequest, step: int) -> None:
        if step <= r.finish_step:
            self._block_events.setdefault(step, []).append((r, r.gen))

    def _grow_decodes(self, step: int) -> bool:
        """Give a new block to every decoding request crossing a block boundary; preempt when short."""
        events = self._block_events.pop(step, None)
        if not events:
            return False
        running = self._running
        live = [r for r, gen in events if r.gen == gen and r.rid in running]
        pool = self._pool
        if pool.num_free >= len(live) and not (self._caching and any(r.preempted for r in live)):
            # Nothing to preempt and nothing to cache (only a preempted request's decode blocks are
            # registered, see _cache): one allocation takes the blocks one by one would, in any order.
            pool.allocate(len(live))
            events_at, later = self._block_events, step + self._bs
            for r in live:
                r.blocks.append(ANONYMOUS)
                if later <= r.finish_step:
                    events_at.setdefault(later, []).append((r, r.gen))
            return False
        live.sort(key=by_admission)
        preempted = False
        for r in live:
            if r.rid not in running:
                continue  # preempted earlier in this loop
            while pool.num_free < 1:
                victim = self._preempt_newest(step)
                preempted = True
                if victim is r:
                    break
            if r.rid not in running:
                continue
            r.blocks.extend(pool.allocate(1))
            self._kv.cache(r, len(r.blocks) - 1)
            self._schedule_block_event(r, step + self._bs)
        return preempted

    def _finish_due(self, step: int, finished: list[int]) -> None:
        """Finish the decodes whose last token was this step's (their finish events)."""
        running = self._running
        for r, gen in self._finish_events.pop(step, ()):
            if r.gen == gen and r.rid in running:
                self._decode_context -= r.prompt_len + r.output_len - 1
                r.outputs = r.output_len
                finished.append(self._finish(r, step))

    def _finish(self, r: EngineRequest, step: int) -> int:
        first, _ = r.segments[-1]
        r.segments[-1] = (first, step)
        del self._running[r.rid]
        self._kv.free(r, (r.prompt_len + r.output_len - 1) // self._bs)
        self._done[r.rid] = r
        return r.rid

    def _drop_running(self, r: EngineRequest, step: int) -> int:
        """Take r (already out of `running`) off the batch before `step` runs; returns its KV tokens."""
        if self._prefilling.pop(r.rid, None) is not None:
            return r.computed
        computed = r.computed_at(step)
        self._decode_context -= computed
        r.outputs = r.decode_outputs + (step - r.decode_start)
        first, _ = r.segments[-1]
        r.segments[-1] = (first, step - 1)
        return computed

    def _preempt_newest(self, step: int) -> EngineRequest:
        """Recompute preemption of the newest running request: to the front of the waiting queue."""
        rid = next(reversed(self._running))
        r = self._running.pop(rid)
        r.preempted = True
        self._kv.free(r, self._drop_running(r, step) // self._bs)
        r.computed = 0
        r.decode_start = -1
        r.gen += 1
        self._waiting.appendleft(r)
        self.stats.num_preemptions += 1
        return r
