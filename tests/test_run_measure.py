"""What `autotune run` measures: runs that did not keep up, repeats on a noisy backend, untunable flags."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autotune.cli import main

pytestmark = pytest.mark.usefixtures("ray_cluster")
SPACE = """fixed: {model: meta-llama/Llama-3.1-8B-Instruct, gpu: H100, max_model_len: 4096}
params:
  max_num_seqs: {type: int, low: 16, high: 512, log: true}
  max_num_batched_tokens: {type: int, low: 1024, high: 8192, log: true}
  enable_prefix_caching: {type: bool}
"""


def write(tmp_path: Path, workload: str) -> tuple[Path, Path]:
    space, load = tmp_path / "space.yaml", tmp_path / "load.yaml"
    space.write_text(SPACE)
    load.write_text(workload)
    return space, load


def study_of(tmp_path: Path, name: str) -> optuna.Study:
    storage = f"sqlite:///{tmp_path / 'runs' / name / 'study.db'}"
    return optuna.load_study(study_name=name, storage=storage)


def run(tmp_path: Path, name: str, space: Path, load: Path, *extra: str) -> int:
    args = ["run", "--space", str(space), "--workload", str(load), "--runs-dir", str(tmp_path / "runs")]
    return main([*args, "--study", name, "--slo", "ttft_p99=2s", *extra])


def test_a_fixed_load_the_config_cannot_keep_up_with_is_said_and_not_feasible(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 150 req/s for 20 s: about twice what one H100 serves of these requests, and long enough to tell.
    space, load = write(
        tmp_path, "name: flood\nnum_requests: 3000\nrequest_rate: 150\nprompt_len: 512\noutput_len: 128\n"
    )
    assert run(tmp_path, "flood", space, load, "--n-trials", "2", "--no-screen") == 0
    err = capsys.readouterr().err
    assert "did not keep up (served" in err
    trials = study_of(tmp_path, "flood").trials
    behind = [t for t in trials if t.user_attrs.get("info", {}).get("kept_up") is False]
    assert behind and all(t.constraints["load_kept_up"] > 0 and not t.user_attrs["feasible"] for t in behind)


def test_prefix_caching_is_not_tuned_on_prompts_that_share_no_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    space, load = write(
        tmp_path, "name: plain\nnum_requests: 40\nrequest_rate: 10\nprompt_len: 256\noutput_len: 32\n"
    )
    assert run(tmp_path, "plain", space, load, "--n-trials", "3", "--quiet") == 0
    assert "enable_prefix_caching is not tuned" in capsys.readouterr().err
    for trial in study_of(tmp_path, "plain").trials:
        assert "enable_prefix_caching" not in trial.params
        assert trial.user_attrs["config"]["enable_prefix_caching"] is True  # vLLM's default
    shared = tmp_path / "shared.yaml"
    shared.write_text(
        load.read_text().replace("plain", "shared") + "shared_prefix: {num_prefixes: 2, prefix_len: 128}\n"
    )
    assert run(tmp_path, "shared", space, shared, "--n-trials", "3", "--quiet") == 0
    assert all("enable_prefix_caching" in t.params for t in study_of(tmp_path, "shared").trials)


def test_a_noisy_backend_re_measures_the_top_configs_and_gives_the_gain_an_interval(tmp_path: Path) -> None:
    space, load = write(
        tmp_path, "name: quick\nnum_requests: 60\nrequest_rate: 20\nprompt_len: 256\noutput_len: 32\n"
    )
    args = ("--n-trials", "5", "--quiet", "--noise", "--repeats", "2")
    assert run(tmp_path, "noisy", space, load, *args) == 0
    study = study_of(tmp_path, "noisy")
    remeasured = study.user_attrs["remeasured"]
    assert "0" in remeasured  # the baseline, always
    assert all(sorted(v) == ["1", "2"] for v in remeasured.values())
    assert 2 <= len(remeasured) <= 4  # up to 3 candidates and the baseline
    best = json.loads((tmp_path / "runs" / "noisy" / "best.json").read_text())
    if best.get("gain"):  # the best found is not the baseline: its gain is told with 3 paired runs
        assert best["gain"]["how"] == "3 paired runs"
        assert best["gain"]["interval"][0] <= best["gain"]["ratio"] <= best["gain"]["interval"][1]
    # resuming does not run the repeats again
    assert run(tmp_path, "noisy", space, load, *args, "--resume") == 0
    assert study_of(tmp_path, "noisy").user_attrs["remeasured"] == remeasured


def test_a_fixed_load_too_short_to_judge_says_so_beside_its_recommendation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """400 chat requests at 40 req/s, twice what vLLM's defaults serve on an H100: their 1,024 sequences
    admit the whole overload, so TTFT meets 2 s while the run ends 16 s after its last arrival, and the
    10 s of arrivals are too short to judge. The recommendation said nothing of it; a closed loop, which
    has no verdict to give, still says nothing."""
    lengths = (
        "prompt_len: {dist: lognormal, mean: 1000, sigma: 0.8, min: 16, max: 6000}\n"
        "output_len: {dist: lognormal, mean: 250, sigma: 0.7, min: 8, max: 1024}\n"
    )
    _, load = write(tmp_path, "name: over\nnum_requests: 400\nrequest_rate: 40\nload: fixed\n" + lengths)
    assert run(tmp_path, "over", Path("small"), load, "--n-trials", "1", "--quiet") == 0
    note = "Not judged: whether trial #0 keeps up with the fixed load's arrivals"
    assert note in capsys.readouterr().out
    best = json.loads((tmp_path / "runs" / "over" / "best.json").read_text())
    assert best["trial"] == 0 and any(flag.startswith(note) for flag in best["flags_to_know"])
    load.write_text(load.read_text().replace("name: over", "name: closed") + "max_concurrency: 8\n")
    assert run(tmp_path, "closed", Path("small"), load, "--n-trials", "1", "--quiet") == 0
    assert "Not judged" not in capsys.readouterr().out
