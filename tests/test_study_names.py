"""`autotune run`'s default study name: runs that can never be one study (another search space, guided
or not) get their own, the README's main command keeps its name, and a --resume typed as an earlier
autotune's study was started (named without the space and the guide) still finds that study. A name a
study of other settings holds is refused with what differs."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from study_db import counted_trials

from autotune.cli import main
from autotune.commands import run as run_command
from autotune.core.errors import AutotuneError
from autotune.tune.objectives import load_objectives
from autotune.tune.study import StudySettings
from autotune.tune.study_open import open_study, sqlite_url

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


def test_a_taken_name_says_what_differs_and_asks_for_another_name(tmp_path: Path) -> None:
    """A new run whose name a study of other settings holds was told to add --resume, which then refused
    it: the first line says what differs (check_resume's words) and asks for --study NAME. With the same
    settings, or only a guide added (recorded on resume), --resume continues it."""
    objectives = load_objectives("default")
    kept = StudySettings(
        objectives=objectives.names,
        directions=objectives.directions,
        slos=["ttft_p99=2s"],
        model="meta-llama/Llama-3.1-8B-Instruct",
        gpu="H100",
        workload="chat",
        backend="sim",
        space_digest="small",
        seed=0,
    )
    storage, sampler = sqlite_url(tmp_path), optuna.samplers.RandomSampler()
    open_study("s", storage, kept, sampler, resume=False)
    taken = r"^study 's' already exists in sqlite:///\S+ and "
    other = r": this run is another study, pass --study NAME to name it \(--resume would be refused\)$"
    for changes, said in (
        ({"space_digest": "vllm"}, "was run with another search space (its tuned or fixed flags differ)"),
        ({"seed": 3}, "was run with --seed 0, not 3"),
        ({"slos": ["ttft_p99=1s"]}, "was run with slos ['ttft_p99=2s'], not ['ttft_p99=1s']"),
    ):
        changed = dataclasses.replace(kept, **changes)
        with pytest.raises(AutotuneError, match=taken + re.escape(said) + other):
            open_study("s", storage, changed, sampler, resume=False)
        with pytest.raises(AutotuneError, match=f"^study 's' {re.escape(said)}: "):  # as --resume says it
            open_study("s", storage, changed, sampler, resume=True)
    resumable = r"already exists in \S+: add --resume to continue it or pick --study$"
    for same in (kept, dataclasses.replace(kept, guide="sim", gpu_hours=1.0)):
        with pytest.raises(AutotuneError, match=resumable):
            open_study("s", storage, same, sampler, resume=False)


def test_a_default_name_taken_by_another_spaces_study_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A space file of the default space's name (a copy, edited) gets the default name, which a study of
    the bundled space holds: refused before any trial, in one line that says so (exit 2)."""
    name = "llama-3.1-8b-instruct-h100-chat-fixed-small-ttft-p99-2s"
    base = ["run", "--load", "fixed", "--slo", "ttft_p99=2s", "--quiet", "--runs-dir", str(tmp_path / "runs")]
    assert main([*base, "--space", "small", "--n-trials", "1"]) == 0
    edited = tmp_path / "small.yaml"
    edited.write_text((ROOT / "search_spaces" / "small.yaml").read_text().replace("high: 0.95", "high: 0.9"))
    capsys.readouterr()
    assert main([*base, "--space", str(edited), "--n-trials", "2"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"autotune run: error: study {name!r} already exists in sqlite:///"), line
    assert line.endswith(
        "and was run with another search space (its tuned or fixed flags differ): this run is another "
        "study, pass --study NAME to name it (--resume would be refused)"
    ), line
    assert counted_trials(tmp_path / "runs" / name / "study.db", name) == (1, 0)
