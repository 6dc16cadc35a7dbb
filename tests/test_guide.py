"""The guide's table (autotune/tune/guide.py) on the real simulated engine, small spaces."""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from pathlib import Path

import optuna
import pytest

from autotune.backends.sim import SimBackend, SimSession
from autotune.catalog.gpus import get_gpu
from autotune.measure.slo import parse_slos
from autotune.sim.engine import SimEngine
from autotune.trial.capacity import find_capacity
from autotune.tune.guide import GRID_STEPS, GuideTable, cache_key, predict_space
from autotune.tune.guide_estimate import Estimator, GuideSettings, Pool
from autotune.tune.guided import ATTR, GuidedOptions, GuidedSearch
from autotune.tune.objectives import load_objectives
from autotune.tune.space import space_from_dict
from autotune.tune.study import config_key
from autotune.workloads.files import load_workload
from autotune.workloads.spec import WorkloadSpec

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SLOS = parse_slos(["ttft_p99=2s"])
# Every startup verdict: invalid combinations (budget < seqs; chunked prefill off below max_model_len),
# too little memory for the KV cache (0.3), and configs that start.
SPACE = space_from_dict(
    {
        "fixed": {"model": MODEL, "gpu": "H100", "max_model_len": 8192, "enable_prefix_caching": True},
        "params": {
            "max_num_seqs": {"type": "categorical", "choices": [64, 4096]},
            "max_num_batched_tokens": {"type": "categorical", "choices": [2048, 8192]},
            "enable_chunked_prefill": {"type": "bool"},
            "block_size": {"type": "categorical", "choices": [16, 32]},
            "gpu_memory_utilization": {"type": "float", "low": 0.3, "high": 0.9, "step": 0.01},
        },
    }
)


@pytest.fixture(scope="module")
def chat() -> WorkloadSpec:
    return load_workload("chat")


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory, chat: WorkloadSpec) -> GuideTable:
    """The small space's table, made on two worker processes."""
    return predict_space(SPACE, chat, SLOS, runs_dir=tmp_path_factory.mktemp("runs"), processes=2)


def test_the_table_covers_the_grid_with_the_startup_verdicts_of_the_simulated_server(
    table: GuideTable,
) -> None:
    grid = SPACE.grid(GRID_STEPS)
    assert grid["gpu_memory_utilization"] == [0.3, 0.45, 0.6, 0.75, 0.9]  # a stepped range, thinned
    points = list(itertools.product(*grid.values()))
    assert len(table.predictions) == len(points) == 2 * 2 * 2 * 2 * 5
    assert {tuple(p.params.values()) for p in table.predictions} == set(points)
    verdicts = {p.failure for p in table.predictions}
    assert {None, "invalid_config", "kv_cache_oom"} <= verdicts
    for p in table.predictions:
        config = SPACE.config(p.params)
        assert table.lookup(config) is p and table.lookup(config_key(config)) is p
        session = SimSession(config, "H100")
        if p.failure == "invalid_config":  # vLLM's validity rules, checked before anything starts
            assert "max_num_batched_tokens" in p.message and not p.starts
        else:
            assert p.starts == session.alive
            if not session.alive:
                failed = session.measure(dataclasses.replace(load_workload("chat"), num_requests=1))
                assert p.failure == str(failed.failure) and p.message == failed.message
    started = [p for p in table.predictions if p.starts]
    assert started and all(p.capacity_rate > 0 and p.p99_ttft_ms <= 2000 for p in started)
    knees = [p.knee_rate for p in started if p.knee_rate is not None]  # None: latency never doubled
    assert len(knees) > len(started) / 2 and all(k > 0 for k in knees)


def test_predictions_rank_by_the_objective_and_agree_with_the_capacity_they_report(
    table: GuideTable,
) -> None:
    objectives = load_objectives("default").objectives
    ranked = table.ranking(objectives[0])  # output_throughput, maximised
    assert ranked and all(p.starts and p.capacity_rate > 0 for p in ranked)
    assert table.ranking() == ranked  # the default: the table has no study's objectives
    values = [p.output_throughput for p in ranked]
    assert values == sorted(values, reverse=True)
    by_ttft = table.ranking(objectives[1])  # p99 TTFT, minimised
    assert [p.p99_ttft_ms for p in by_ttft] == sorted(p.p99_ttft_ms for p in by_ttft)
    for p in ranked:  # throughput at capacity: the rate times the tokens a request returns (~250)
        assert 150 < p.output_throughput / p.capacity_rate < 350


def test_a_second_call_reads_the_cache_and_other_slos_or_calibration_miss_it(
    tmp_path: Path, chat: WorkloadSpec
) -> None:
    space = SPACE.fix("gpu_memory_utilization", 0.9).fix("enable_chunked_prefill", True)
    first = predict_space(space, chat, SLOS, runs_dir=tmp_path, processes=1)
    assert not first.from_cache and first.cache_path is not None
    assert first.cache_path.parent == tmp_path / "guide"
    per_gpu = load_objectives("per_gpu")  # a study's objectives order the ranking, not the predictions
    again = predict_space(space, chat, SLOS, objectives=per_gpu, runs_dir=tmp_path, processes=1)
    assert again.from_cache and again.cpu_s == 0 and again.predictions == first.predictions
    assert again.objectives == per_gpu.objectives and again.ranking() == again.ranking(per_gpu.objectives[0])
    assert [p.key for p in again.predictions] == [p.key for p in first.predictions]
    tighter = predict_space(space, chat, parse_slos(["ttft_p99=1s"]), runs_dir=tmp_path, processes=1)
    assert not tighter.from_cache and tighter.cache_path != first.cache_path
    assert sorted(path.name for path in (tmp_path / "guide").iterdir()) == sorted(
        [first.cache_path.name, tighter.cache_path.name]
    )
    # The calibration is part of the key (here on a space where nothing starts: nothing simulated).
    oom = space.fix("gpu_memory_utilization", 0.15)
    grid = oom.grid(GRID_STEPS)
    keys = {cache_key(oom, grid, chat, SLOS, c, GuideSettings()) for c in (None, ("fit", 1), ("fit", 2))}
    assert len(keys) == 3
    cal_a = predict_space(oom, chat, SLOS, calibration=("fit", 1), runs_dir=tmp_path, processes=1)
    cal_b = predict_space(oom, chat, SLOS, calibration=("fit", 2), runs_dir=tmp_path, processes=1)
    assert not cal_b.from_cache and cal_a.cache_path != cal_b.cache_path
    assert predict_space(oom, chat, SLOS, calibration=("fit", 1), runs_dir=tmp_path).from_cache
    # ... and so is the content of a file the workload reads its lengths from.
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt_len": 900, "output_len": 100}\n')
    from_file = WorkloadSpec(name="rows", num_requests=10, jsonl=rows)
    assert not predict_space(oom, from_file, SLOS, runs_dir=tmp_path).from_cache
    assert predict_space(oom, from_file, SLOS, runs_dir=tmp_path).from_cache
    rows.write_text('{"prompt_len": 90, "output_len": 100}\n')
    assert not predict_space(oom, from_file, SLOS, runs_dir=tmp_path).from_cache


def test_predictions_are_deterministic_in_any_number_of_processes(
    tmp_path: Path, chat: WorkloadSpec, table: GuideTable
) -> None:
    heard: list[tuple[int, int]] = []

    def progress(done: int, total: int) -> None:
        heard.append((done, total))

    start = time.process_time()
    again = predict_space(SPACE, chat, SLOS, runs_dir=tmp_path, processes=1, progress=progress)
    spent = time.process_time() - start
    assert not again.from_cache and again.predictions == table.predictions
    assert 0.8 * spent <= again.cpu_s <= spent  # in this process: its CPU time, each second counted once
    # progress: configs predicted so far, rising to all of them
    total = len(table.predictions)
    assert len(heard) > 1 and heard[-1] == (total, total) and {t for _, t in heard} == {total}
    assert [d for d, _ in heard] == sorted(d for d, _ in heard)


def test_a_config_estimated_with_its_class_gets_what_it_gets_alone(chat: WorkloadSpec) -> None:
    """Shared runs change no estimate: each config of a class, estimated on its own, gets the same."""
    gpu = get_gpu("H100")
    members = []
    for block, utilization in itertools.product((16, 32), (0.3, 0.9)):
        params = {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "enable_chunked_prefill": True}
        params |= {"block_size": block, "gpu_memory_utilization": utilization}
        engine = SimEngine(SPACE.config(params), gpu)
        members.append((engine.config, Pool.of(engine.config, engine.memory, False)))
    shared = Estimator(gpu, chat, SLOS)
    together = [shared.estimate(config, pool, shared.scan(config, pool)) for config, pool in members]
    assert len({pool.behaviour for _, pool in members}) == 1 and len({m[1] for m in members}) == 4
    estimators = [Estimator(gpu, chat, SLOS) for _ in members]
    pairs = zip(estimators, members, strict=True)
    alone = [e.estimate(config, pool, e.scan(config, pool)) for e, (config, pool) in pairs]
    assert together == alone
    assert len({e.capacity_rate for e in alone}) > 1  # a smaller KV cache serves less here
    assert shared.simulated < sum(estimator.simulated for estimator in estimators)  # runs were shared


@pytest.mark.parametrize("slo", ["ttft_p99=20ms", "itl_median=4ms"])
def test_an_slo_missed_by_requests_served_one_at_a_time_ends_the_scan(chat: WorkloadSpec, slo: str) -> None:
    """No rate meets an SLO that requests served alone miss (their latencies are every rate's floor):
    the estimate says so after the scan's first two windows instead of stepping down to MIN_RATE, and
    the capacity search a trial runs, from the saturation run to its lowest rate, finds no rate either."""
    gpu, slos = get_gpu("H100"), parse_slos([slo])
    engine = SimEngine(SPACE.config({"max_num_seqs": 64, "max_num_batched_tokens": 2048}), gpu)
    pool = Pool.of(engine.config, engine.memory, False)
    estimator = Estimator(gpu, chat, slos)
    estimate = estimator.estimate(engine.config, pool, estimator.scan(engine.config, pool))
    assert estimate.capacity_rate == 0
    assert estimator.simulated <= 5  # the burst, two windows, the lone requests, the light window
    searched = find_capacity(SimBackend("H100"), engine.config, chat, slos)
    assert searched.capacity is not None and searched.capacity.rate == 0


@pytest.mark.parametrize(("sd", "below"), [(0.04, 0.04), (0.35, 0.1)])
def test_a_bracketed_search_starts_one_sd_below_the_corrected_capacity_at_most_ten_percent(
    table: GuideTable, sd: float, below: float
) -> None:
    """With bracketing on, a pick's capacity search starts below its corrected capacity by its sd
    (capped): a probe at the prediction is the threshold itself. Off (the default), no hint at all."""
    objective = load_objectives().objectives[0]
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({}, user_attrs={ATTR: {"rate": 10.0, "sd": sd}})
    trial = study.ask()
    on = GuidedSearch(table, SPACE, objective, GuidedOptions(bracket=True))
    assert on.hint_rate(trial) == pytest.approx(10.0 * math.exp(-below))
    assert GuidedSearch(table, SPACE, objective).hint_rate(trial) is None
    assert on.hint_rate(study.ask()) is None  # a trial the guide did not pick


def test_among_configs_the_guide_scores_equal_the_first_pick_can_prefer_vllms_defaults(
    table: GuideTable,
) -> None:
    """The guide's estimates tie on plateaus (here chunked prefill and block size move nothing at the
    top): by default the first pick is the table's first of them; with `prefer_defaults`, the one
    nearest vLLM's defaults."""
    objective = load_objectives().objectives[0]
    defaults = SPACE.baseline_params(get_gpu("H100").memory_gib, None)
    best = table.ranking(objective)[0].value(objective, 1)
    tied = [p.params for p in table.ranking(objective) if p.value(objective, 1) == best]
    assert len(tied) > 1
    picks = []
    for prefer in (False, True):
        search = GuidedSearch(
            table, SPACE, objective, GuidedOptions(prefer_defaults=prefer), baseline=defaults
        )
        study = optuna.create_study(direction="maximize")
        assert search.step(study) is None
        picks.append(study.trials[0].system_attrs["fixed_params"])
    assert picks[0] == tied[0]
    assert picks[1] in tied and picks[1] != tied[0]
    for name in ("enable_chunked_prefill", "block_size"):  # the flags the tie is over: vLLM's values
        assert picks[1][name] == defaults[name]


def test_with_resolution_ties_the_first_pick_is_the_tables_first_within_the_resolution_of_the_best(
    table: GuideTable,
) -> None:
    """The guide cannot rank configs predicted within the measurement's resolution of each other: with
    `resolution_ties` a pick by best prediction is the table's first of those, not the strict best."""
    objective = load_objectives().objectives[0]

    def lowered(p, factor: float):  # noqa: ANN001, ANN202
        metrics = {**p.metrics, "output_throughput": p.metrics["output_throughput"] * factor}
        return dataclasses.replace(p, metrics=metrics)

    best = table.ranking(objective)[0].value(objective, 1)
    order = [p for p in table.predictions if p.starts and (p.value(objective, 1) or 0) >= best / 1.01]
    assert len(order) > 2  # the best and configs the guide's estimate ties with it, in table order
    # the table's first of them 2 % below the rest, its second 5 % below
    changed = {order[0].key: lowered(order[0], 0.98), order[1].key: lowered(order[1], 0.95)}
    moved = GuideTable([changed.get(p.key, p) for p in table.predictions], 1)
    picks = []
    ties, finer = GuidedOptions(resolution_ties=True), GuidedOptions(resolution_ties=True, resolution=0.01)
    for options in (GuidedOptions(), ties, finer):
        study = optuna.create_study(direction="maximize")
        assert GuidedSearch(moved, SPACE, objective, options).step(study) is None
        picks.append(config_key(SPACE.config(study.trials[0].system_attrs["fixed_params"])))
    best_key = moved.ranking(objective)[0].key
    assert picks[0] == best_key != order[0].key  # strict: the best prediction
    assert picks[1] == order[0].key  # within 3 % of it: the table's first
    assert picks[2] == best_key  # within 1 %: the 2 % lower one is not tied


def test_a_trial_that_failed_to_start_does_not_lower_the_charge_of_the_next_below_the_estimate(
    table: GuideTable,
) -> None:
    """A config that failed to start cost its startup only: until a trial served load, the budget
    charges the next at least the pre-run estimate (charged at the startup's cost, a 1 GPU-h budget
    would start trials it cannot pay for), and without an estimate a second GPU waits for a search."""
    objective = load_objectives().objectives[0]
    study = optuna.create_study(direction="maximize")
    key = table.predictions[0].key
    attrs = {"config_key": key, "feasible": False, "failure": "startup_oom", "gpu_seconds": 60.0}
    study.add_trial(optuna.trial.create_trial(value=0.0, user_attrs=attrs))
    options = GuidedOptions(gpu_hours=1.0, first_trial_gpu_s=1800.0)
    search = GuidedSearch(table, SPACE, objective, options)
    failed = search.observations(study)
    assert [o.searched for o in failed] == [False]
    assert search.budget.next_cost_s(failed, 100.0) == 1800.0
    assert search.budget.trials_left(failed, 100.0) == pytest.approx((3600 - 60) / 1800)
    assert GuidedSearch(table, SPACE, objective, GuidedOptions(gpu_hours=1.0)).waits(study, busy=1)
    # Once a trial served load (here it met no rate), its cost is a search's: the estimate steps aside.
    searched = {**attrs, "failure": None, "gpu_seconds": 900.0, "config_key": table.predictions[1].key}
    study.add_trial(optuna.trial.create_trial(value=0.0, user_attrs=searched))
    both = search.observations(study)
    assert [o.searched for o in both] == [False, True]
    assert search.budget.next_cost_s(both, 100.0) == 900.0
    assert not GuidedSearch(table, SPACE, objective, GuidedOptions(gpu_hours=1.0)).waits(study, busy=1)
