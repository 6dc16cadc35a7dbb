"""Configs that take different numbers of GPUs are compared per GPU, not only per replica: the objective
a user picks is explicit (a run says before it starts when the space varies TP and the objective is per
replica), the summary and report show GPUs per replica and the per-GPU gain, and the baseline is
labelled as what it is, vLLM's defaults at the space's TP when vLLM's own (TP=1) is outside the space.

The issue's case: a TP=4 config recommended at "+152.9 %" over a TP=2 baseline, 110 vs 43.7 tok/s per
replica, which per GPU is 27.5 vs 21.9 tok/s: +26 %.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from cli import autotune
from test_study import OBJECTIVES, build_run, ok

from autotune.outputs import report
from autotune.outputs.outcome import outcome
from autotune.tune.study import records

MAXIMIZE = [o.maximize for o in OBJECTIVES.objectives]
SPACE = """fixed:
  model: meta-llama/Llama-3.1-8B-Instruct
  gpu: H100
  max_model_len: 4096
params:
  tensor_parallel_size: {type: categorical, choices: [2, 4]}
  max_num_seqs: {type: categorical, choices: [8, 64]}
"""
WORKLOAD = """name: tiny
num_requests: 12
load: capacity
request_rate: 8
prompt_len: {dist: fixed, mean: 64}
output_len: {dist: fixed, mean: 16}
"""


def run(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`autotune run` on the TP space as a process in `folder` (relative paths)."""
    return autotune(
        folder, "run", "--space", "tp2.yaml", "--workload", "tiny.yaml", "--sampler", "grid", "--quiet", *args
    )


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "tp2.yaml").write_text(SPACE)
    (tmp_path / "tiny.yaml").write_text(WORKLOAD)
    return tmp_path


def test_a_tp_run_says_its_objective_is_per_replica_and_shows_gpus(folder: Path) -> None:
    done = run(folder, "--n-trials", "4", "--study", "tp")
    assert (
        "autotune: tensor_parallel_size varies (2, 4) and output_throughput is per replica: a config "
        "wins by taking more GPUs; to compare per GPU, pass --objectives per_gpu" in done.stderr
    )
    header = next(line for line in done.stdout.splitlines() if line.lstrip().startswith("trial"))
    assert "GPUs" in header and "per GPU vs baseline" in header
    best = json.loads((folder / "runs/tp/best.json").read_text())
    # vLLM's default TP is 1 (and max_num_seqs 1024), outside the space: the baseline is its defaults at
    # the nearest values, said so
    label = best["baseline"]["label"]
    assert label == "vLLM's defaults at TP=2, max_num_seqs=64" and best["baseline"]["gpus_per_replica"] == 2
    assert "the baseline is vLLM's defaults at TP=2" in " ".join(best["flags_to_know"])
    if best["gpus_per_replica"] != 2:
        assert f"Per GPU ({best['gpus_per_replica']} GPUs per replica vs 2)" in best["verdict"]
    html = (folder / "runs/tp/report.html").read_text()
    assert "<th>GPUs</th>" in html and "<th>per GPU vs baseline</th>" in html


def test_a_per_gpu_objective_needs_no_warning(folder: Path) -> None:
    done = run(folder, "--n-trials", "2", "--study", "pg", "--objectives", "per_gpu")
    assert "is per replica" not in done.stderr
    assert "output_throughput_per_gpu" in done.stdout


def test_the_verdict_compares_per_gpu_when_gpu_counts_differ(tmp_path: Path) -> None:
    study = build_run(
        tmp_path,
        [
            ({"tensor_parallel_size": 2, "baseline": True}, ok(43.7, 500, 40)),
            ({"tensor_parallel_size": 4}, ok(110.0, 450, 35)),
        ],
    )
    out = outcome(records(study), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"])
    assert out.best.number == 1
    verdict = out.verdict()
    assert "vs vLLM's defaults at TP=2" in verdict and "output_throughput +151.7%" in verdict
    assert "Per GPU (4 GPUs per replica vs 2): output_throughput +25.9% (27.5 vs 21.9)." in verdict
    assert out.gain_per_gpu(out.best) == pytest.approx(110 / 4 / (43.7 / 2) - 1)
    assert "+25.9%" in report.front_table(out)


def test_the_guide_predicts_per_gpu_with_each_configs_own_tp(folder: Path) -> None:
    """A guided run whose space tunes TP under a per-GPU objective: the guide divides each config's
    throughput by that config's GPUs (it used the space's fixed TP, 1, and so predicted TP=4 configs
    4x too high, read the gap as a GPU twice slower and ranked TP by the replica)."""
    args = [
        "--n-trials",
        "2",
        "--study",
        "g",
        "--objectives",
        "per_gpu",
        "--guide",
        "sim",
        "--guide-top",
        "0",
    ]
    run(folder, *args, "--repeats", "0")
    guide = json.loads((folder / "runs/g/guide.json").read_text())
    first = guide["trials"][0]
    assert first["measured"] and abs(first["raw"] / first["measured"] - 1) < 0.25, first
    assert guide["speed_factor"] > 0.8  # the engine is the guide's own: nothing to refit


def test_a_per_gpu_prediction_divides_by_the_configs_own_tp() -> None:
    from autotune.tune.guide import Prediction
    from autotune.tune.objectives import Objective

    per_gpu, per_replica = (
        Objective("output_throughput_per_gpu", "maximize"),
        Objective("output_throughput", "maximize"),
    )
    tuned = Prediction(
        "a", {"tensor_parallel_size": 4}, True, capacity_rate=1.0, metrics={"output_throughput": 800.0}
    )
    fixed = Prediction(
        "b", {"max_num_seqs": 8}, True, capacity_rate=1.0, metrics={"output_throughput": 800.0}
    )
    assert tuned.value(per_gpu, tp=2) == 200 and fixed.value(per_gpu, tp=2) == 400
    assert tuned.value(per_replica, tp=2) == fixed.value(per_replica) == 800
