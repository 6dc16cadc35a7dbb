"""optuna-dashboard serves the run's study over HTTP on 127.0.0.1, with feasibility in user attrs."""

from __future__ import annotations

from pathlib import Path

import httpx
from test_study import build_run, ok

from autotune.outputs.dashboard import start_dashboard
from autotune.outputs.export import load_run


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
