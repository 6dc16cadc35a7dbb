"""The estimate before a real-GPU run comes from the model that charges a simulated study's GPU time: the
baseline and a sample of the space run as trials on the simulated engine (benchmarks/estimate_accuracy.py
sets it beside simulated studies of five scenarios); a simulated run says its GPU-hours as time on the
GPUs the user has."""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

import pytest
from cli import autotune
from test_study import OBJECTIVES, build_run, ok

from autotune.backends.sim import SimBackend
from autotune.catalog.gpus import get_gpu
from autotune.catalog.models import known_max_model_len
from autotune.measure.slo import parse_slos
from autotune.outputs.estimate import SAMPLE, remeasure_trials, sample_configs
from autotune.outputs.outcome import outcome
from autotune.trial.task import evaluate_trial
from autotune.tune.screen import make_screen
from autotune.tune.space import load_space
from autotune.tune.study import records
from autotune.workloads.files import load_workload

SPACE = """fixed:
  model: meta-llama/Llama-3.1-8B-Instruct
  gpu: H100
  max_model_len: 4096
params:
  max_num_seqs: {type: int, low: 2, high: 256, log: true}
  gpu_memory_utilization: {type: float, low: 0.85, high: 0.95, step: 0.01}
"""
WORKLOAD = """name: tiny
num_requests: 16
load: fixed
request_rate: 8
prompt_len: {dist: fixed, mean: 64}
output_len: {dist: fixed, mean: 16}
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "space.yaml").write_text(SPACE)
    (tmp_path / "tiny.yaml").write_text(WORKLOAD)
    return tmp_path


def test_a_real_backend_run_prints_the_simulated_studys_estimate_first(folder: Path) -> None:
    serve = f"{sys.executable} -m autotune.cli sim-server"
    args = ["run", "--space", "space.yaml", "--workload", "tiny.yaml", "--slo", "ttft_p99=2s", "--quiet"]
    args += ["--backend", "vllm", "--serve-cmd", serve, "--gpus", "1", "--n-trials", "2", "--repeats", "0"]
    done = autotune(folder, *args, "--study", "real")
    printed = re.search(r"estimate: about ([\d.]+) GPU-hours for 2 trials: about (\S+) on 1 GPU", done.stderr)
    assert printed, done.stderr
    # The same model, recomputed here: the baseline and a sample of configs the tuner would launch,
    # each a trial on the simulated engine (startup and load), their GPU time summed as a study sums it.
    space, workload = load_space(folder / "space.yaml"), load_workload(folder / "tiny.yaml")
    slos = parse_slos("ttft_p99=2s")
    screen = make_screen(space.model, space.gpu)
    sim = SimBackend("H100")
    max_pos = known_max_model_len(space.model, None, "vllm")
    baseline = space.config(space.baseline_params(get_gpu("H100").memory_gib, max_pos))
    sample = sample_configs(space, SAMPLE, 0, screen, max_pos)
    costs = [evaluate_trial(sim, c, workload, slos, 0, (), None).gpu_seconds for c in sample]
    base = evaluate_trial(sim, baseline, workload, slos, 0, (), None).gpu_seconds
    expected = (base + sum(costs) / len(costs)) / 3600  # the baseline, then one more trial at the mean
    assert float(printed[1]) == pytest.approx(expected, abs=0.006)
    assert len({round(c) for c in costs}) > 1  # the sample is other configs, not the baseline again


def test_a_simulated_run_says_its_gpu_hours_as_time_on_the_users_gpus(tmp_path: Path) -> None:
    study = build_run(tmp_path, [({"max_num_seqs": 256, "baseline": True}, ok(4000, 1500, 20))])
    recs = records(study)
    recs[0].gpu_seconds = 8 * 3600.0  # 8 GPU-hours
    names, maximize = OBJECTIVES.names, [o.maximize for o in OBJECTIVES.objectives]
    context = {"simulated": True, "gpu": "H100"}
    on_four = outcome(recs, names, maximize, [], {**context, "gpus": 4}).cost.text()
    assert "simulated GPU time spent 8.00 GPU-h (on real H100 GPUs: about 2h00m on 4 GPUs)" in on_four
    alone = outcome(recs, names, maximize, [], context).cost.text()
    assert "(on real H100 GPUs: about 8h00m on 1 GPU; --gpus N: on N)" in alone
    real = outcome(recs, names, maximize, [], {"simulated": False, "gpus": 4}).cost.text()
    assert "on real" not in real  # a real run's hours were spent on its GPUs: nothing to translate
    # Without --gpus, as many GPUs as its widest trial took: one GPU cannot run a TP=4 trial.
    wide = records(
        build_run(tmp_path / "tp", [({"tensor_parallel_size": 4, "baseline": True}, ok(4000, 1500, 20))])
    )
    wide[0].gpu_seconds = 8 * 3600.0
    assert wide[0].engine_config().tensor_parallel_size == 4
    text = outcome(wide, names, maximize, [], context).cost.text()
    assert "(on real H100 GPUs: about 2h00m on 4 GPUs; --gpus N: on N)" in text


def test_re_measurements_count_in_the_gpu_time_spent(folder: Path) -> None:
    """On a noisy backend the top configs and the baseline are measured again: that is GPU time too."""
    args = ["run", "--space", "space.yaml", "--workload", "tiny.yaml", "--n-trials", "2", "--quiet"]
    done = autotune(folder, *args, "--noise", "--repeats", "1", "--study", "noisy")
    spent = re.search(
        r"GPU time spent ([\d.]+) GPU-h, ([\d.]+) of them re-measuring the top configs", done.stdout
    )
    assert spent, done.stdout
    with open(folder / "runs/noisy/trials.csv") as f:
        trials_h = sum(float(row["gpu_seconds"] or 0) for row in csv.DictReader(f)) / 3600
    assert float(spent[2]) > 0 and float(spent[1]) == pytest.approx(trials_h + float(spent[2]), abs=0.011)


def test_the_estimate_re_measures_no_more_configs_than_the_run_measures() -> None:
    """The top three and the baseline, `--repeats` each: with --n-trials 2 only two configs exist."""
    assert remeasure_trials(2, noisy=True, n_trials=50) == 8
    assert remeasure_trials(2, noisy=True, n_trials=2) == 4
    assert remeasure_trials(2, noisy=False, n_trials=50) == 0  # a noise-free backend repeats nothing
