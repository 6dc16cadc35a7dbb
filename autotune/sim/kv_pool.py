"""vLLM's KV block pool (vllm/v1/core/block_pool.py): a free queue in LRU order, reference counts,
and the hash -> block map of cached blocks that prefix caching looks up.

Never-used blocks are handed out first, then the least recently freed; a request's tail blocks are
freed first so they are evicted first. A block is cached under its request's key for it (shared-prefix
blocks by (prefix_id, i), the rest unique to the request) as soon as it is full.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol


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
        self.fresh_next = 0  # blocks [fresh_next, num_blocks) were never used: the free queue's head
        self.free: OrderedDict[int, None] = OrderedDict()  # freed blocks, least recently freed first
        self.ref = [0] * num_blocks
        self.hash: list[object | None] = [None] * num_blocks
        self.cache: dict[object, int] = {}

    @property
    def num_free(self) -> int:
        return self.num_blocks - self.fresh_next + len(self.free)

    def allocate(self, n: int) -> list[int]:
        """n blocks (caller checked num_free); evicts the least recently freed cached blocks."""
        fresh = min(n, self.num_blocks - self.fresh_next)
        out = list(range(self.fresh_next, self.fresh_next + fresh))
        self.fresh_next += fresh
        for _ in range(n - fresh):
            bid = self.free.popitem(last=False)[0]
            h = self.hash[bid]
            if h is not None:
                self.hash[bid] = None
                if self.cache.get(h) == bid:
                    del self.cache[h]
            out.append(bid)
        ref = self.ref
        for bid in out:
            ref[bid] = 1
        return out

    def touch(self, hits: list[int]) -> None:
        """Take a reference on cached blocks (removing free ones from the free queue)."""
        for bid in hits:
            if self.ref[bid] == 0:
                del self.free[bid]
            self.ref[bid] += 1

    def release(self, blocks: list[int]) -> None:
        """Drop a request's references; its tail blocks are freed first so they are evicted first."""
        ref, free = self.ref, self.free
        for bid in reversed(blocks):
            ref[bid] -= 1
            if ref[bid] == 0:
                free[bid] = None

    def register(self, req: PooledRequest, upto: int) -> None:
        """Cache req's full blocks [cached_upto, upto)."""
        cache, hashes, blocks = self.cache, self.hash, req.blocks
        for i in range(req.cached_upto, upto):
            key = req.key(i)
            if key not in cache:
                bid = blocks[i]
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
