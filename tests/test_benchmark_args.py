"""A bad argument to a benchmark script is refused as autotune's own commands refuse one: one line on
stderr, exit 2, no traceback, before anything runs (benchmarks/arguments.py).

Each case runs the script as a reviewer does (`python benchmarks/X.py ...` from the repository's root)
and fails while its arguments are checked: none starts a benchmark. One case per kind of check: a name
(argparse's choices), a count, a --before revision, a file or a GPU (an AutotuneError), and the few that
a script checks after parsing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import autotune

REPO = Path(__file__).resolve().parents[1]
QUICK_FILE = "{quick}"  # a file as `gpu_step_check.py --measure --device cpu --quick` writes one

# (script, arguments, what the error line says)
CASES: list[tuple[str, list[str], str]] = [
    ("guided_search.py", ["--strategies", "nosuch"], "invalid choice: 'nosuch'"),
    ("guided_search.py", ["--quick", "--realities", "mixed"], "--quick runs only"),
    ("guide_adequacy.py", ["--case", "nosuch"], "invalid choice: 'nosuch'"),
    ("sim_speed.py", ["--repeat", "0"], "--repeat: must be at least 1"),
    ("sim_speed.py", ["--before", "nosuchrev"], "'nosuchrev' is not a commit"),
    ("default_run.py", ["--before", "nosuchrev"], "'nosuchrev' is not a commit"),
    ("fidelity.py", ["--sim-calibration", "nosuch.yaml"], "nosuch.yaml"),
    ("gpu_step_check.py", ["--compare", "README.md"], "not valid JSON"),
    ("gpu_step_check.py", ["--compare", "benchmarks/h100_step_kernels.json", "--gpu", "NOPE"], "'NOPE'"),
    ("gpu_step_check.py", ["--compare", QUICK_FILE], "--measure --quick"),
    ("sample_efficiency.py", ["--strategies", "nosuch"], "invalid choice: 'nosuch'"),
    ("calibration_recovery.py", ["--gpu", "nosuch"], "unknown GPU 'nosuch'"),
    ("estimate_accuracy.py", ["--only", "nosuchword"], "no scenario name contains 'nosuchword'"),
    ("fixed_load_verdicts.py", ["--seeds", "0"], "--seeds: must be at least 1"),
    # each was a traceback once the work was done (or the pool started)
    ("guide_speed.py", ["--gpu", "nosuch"], "unknown GPU 'nosuch'"),
    ("guided_search.py", ["--truth-noise", "-1"], "--truth-noise: must be in [0, 1), got '-1'"),
    ("capacity_accuracy.py", ["--noise", "nan"], "--noise: must be in [0, 1), got 'nan'"),
    ("sample_efficiency.py", ["--out", "README.md"], "--out: 'README.md' is a file, not a folder"),
    ("guide_accuracy.py", ["--detail", "README.md"], "--detail: 'README.md' is a file, not a folder"),
    ("calibration_recovery.py", ["--keep", "README.md"], "--keep: 'README.md' is a file, not a folder"),
]
if importlib.util.find_spec("torch") is None:
    CASES.append(("gpu_step_check.py", ["--measure", "out.json"], "--measure needs PyTorch"))


@pytest.mark.parametrize(
    ("script", "args", "says"), CASES, ids=[f"{c[0]}-{'-'.join(c[1])}".replace("/", "_") for c in CASES]
)
def test_a_bad_argument_is_one_line_exit_2(tmp_path: Path, script: str, args: list[str], says: str) -> None:
    quick = tmp_path / "quick.json"
    quick.write_text(json.dumps({"header": {"device": "cpu"}, "models": {"tiny": {}, "tiny-tp2": {}}}))
    argv = [str(quick) if a == QUICK_FILE else a for a in args]
    tree = str(Path(autotune.__file__).parents[1])  # the autotune these tests import
    path = os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *argv],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{script}: error: ") and lines[0].endswith(f"(see {script} --help)")
    assert says in lines[0]
    assert done.stdout == ""
    assert not (REPO / "out.json").exists()
