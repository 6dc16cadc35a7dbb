"""The study: constraints told in a fixed order, failures as violations, dedupe, resume, the front."""

from __future__ import annotations

import dataclasses
import re
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
from autotune.outputs.export import RunInfo
from autotune.store.storage import connect_storage
from autotune.tune.front import pareto_front, recommend
from autotune.tune.objectives import FAILED_KEY, KEPT_UP_KEY, Objective, ObjectiveSet, load_objectives
from autotune.tune.progress import ProgressState
from autotune.tune.run_records import TunerOptions
from autotune.tune.samplers import GP_MODULES, auto_sampler, make_sampler
from autotune.tune.space import load_space, space_from_dict
from autotune.tune.study import StudySettings, config_key, records, tell_result
from autotune.tune.study_checks import check_resumable
from autotune.tune.study_open import open_study, sqlite_url, start_study
from autotune.tune.tuner import MAX_DUPLICATES_IN_A_ROW, Tuner
from autotune.workloads.digest import workload_digest
from autotune.workloads.files import load_workload, spec_from_dict

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


def test_connect_storage(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    storage = connect_storage(url)
    assert isinstance(storage, optuna.storages.RDBStorage)
    assert connect_storage(storage) is storage
    assert connect_storage(url) is not None  # a second process opening the same file finds its schema
    with pytest.raises(AutotuneError, match="cannot open storage nosuchdb://x"):
        connect_storage("nosuchdb://x", attempts=2)


def test_a_resumed_study_keeps_its_search_space_and_load(tmp_path: Path) -> None:
    """Trials of two spaces or two loads in one study would be compared as if alike: refused. A study
    from before they were recorded resumes."""
    storage, sampler = sqlite_url(tmp_path), optuna.samplers.RandomSampler()
    small, wide = load_space("small"), load_space("vllm")
    assert small.digest() != wide.digest() and small.digest() == load_space("small").digest()
    kept = settings(load="capacity", space_digest=small.digest())
    open_study("s", storage, kept, sampler, resume=False)
    with pytest.raises(AutotuneError, match="another search space.*same --space"):
        open_study("s", storage, dataclasses.replace(kept, space_digest=wide.digest()), sampler, resume=True)
    with pytest.raises(AutotuneError, match="was run with load 'capacity', not 'fixed'"):
        open_study("s", storage, dataclasses.replace(kept, load="fixed"), sampler, resume=True)
    assert open_study("s", storage, kept, sampler, resume=True).study_name == "s"
    open_study("old", storage, settings(), sampler, resume=False)
    assert open_study("old", storage, kept, sampler, resume=True).study_name == "old"


def test_a_resumed_study_keeps_its_workloads_content(tmp_path: Path) -> None:
    """A workload file edited since (same name, other lengths or seed) would mix two workloads in one
    front: refused. Its load and description are not its content; a study from before it was recorded
    resumes."""
    chat = load_workload("chat")
    edited = dataclasses.replace(chat, prompt_len=dataclasses.replace(chat.prompt_len, mean=2000.0))
    same = dataclasses.replace(chat, load="fixed", description="another text")
    assert workload_digest(same) == workload_digest(chat) == workload_digest(load_workload("chat"))
    assert workload_digest(dataclasses.replace(chat, seed=1)) != workload_digest(chat)
    assert workload_digest(edited) != workload_digest(chat)
    storage, sampler = sqlite_url(tmp_path), optuna.samplers.RandomSampler()
    kept = settings(workload_digest=workload_digest(chat))
    open_study("s", storage, kept, sampler, resume=False)
    other = dataclasses.replace(kept, workload_digest=workload_digest(edited))
    with pytest.raises(AutotuneError, match="was run with workload chat of other content.*another --study"):
        open_study("s", storage, other, sampler, resume=True)
    assert open_study("s", storage, kept, sampler, resume=True).study_name == "s"
    open_study("old", storage, settings(), sampler, resume=False)  # no digest recorded
    assert open_study("old", storage, other, sampler, resume=True).study_name == "old"


def test_a_jsonl_workloads_digest_is_its_files_content_not_its_path(tmp_path: Path) -> None:
    rows = tmp_path / "a.jsonl"
    rows.write_text('{"prompt_len": 100, "output_len": 10}\n')
    copy = tmp_path / "b.jsonl"
    copy.write_bytes(rows.read_bytes())
    spec = spec_from_dict({"name": "j", "num_requests": 1, "jsonl": str(rows)})
    moved = dataclasses.replace(spec, jsonl=copy)
    assert workload_digest(moved) == workload_digest(spec)
    copy.write_text('{"prompt_len": 200, "output_len": 10}\n')
    assert workload_digest(moved) != workload_digest(spec)


def test_a_guided_study_resumes_guided_within_a_budget(tmp_path: Path) -> None:
    """Unguided trials past a guided study's budget would contradict its guide's files: a resume that
    drops --guide sim or --gpu-hours is refused; another budget, or a guide added, is recorded."""
    storage, sampler = sqlite_url(tmp_path), optuna.samplers.RandomSampler()
    open_study("g", storage, settings(guide="sim", gpu_hours=1.0), sampler, resume=False)
    said = "was run with --guide sim --gpu-hours 1: pass them again (a larger --gpu-hours continues it)"
    for dropped in (settings(guide="none"), settings(guide="sim")):
        with pytest.raises(AutotuneError, match=re.escape(said)):
            open_study("g", storage, dropped, sampler, resume=True)
    study = open_study("g", storage, settings(guide="sim", gpu_hours=3.0), sampler, resume=True)
    assert study.user_attrs["autotune"]["gpu_hours"] == 3.0
    open_study("u", storage, settings(guide="sim"), sampler, resume=False)  # guided, no budget
    with pytest.raises(AutotuneError, match="was run with --guide sim: pass it again$"):
        open_study("u", storage, settings(guide="none"), sampler, resume=True)
    open_study("plain", storage, settings(guide="none"), sampler, resume=False)
    open_study("plain", storage, settings(guide="sim", gpu_hours=0.5), sampler, resume=True)
    with pytest.raises(AutotuneError, match="--gpu-hours 0.5: pass them again"):
        open_study("plain", storage, settings(guide="none"), sampler, resume=True)
    open_study("old", storage, settings(), sampler, resume=False)  # from before the guide was recorded
    assert open_study("old", storage, settings(guide="none"), sampler, resume=True).study_name == "old"


def test_a_resumed_simulated_study_keeps_its_noise(tmp_path: Path) -> None:
    """Noisy and noise-free measurements in one front would be compared as if alike: refused. A study
    from before the noise was recorded resumes with any."""
    storage, sampler = sqlite_url(tmp_path), optuna.samplers.RandomSampler()
    open_study("quiet", storage, settings(noise=0.0), sampler, resume=False)
    with pytest.raises(AutotuneError, match="was simulated with --noise 0, not 0.05: resume with the same"):
        open_study("quiet", storage, settings(noise=0.05), sampler, resume=True)
    assert open_study("quiet", storage, settings(noise=0.0), sampler, resume=True).study_name == "quiet"
    open_study("noisy", storage, settings(noise=0.02), sampler, resume=False)
    with pytest.raises(AutotuneError, match="was simulated with --noise 0.02, not 0:"):
        open_study("noisy", storage, settings(noise=0.0), sampler, resume=True)
    open_study("old", storage, settings(), sampler, resume=False)  # no noise recorded
    assert open_study("old", storage, settings(noise=0.05), sampler, resume=True).study_name == "old"


def test_existing_study_needs_resume_and_same_settings(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    sampler = optuna.samplers.RandomSampler()
    study = open_study("s", storage, settings(), sampler, resume=False)
    study.ask()  # left RUNNING, as after a crash
    with pytest.raises(AutotuneError, match="already exists.*--resume"):
        open_study("s", storage, settings(), sampler, resume=False)
    with pytest.raises(AutotuneError, match="optimises"):
        open_study("s", storage, settings(directions=["minimize"] * 3), sampler, resume=True)
    with pytest.raises(AutotuneError, match="slos"):
        open_study("s", storage, settings(slos=["ttft_p99=1s"]), sampler, resume=True)
    resumed = open_study("s", storage, settings(), sampler, resume=True)
    (stale,) = resumed.trials
    assert stale.state == TrialState.FAIL and stale.user_attrs["failure"] == "interrupted"


def test_resume_refuses_a_study_the_storage_lacks_and_knows_a_gpu_by_its_catalog_name(tmp_path: Path) -> None:
    """--resume never starts a new study (a typo, a GPU alias in a default name): one line naming the
    studies there. The GPU is compared as the catalog resolves it, not as typed."""
    storage, sampler = sqlite_url(tmp_path), optuna.samplers.RandomSampler()
    with pytest.raises(AutotuneError, match=r"^nothing to resume: no study 'typo' in sqlite:///"):
        open_study("typo", storage, settings(), sampler, resume=True)
    assert optuna.study.get_all_study_names(connect_storage(storage)) == []  # nothing created
    for name in ("b", "a"):
        open_study(name, storage, settings(gpu="A100"), sampler, resume=False)
    with pytest.raises(AutotuneError, match=r"no study 'typo' in sqlite:///.* \(it holds a, b\); pass an"):
        check_resumable("typo", storage, None)
    check_resumable("a", storage, None)
    for spelling in ("a100", "A100-80GB"):  # one GPU: resumed
        assert open_study("a", storage, settings(gpu=spelling), sampler, resume=True).study_name == "a"
    with pytest.raises(AutotuneError, match="was run with gpu 'A100', not 'H100'"):
        open_study("a", storage, settings(gpu="H100"), sampler, resume=True)


def test_resume_in_a_runs_folder_names_its_run_folders(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for name in ("llama-a100-chat", "llama-h100-chat"):
        (runs / name).mkdir(parents=True)
        open_study(name, sqlite_url(runs / name), settings(), optuna.samplers.RandomSampler(), resume=False)
    missing = sqlite_url(runs / "llama-a100-80gb-chat")
    with pytest.raises(AutotuneError, match=r"in .*/runs/ \(it holds llama-a100-chat, llama-h100-chat\)"):
        check_resumable("llama-a100-80gb-chat", missing, runs)
    assert not (runs / "llama-a100-80gb-chat").exists()


@pytest.mark.parametrize("missing", ["torch", "scipy"])
def test_gp_sampler_falls_back_to_tpe_without_its_dependencies(
    missing: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A None entry in sys.modules makes `import` raise ModuleNotFoundError, as if it were not installed.
    for module in [m for m in GP_MODULES if m.split(".")[0] == missing] + [missing]:
        monkeypatch.setitem(sys.modules, module, None)
    sampler = make_sampler("gp", {"max_num_seqs": [16, 32]}, 0, 20)
    assert isinstance(sampler, optuna.samplers.TPESampler)
    assert "gp sampler needs PyTorch and SciPy" in capsys.readouterr().err


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
