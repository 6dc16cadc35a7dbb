"""`autotune run`'s default study name: runs that can never be one study (another search space, guided
or not) get their own, the README's main command keeps its name, and a --resume typed as an earlier
autotune's study was started (named without the space and the guide) still finds that study."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from study_db import counted_trials

from autotune.cli import main
from autotune.commands import run as run_command

ROOT = Path(__file__).parents[1]
MAIN = ["--space", str(ROOT / "search_spaces" / "vllm.yaml"), "--slo", "ttft_p99=2s"]  # the README's
NAME = "llama-3.1-8b-instruct-h100-chat-ttft-p99-2s"  # its name, in the README's transcript
SIM_SERVER = f"{sys.executable} -m autotune.cli sim-server"


def names(monkeypatch: pytest.MonkeyPatch, runs: Path, *commands: list[str]) -> list[str]:
    """The study each `autotune run` command would open (everything checked, nothing run)."""
    seen: list[str] = []

    def record(args: Any, setup: Any) -> int:
        seen.append(setup.study_name)
        return 0

    monkeypatch.setattr(run_command, "_execute", record)
    for command in commands:
        assert main(["run", "--runs-dir", str(runs), *command]) == 0
    return seen


def test_another_space_or_a_guided_run_is_another_default_study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's follow-ups (another space; the guide on the simulated backend) were stopped as
    "already exists" after its main command, then refused on --resume: each is its own study now. The
    budget is not in the name (a larger one continues the study), nor how the guide was asked for."""
    guided = [*MAIN, "--backend", "sim", "--guide", "sim"]
    real = [*MAIN, "--backend", "vllm", "--serve-cmd", SIM_SERVER]
    assert names(
        monkeypatch,
        tmp_path,
        MAIN,
        ["--space", "small", "--n-trials", "8", "--slo", "ttft_p99=2s"],
        [*guided, "--gpu-hours", "2"],
        [*guided, "--gpu-hours", "3"],
        [*MAIN, "--guide", "none"],
        real,  # guided by default on a real backend
        [*real, "--guide", "sim"],
        [*real, "--guide", "none"],
        [*real, "--load", "fixed"],  # no guide at a fixed load: said, and not in the name
    ) == [
        NAME,
        "llama-3.1-8b-instruct-h100-chat-small-ttft-p99-2s",
        "llama-3.1-8b-instruct-h100-chat-guided-ttft-p99-2s",
        "llama-3.1-8b-instruct-h100-chat-guided-ttft-p99-2s",
        NAME,
        "llama-3.1-8b-instruct-h100-chat-guided-ttft-p99-2s",
        "llama-3.1-8b-instruct-h100-chat-guided-ttft-p99-2s",
        NAME,
        "llama-3.1-8b-instruct-h100-chat-fixed-ttft-p99-2s",
    ]
    assert not any(tmp_path.iterdir())  # naming a study creates nothing


def test_a_resume_finds_the_study_an_earlier_default_name_gave_the_same_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A study started with `--space small` before the space was in default names is named as the
    default space's run: the same command with --resume resumes it there (it was "nothing to resume");
    a space of other content does not, and a new run takes the new name."""
    earlier = "llama-3.1-8b-instruct-h100-chat-fixed-ttft-p99-2s"
    now = "llama-3.1-8b-instruct-h100-chat-fixed-small-ttft-p99-2s"
    base = ["run", "--space", "small", "--load", "fixed", "--slo", "ttft_p99=2s", "--quiet"]
    base += ["--runs-dir", str(tmp_path / "runs")]
    assert main([*base, "--n-trials", "1", "--study", earlier]) == 0
    capsys.readouterr()
    assert main([*base, "--n-trials", "2", "--resume"]) == 0
    assert f"autotune: no study {now}: resuming {earlier}, this run's study by" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [earlier]
    assert counted_trials(tmp_path / "runs" / earlier / "study.db", earlier)[0] == 2

    other = tmp_path / "small.yaml"  # the same file name, other flags: not that study's space
    other.write_text((ROOT / "search_spaces" / "small.yaml").read_text().replace("high: 0.95", "high: 0.9"))
    assert main([*base, "--space", str(other), "--n-trials", "3", "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"nothing to resume: no study {now!r}" in err
    assert f"(it holds {earlier})" in err
    assert main([*base, "--n-trials", "1"]) == 0
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [now, earlier]
