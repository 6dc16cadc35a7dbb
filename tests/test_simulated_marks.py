"""Results from the simulated engine say so wherever they go: the summary, report.html's "Before you
deploy" box and its $/Mtok figure, best.json, best.sh, the dashboard note, and every export format (a
comment line that is valid in that format, so the export still pastes and parses; for `flags`, spliced
into a command, on stderr). A study run as a process from its folder, with relative paths, then exported
from there."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import optuna
import pytest
import yaml
from cli import autotune

from autotune.outputs.export import FORMATS

WORKLOAD = """name: tiny
num_requests: 40
load: fixed
request_rate: 10
prompt_len: {dist: fixed, mean: 64}
output_len: {dist: fixed, mean: 16}
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's folder after a small simulated run (relative paths), with its stdout kept."""
    folder = tmp_path_factory.mktemp("user")
    (folder / "tiny.yaml").write_text(WORKLOAD)
    args = ["run", "--space", "small", "--workload", "tiny.yaml", "--n-trials", "3", "--quiet"]
    args += ["--study", "s", "--target-rate", "40", "--gpu-price", "2.5", "--slo", "ttft_p99=2s"]
    done = autotune(folder, *args)
    (folder / "summary.txt").write_text(done.stdout)
    return folder


def test_the_summary_report_and_best_json_say_simulated(folder: Path) -> None:
    summary = (folder / "summary.txt").read_text()
    assert "Simulated: these results come from autotune's simulated vLLM engine" in summary
    html = (folder / "runs/s/report.html").read_text()
    box = html.split("<b>Before you deploy</b>")[1].split("</div>")[0]
    assert "simulated vLLM engine, not a GPU; confirm them on one" in box
    cost = html.split("<h2>Cost</h2>")[1].split("<h2>")[0]
    assert "per million output tokens (simulated: confirm the rate on a GPU)" in cost
    best = json.loads((folder / "runs/s/best.json").read_text())
    assert best["simulated"] is True and "confirm them on one" in best["simulated_note"]
    assert "# simulated:" in (folder / "runs/s/best.sh").read_text()


def test_the_dashboard_note_says_simulated(folder: Path) -> None:
    from optuna_dashboard import get_note

    study = optuna.load_study(study_name="s", storage=f"sqlite:///{folder / 'runs/s/study.db'}")
    assert "Simulated: these results come from autotune's simulated vLLM engine" in get_note(study)


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "flags"])
def test_every_whole_export_carries_a_valid_comment(folder: Path, fmt: str) -> None:
    text = autotune(folder, "export", "runs/s", "--format", fmt).stdout
    comments = [line for line in text.splitlines() if "# simulated:" in line]
    assert len(comments) == 1 and text.startswith("# simulated:"), text
    without = text.replace(comments[0] + "\n", "")
    if fmt in ("yaml", "k8s", "helm"):
        assert yaml.safe_load(text) == yaml.safe_load(without)  # a YAML comment
    else:
        # a line of its own that a shell running the command as a script ignores
        assert shlex.split(text, comments=True) == shlex.split(without, comments=True)
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_exported_flags_splice_into_a_command_the_note_on_stderr(folder: Path) -> None:
    done = autotune(folder, "export", "runs/s", "--format", "flags")
    assert "simulated:" in done.stderr and "confirm them on one" in done.stderr
    # `vllm serve MODEL $(autotune export RUN --format flags)`: the substitution is word-split, `#`
    # included, so stdout must be the flags and nothing else
    words = subprocess.run(
        ["bash", "-c", 'printf "%s\\n" $(cat)'], input=done.stdout, text=True, capture_output=True, check=True
    ).stdout.split("\n")[:-1]
    assert words == shlex.split(done.stdout) and words[0].startswith("--")
    assert not any(w.startswith("#") or w == "simulated:" for w in words)
