"""A request's KV blocks over the block pool, as vLLM's KVCacheManager keeps them
(vllm/v1/core/kv_cache_manager.py): blocks for the tokens it computes, full blocks registered in the prefix
cache, all released when it finishes or is preempted."""

from __future__ import annotations

from autotune.sim.kv_pool import BlockPool
from autotune.sim.state import EngineRequest


class KvCache:
    """The engine's KV-cache bookkeeping: `pool`'s blocks of `block_size` tokens, prefix caching on or off."""

    def __init__(self, pool: BlockPool, block_size: int, caching: bool) -> None:
        self.pool = pool
        self.block_size = block_size
        self.caching = caching

    def allocate_for(self, r: EngineRequest, num_tokens: int) -> bool:
        """Blocks for a prefill chunk up to num_tokens; like vLLM, blocks it fills are cached at once.
        False (nothing allocated) when the pool is short."""
        need = -(-num_tokens // self.block_size) - len(r.blocks)
        if need > self.pool.num_free:
            return False
        if need > 0:
            r.blocks.extend(self.pool.allocate(need))
        self.cache(r, num_tokens // self.block_size)
        return True

    def cache(self, r: EngineRequest, upto: int) -> None:
        """Register r's full blocks below `upto` in the prefix cache, as vLLM does once a block is full.

        Only blocks someone can look up are registered: its shared-prefix blocks, and once it has been
        preempted (it looks its own blocks up when re-admitted) all of them. Until then its own blocks'
        keys are unique to it and nobody looks them up, so registering them would change no run (and
        costs the simulator time); at its first preemption `free` registers them all.
        """
        if not self.caching:
            return
        if not r.preempted:
            upto = min(upto, r.prefix_blocks)
        if upto > r.cached_upto:
            self.pool.register(r, upto)

    def free(self, r: EngineRequest, full_blocks: int) -> None:
        """Release r's blocks (its first `full_blocks` full ones stay cached until evicted)."""
        self.cache(r, min(full_blocks, len(r.blocks)))
        self.pool.release(r.blocks)
        r.blocks = []
        r.cached_upto = 0
