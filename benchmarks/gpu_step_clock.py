"""`benchmarks/gpu_step_check.py --measure`: how a body of GPU work is timed (torch only)."""

from __future__ import annotations

import statistics
import time
from typing import Any

FLUSH_MIB = 256  # > 5x the H100's 50 MB L2
SPIN_CYCLES = 3_000_000  # ~1.5 ms at 1.98 GHz: the CPU queues a repeat's kernels while the GPU spins
BUDGET_PER_POINT_S = 0.15


class Clock:
    """Times a body of work: CUDA events on a GPU (L2 flushed and the stream held before each repeat),
    perf_counter on the CPU (for --quick tests of the logic)."""

    def __init__(self, torch: Any, device: str) -> None:
        self.torch = torch
        self.cuda = device.startswith("cuda")
        self.repeats = 0
        if self.cuda:
            self.flush = torch.empty(FLUSH_MIB << 20, dtype=torch.int8, device=device)
            self.overhead_s = 2e-3
        else:
            self.overhead_s = 0.0

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def _hold(self) -> None:
        self.flush.zero_()
        if hasattr(self.torch.cuda, "_sleep"):
            self.torch.cuda._sleep(SPIN_CYCLES)
        else:  # a ~1.5 ms filler where the spin kernel is missing
            for _ in range(4):
                self.flush[: 1 << 28].view(self.torch.bfloat16)[: 1 << 26].view(8192, 8192).sum()

    def reps(self, body: Any, n: int) -> list[list[float]]:
        """Seconds between consecutive mark() calls of body, for n repeats."""
        torch = self.torch
        marks: list[list[Any]] = []
        for _ in range(n):
            rep: list[Any] = []
            if self.cuda:
                self._hold()

                def mark(rep: list[Any] = rep) -> None:
                    event = torch.cuda.Event(enable_timing=True)
                    event.record()
                    rep.append(event)

            else:

                def mark(rep: list[Any] = rep) -> None:
                    rep.append(time.perf_counter())

            body(mark)
            marks.append(rep)
        self.sync()
        self.repeats += n
        if self.cuda:
            return [[a.elapsed_time(b) / 1e3 for a, b in zip(rep, rep[1:], strict=False)] for rep in marks]
        return [[b - a for a, b in zip(rep, rep[1:], strict=False)] for rep in marks]

    def measure(self, body: Any, warm: int = 2) -> dict[str, Any]:
        """Median (and min) seconds of each segment and of their total, over adaptive repeats."""
        for _ in range(warm):
            body(lambda: None)
        self.sync()
        first = sum(self.reps(body, 1)[0])
        n = max(7, min(25, int(BUDGET_PER_POINT_S / (first + self.overhead_s))))
        rows = self.reps(body, n)
        segments = [statistics.median(col) for col in zip(*rows, strict=True)]
        totals = [sum(r) for r in rows]
        return {"segments": segments, "median": statistics.median(totals), "min": min(totals), "n": n}


def us(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e6, 2)


def rate(amount: float, seconds: float, unit: float) -> float:
    return round(amount / seconds / unit, 1)
