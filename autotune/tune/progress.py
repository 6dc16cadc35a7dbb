"""The live progress of `autotune run` on stderr: a redrawn bar on a TTY, plain lines otherwise.

The bar's line shows the run's elapsed time; every running trial gets a line of its own under it
(elapsed, its config, and which capacity probe it is on, when the search writes `probe.json` into the
trial's folder: `autotune.trial.live`), so a long real trial shows that it is alive and where it is.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

BAR_WIDTH = 20
# Without a TTY (output to a file, a CI log), a line is also printed this often while trials run: a real
# trial takes minutes, and a log that says nothing for that long reads as a hung run.
PLAIN_EVERY_S = 60.0
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
    maximize: bool = True  # the primary objective's direction: a minimized one's gain is its reduction
    running: list[tuple[int, Mapping[str, Any]]] = field(default_factory=list)  # (trial number, params)
    last: str = ""  # what the last finished trial was, e.g. "#7 feasible 4,210 tok/s"
    elapsed_s: float | None = None  # since the run started
    running_since: dict[int, float] = field(default_factory=dict)  # trial number -> seconds running
    probes: dict[int, str] = field(default_factory=dict)  # trial number -> "probe 3/8 at 12 req/s"
    gpu_hours: float | None = None  # GPU-hours spent by the finished trials (shown when set)
    budget_h: float | None = None  # --gpu-hours


def clock(seconds: float) -> str:
    """12 s, 4m05s, 2h03m."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


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


def versus(gain: float, maximize: bool, other: str) -> str:
    """A primary objective's gain (+0.23 = 23 % better) against `other`: "+23.0% vs baseline", or for a
    minimized one its reduction in words, "32.3% lower than baseline", as the verdict words it."""
    if maximize:
        return f"{gain * 100:+.1f}% vs {other}"
    return f"{abs(gain) * 100:.1f}% {'lower' if gain >= 0 else 'higher'} than {other}"


def render(state: ProgressState, width: int | None = None, bar: bool = True) -> str:
    """One line: [####....] 12/50  12m03s  feasible 7  best 4,210 tok/s (+23% vs baseline)  running #13 ..."""
    parts = []
    if bar:
        filled = int(BAR_WIDTH * state.done / max(1, state.total))
        parts.append("[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]")
    parts.append(f"{state.done}/{state.total}")
    if state.elapsed_s is not None:
        parts.append(clock(state.elapsed_s))
    if state.gpu_hours is not None:
        budget = f"/{state.budget_h:g}" if state.budget_h is not None else ""
        parts.append(f"{state.gpu_hours:.2f}{budget} GPU-h")
    parts.append(f"feasible {state.feasible}")
    if state.failed:
        parts.append(f"failed {state.failed}")
    if state.rejected:
        parts.append(f"rejected {state.rejected}")
    if state.best is not None:
        best = f"best {state.best:,.0f} {state.unit}"
        if state.baseline:
            change = state.best / state.baseline - 1
            best += f" ({versus(change if state.maximize else -change, state.maximize, 'baseline')})"
        parts.append(best)
    else:
        parts.append("best -")
    if state.last and not bar:
        parts.append(f"last {state.last}")
    if state.running and not bar:
        parts.append("running " + "; ".join(running_line(state, n, p) for n, p in state.running))
    line = "  ".join(parts)
    if width and len(line) > width:
        line = line[: width - 1] + "…"
    return line


def running_line(state: ProgressState, number: int, params: Mapping[str, Any]) -> str:
    """One running trial: "#13 4m05s probe 3/8 at 12 req/s seqs=256 budget=4096"."""
    parts = [f"#{number}"]
    if number in state.running_since:
        parts.append(clock(state.running_since[number]))
    if state.probes.get(number):
        parts.append(state.probes[number])
    parts.append(short_params(params))
    return " ".join(parts)


def render_lines(state: ProgressState, width: int | None = None) -> list[str]:
    """The TTY display: the bar's line, then one line per running trial (every one is listed)."""
    lines = [render(state, width=width)]
    for number, params in state.running:
        line = "  running " + running_line(state, number, params)
        lines.append(line[: width - 1] + "…" if width and len(line) > width else line)
    return lines


class Progress:
    """Draws ProgressState on a stream: redrawn in place on a TTY, one line per change otherwise."""

    def __init__(
        self, stream: TextIO | None = None, tty: bool | None = None, every_s: float = PLAIN_EVERY_S
    ) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every_s = every_s  # plain mode: a line at least this often while trials run
        self._last_done = -1
        self._last_line = time.monotonic()
        self._drawn = 0  # lines on screen (TTY)

    def show(self, state: ProgressState) -> None:
        """Draw the state (plain mode prints when a trial finished, and every `every_s` while trials
        run, so logs stay short and still show a long trial is alive)."""
        if self.tty:
            width = shutil.get_terminal_size((120, 20)).columns - 1
            lines = render_lines(state, width=width)
            self._erase()
            self.stream.write("\n".join(lines))
            self._drawn = len(lines)
        elif state.done != self._last_done or (
            state.running and time.monotonic() - self._last_line >= self.every_s
        ):
            self.stream.write(render(state, bar=False) + "\n")
            self._last_line = time.monotonic()
        self._last_done = state.done
        self.stream.flush()

    def message(self, text: str) -> None:
        """A line above the bar (e.g. a warning), without breaking the redraw."""
        self._erase()
        self._drawn = 0
        self.stream.write(text + "\n")
        self.stream.flush()

    def _erase(self) -> None:
        """Clear what the TTY display drew (cursor to its first line, then clear to the end)."""
        if self.tty and self._drawn:
            up = f"\x1b[{self._drawn - 1}F" if self._drawn > 1 else ""
            self.stream.write(up + "\r\x1b[J")

    def close(self) -> None:
        """End the bar's line."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
        self._drawn = 0


def running_params(
    in_flight: Sequence[tuple[int, Any]], names: Sequence[str]
) -> list[tuple[int, dict[str, Any]]]:
    """(number, {tuned param: value}) of in-flight trials, for the progress line."""
    out = []
    for number, config in in_flight:
        values = config.params()
        out.append((number, {name: values[name] for name in names if name in values}))
    return out
