"""Why a real server failed: a FailureKind and a one-line message, from its exit code and its log.

The patterns are vLLM's own messages (verbatim, see docs/vllm.md, "Startup errors"), so the study
learns *why* a config failed (scheduler validation, no memory for KV, CUDA OOM...) and not just
that it did. A pattern's match is the message itself, so the line stays vLLM's own wording even
when vLLM wraps it in a log prefix or a pydantic ValidationError.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator

from autotune.core.errors import FailureKind

STARTUP = "startup"
BENCHMARK = "benchmark"
MAX_MESSAGE_CHARS = 400
LOG_HEADER = "# autotune: "  # the first line of a launched server's log: its command (process.py)

# CUDA OOM is a startup OOM while the server starts, an OOM under load once it serves.
_CUDA_OOM = re.compile(r"(?:torch\.)?(?:cuda\.)?OutOfMemoryError:[^\n]*|CUDA (?:error: )?out of memory[^\n]*")

# (kind, pattern) in priority order: the first pattern found anywhere in the log decides.
_PATTERNS: tuple[tuple[FailureKind, re.Pattern[str]], ...] = (
    (
        FailureKind.INVALID_CONFIG,
        re.compile(r"max_num_batched_tokens \(\d+\) is smaller than max_model_len \(\d+\)[^\n]*"),
    ),
    (
        FailureKind.INVALID_CONFIG,
        re.compile(r"max_num_batched_tokens \(\d+\) must be greater than or equal to max_num_seqs[^\n]*"),
    ),
    (FailureKind.KV_CACHE_OOM, re.compile(r"No available memory for the cache blocks[^\n]*")),
    (
        FailureKind.KV_CACHE_OOM,
        re.compile(r"To serve at least one request with the models?'?s? max seq len[^\n]*"),
    ),
    (FailureKind.STARTUP_OOM, re.compile(r"Free memory on device [^\n]*less than desired GPU memory[^\n]*")),
    (
        FailureKind.PORT_IN_USE,
        re.compile(r"[^\n]*(?:address already in use|port is already allocated)[^\n]*", re.IGNORECASE),
    ),
    # Other config validation: pydantic's wrapped ValueError, argparse rejecting a flag, a feature the
    # V1 engine does not implement (e.g. concurrent partial prefills).
    (FailureKind.INVALID_CONFIG, re.compile(r"(?<=Value error, )[^\n]*")),
    (FailureKind.INVALID_CONFIG, re.compile(r"(?<=NotImplementedError: )[^\n]*is not supported[^\n]*")),
    (FailureKind.INVALID_CONFIG, re.compile(r"error: (?:unrecognized arguments|argument )[^\n]*")),
)
# At startup a bare ValueError is vLLM rejecting its configuration (EngineArgs/VllmConfig checks).
_STARTUP_VALUE_ERROR = re.compile(r"(?<=ValueError: )[^\n]*")
# vLLM's log prefix, e.g. "(APIServer pid=1) ERROR 05-01 12:00:00 [core.py:12] ".
_LOG_PREFIX = re.compile(
    r"^\s*(?:\([^)]*\)\s*)?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d\s+[\d:.]+\s+\[[^\]]*\]\s*)?"
)
_ERROR_LINE = re.compile(r"\b\w*(?:Error|Exception)\b|\berror\b", re.IGNORECASE)
_PYDANTIC_SUFFIX = re.compile(r"\s*\[type=[^\]]*\]$")


def classify(exit_code: int | None, log_text: str, phase: str) -> tuple[FailureKind, str]:
    """The failure kind and a one-line message for a server that failed in `phase`.

    `exit_code` is the server's exit status (negative: killed by that signal; None: still running
    or never started), `log_text` its log (or the launcher's error), `phase` STARTUP or BENCHMARK.
    """
    oom = _last_match(_CUDA_OOM, log_text)
    for kind, pattern in _PATTERNS:
        message = _last_match(pattern, log_text)
        if message:
            return kind, message
    if oom:
        return (FailureKind.STARTUP_OOM if phase == STARTUP else FailureKind.OOM_UNDER_LOAD), oom
    if phase == STARTUP:
        value_error = _last_match(_STARTUP_VALUE_ERROR, log_text)
        if value_error:
            return FailureKind.INVALID_CONFIG, value_error
    message = _unclassified_message(exit_code, log_text, phase)
    # A server that exited (at startup too, e.g. at once) crashed, with its exit code in the message;
    # without an exit code (the launcher failed) it is an error.
    kind = FailureKind.CRASHED if exit_code is not None or phase != STARTUP else FailureKind.ERROR
    return kind, _one_line(message)


def describe_exit(exit_code: int | None) -> str:
    """'server exited with code 1', 'server was killed by SIGKILL', or 'server failed'."""
    if exit_code is None:
        return "server failed"
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        return f"server was killed by {name}"
    return f"server exited with code {exit_code}"


def _last_match(pattern: re.Pattern[str], text: str) -> str:
    """The last match of `pattern` in `text` as a clean one-line message, or ''."""
    last = None
    for last in pattern.finditer(text):  # noqa: B007 - only the last one is kept
        pass
    if last is None:
        return ""
    return _one_line(_PYDANTIC_SUFFIX.sub("", _LOG_PREFIX.sub("", last.group(0))))


def _unclassified_message(exit_code: int | None, log_text: str, phase: str) -> str:
    """How the server ended, with the log's last line that names an error; at startup without one, its
    last line: the reason a wrapper script gives (`chroot: cannot change root directory ...`) names no
    error. (Mid-run, the last line of a killed server is its latest request's, not a reason.)"""
    exit_text = describe_exit(exit_code)
    lines = _server_lines(log_text)
    last = ""
    for line in lines:
        last = last or line
        if not line.startswith("Traceback") and _ERROR_LINE.search(line):
            return f"{exit_text}: {line}"
    return f"{exit_text}; its last log line: {last}" if last and phase == STARTUP else exit_text


def _server_lines(text: str) -> Iterator[str]:
    """The server's non-empty log lines, last first, without their log prefix (not the header line
    autotune writes: the command it launched)."""
    for line in reversed(text.splitlines()):
        clean = _LOG_PREFIX.sub("", line).strip()
        if clean and not clean.startswith(LOG_HEADER):
            yield clean


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 3] + "..."
    return text
