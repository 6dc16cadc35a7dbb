"""What a user sees in a real browser: optuna-dashboard on a small simulated study, and report.html.

Headless Chromium loads the pages (the dashboard is a JS app: --virtual-time-budget lets it fetch and
render) and the test reads the rendered DOM. Skips when chromium is not installed
(.ci/install-chromium.sh provisions it).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import optuna
import pytest
from test_study import OBJECTIVES, build_run

from autotune.backends.sim import SimBackend
from autotune.core.config import EngineConfig
from autotune.outputs import report
from autotune.outputs.dashboard import StudyNote, start_dashboard
from autotune.outputs.outcome import outcome
from autotune.outputs.run_info import load_run
from autotune.tune.study import records
from autotune.workloads.files import load_workload

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (.ci/install-chromium.sh)")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CONTEXT = {"slos": ["ttft_p99=2s"], "model": MODEL, "gpu": "H100", "workload": "chat", "load": "fixed"}


def rendered(url: str) -> str:
    """The DOM after the page's scripts ran (10 s of virtual time)."""
    assert CHROMIUM is not None
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000"]
    done = subprocess.run([*args, "--dump-dom", url], capture_output=True, text=True, timeout=90, check=True)
    return done.stdout


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three configs measured on the simulated engine (one of them fails to start), note written."""
    run_dir = tmp_path_factory.mktemp("run")
    workload = load_workload("chat").with_load(request_rate=8.0)
    sim = SimBackend("H100")
    configs = [
        ({"max_num_seqs": 256, "baseline": True}, {"max_num_seqs": 256}),
        (
            {"max_num_seqs": 64, "max_num_batched_tokens": 2048},
            {"max_num_seqs": 64, "max_num_batched_tokens": 2048},
        ),
        ({"gpu_memory_utilization": 0.2}, {"gpu_memory_utilization": 0.2}),
    ]
    outcomes = []
    for params, flags in configs:
        result = sim.evaluate(EngineConfig(model=MODEL).replace(**flags), workload, [], seed=0)
        outcomes.append((params, result))
    study = build_run(run_dir, outcomes)
    StudyNote(study, CONTEXT).update(force=True)
    maximize = [o.maximize for o in OBJECTIVES.objectives]
    out = outcome(records(study), OBJECTIVES.names, maximize, CONTEXT["slos"], CONTEXT)
    report.write_all(run_dir, out)
    return run_dir


def test_the_dashboard_shows_the_note_and_the_feasibility_figure(study_dir: Path) -> None:
    study = optuna.load_study(study_name="unit", storage=load_run(study_dir).storage)
    server = start_dashboard(load_run(study_dir).storage)
    try:
        base = f"{server.url}studies/{study._study_id}"
        note = rendered(f"{base}/note")
        assert "autotune: unit" in note and "ttft_p99=2s" in note
        assert "Recommendation" in note and "vllm serve meta-llama/Llama-3.1-8B-Instruct" in note
        assert "Failures by class" in note and "kv_cache_oom" in note
        main = rendered(base)
        assert "Pareto front with feasibility" in main
        assert "p99_ttft (ms)" in main  # the figure's axis, with its unit
    finally:
        server.stop()


def test_report_html_puts_the_recommendation_first_and_marks_its_row(study_dir: Path) -> None:
    page = rendered((study_dir / "report.html").as_uri())
    assert (
        page.index("Recommendation") < page.index("Feasible Pareto front") < page.index("Failures by class")
    )
    assert '<tr class="rec">' in page and "★" in page
    assert "output_throughput (tok/s)" in page and "kv_cache_oom" in page
    assert "None" not in page.split("Failures by class")[0]  # no Python None in the tables


# Text of the note (its rendered markdown: the parent of the "Recommendation" heading) that lies past the
# window's right edge, or sits in a box narrower than its content (cut off, or behind a scroll bar).
CUT_OFF = """(() => {
  const heading = [...document.querySelectorAll("h3")].find(e => e.textContent.trim() === "Recommendation");
  const note = heading.parentElement;
  const width = document.documentElement.clientWidth;
  const cut = [...note.querySelectorAll("*")].filter(e =>
    (!e.children.length && e.textContent.trim() && e.getBoundingClientRect().right > width + 1) ||
    e.scrollWidth > e.clientWidth + 1);
  return {text: note.innerText, cut: cut.map(e => e.tagName + ": " + e.textContent.trim().slice(0, 60))};
})()"""


def test_the_dashboard_note_wraps_in_a_1400_px_window(study_dir: Path) -> None:
    """The recommendation and its command are readable whole at 1,400 px (a one-line command in a
    code block widened the note past the window and cut them off)."""
    from browser import Browser

    study = optuna.load_study(study_name="unit", storage=load_run(study_dir).storage)
    server = start_dashboard(load_run(study_dir).storage)
    browser = Browser(width=1400, height=900)
    try:
        browser.open(f"{server.url}studies/{study._study_id}/note")
        assert browser.wait_for("document.body.innerText.includes('Failures by class')")
        seen = browser.evaluate(CUT_OFF)
    finally:
        browser.close()
        server.stop()
    assert "vllm serve meta-llama/Llama-3.1-8B-Instruct" in seen["text"]
    assert "--kv-cache-dtype" in seen["text"]
    assert seen["cut"] == []
