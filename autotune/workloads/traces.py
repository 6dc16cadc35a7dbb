"""Request traces: rows of an Azure-format CSV (arrival time, prompt and output token counts).

Two are shipped: Azure's LLM inference trace 2023, conversation and code (CC-BY 4.0, Patel et al.,
"Splitwise", ISCA 2024; see autotune/workloads/data/AZURE_TRACE_README.md). A workload replays a trace's
timestamps or samples its rows at its own rate (autotune/workloads/spec.py).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autotune.core.errors import AutotuneError
from autotune.core.inputs import MAX_DATA_BYTES, regular_file
from autotune.core.values import MAX_TOKENS

DATA_DIR = Path(__file__).resolve().parent / "data"
TRACES = ("conv", "code")  # the shipped Azure LLM inference traces (see data/AZURE_TRACE_README.md)
COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")  # the Azure traces' header: a trace's
# An ISO date, optionally with a time of day to the minute, second or a fraction of one (T or a space),
# then optionally its zone: Z (UTC) or an offset from UTC (+01:00, -0530, +01)
_ISO = re.compile(
    r"(?P<local>\d{4}-\d\d-\d\d(?:[T ]\d\d:\d\d(?::\d\d(?:\.\d+)?)?)?)"
    r"(?:Z|(?P<sign>[+-])(?P<hours>\d\d)(?::?(?P<minutes>\d\d))?)?"
)
# The same without a zone, one a line: a whole column checked in one match
_PLAIN_ISO = re.compile(r"(?:\d{4}-\d\d-\d\d(?:[T ]\d\d:\d\d(?::\d\d(?:\.\d+)?)?)?\n)*")


@dataclass(frozen=True)
class TraceSource:
    """Rows of an Azure-format CSV (TIMESTAMP, ContextTokens, GeneratedTokens).

    TIMESTAMP: all seconds (numbers) or all ISO date-times, converted to UTC where they end in Z or an
    offset (+01:00); a bad one is an error naming its line.

    arrivals "trace": replay the timestamps from the first row at or after `start` seconds into the
    trace, divided by `time_scale` (2 = twice as fast). arrivals "rate": lengths only, rows from the
    first at or after `start` (the next `rows` of them, or all) sampled stratified by length, arrivals
    from the workload's rate. Rows with prompt + output > max_len are skipped.
    """

    name: str  # "conv" | "code" (shipped) or a path to a CSV with the same columns
    arrivals: str = "trace"
    time_scale: float = 1.0
    start: float = 0.0
    max_len: int | None = None
    rows: int | None = None  # arrivals "rate": sample only this many rows from `start` (None: all)

    def __post_init__(self) -> None:
        if self.arrivals not in ("trace", "rate"):
            raise AutotuneError(f"trace arrivals must be 'trace' or 'rate', got {self.arrivals!r}")
        if self.time_scale <= 0 or not math.isfinite(self.time_scale):
            raise AutotuneError(f"time_scale must be a positive number, got {self.time_scale:g}")
        if self.start < 0:
            raise AutotuneError(f"trace start must be >= 0 seconds, got {self.start:g}")
        if self.max_len is not None and self.max_len < 2:
            raise AutotuneError(f"trace max_len must be >= 2, got {self.max_len}")
        if self.arrivals == "rate" and self.time_scale != 1:
            raise AutotuneError("time_scale only applies to trace arrivals (arrivals: trace)")

    @property
    def path(self) -> Path:
        """The CSV file: a shipped trace by name, else the given path."""
        return DATA_DIR / f"{self.name}.csv" if self.name in TRACES else Path(self.name)

    def read(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(seconds since the first row, prompt lengths, output lengths), sorted by time, filtered."""
        regular_file(self.path, "trace", MAX_DATA_BYTES)
        try:
            # utf-8-sig: Excel's "CSV UTF-8" starts with a byte order mark, else glued to "TIMESTAMP"
            with self.path.open(newline="", encoding="utf-8-sig") as f:
                rows = list(csv.reader(f))
        except OSError as exc:
            raise AutotuneError(f"cannot read trace {self.path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise AutotuneError(f"trace {self.path} is not a text CSV file") from None
        missing = [name for name in COLUMNS if name not in (rows[0] if rows else [])]
        if missing:
            raise AutotuneError(
                f"trace {self.path}: its header has no {', '.join(missing)} (a trace is "
                f"{','.join(COLUMNS)} CSV)"
            )
        # csv.reader + column indexes: DictReader is 3x slower on the 19k-row conv trace
        columns = [rows[0].index(name) for name in COLUMNS]
        try:
            table = [[row[i] for i in columns] for row in rows[1:] if row]
            prompt = np.array([int(p) for _, p, _ in table], dtype=np.int64)
            output = np.array([int(o) for _, _, o in table], dtype=np.int64)
        except (IndexError, ValueError):  # parsed whole for speed; now find the line
            raise AutotuneError(_bad_row(self.path, rows, columns)) from None
        except OverflowError:  # numpy's int64 cannot hold it; nor can any max_model_len
            raise AutotuneError(f"trace {self.path} has a token count above {MAX_TOKENS:,}") from None
        if not table:
            raise AutotuneError(f"trace {self.path} has no rows")
        negative = np.flatnonzero((prompt < 0) | (output < 0))
        if negative.size:  # a corrupt row, not a request to leave out (as a 0-token one is)
            line = [i for i, row in enumerate(rows) if row][int(negative[0]) + 1] + 1
            raise AutotuneError(f"trace {self.path}:{line}: a negative token count")
        seconds = _seconds(self.path, [t.strip() for t, _, _ in table], rows)
        order = np.argsort(seconds, kind="stable")
        keep = (prompt[order] >= 1) & (output[order] >= 1)
        if self.max_len is not None:
            keep &= prompt[order] + output[order] <= self.max_len
        return seconds[order][keep], prompt[order][keep], output[order][keep]

    def kept(self) -> str:
        """The rows read() keeps from `start` on, for an error that finds too few: e.g. "after 0s with
        prompt and output of 1 token or more, prompt + output of at most max_len=5 tokens" (a filter must
        be named, or it looks like the trace)."""
        length = f", prompt + output of at most max_len={self.max_len} tokens" if self.max_len else ""
        return f"after {self.start:g}s with prompt and output of 1 token or more{length}"

    def describe(self) -> str:
        """E.g. "Azure conv trace x2"."""
        label = f"Azure {self.name} trace" if self.name in TRACES else f"trace {Path(self.name).name}"
        if self.arrivals == "rate":
            return f"{label} lengths"
        start = f" from {self.start:g}s" if self.start else ""
        return f"{label} x{self.time_scale:g}{start}"


def _bad_row(path: Path, rows: list[list[str]], columns: list[int]) -> str:
    """The first data row that is short of the header's columns or whose token counts are not whole
    numbers, named by its line (a CSV row is a line: no field of a trace spans two)."""
    for number, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) <= max(columns):
            return f"trace {path} line {number}: {len(row)} fields, fewer than the header's {len(rows[0])}"
        for name, index in zip(COLUMNS[1:], columns[1:], strict=True):
            try:
                int(row[index])
            except ValueError:
                return f"trace {path} line {number}: {name} {row[index]!r} is not a whole number"
    return f"trace {path} is not {','.join(COLUMNS)} CSV"


def _seconds(path: Path, texts: list[str], rows: list[list[str]]) -> np.ndarray:
    """The TIMESTAMPs `texts` of the data rows as seconds after the earliest: all numbers (seconds) or all
    ISO date-times, as the first row's; any other is an AutotuneError naming its line (of `rows`, the
    file's rows, header and blank ones too: a CSV row is a line, no field of these spans two)."""
    numeric = _number(texts[0]) is not None
    try:
        return _all_numbers(texts) if numeric else _all_date_times(texts)
    except ValueError:  # parsed whole for speed (a capacity search reads a trace per probe); now find why
        parse = _number if numeric else _date_time
        bad = next(i for i, text in enumerate(texts) if parse(text) is None)
        line = [n + 1 for n, row in enumerate(rows) if n and row][bad]
        raise AutotuneError(_bad_stamp(path, line, texts[bad], numeric)) from None


def _all_numbers(texts: list[str]) -> np.ndarray:
    """Seconds after the earliest of finite numbers; ValueError if any is not one."""
    values = np.array([float(text) for text in texts])  # as _number reads each (numpy's parser differs)
    if not np.isfinite(values).all():
        raise ValueError("not finite")
    return values - values.min()


def _all_date_times(texts: list[str]) -> np.ndarray:
    """Seconds after the earliest of ISO date-times, in UTC where they name a zone; ValueError if any is
    not one. Matched before numpy parses them: numpy reads "2" as the year 2."""
    if _PLAIN_ISO.fullmatch("\n".join(texts) + "\n"):  # no zone (the Azure traces): one match in all
        return _since_earliest(np.array([t.replace(" ", "T") for t in texts], dtype="datetime64[ns]"))
    matches = [_ISO.fullmatch(text) for text in texts]
    if not all(matches):
        raise ValueError("not an ISO date-time")
    found = [m for m in matches if m is not None]
    # the zone is applied here: numpy would too, but warns on every zoned string it parses
    times = np.array([m["local"].replace(" ", "T") for m in found], dtype="datetime64[ns]")
    if any(m["sign"] is not None for m in found):
        times = times - np.array([_utc_offset(m) for m in found], dtype="timedelta64[m]")
    return _since_earliest(times)


def _since_earliest(times: np.ndarray) -> np.ndarray:
    """datetime64 values as seconds after the earliest."""
    return (times - times.min()) / np.timedelta64(1, "s")


def _number(text: str) -> float | None:
    """A finite number of seconds, else None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _date_time(text: str) -> np.datetime64 | None:
    """An ISO date-time ("2023-11-16 18:15:46.6805900", as the Azure traces write it), in UTC if it
    names its zone, else None. Matched before numpy parses it: numpy reads "2" as the year 2."""
    match = _ISO.fullmatch(text.strip())
    if match is None:
        return None
    try:
        # the zone is applied here: numpy would too, but warns on every zoned string it parses
        local = np.datetime64(match["local"].replace(" ", "T"), "ns")
    except ValueError:  # well-formed but no date, e.g. month 13
        return None
    return local - _utc_offset(match)


def _utc_offset(match: re.Match[str]) -> np.timedelta64:
    """How far an _ISO match's zone is ahead of UTC (none or Z: zero)."""
    if match["sign"] is None:
        return np.timedelta64(0, "m")
    minutes = int(match["hours"]) * 60 + int(match["minutes"] or 0)
    return np.timedelta64(minutes if match["sign"] == "+" else -minutes, "m")


def _bad_stamp(path: Path, line: int, text: str, numeric: bool) -> str:
    """The error of a TIMESTAMP that is not of the first row's format."""
    where = f"trace {path} line {line}: TIMESTAMP {text!r}"
    if _number(text) is None and _date_time(text) is None:
        return f"{where} is neither seconds (a number) nor an ISO date-time (e.g. 2023-11-16 18:15:46.68)"
    first = "seconds (a number)" if numeric else "an ISO date-time"
    return f"{where} mixes formats: the first row's TIMESTAMP is {first}"
