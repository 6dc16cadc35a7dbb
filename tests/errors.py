"""What a user sees of an AutotuneError: its one line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from autotune.core.errors import AutotuneError


def one_line_error(call: Callable[[], Any]) -> str:
    """The message of the AutotuneError `call` raises, checked to be one non-empty line."""
    with pytest.raises(AutotuneError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and message
    return message
