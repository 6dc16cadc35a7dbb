"""Startup screening: clear memory failures are told without launching; borderline ones still launch."""

from __future__ import annotations

import csv
import dataclasses
import sys
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import optuna
import pytest
import ray.cloudpickle

from autotune.backends.sim import SimBackend, SimSession
from autotune.cli import main
from autotune.core.config import EngineConfig
from autotune.core.errors import AutotuneError, EngineStartupError, FailureKind
from autotune.dispatch.executor import Executor
from autotune.measure.slo import parse_slos
from autotune.sim.engine import SimEngine
from autotune.tune.objectives import FAILED_KEY, load_objectives
from autotune.tune.run_records import TunerOptions
from autotune.tune.samplers import make_sampler
from autotune.tune.screen import (
    PREFIX,
    Margins,
    check_gpu_count,
    check_tensor_parallel,
    describe,
    make_screen,
)
from autotune.tune.space import SearchSpace, load_space, space_from_dict
from autotune.tune.tuner import Tuner
from autotune.workloads.files import load_workload

# Ray workers cannot import this test module: ship its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
OBJECTIVES = load_objectives("default")
SLOS = parse_slos("ttft_p99=5s")
# Llama-3.1-8B on L4 at max_model_len 8192: 0.5 leaves no KV memory at all (screened), 0.75 fails to
# start in the model by less than the margin (launched), 0.9 (vLLM's default) starts.
L4_UTILIZATIONS = [0.5, 0.75, 0.9]


def startup_failure(config: EngineConfig, gpu: str) -> EngineStartupError | None:
    """What the simulated engine says when it starts `config` (None: it starts)."""
    try:
        SimEngine(config, gpu)
    except EngineStartupError as exc:
        return exc
    return None


@pytest.mark.parametrize(
    ("model", "gpu", "flags", "kind"),
    [
        (LLAMA_70B, "L4", {}, FailureKind.STARTUP_OOM),  # the weights alone do not fit
        (LLAMA_8B, "L4", {"gpu_memory_utilization": 0.5}, FailureKind.KV_CACHE_OOM),  # no KV memory
        (LLAMA_8B, "H100", {"gpu_memory_utilization": 0.98}, FailureKind.STARTUP_OOM),  # CUDA graphs
        (LLAMA_8B, "H100", {"gpu_memory_utilization": 0.995}, FailureKind.INVALID_CONFIG),  # free memory
    ],
)
def test_clear_failures_are_screened_with_vllms_message(
    model: str, gpu: str, flags: dict[str, float], kind: FailureKind
) -> None:
    config = EngineConfig(model=model, max_model_len=8192).replace(**flags)
    screening = make_screen(model, gpu).check(config)  # type: ignore[union-attr]
    engine_error = startup_failure(config, gpu)
    assert screening is not None and engine_error is not None
    assert screening.kind == kind == FailureKind(engine_error.kind)
    assert screening.message == PREFIX + str(engine_error)
    result = screening.result(config)
    assert (result.failure, result.gpu_seconds, result.benchmark) == (kind, 0.0, None)


@pytest.mark.parametrize(
    ("model", "gpu", "flags"),
    [
        # KV short by ~2 % of the A100's memory (margin 5 %)
        (LLAMA_70B, "A100-80GB", {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.86}),
        (LLAMA_8B, "L4", {"gpu_memory_utilization": 0.75}),
        # CUDA graphs + sampler warm-up need ~110 % of the memory left outside the budget (margin 125 %)
        (LLAMA_8B, "H100", {"gpu_memory_utilization": 0.975}),
    ],
)
def test_borderline_failures_inside_the_margin_still_launch(
    model: str, gpu: str, flags: dict[str, float]
) -> None:
    config = EngineConfig(model=model, max_model_len=8192).replace(**flags)
    assert startup_failure(config, gpu) is not None  # the model predicts a failure...
    assert make_screen(model, gpu).check(config) is None  # type: ignore[union-attr]  # ...within the margin
    exact = make_screen(model, gpu, Margins(kv_fraction=0.0, capture_factor=1.0))
    assert exact is not None and exact.check(config) is not None  # without margins it would be screened


def test_configs_that_start_are_never_screened() -> None:
    screen = make_screen(LLAMA_8B, "H100")
    assert screen is not None
    for utilization in (0.5, 0.9, 0.97):
        for seqs, budget in ((32, 512), (1024, 8192), (1024, 16384)):
            config = EngineConfig(
                model=LLAMA_8B,
                max_num_seqs=seqs,
                max_num_batched_tokens=budget,
                gpu_memory_utilization=utilization,
            )
            assert startup_failure(config, "H100") is None
            assert screen.check(config) is None


def test_invalid_flags_are_left_to_the_validity_rules() -> None:
    screen = make_screen(LLAMA_70B, "L4")
    assert screen is not None
    assert screen.check(EngineConfig(model=LLAMA_70B, max_model_len=8192)) is not None
    # the same hopeless config with a block size vLLM rejects first: that is not a memory failure
    assert screen.check(EngineConfig(model=LLAMA_70B, max_model_len=8192, block_size=12)) is None


def test_unknown_model_or_gpu_skips_screening() -> None:
    assert make_screen("acme/NotInTheCatalog-3B", "H100") is None
    assert make_screen(LLAMA_8B, "RTX-9999") is None
    assert "skipped" in describe(None)
    assert "off" in describe(make_screen(LLAMA_8B, "H100"), enabled=False)
    assert "5%" in describe(make_screen(LLAMA_8B, "H100"))


def test_the_tp_check_counts_one_requests_kv_cache_and_refuses_only_what_cannot_start() -> None:
    """70B's weights fit an H200 (131 of 140 GiB), not with the KV cache of one 8192-token request at the
    small space's highest utilization (0.95): refused up front. At the leanest flags, the longest
    max_model_len the engine starts with passes the check, and one block more is refused."""
    with pytest.raises(AutotuneError, match=r"does not fit on one H200 .* \(TP >= 2\), e\.g\. --space tp$"):
        check_tensor_parallel(load_space("small").with_overrides(model=LLAMA_70B, gpu="H200"))
    lean = {"max_num_seqs": 16, "max_num_batched_tokens": 1024, "gpu_memory_utilization": 0.95}

    def starts(max_len: int) -> bool:
        return startup_failure(EngineConfig(model=LLAMA_70B, max_model_len=max_len, **lean), "H200") is None

    def space_at(max_len: int) -> SearchSpace:
        fixed = {"model": LLAMA_70B, "gpu": "H200", "max_model_len": max_len, **lean}
        return space_from_dict(
            {"fixed": fixed, "params": {"block_size": {"type": "categorical", "choices": [16]}}}
        )

    longest = max(n for n in range(16, 8192, 16) if starts(n))
    assert not starts(longest + 16)
    check_tensor_parallel(space_at(longest))  # barely fits: never refused
    with pytest.raises(AutotuneError, match="TP >= 2"):
        check_tensor_parallel(space_at(longest + 16))


def test_gpu_count_refuses_a_space_none_of_whose_configs_fits_and_notes_one_some_fit() -> None:
    tp = load_space("tp")  # tensor_parallel_size 2 or 4
    with pytest.raises(
        AutotuneError, match=r"^tensor_parallel_size 2\.\.4 needs 2\.\.4 GPUs; --gpus gives 1$"
    ):
        check_gpu_count(tp, 1)
    assert check_gpu_count(tp, 2) == (
        "tensor_parallel_size 2..4 needs 2..4 GPUs; --gpus gives 2: configs needing more are not launched"
    )
    assert check_gpu_count(tp, 4) is None
    assert check_gpu_count(load_space("small"), 1) is None  # no parallel size: one GPU a config


class RecordingBackend(SimBackend):
    """The sim backend on an L4, writing every config it is asked to start to a file (from the Ray worker)."""

    def __init__(self, calls: Path) -> None:
        super().__init__("L4")
        self.calls = calls

    def session(
        self, config: EngineConfig, gpu_ids: Sequence[int] = (), trial_dir: Path | None = None
    ) -> AbstractContextManager[SimSession]:
        with open(self.calls, "a") as fh:
            fh.write(f"{config.gpu_memory_utilization}\n")
        return super().session(config, gpu_ids, trial_dir)


def l4_space_dict() -> dict[str, object]:
    return {
        "fixed": {"model": LLAMA_8B, "gpu": "L4", "max_model_len": 8192},
        "params": {"gpu_memory_utilization": {"type": "categorical", "choices": L4_UTILIZATIONS}},
    }


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.parametrize("screened", [True, False])
def test_tuner_never_launches_a_screened_config(tmp_path: Path, screened: bool) -> None:
    space = space_from_dict(l4_space_dict())
    calls = tmp_path / "calls.txt"
    # One short run at a fixed load per launch: what is tested is which configs launch, not their capacity.
    workload = dataclasses.replace(load_workload("chat"), num_requests=40, load="fixed")
    executor = Executor(RecordingBackend(calls), workload, SLOS, cpu_slots=1)
    study = optuna.create_study(
        directions=OBJECTIVES.directions, sampler=make_sampler("grid", space.grid(), 0, 10)
    )
    study.enqueue_trial({"gpu_memory_utilization": 0.9}, user_attrs={"baseline": True})
    screen = make_screen(LLAMA_8B, "L4") if screened else None
    tuner = Tuner(study, space, OBJECTIVES, SLOS, executor, TunerOptions(n_trials=10), screen=screen)
    summary = tuner.run()

    launched = sorted(float(line) for line in calls.read_text().split())
    by_utilization = {t.params["gpu_memory_utilization"]: t for t in study.trials}
    assert sorted(by_utilization) == L4_UTILIZATIONS  # the grid was walked to its end
    if not screened:
        assert launched == L4_UTILIZATIONS and summary.screened == 0
        assert by_utilization[0.5].user_attrs["failure"] == "kv_cache_oom"  # found out by launching it
        return
    assert launched == [0.75, 0.9]  # 0.75 fails in the model too, but inside the margin: it launches
    assert by_utilization[0.75].user_attrs["failure"] == "kv_cache_oom"
    assert by_utilization[0.75].user_attrs["gpu_seconds"] > 0
    attrs = by_utilization[0.5].user_attrs
    assert attrs["screened"] is True and attrs["launched"] is False and attrs["gpu_seconds"] == 0.0
    assert attrs["failure"] == "kv_cache_oom" and not attrs["feasible"]
    assert attrs["message"].startswith(PREFIX + "No available memory for the cache blocks")
    assert by_utilization[0.5].constraints[FAILED_KEY] > 0  # told as a violation
    counted = [
        t for t in study.trials if t.user_attrs.get("launched", True) and "duplicate_of" not in t.user_attrs
    ]
    assert (summary.completed, summary.rejected, summary.screened) == (len(counted), 1, 1)


@pytest.mark.usefixtures("ray_cluster")
def test_run_reports_the_screened_trial_and_no_screen_launches_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    space_file = tmp_path / "l4.yaml"
    space_file.write_text(yaml.safe_dump(l4_space_dict()))
    common = ["run", "--space", str(space_file), "--sampler", "grid", "--n-trials", "5", "--quiet"]
    common += ["--runs-dir", str(tmp_path), "--slo", "ttft_p99=5s"]
    rows = {}
    for name, extra in (("screened", []), ("unscreened", ["--no-screen"])):
        assert main([*common, "--study", name, *extra]) == 0
        with (tmp_path / name / "trials.csv").open() as fh:
            rows[name] = {float(r["gpu_memory_utilization"]): r for r in csv.DictReader(fh)}
    err = capsys.readouterr().err
    assert "startup screening on" in err and "startup screening off (--no-screen)" in err

    screened = rows["screened"][0.5]
    assert screened["reason"] == "kv_cache_oom" and float(screened["gpu_seconds"]) == 0.0
    assert screened["message"].startswith(PREFIX + "No available memory for the cache blocks")
    launched = rows["unscreened"][0.5]
    assert launched["reason"] == "kv_cache_oom" and float(launched["gpu_seconds"]) > 0
    assert not launched["message"].startswith(PREFIX)
