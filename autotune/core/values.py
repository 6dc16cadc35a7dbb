"""Checked values, one helper per kind (numbers, counts, seeds, names): each bad value is one
AutotuneError line. User files (workload YAML, JSONL rows) and command-line flags (through
`autotune.core.inputs.arg`) share them, so a value means the same wherever it is given.
"""

from __future__ import annotations

import math
import urllib.parse
from typing import Any

from autotune.core.errors import AutotuneError
from autotune.core.secrets import masked

# numpy's seeds are 32-bit: a larger --seed would end in numpy's ValueError mid-run.
MAX_SEED = 2**32 - 1
# A name that becomes a folder (a study under runs/): file systems take 255 bytes per name, and the
# run's own files add their names to it.
MAX_NAME_CHARS = 100
# Request rates a load can have (req/s): below one request per 1000 s a run never ends (and 1e-300
# overflows the arrival times to inf), above 1e6 req/s no server keeps up; "inf" sends all at once.
MIN_RATE, MAX_RATE = 1e-3, 1e6
# The most tokens one length can have: vLLM takes max_model_len as a 32-bit int, so no model serves a
# longer request (and a count past 2**63 would not fit the int64 arrays lengths are kept in).
MAX_TOKENS = 2**31 - 1


def number(value: Any, what: str) -> float:
    """A float; "inf" and YAML's .inf are accepted for unbounded rates."""
    if isinstance(value, bool) or value is None:
        raise AutotuneError(f"{what} must be a number, got {value!r}")
    try:
        checked = float(value)
    except (TypeError, ValueError, OverflowError):
        raise AutotuneError(f"{what} must be a number, got {shown(value)}") from None
    if math.isnan(checked):
        raise AutotuneError(f"{what} must be a number, got {shown(value)}")
    return checked


def finite_number(value: Any, what: str, low: float = -math.inf, high: float = math.inf) -> float:
    """A finite number in [low, high] (a delay, a price, a limit)."""
    checked = number(value, what)
    if not math.isfinite(checked):
        raise AutotuneError(f"{what} must be a finite number, got {shown(value)}")
    if not low <= checked <= high:
        raise AutotuneError(f"{what} must be between {low:g} and {high:g}, got {shown(value)}")
    return checked


def positive_number(value: Any, what: str, high: float = math.inf) -> float:
    """A finite number > 0 (and <= `high`): a rate, a price, a timeout."""
    checked = finite_number(value, what)
    if checked <= 0:
        raise AutotuneError(f"{what} must be positive, got {shown(value)}")
    if checked > high:
        raise AutotuneError(f"{what} must be at most {high:g}, got {shown(value)}")
    return checked


def rate(value: Any, what: str) -> float:
    """A request rate in req/s: MIN_RATE to MAX_RATE, or inf (every request at once)."""
    checked = number(value, what)
    if checked == math.inf:
        return checked
    if checked <= 0:
        raise AutotuneError(f"{what} must be > 0 (or inf), got {shown(value)}")
    return finite_number(checked, what, MIN_RATE, MAX_RATE)


def whole_number(value: Any, what: str) -> int:
    """An integer (3 and 3.0 are; 3.5, inf and true are not)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value  # exact, however large (a float would round 2**63)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    checked = number(value, what)
    if not math.isfinite(checked) or checked != int(checked):
        raise AutotuneError(f"{what} must be a whole number, got {shown(value)}")
    return int(checked)


def bounded_int(value: Any, what: str, low: int, high: int | None = None) -> int:
    """A whole number in [low, high] (no upper bound when `high` is None)."""
    checked = whole_number(value, what)
    if checked < low:
        raise AutotuneError(f"{what} must be >= {low}, got {shown(value)}")
    if high is not None and checked > high:
        raise AutotuneError(f"{what} must be <= {high:,}, got {shown(value)}")
    return checked


def positive_int(value: Any, what: str) -> int:
    """A whole number >= 1."""
    return bounded_int(value, what, 1)


def token_count(value: Any, what: str) -> int:
    """A number of tokens (a prompt or output length): 1 to MAX_TOKENS."""
    return bounded_int(value, what, 1, MAX_TOKENS)


def seed(value: Any, what: str = "--seed") -> int:
    """A random seed: 0 to 2**32 - 1, what numpy takes."""
    return bounded_int(value, what, 0, MAX_SEED)


def text(value: Any, what: str) -> str:
    """Non-empty text on one line (a model, a GPU, a study, a URL): "" never means "the default"."""
    if not isinstance(value, str) or not value.strip():
        raise AutotuneError(f"{what} must not be empty")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise AutotuneError(f"{what} must be one line of text without control characters")
    return value


def url(value: Any, what: str) -> str:
    """An http(s) URL with a host (a server to reach); the message never shows its password."""
    checked = text(value, what)
    try:
        parts = urllib.parse.urlsplit(checked)
        parts.port  # noqa: B018  (raises ValueError on a port that is not one)
    except ValueError as exc:
        raise AutotuneError(f"bad {what} {masked(checked)!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AutotuneError(f"bad {what} {masked(checked)!r}: expected http(s)://HOST[:PORT]")
    return checked


def server_url(value: Any, what: str) -> str:
    """A running server's base URL (`url`), the endpoints' paths (/v1/models, /health, /metrics) to be
    appended: an OpenAI client's base URL, which ends in /v1, is taken without it."""
    return url(value, what).rstrip("/").removesuffix("/v1")


def file_name(value: Any, what: str) -> str:
    """A name that becomes a folder: letters, digits, '-', '_' and '.', at most MAX_NAME_CHARS."""
    checked = text(value, what)
    if not all(c.isascii() and (c.isalnum() or c in "-_.") for c in checked) or not checked.strip("."):
        raise AutotuneError(f"bad {what} {shown(value)}: use letters, digits, '-', '_' and '.'")
    if len(checked) > MAX_NAME_CHARS:
        raise AutotuneError(f"bad {what}: {len(checked)} characters, at most {MAX_NAME_CHARS}")
    return checked


def shown(value: Any, limit: int = 40) -> str:
    """A value as an error message shows it: repr, a long one (400 digits) cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def brief(text: str, limit: int = 200) -> str:
    """`text` in at most `limit` characters: its whole sentences that fit, else its whole words and
    "...". A reason cut mid-word ("config.json). Th") reads as a garbled message."""
    if len(text) <= limit:
        return text
    end = text.rfind(". ", 0, limit)
    if end > 0:
        return text[: end + 1]
    cut = text[: limit - 3]
    if text[limit - 3] != " ":  # inside a word: drop its start (unless it is the only word)
        cut = cut.rpartition(" ")[0] or cut
    return cut.rstrip(" ,;:(") + "..."


def fmt_number(value: Any) -> str:
    """A figure as people read it: 12,571 / 95.8 / 0.82; "" for a missing value."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"


def counted(n: int, noun: str) -> str:
    """`n` and `noun`, plural unless n is 1: "1 trial", "0 trials", "3 duplicate suggestions"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
