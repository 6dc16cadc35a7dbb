"""vLLM's KV block pool (vllm/v1/core/block_pool.py): a free queue in LRU order, reference counts,
and the hash -> block map of cached blocks that prefix caching looks up.

Never-used blocks are handed out first, then the least recently freed; a request's tail blocks are
freed first so they are evicted first. A block is cached under its request's key for it (shared-prefix
blocks by (prefix_id, i), the rest unique to the request) as soon as it is full.

Which physical block a request holds only matters once the block is cached (it carries a hash a later
request may look up). So a block without a hash has no identity here: a request's block list holds
ANONYMOUS for it, the free queue holds runs of such blocks as counts, and a block gets an id only when
it is registered in the cache (and loses it when it is evicted). The queue's order, its length and
which cached blocks it evicts are the ones a pool of numbered blocks has, without a Python step per
block: a chat run allocates and frees ~80 blocks per request.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

ANONYMOUS = -1  # a block in a request's list that is not in the cache


class PooledRequest(Protocol):
    """What the pool needs of a request: its blocks, how many are cached, and their hash keys."""

    blocks: list[int]
    cached_upto: int

    def key(self, i: int) -> object:
        """Hash key of the request's full block i."""
        ...


class BlockPool:
    """vLLM's KV block pool: free queue in LRU order, ref counts, hash -> block map for cached blocks."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.fresh = num_blocks  # never-used blocks: the free queue's head
        # Freed blocks, least recently freed first: a cached block's id -> 1, or a run's label (< 0) ->
        # how many blocks without a hash were freed in a row there.
        self.free: OrderedDict[int, int] = OrderedDict()
        self.queued = 0  # blocks in `free`
        self.low = num_blocks  # the fewest free blocks there ever were (the pool's high-water mark)
        self.ref: dict[int, int] = {}  # references to each cached block (blocks without an id hold one)
        self.hash: dict[int, object] = {}  # cached block id -> its key
        self.cache: dict[object, int] = {}
        self._next_id = 0
        self._next_run = -1

    @property
    def num_free(self) -> int:
        return self.fresh + self.queued

    def allocate(self, n: int) -> list[int]:
        """n blocks (caller checked num_free), never-used ones first; evicts the least recently freed
        cached blocks it takes."""
        rest = n - min(n, self.fresh)
        self.fresh -= n - rest
        if rest:
            self.queued -= rest
            free = self.free
            while rest:
                label, count = next(iter(free.items()))
                if label < 0 and count > rest:
                    free[label] = count - rest
                    break
                del free[label]
                if label < 0:
                    rest -= count
                else:
                    rest -= 1
                    self._evict(label)
        self.low = min(self.low, self.fresh + self.queued)
        return [ANONYMOUS] * n

    def _evict(self, bid: int) -> None:
        """A cached free block handed out again: its hash leaves the cache, and it its id."""
        h = self.hash.pop(bid)
        if self.cache.get(h) == bid:
            del self.cache[h]
        del self.ref[bid]

    def touch(self, hits: list[int]) -> None:
        """Take a reference on cached blocks (removing free ones from the free queue)."""
        for bid in hits:
            if self.ref[bid] == 0:
                del self.free[bid]
                self.queued -= 1
            self.ref[bid] += 1
        self.low = min(self.low, self.fresh + self.queued)

    def release(self, blocks: list[int]) -> None:
        """Drop a request's references; its tail blocks are freed first so they are evicted first."""
        if blocks.count(ANONYMOUS) == len(blocks):
            self._free_run(len(blocks))
            return
        ref, run = self.ref, 0
        for bid in reversed(blocks):
            if bid == ANONYMOUS:
                run += 1
                continue
            self._free_run(run)
            run = 0
            ref[bid] -= 1
            if ref[bid] == 0:
                self.free[bid] = 1
                self.queued += 1
        self._free_run(run)

    def _free_run(self, count: int) -> None:
        """Append `count` blocks without a hash to the free queue (to the run at its end, if any)."""
        if count <= 0:
            return
        self.queued += count
        free = self.free
        last = next(reversed(free), 0) if free else 0
        if last < 0:
            free[last] += count
        else:
            free[self._next_run] = count
            self._next_run -= 1

    def register(self, req: PooledRequest, upto: int) -> None:
        """Cache req's full blocks [cached_upto, upto) (a block gets its id here)."""
        cache, hashes, blocks = self.cache, self.hash, req.blocks
        for i in range(req.cached_upto, upto):
            key = req.key(i)
            if key not in cache:
                bid = blocks[i]
                if bid == ANONYMOUS:
                    bid = blocks[i] = self._next_id
                    self._next_id += 1
                    self.ref[bid] = 1
                cache[key] = bid
                hashes[bid] = key
        req.cached_upto = max(req.cached_upto, upto)

    def lookup(self, req: PooledRequest, max_blocks: int) -> list[int]:
        """The cached blocks of req's longest cached prefix (at most max_blocks)."""
        hits = []
        cache = self.cache
        for i in range(max_blocks):
            bid = cache.get(req.key(i))
            if bid is None:
                break
            hits.append(bid)
        return hits
