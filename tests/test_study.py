"""The study: constraints told in a fixed order, failures as violations, the front, the samplers, and
the tuner's dedupe and resume. Opening a study, and what a resume must keep: tests/test_study_resume.py.

Its helpers (`build_run`, `ok`, `settings`, ...) make the finished studies other test files read."""

from __future__ import annotations

import dataclasses
import signal
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.backends.sim import SimBackend
from autotune.core.config import EngineConfig
from autotune.core.errors import AutotuneError, FailureKind
from autotune.dispatch.executor import Executor
from autotune.measure.metrics import BenchmarkResult
from autotune.measure.result import TrialResult
from autotune.measure.slo import parse_slos
from autotune.outputs.run_info import RunInfo
from autotune.tune.front import pareto_front, recommend
from autotune.tune.objectives import FAILED_KEY, KEPT_UP_KEY, Objective, ObjectiveSet, load_objectives
from autotune.tune.progress import ProgressState
from autotune.tune.run_records import TunerOptions
from autotune.tune.samplers import GP_MODULES, auto_sampler, fallback_note, make_sampler
from autotune.tune.space import space_from_dict
from autotune.tune.study import StudySettings, config_key, records, tell_result
from autotune.tune.study_open import open_study, sqlite_url, start_study
from autotune.tune.tuner import MAX_DUPLICATES_IN_A_ROW, Tuner
from autotune.workloads.files import load_workload

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
OBJECTIVES = load_objectives("default")
SLOS = parse_slos("ttft_p99=2s")


def settings(**changes: object) -> StudySettings:
    base = StudySettings(
        objectives=OBJECTIVES.names,
        directions=OBJECTIVES.directions,
        slos=[str(s) for s in SLOS],
        model=MODEL,
        gpu="H100",
        workload="chat",
        backend="sim",
    )
    return dataclasses.replace(base, **changes)


def bench(throughput: float, ttft_ms: float, itl_ms: float) -> BenchmarkResult:
    """A benchmark with the given headline figures (the rest consistent enough for the tuner)."""
    data = {"duration": 10.0, "completed": 100, "failed": 0, "total_input_tokens": 1000}
    data |= {"total_output_tokens": int(throughput * 10), "request_throughput": 10.0, "request_goodput": None}
    data |= {"output_throughput": throughput, "total_token_throughput": throughput + 100}
    for metric, value in (("ttft", ttft_ms), ("tpot", itl_ms), ("itl", itl_ms), ("e2el", ttft_ms * 2)):
        for stat in ("mean", "median", "p90", "p99"):
            data[f"{stat}_{metric}_ms"] = value
    return BenchmarkResult.from_dict(data)


def build_run(
    run_dir: Path, outcomes: list[tuple[dict, TrialResult | None]], objectives: ObjectiveSet = OBJECTIVES
) -> optuna.Study:
    """A finished study on SQLite in run_dir (with run.json), one trial per (params, result), optimising
    `objectives` (the default run's unless given); params "baseline" and "guide" (a guided run's pick:
    the guide's attrs) are the trial's user attrs, not flags."""
    run_dir.mkdir(parents=True, exist_ok=True)
    storage = sqlite_url(run_dir)
    chosen = settings(objectives=objectives.names, directions=objectives.directions)
    study = open_study("unit", storage, chosen, optuna.samplers.RandomSampler(seed=0), resume=False)
    for params, result in outcomes:
        trial = study.ask()
        if params.get("baseline"):
            trial.set_user_attr("baseline", True)
        if params.get("guide"):
            trial.set_user_attr("guide", params["guide"])
        flags = {k: v for k, v in params.items() if k not in ("baseline", "guide")}
        config = EngineConfig(model=MODEL).replace(**flags)
        result = result or TrialResult(
            config=config, failure=FailureKind.KV_CACHE_OOM, message="No available memory"
        )
        result.config = config
        tell_result(study, trial, result, objectives, SLOS, config_key(config))
    RunInfo(study="unit", storage=storage, directory=run_dir).save()
    return study


def ok(throughput: float, ttft_ms: float, itl_ms: float) -> TrialResult:
    return TrialResult(config=EngineConfig(model=MODEL), benchmark=bench(throughput, ttft_ms, itl_ms))


def test_a_trials_gpu_time_counts_every_gpu_of_its_replica(tmp_path: Path) -> None:
    """TP 2 x PP 2: a replica of four GPUs, so 10 s of its server is 40 GPU-seconds."""
    result = ok(4000, 1500, 20)
    result.startup_s, result.benchmark_s = 4.0, 6.0
    study = build_run(tmp_path, [({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, result)])
    assert study.trials[0].user_attrs["gpu_seconds"] == 40.0
    # and a per-GPU objective divides by the same four
    per_gpu = Objective("output_throughput_per_gpu", "maximize")
    config = EngineConfig(model=MODEL).replace(tensor_parallel_size=2, pipeline_parallel_size=2)
    assert per_gpu.value(dataclasses.replace(result, config=config)) == 1000.0


def test_constraints_fixed_order_and_failures_are_violations(tmp_path: Path) -> None:
    study = build_run(
        tmp_path,
        [
            ({"max_num_seqs": 256, "baseline": True}, ok(4000, 1500, 20)),  # feasible
            ({"max_num_seqs": 512}, ok(5000, 2500, 30)),  # violates the 2 s TTFT
            ({"max_num_seqs": 1024}, None),  # failed to start
        ],
    )
    feasible, violating, failed = study.trials
    for trial in study.trials:
        # the same keys in the same order on every trial (GPSampler needs it)
        assert list(trial.constraints) == list(study.trials[0].constraints)
        assert set(trial.constraints) == {"ttft_p99", KEPT_UP_KEY, FAILED_KEY}
        assert trial.state == TrialState.COMPLETE  # failures are COMPLETE + violation, so samplers learn
    # a run that cannot tell whether it kept up (no steadiness in its info) is not held against it
    assert feasible.constraints == {"ttft_p99": pytest.approx(-0.25), KEPT_UP_KEY: 0.0, FAILED_KEY: 0.0}
    assert feasible.user_attrs["feasible"] is True and feasible.user_attrs["margin_ttft_p99"] == -0.25
    assert (
        violating.constraints["ttft_p99"] == pytest.approx(0.25) and violating.user_attrs["feasible"] is False
    )
    assert failed.constraints[FAILED_KEY] == 1.0 and all(v > 0 for v in failed.constraints.values())
    assert (
        failed.user_attrs["failure"] == "kv_cache_oom"
        and failed.user_attrs["message"] == "No available memory"
    )
    # pessimistic but on the plots' scale: 10% past the worst measured (TTFT: the worst is 2.5 s)
    assert failed.values == [0.0, pytest.approx(2750.0), pytest.approx(33.0)]
    assert study.metric_names == ["output_throughput", "p99_ttft_ms", "p99_itl_ms"]
    # Optuna's own view agrees: only the feasible trial is on the constrained front
    assert [t.number for t in study.best_trials] == [0]


def test_pareto_and_recommendation_rules(tmp_path: Path) -> None:
    study = build_run(
        tmp_path,
        [
            ({"max_num_seqs": 64, "baseline": True}, ok(4000, 1500, 20)),
            ({"max_num_seqs": 128}, ok(5000, 1800, 40)),  # front: best throughput
            ({"max_num_seqs": 256}, ok(4990, 1200, 30)),  # front: within 1% of #1, lower latency -> wins
            ({"max_num_seqs": 512}, ok(3000, 1900, 50)),  # dominated
            ({"max_num_seqs": 1024}, ok(9000, 2500, 10)),  # infeasible: never recommended
            # front, tied too, 4% less TTFT than #2 but 50% more ITL: loses (latencies weigh together)
            ({"max_num_seqs": 320}, ok(4995, 1150, 45)),
        ],
    )
    recs = records(study)
    maximize = [True, False, False]
    assert {r.number for r in pareto_front(recs, maximize)} == {0, 1, 2, 5}
    assert recommend(recs, maximize).number == 2
    assert recommend([r for r in recs if r.number != 2], maximize).number == 5  # vs #1: better on both


def test_records_show_float_params_without_optunas_step_noise() -> None:
    study = optuna.create_study()
    noisy = 0.8 + 3 * 0.05  # 0.9500000000000001: what a float step makes of 0.95
    study.add_trial(
        optuna.trial.create_trial(
            params={"gpu_memory_utilization": noisy},
            distributions={"gpu_memory_utilization": optuna.distributions.FloatDistribution(0.5, 1.0)},
            user_attrs={"config": {"gpu_memory_utilization": 0.95}},
            value=1.0,
        )
    )
    assert study.trials[0].params["gpu_memory_utilization"] == noisy != 0.95
    assert records(study)[0].params["gpu_memory_utilization"] == 0.95


@pytest.mark.parametrize("missing", ["torch", "scipy"])
def test_gp_sampler_falls_back_to_tpe_without_its_dependencies(
    missing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A None entry in sys.modules makes `import` raise ModuleNotFoundError, as if it were not installed.
    for module in [m for m in GP_MODULES if m.split(".")[0] == missing] + [missing]:
        monkeypatch.setitem(sys.modules, module, None)
    sampler = make_sampler("gp", {"max_num_seqs": [16, 32]}, 0, 20)
    assert isinstance(sampler, optuna.samplers.TPESampler)
    assert "gp sampler needs PyTorch and SciPy" in (fallback_note("gp") or "")
    assert fallback_note("tpe") is None


def test_gp_sampler_is_used_when_torch_and_scipy_are_installed() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("scipy")
    sampler = make_sampler("gp", {"max_num_seqs": [16, 32]}, 0, 20)
    assert isinstance(sampler, optuna.samplers.GPSampler)


def test_samplers() -> None:
    grid = space_from_dict(
        {"params": {"max_num_seqs": {"type": "int", "low": 16, "high": 64, "log": True}}}
    ).grid()
    assert isinstance(auto_sampler(seed=0), optuna.samplers.TPESampler)
    for name, cls in [("random", optuna.samplers.RandomSampler), ("grid", optuna.samplers.GridSampler)]:
        assert isinstance(make_sampler(name, grid, 0, 20), cls)
    assert isinstance(make_sampler("nsga2", grid, 0, 20), optuna.samplers.NSGAIISampler)
    with pytest.raises(AutotuneError, match="unknown sampler"):
        make_sampler("bayes", grid, 0, 20)


@pytest.fixture
def tiny_space():
    """Two tuned booleans (4 configs) plus a chunked-prefill rule that rejects one of them."""
    return space_from_dict(
        {
            "fixed": {"model": MODEL, "gpu": "H100", "max_model_len": 8192, "max_num_batched_tokens": 4096},
            "params": {"enable_prefix_caching": {"type": "bool"}, "enable_chunked_prefill": {"type": "bool"}},
        }
    )


def run_tuner(study: optuna.Study, space, n_trials: int, run_dir: Path) -> None:
    workload = dataclasses.replace(load_workload("chat"), num_requests=60, load="fixed")
    executor = Executor(SimBackend("H100"), workload, SLOS, cpu_slots=2)
    tuner = Tuner(study, space, OBJECTIVES, SLOS, executor, TunerOptions(n_trials=n_trials, run_dir=run_dir))
    tuner.run()


@pytest.mark.usefixtures("ray_cluster")
def test_ctrl_c_stops_the_tuner_at_its_next_step(tmp_path: Path) -> None:
    space = space_from_dict(
        {
            "fixed": {"model": MODEL, "gpu": "H100", "max_model_len": 8192},
            "params": {"max_num_seqs": {"type": "int", "low": 8, "high": 1024}},
        }
    )
    storage = sqlite_url(tmp_path)
    study = start_study(
        "c", storage, settings(), optuna.samplers.RandomSampler(seed=0), False, {"max_num_seqs": 256}
    )

    class CtrlCInAFinalizer:
        """Ctrl-C arriving while the main thread runs a finalizer: a KeyboardInterrupt raised there
        is printed and dropped by Python ("Exception ignored in ..."), and the run would go on."""

        def __del__(self) -> None:
            signal.raise_signal(signal.SIGINT)

    class Progress:
        def show(self, state: ProgressState) -> None:
            if state.done >= 2 and not hasattr(self, "sent"):
                self.sent = CtrlCInAFinalizer()
                del self.sent

        def close(self) -> None:
            pass

    workload = dataclasses.replace(load_workload("chat"), num_requests=60, load="fixed")
    executor = Executor(SimBackend("H100"), workload, SLOS, cpu_slots=1)
    options = TunerOptions(n_trials=100, run_dir=tmp_path)
    tuner = Tuner(study, space, OBJECTIVES, SLOS, executor, options, progress=Progress())  # type: ignore[arg-type]
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        tuner.run()
    assert signal.getsignal(signal.SIGINT) is before  # the loop's own Ctrl-C handling is undone
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states.count(TrialState.COMPLETE) >= 2 and TrialState.RUNNING not in states
    assert len(states) < 10  # it stopped at the next step, not at the end of the budget


@pytest.mark.usefixtures("ray_cluster")
def test_a_second_ctrl_c_during_the_cancel_leaves_no_trial_running(tmp_path: Path) -> None:
    """Ctrl-C twice, the second while the running trials are cancelled (a grace of seconds): the study
    kept them RUNNING, and the dashboard showed them running until a resume."""
    space = space_from_dict(
        {
            "fixed": {"model": MODEL, "gpu": "H100", "max_model_len": 8192},
            "params": {"max_num_seqs": {"type": "int", "low": 8, "high": 1024}},
        }
    )
    study = start_study(
        "c2", sqlite_url(tmp_path), settings(), optuna.samplers.RandomSampler(seed=0), False, {}
    )

    class CtrlCAgainWhileCancelling(Executor):
        def cancel_all(self) -> list[int]:
            signal.raise_signal(signal.SIGINT)
            return super().cancel_all()

    class Progress:
        def show(self, state: ProgressState) -> None:
            if state.done >= 1 and state.running and not hasattr(self, "sent"):
                self.sent = True
                signal.raise_signal(signal.SIGINT)

        def close(self) -> None:
            pass

    workload = dataclasses.replace(load_workload("chat"), num_requests=60, load="fixed")
    executor = CtrlCAgainWhileCancelling(SimBackend("H100"), workload, SLOS, cpu_slots=2)
    tuner = Tuner(study, space, OBJECTIVES, SLOS, executor, TunerOptions(n_trials=100), progress=Progress())  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        tuner.run()
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert TrialState.FAIL in states and TrialState.RUNNING not in states


@pytest.mark.usefixtures("ray_cluster")
def test_dedupe_rejects_and_resume(tmp_path: Path, tiny_space) -> None:
    storage = sqlite_url(tmp_path)
    sampler = optuna.samplers.RandomSampler(seed=1)
    baseline = {"enable_prefix_caching": True, "enable_chunked_prefill": True}
    study = start_study("d", storage, settings(), sampler, False, baseline)
    assert [t.state for t in study.trials] == [TrialState.WAITING]  # the baseline, queued first
    run_tuner(study, tiny_space, n_trials=4, run_dir=tmp_path)
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    assert trials[0].user_attrs["baseline"] is True
    rejected = [t for t in trials if t.user_attrs.get("launched") is False]
    assert all(not t.params["enable_chunked_prefill"] for t in rejected)  # budget 4096 < max_model_len 8192
    assert all(t.user_attrs["failure"] == "invalid_config" for t in rejected)
    # only 2 valid configs exist: both measured once, every later suggestion of them a free duplicate;
    # duplicates do not count toward the 4 trials asked for, and a run of them ends the run (converged)
    dups = [t for t in trials if "duplicate_of" in t.user_attrs]
    measured = [
        t for t in trials if t.user_attrs.get("launched", True) and "duplicate_of" not in t.user_attrs
    ]
    assert len({t.user_attrs["config_key"] for t in measured}) == len(measured) == 2
    assert len(dups) >= MAX_DUPLICATES_IN_A_ROW
    for dup in dups:
        original = study.trials[dup.user_attrs["duplicate_of"]]
        assert dup.values == original.values and dup.constraints == original.constraints
        assert dup.user_attrs["gpu_seconds"] == 0.0

    # resume the same study: nothing measured twice, the baseline not re-enqueued
    resumed = start_study("d", storage, settings(), optuna.samplers.RandomSampler(seed=2), True, baseline)
    run_tuner(resumed, tiny_space, n_trials=7, run_dir=tmp_path)
    trials = resumed.get_trials(states=(TrialState.COMPLETE,))
    assert sum(bool(t.user_attrs.get("baseline")) for t in trials) == 1
    measured = [
        t for t in trials if t.user_attrs.get("launched", True) and "duplicate_of" not in t.user_attrs
    ]
    assert len({t.user_attrs["config_key"] for t in measured}) == len(measured) == 2
