"""JSONL workload files: one request per line, its prompt as text or a token count, its output length.

Without a tokenizer a text prompt's length is estimated at CHARS_PER_TOKEN characters per token, as the
simulated engine's server counts it (autotune/sim_server/parsing.py).
"""

from __future__ import annotations

import math
from pathlib import Path

from autotune.core.errors import AutotuneError
from autotune.core.inputs import MAX_DATA_BYTES, parse_json, read_text
from autotune.core.values import token_count

CHARS_PER_TOKEN = 4  # text prompts without a tokenizer: ~4 characters per token (English BPE rule of thumb)

# Length keys of other tools' exports (OpenAI request bodies and usage records, other benchmarks): a row
# that names a length so is refused, not run with the workload's default length in its place.
OTHER_LENGTH_KEYS = {
    "max_tokens": "output_len",
    "max_completion_tokens": "output_len",
    "completion_tokens": "output_len",
    "output_tokens": "output_len",
    "output_length": "output_len",
    "prompt_tokens": "prompt_len",
    "input_tokens": "prompt_len",
    "input_len": "prompt_len",
    "input_length": "prompt_len",
    "prompt_length": "prompt_len",
}


# Arrival times under common names: a row with one expects them replayed, which a JSONL workload does not
ARRIVAL_KEYS = ("timestamp", "arrival_time", "TIMESTAMP")
TEMPLATE_TOKENS = 16  # special tokens a server may add to a text (BOS, a chat template's headers)


def _check_tokens_fit_text(prompt_len: int, text: str, where: str) -> None:
    """A row's prompt_len stands for its text's token count (a tokenizer's, where the estimate is
    rough), but a server is sent the text: a byte-level BPE token holds at least one UTF-8 byte, so more
    tokens than bytes (plus a template's few) is a length the server never sees."""
    size = len(text.encode())
    if prompt_len > size + TEMPLATE_TOKENS:
        raise AutotuneError(
            f"{where}: prompt_len {prompt_len} is more tokens than its text's {size} bytes can hold: a "
            "server is sent the text, so give prompt_len without a text, or the text it counts"
        )


def read_jsonl(path: Path, needs_output_len: bool = False) -> list[tuple[int, int | None, str | None]]:
    """Rows of (prompt_len, output_len or None, prompt text or None) from a JSONL file.

    A row is {"prompt": text, "output_len": n?} or {"prompt_len": n, "output_len": n?}; other keys are
    ignored, except a length under another tool's name (OTHER_LENGTH_KEYS), which is refused. A text
    prompt's length is estimated as ceil(characters / 4) unless the row gives prompt_len.
    `needs_output_len` (the workload has no default): a row without one is an error, whether or not
    this load reaches it (a capacity probe with more requests would).
    """
    # JSON Lines ends records with \n alone: splitlines() would also cut a text at U+2028, U+0085, ...,
    # which JSON writers (ensure_ascii=False) leave raw inside strings
    # a byte order mark (Windows' "UTF-8 with BOM") is not part of the first record
    lines = read_text(path, "JSONL file", MAX_DATA_BYTES).removeprefix("\ufeff").split("\n")
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        row = parse_json(line, where)
        if not isinstance(row, dict):
            raise AutotuneError(f"{where}: each line must be a JSON object")
        other = next((key for key in OTHER_LENGTH_KEYS if key in row), None)
        if other is not None:
            raise AutotuneError(
                f"{where}: {other} is not read: name the length {OTHER_LENGTH_KEYS[other]} (tokens)"
            )
        stamp = next((key for key in ARRIVAL_KEYS if key in row), None)
        if stamp is not None:
            raise AutotuneError(
                f"{where}: {stamp} is not read: a JSONL workload's requests arrive at its request_rate (a "
                "trace: CSV replays its timestamps)"
            )
        text = row.get("prompt")
        if text is not None and not isinstance(text, str):
            raise AutotuneError(f"{where}: prompt must be a string")
        if text == "":
            raise AutotuneError(f"{where}: prompt is empty (vLLM refuses an empty prompt)")
        if "prompt_len" in row:
            prompt_len = token_count(row["prompt_len"], f"{where}: prompt_len")
            if text is not None:
                _check_tokens_fit_text(prompt_len, text, where)
        elif text is not None:
            prompt_len = max(1, math.ceil(len(text) / CHARS_PER_TOKEN))
        else:
            raise AutotuneError(f"{where}: a row needs prompt (text) or prompt_len (tokens)")
        output_len = token_count(row["output_len"], f"{where}: output_len") if "output_len" in row else None
        if output_len is None and needs_output_len:
            raise AutotuneError(f"{where}: a row has no output_len and the workload sets no output_len")
        rows.append((prompt_len, output_len, text))
    if not rows:
        raise AutotuneError(f"JSONL file {path} has no rows")
    return rows
