"""The guided runs of tests/test_guided.py and tests/test_guided_resume.py: the six-config space, a
reality the guide does not know, a guided run on them, and the fixtures a test file binds by name
(`bare, folder, unbudgeted = guided_runs.bare, ...`) so that pytest finds them there."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest
from cli import autotune

SPACE = """\
fixed:
  model: meta-llama/Llama-3.1-8B-Instruct
  gpu: H100
  max_model_len: 8192
params:
  max_num_seqs: {type: categorical, choices: [32, 256, 1024]}
  max_num_batched_tokens: {type: categorical, choices: [2048, 16384]}
"""
# A slower GPU than the guide's model: its efficiencies 30 % lower, its CPU per step twice the guide's.
# vLLM's defaults within it are 1024 / 2048 (the nearest to 8192): not the guide's best.
REALITY = "gemm_eff: 0.42\nattn_eff: 0.42\nstep_base_s: 5.0e-3\n"


def space_folder(path: Path) -> Path:
    """`path` with the space and the reality written in it."""
    (path / "space.yaml").write_text(SPACE)
    (path / "reality.yaml").write_text(REALITY)
    return path


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    """A folder with the space and the reality, and no runs yet."""
    return space_folder(tmp_path)


def with_tables(folder: Path, unbudgeted: tuple[Path, str]) -> Path:
    """`folder` with the guide tables the unbudgeted run predicted in its runs directory (their cache:
    tune/guide.py), as a user's next run in that directory has them: that run tests predicting them."""
    shutil.copytree(unbudgeted[0] / "runs" / "guide", folder / "runs" / "guide")
    return folder


@pytest.fixture
def folder(bare: Path, unbudgeted: tuple[Path, str]) -> Path:
    """A folder with the space, the reality and the unbudgeted run's guide tables."""
    return with_tables(bare, unbudgeted)


@pytest.fixture(scope="module")
def unbudgeted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A guided run with more trials than the space's six configs and no budget (its folder and stderr),
    read by tests/test_guided.py and tests/test_guided_resume.py: the stop rule, not --n-trials, ends it."""
    folder = space_folder(tmp_path_factory.mktemp("unbudgeted"))
    return folder, guided_run(folder, "--n-trials", "20").stderr


def guided_run(folder: Path, *extra: str, check: bool = True):  # noqa: ANN201
    """A guided run from the guide's fast estimate (--guide-top 0: its top's full searches are tested
    on their own, in tests/test_guided.py)."""
    args = ["run", "--space", "space.yaml", "--slo", "ttft_p99=2s", "--guide", "sim", "--parallel", "1"]
    args += ["--sim-calibration", "reality.yaml", "--noise", "0.02", "--repeats", "0", "--study", "g"]
    return autotune(folder, *args, "--guide-top", "0", *extra, check=check)


def study_of(folder: Path) -> optuna.Study:
    return optuna.load_study(study_name="g", storage=f"sqlite:///{folder}/runs/g/study.db")
