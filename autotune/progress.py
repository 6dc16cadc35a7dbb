"""The live progress line of `autotune run` on stderr: a redrawn bar on a TTY, plain lines otherwise."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

BAR_WIDTH = 20
# Short names so several running configs fit on one line.
SHORT = {
    "max_num_seqs": "seqs",
    "max_num_batched_tokens": "budget",
    "enable_chunked_prefill": "chunked",
    "block_size": "block",
    "gpu_memory_utilization": "gmu",
    "enable_prefix_caching": "prefix",
    "tensor_parallel_size": "tp",
    "kv_cache_dtype": "kv",
}


@dataclass
class ProgressState:
    """What the progress line shows."""

    done: int
    total: int
    feasible: int = 0
    failed: int = 0
    rejected: int = 0  # invalid suggestions told without launching
    best: float | None = None  # best feasible primary objective so far
    baseline: float | None = None  # the baseline's primary objective (if it was feasible)
    unit: str = "tok/s"
    running: list[tuple[int, Mapping[str, Any]]] = field(default_factory=list)  # (trial number, params)
    last: str = ""  # what the last finished trial was, e.g. "#7 feasible 4,210 tok/s"


def short_params(params: Mapping[str, Any]) -> str:
    """A compact "seqs=256 budget=4096 gmu=0.92" rendering of a config's parameters."""
    parts = []
    for name, value in params.items():
        if isinstance(value, bool):
            value = "on" if value else "off"
        elif isinstance(value, float):
            value = f"{value:g}"
        parts.append(f"{SHORT.get(name, name)}={value}")
    return " ".join(parts)


def render(state: ProgressState, width: int | None = None, bar: bool = True) -> str:
    """One line: [####....] 12/50  feasible 7  best 4,210 tok/s (+23% vs baseline)  running #13 ..."""
    parts = []
    if bar:
        filled = int(BAR_WIDTH * state.done / max(1, state.total))
        parts.append("[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]")
    parts.append(f"{state.done}/{state.total}")
    parts.append(f"feasible {state.feasible}")
    if state.failed:
        parts.append(f"failed {state.failed}")
    if state.rejected:
        parts.append(f"rejected {state.rejected}")
    if state.best is not None:
        best = f"best {state.best:,.0f} {state.unit}"
        if state.baseline:
            best += f" ({(state.best / state.baseline - 1) * 100:+.1f}% vs baseline)"
        parts.append(best)
    else:
        parts.append("best -")
    if state.last and not bar:
        parts.append(f"last {state.last}")
    if state.running:
        parts.append("running " + "; ".join(f"#{n} {short_params(p)}" for n, p in state.running))
    line = "  ".join(parts)
    if width and len(line) > width:
        line = line[: width - 1] + "…"
    return line


class Progress:
    """Draws ProgressState on a stream: redrawn in place on a TTY, one line per change otherwise."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self._last_done = -1
        self._drawn = False

    def show(self, state: ProgressState) -> None:
        """Draw the state (plain mode prints only when a trial finished, so logs stay short)."""
        if self.tty:
            width = shutil.get_terminal_size((120, 20)).columns - 1
            self.stream.write("\r\x1b[2K" + render(state, width=width))
            self._drawn = True
        elif state.done != self._last_done:
            self.stream.write(render(state, bar=False) + "\n")
        self._last_done = state.done
        self.stream.flush()

    def message(self, text: str) -> None:
        """A line above the bar (e.g. a warning), without breaking the redraw."""
        if self.tty and self._drawn:
            self.stream.write("\r\x1b[2K")
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
        self._drawn = False


def running_params(
    in_flight: Sequence[tuple[int, Any]], names: Sequence[str]
) -> list[tuple[int, dict[str, Any]]]:
    """(number, {tuned param: value}) of in-flight trials, for the progress line."""
    out = []
    for number, config in in_flight:
        values = config.params()
        out.append((number, {name: values[name] for name in names if name in values}))
    return out
