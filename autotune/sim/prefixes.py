"""Which prompts share a prefix: the simulated engine's (prefix_id, prefix_len) from the prompts themselves.

The engine caches a shared prefix's blocks by (prefix_id, i) (sim/kv_pool.py), so it needs to know which
requests share how much. Token-id and text prompts are grouped by their first block (of tokens, or of
characters for text: no tokenizer) and share their longest common prefix with the group's first prompt.
The sim-server groups what it is sent this way (sim_server/parsing.py), and `text_prefixes` groups a
workload's text prompts (JSONL) the same way for the in-process replay.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from autotune.workloads.jsonl import CHARS_PER_TOKEN
from autotune.workloads.spec import Request

PREFIX_GROUPS = 4096  # prefix groups remembered (LRU)


class PrefixIndex:
    """Groups prompts by their first block and finds how much each shares with its group's first prompt.

    The simulated engine models prefix sharing as (prefix_id, prefix_len): requests with the same
    prefix_id share their first prefix_len tokens. A group's first request claims its whole prompt,
    so any later prompt that shares its first block reuses the common part.
    """

    def __init__(self, unit: int, capacity: int = PREFIX_GROUPS, ids: Iterator[int] | None = None) -> None:
        self.unit = unit  # items per block (tokens, or characters for text)
        self.capacity = capacity
        self._groups: OrderedDict[Any, tuple[int, Sequence]] = OrderedDict()
        # Indexes of one engine share their ids: the engine caches blocks by (prefix_id, i), so a text
        # group and a token-id group with the same id would hit each other's blocks.
        self._ids = ids if ids is not None else itertools.count()

    def match(self, items: Sequence) -> tuple[int | None, int]:
        """(prefix_id, shared items) for a prompt given as token ids or text."""
        if len(items) < self.unit:
            return None, 0
        key = tuple(items[: self.unit]) if isinstance(items, list) else items[: self.unit]
        group = self._groups.get(key)
        if group is None:
            group = (next(self._ids), items)
            self._groups[key] = group
            if len(self._groups) > self.capacity:
                self._groups.popitem(last=False)
            return group[0], len(items)
        self._groups.move_to_end(key)
        return group[0], _common_prefix(group[1], items)

    def match_text(self, text: str) -> tuple[int | None, int]:
        """(prefix_id, shared tokens) for a text prompt: the shared characters at ~4 per token."""
        prefix_id, chars = self.match(text)
        return prefix_id, chars // CHARS_PER_TOKEN


def text_index(block_size: int, ids: Iterator[int] | None = None) -> PrefixIndex:
    """The index of text prompts for an engine of `block_size`: a block's worth of characters."""
    return PrefixIndex(block_size * CHARS_PER_TOKEN, ids=ids)


def text_prefixes(requests: Sequence[Request], block_size: int) -> list[Request]:
    """`requests` (in the order they are sent) with their text prompts grouped as the sim-server groups
    what it is sent: identical texts, or texts sharing at least a block, share their common prefix."""
    taken = [r.prefix_id for r in requests if r.prefix_id is not None]
    index = text_index(block_size, itertools.count(max(taken, default=-1) + 1))
    out = []
    for r in requests:
        if r.prompt is not None and r.prefix_id is None:
            prefix_id, shared = index.match_text(r.prompt)
            r = dataclasses.replace(r, prefix_id=prefix_id, prefix_len=min(shared, r.prompt_len))
        out.append(r)
    return out


def _common_prefix(a: Sequence, b: Sequence) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # binary search on equal slices: C-speed comparisons instead of a Python loop
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
