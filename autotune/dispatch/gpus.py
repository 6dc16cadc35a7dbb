"""`--gpus`: which devices a run may use."""

from __future__ import annotations

from autotune.core.errors import AutotuneError

__all__ = ["parse_gpus"]


def parse_gpus(text: str | None) -> list[int]:
    """`--gpus 0,1,2,3` (ids) or `--gpus 4` (a count) -> device ids; AutotuneError on bad input.

    `--gpus 0` is device 0 (as CUDA_VISIBLE_DEVICES=0 is): a count of zero GPUs runs nothing.
    """
    if not text:
        return []
    text = text.strip()
    if text == "0":
        return [0]
    try:
        if "," in text:
            ids = [int(part) for part in text.split(",") if part.strip()]
        else:
            count = int(text)
            if count < 1:
                raise ValueError
            ids = list(range(count))
    except ValueError:
        raise AutotuneError(f"bad --gpus {text!r}: expected a count (4) or device ids (0,1,2,3)") from None
    if len(set(ids)) != len(ids) or any(i < 0 for i in ids):
        raise AutotuneError(f"bad --gpus {text!r}: device ids must be distinct and >= 0")
    return ids
