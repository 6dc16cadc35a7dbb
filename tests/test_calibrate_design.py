"""The configs `autotune calibrate --backend` designs: each one vLLM would start, and an error about a
config calibrate chose does not blame --set."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import pytest

from autotune.calibrate import campaign
from autotune.calibrate.campaign import Measured, Target, on_backend
from autotune.calibrate.design import ConfigUnderTest, second_config_flags
from autotune.core.errors import AutotuneError
from autotune.sim.calibration import DEFAULT_CALIBRATION

QWEN_14B = "Qwen/Qwen3-14B"


class Launched(Exception):
    """The fake backend's launch: the campaign got past its planning."""


class FakeBackend:
    """A backend whose every launch raises Launched (nothing runs)."""

    @contextmanager
    def session(self, config: Any, gpu_ids: list[int]) -> Any:
        raise Launched(config)
        yield


@pytest.mark.parametrize("max_len", [None, 8192])
def test_with_chunked_prefill_off_the_second_configs_budget_holds_max_model_len(max_len: int | None) -> None:
    """It picked a 2048-token budget, below max_model_len: vLLM does not start that config."""
    first: dict[str, Any] = {"enable_chunked_prefill": False}
    if max_len:
        first["max_model_len"] = max_len
    flags = second_config_flags(first, QWEN_14B, "A100")
    assert flags["max_num_batched_tokens"] >= (max_len or 40960), flags


def test_with_chunked_prefill_off_the_backend_campaign_gets_to_its_launches() -> None:
    """`--set enable_chunked_prefill=false` was refused with an error that blamed --set for a config
    calibrate chose."""
    target = Target(QWEN_14B, "A100", {"enable_chunked_prefill": False})
    with pytest.raises(Launched):
        on_backend(FakeBackend(), target, [0], 10.0, DEFAULT_CALIBRATION, lambda line: None, Measured())


def test_a_chosen_config_that_cannot_start_is_skipped_and_noted_the_users_is_refused() -> None:
    """A config calibrate chose that the prior predicts does not start is skipped with a note naming it
    as calibrate's (28 GiB of weights in 30 % of an H100); the user's own config is refused."""
    lines: list[str] = []
    notes: list[str] = []
    said = (lines.append, notes)
    ok = ConfigUnderTest("defaults", {"max_model_len": 4096}, 4096)
    small = {"max_model_len": 4096, "gpu_memory_utilization": 0.3}
    chosen = ConfigUnderTest("budget", small, 4096, chosen=True)
    target = Target(QWEN_14B, "H100")
    planned = campaign._planned([ok, chosen], (0.6, 0.3), target, QWEN_14B, 10.0, DEFAULT_CALIBRATION, said)
    assert [c.label for c, _ in planned] == ["defaults"]
    assert len(notes) == 1 and "config budget" in notes[0] and "one calibrate chose" in notes[0], notes
    assert "--set" not in notes[0] and notes[0] in lines
    users = ConfigUnderTest("defaults", small, 4096)
    with pytest.raises(AutotuneError, match="check --model, --gpu and --set"):
        campaign._planned([users], (1.0,), target, QWEN_14B, 10.0, DEFAULT_CALIBRATION, said)
