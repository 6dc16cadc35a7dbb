"""optuna-dashboard serves the run's study over HTTP on 127.0.0.1, with feasibility in user attrs."""

from __future__ import annotations

from pathlib import Path

import httpx
from test_study import build_run, ok

from autotune.outputs.dashboard import start_dashboard
from autotune.outputs.run_info import load_run


def test_dashboard_serves_the_study_api(tmp_path: Path) -> None:
    build_run(
        tmp_path, [({"max_num_seqs": 64, "baseline": True}, ok(4000, 1500, 20)), ({"max_num_seqs": 8}, None)]
    )
    server = start_dashboard(load_run(tmp_path).storage)
    try:
        assert server.url.startswith("http://127.0.0.1:") and server.port > 0
        base = server.url.removesuffix("/dashboard/")
        studies = httpx.get(f"{base}/api/studies", timeout=10).json()["study_summaries"]
        (study,) = [s for s in studies if s["study_name"] == "unit"]
        detail = httpx.get(f"{base}/api/studies/{study['study_id']}", params={"after": 0}, timeout=10).json()
        assert detail["objective_names"] == ["output_throughput", "p99_ttft_ms", "p99_itl_ms"]
        attrs = [{a["key"]: str(a["value"]).lower() for a in t["user_attrs"]} for t in detail["trials"]]
        assert [a["feasible"] for a in attrs] == ["true", "false"]
        assert "margin_ttft_p99" in attrs[0] and attrs[1]["failure"] == "kv_cache_oom"
        assert httpx.get(server.url, timeout=10).status_code == 200
    finally:
        server.stop()


def test_the_dashboard_command_gives_an_older_study_its_note(tmp_path: Path) -> None:
    import optuna
    from optuna_dashboard import get_note

    from autotune.commands.dashboard import _write_note

    study = build_run(
        tmp_path, [({"max_num_seqs": 64, "baseline": True}, ok(4000, 1500, 20)), ({"max_num_seqs": 8}, None)]
    )
    assert get_note(study) == ""
    _write_note(load_run(tmp_path))
    note = get_note(optuna.load_study(study_name="unit", storage=load_run(tmp_path).storage))
    assert "## autotune: unit" in note and "kv_cache_oom" in note and "trial #0" in note


def test_the_note_says_the_dashboards_best_trials_ignore_the_slos(tmp_path: Path) -> None:
    """optuna-dashboard 0.21's best_trials is the Pareto front of every trial, constraints unread (its
    `_pareto_front.py`), so a study where nothing meets the SLO lists its violating trials as best: no
    storage key changes that, so the study's note says it."""
    from autotune.outputs.dashboard import note_markdown
    from autotune.outputs.outcome import outcome
    from autotune.tune.study import records

    study = build_run(tmp_path, [({"max_num_seqs": 64, "baseline": True}, ok(4000, 2500, 20))])  # misses
    server = start_dashboard(load_run(tmp_path).storage)
    try:
        base = server.url.removesuffix("/dashboard/")
        detail = httpx.get(f"{base}/api/studies/{study._study_id}", params={"after": 0}, timeout=10).json()
        assert [t["number"] for t in detail["best_trials"]] == [0]  # infeasible, yet "best"
    finally:
        server.stop()
    names = ["output_throughput", "p99_ttft_ms", "p99_itl_ms"]
    out = outcome(records(study), names, [True, False, False], ["ttft_p99=2s"])
    assert out.front == [] and "SLO-violating ones included" in note_markdown("unit", out)


def test_the_dashboard_gives_a_guided_runs_trials_the_prediction_of_guide_json(tmp_path: Path) -> None:
    """The guide chose #0; vLLM's defaults, #1, it did not (no `guide` attr on the trial), yet guide.json
    (and with it the summary, report.html and guide.png) gives them its own prediction, 4,722.5. The
    dashboard's note and figure give them the same (the note said "-" and the figure left them out)."""
    import json

    import optuna
    from optuna_dashboard import get_note
    from optuna_dashboard._custom_plot_data import get_plotly_graph_objects

    from autotune.commands.dashboard import _write_note
    from autotune.outputs.dashboard import GUIDE_FIGURE_ID
    from autotune.outputs.guide_view import GUIDE_FILE

    chosen = {"predicted": 4828.4, "raw": 4828.4, "by": "best predicted", "rate": 19.9}
    build_run(
        tmp_path,
        [
            ({"max_num_seqs": 512, "guide": chosen}, ok(4828, 401, 125)),
            ({"max_num_seqs": 1024, "baseline": True}, ok(4757, 369, 175)),
        ],
    )

    def row(trial: int, predicted: float, measured: float, by: str) -> dict:
        """A trial's row as guide.json has it (its raw prediction the corrected one: no refit)."""
        return {"trial": trial, "predicted": predicted, "raw": predicted, "measured": measured, "by": by}

    rows = [row(0, 4828.4, 4828.0, "best predicted"), row(1, 4722.5, 4757.0, "vLLM's defaults")]
    data = {"gpu_hours": 0.23, "budget_gpu_hours": 2.0, "stop_reason": "--n-trials reached", "trials": rows}
    (tmp_path / GUIDE_FILE).write_text(json.dumps(data))

    _write_note(load_run(tmp_path))  # what `autotune dashboard RUN` shows
    study = optuna.load_study(study_name="unit", storage=load_run(tmp_path).storage)
    note = get_note(study)
    assert "| #0 | best predicted | 4,828.4 | 4,828.0 |" in note
    assert "| #1 | vLLM's defaults | 4,722.5 | 4,757.0 |" in note, note
    figures = get_plotly_graph_objects(study._storage.get_study_system_attrs(study._study_id))
    points = json.loads(figures[GUIDE_FIGURE_ID])["data"][-1]
    assert (points["text"], points["x"], points["y"]) == (["#0", "#1"], [4828.4, 4722.5], [4828.0, 4757.0])


def test_while_the_defaults_are_measured_the_note_does_not_say_there_are_none(tmp_path: Path) -> None:
    """A guided run measures its pick first and vLLM's defaults second: between them the note said "no
    baseline trial in this study to compare with" of a study whose baseline was running."""
    from optuna_dashboard import get_note

    from autotune.outputs.dashboard import StudyNote

    study = build_run(tmp_path, [({"max_num_seqs": 64}, ok(4000, 1500, 20))])
    study.enqueue_trial({"max_num_seqs": 256}, user_attrs={"baseline": True})
    running = study.ask()
    StudyNote(study, {"slos": ["ttft_p99=2s"]}).update(force=True)
    note = get_note(study)
    assert f"vLLM's defaults (trial #{running.number}) are being measured" in note
    assert "no baseline trial" not in note
