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
from autotune.commands.run_guide import budget_text
from autotune.measure.slo import parse_slos
from autotune.outputs.estimate import SAMPLE, Left, RunEstimate, remeasure_trials, sample_configs
from autotune.outputs.outcome import outcome
from autotune.trial.task import evaluate_trial
from autotune.tune.progress import clock
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
    outcomes = [({"max_num_seqs": 256, "baseline": True}, ok(4000, 1500, 20))]
    outcomes += [({"max_num_seqs": seqs}, ok(4000, 1500, 20)) for seqs in (64, 128, 512)]
    recs = records(build_run(tmp_path, outcomes))
    for rec in recs:
        rec.gpu_seconds = 2 * 3600.0  # 8 GPU-hours in all
    names, maximize = OBJECTIVES.names, [o.maximize for o in OBJECTIVES.objectives]
    context = {"simulated": True, "gpu": "H100"}
    on_four = outcome(recs, names, maximize, [], {**context, "gpus": 4}).cost.text()
    assert "simulated GPU time spent 8.00 GPU-h (on real H100 GPUs: about 2h00m on 4 GPUs)" in on_four
    alone = outcome(recs, names, maximize, [], context).cost.text()
    assert "(on real H100 GPUs: about 8h00m on 1 GPU; --gpus N: on N)" in alone
    # one trial of 8 h takes 8 h however many GPUs wait beside it (it said "about 2h00m on 4 GPUs")
    recs[0].gpu_seconds, recs[1:] = 8 * 3600.0, []
    on_four = outcome(recs, names, maximize, [], {**context, "gpus": 4}).cost.text()
    assert "(on real H100 GPUs: about 8h00m on 4 GPUs)" in on_four
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


def _seconds(text: str) -> float:
    """A `clock` figure (6m32s, 12 s) in seconds."""
    m = re.fullmatch(r"(?:(\d+)m)?(\d+)(?: )?s", text)
    assert m, text
    return int(m[1] or 0) * 60 + int(m[2])


def test_the_per_trial_figures_add_up_to_the_trials_gpu_hours() -> None:
    """The baseline costs less than the sampled configs: the line names both, and they sum to the total
    (2 trials were 0.93 GPU-h beside 'per trial 34m21s on average', which doubled is 1.15)."""
    estimate = RunEstimate(1287.0, 2061.0, 2, 0, 1, SAMPLE, (1287.0, 3000.0))
    text = estimate.text()
    printed = re.search(r"about ([\d.]+) GPU-hours for 2 trials: .* Per trial (\S+) of GPU time for the "
                        r"baseline, (\S+) on average for the others", text)  # fmt: skip
    assert printed, text
    assert float(printed[1]) == pytest.approx((_seconds(printed[2]) + _seconds(printed[3])) / 3600, abs=0.006)


def test_a_run_takes_no_less_time_than_its_longest_trial_on_its_own_gpus() -> None:
    """One 2m51s trial on a run given two GPUs was "about 1m25s on 2 GPU(s)": half a trial's time."""
    one = RunEstimate(171.0, 171.0, 1, 0, 2, SAMPLE, (171.0, 171.0))
    assert "about 2m51s on 2 GPU(s)" in one.text()
    four = RunEstimate(171.0, 171.0, 4, 0, 2, SAMPLE, (171.0, 171.0))  # two at a time: twice one's time
    assert "about 5m42s on 2 GPU(s)" in four.text()
    tp2 = RunEstimate(342.0, 342.0, 1, 0, 2, SAMPLE, (342.0, 342.0), replica_gpus=2)  # 2 GPUs for 2m51s
    assert "about 2m51s on 2 GPU(s)" in tp2.text()


def test_a_budgeted_guided_estimate_counts_what_the_budget_affords_at_the_budget_lines_trial_cost() -> None:
    """A guided run's trials are the configs predicted best, charged the baseline's cost as its budget
    charges the first one: the estimate states the spend --gpu-hours allows (not 50 trials and 8
    re-measurements at the space's mean cost, 9.55 + 1.54 GPU-h against a 1 GPU-h budget), and its
    per-trial figure is the budget line's."""
    left = Left(guided=True, budget_s=3600.0)
    estimate = RunEstimate(392.0, 693.0, 50, 8, 1, SAMPLE, (392.0, 1462.0), left)
    text = estimate.text()
    assert text.startswith("estimate: about 0.98 GPU-hours for 9 trials, all that the budget's 1.00 GPU-h"), (
        text
    )
    assert estimate.gpu_hours <= 1.0
    per = f"{clock(392.0)} of GPU time"
    assert f"Per trial {per}, the baseline's" in text
    assert f"a trial costs about {per} (the estimate above)" in budget_text(1.0, estimate.trial_gpu_s)
    assert "about 9 trials as dear" in budget_text(1.0, estimate.trial_gpu_s)
    assert "about 1 trial as dear;" in budget_text(0.2, estimate.trial_gpu_s)  # not "1 trials"


def test_the_budget_line_without_gpu_hours_says_when_the_run_stops() -> None:
    """No --gpu-hours: the line names both stops, not a sentence cut after "when the guide"."""
    for per in (None, 392.0):
        assert budget_text(None, per).endswith(
            "no --gpu-hours: the run stops at --n-trials or when the guide predicts nothing better is left"
        )


def test_the_guides_budget_line_counts_what_a_resumed_study_spent() -> None:
    """A resume with --gpu-hours below what the study spent said "at most 4 trials" of the whole budget
    beside the estimate's "affords no trial"; half of it left affords half the trials."""
    spent = budget_text(0.5, 392.0, left_h=0.0)
    assert spent.startswith("budget 0.5 GPU-h (0.00 GPU-h left after what the study spent) affords no trial")
    assert "about 2 trials as dear" in budget_text(0.5, 392.0, left_h=0.25)
    assert "about 4 trials as dear" in budget_text(0.5, 392.0) == budget_text(0.5, 392.0, left_h=0.5)


def test_a_guided_estimate_charges_picks_as_the_budget_does_and_leaves_out_unaffordable_defaults() -> None:
    """Under an ITL SLO vLLM's defaults' search cost 0.73 GPU-h, the guide's first pick's 0.17: a 0.5
    GPU-h budget "afforded no trial", and the run launched none. Its picks are charged their own cost, the
    defaults run second when the budget affords them after the first pick (else a pick instead)."""
    left = Left(guided=True, budget_s=1800.0)
    estimate = RunEstimate(2628.0, 693.0, 12, 0, 1, SAMPLE, (600.0, 2628.0), left).charged(612.0)
    assert estimate.trial_gpu_s == 612.0
    text = estimate.text()
    assert text.startswith("estimate: about 0.34 GPU-hours for 2 trials, all that the budget's 0.50"), text
    assert "the guide's next pick (scaled to its predicted rate; the baseline's 43m48s)" in text
    roomy = RunEstimate(2628.0, 693.0, 3, 0, 1, SAMPLE, (600.0, 2628.0), Left(guided=True)).charged(612.0)
    assert roomy.trials_gpu_h == pytest.approx((612.0 + 2628.0 + 612.0) / 3600)


def test_a_resumed_estimate_counts_only_what_is_left() -> None:
    """On resume the study's measured trials, the baseline among them, and its re-measurements are not
    estimated again; nothing left says so."""
    after = RunEstimate(392.0, 693.0, 2, 0, 1, SAMPLE, (392.0, 1462.0), Left(baseline=False))
    assert after.trials_gpu_h == pytest.approx(2 * 693.0 / 3600)
    assert "Per trial 11m33s of GPU time on average;" in after.text()
    done = RunEstimate(392.0, 693.0, 0, 0, 1, SAMPLE, (392.0, 1462.0), Left(baseline=False))
    assert (
        done.text()
        == "estimate: nothing left to run: the study already has the trials and re-measurements asked for"
    )
