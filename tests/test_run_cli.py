"""`autotune run` end to end: bad inputs, a parallel run on Ray, Ctrl-C and --resume (real subprocess)."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from study_db import counted_trials

from autotune.cli import main
from autotune.commands.run_end import print_summary
from autotune.outputs.export import parse_command
from autotune.outputs.run_info import load_run
from autotune.store.urls import run_storage
from autotune.tune.run_records import RunSummary
from autotune.tune.tally import Tally

SIM_SERVER = f"{sys.executable} -m autotune.cli sim-server"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--space", "no/such/space.yaml"], "search space file not found"),
        (["--space", "{bad_param}"], "unknown parameter 'max_num_sequences'"),
        (["--space", "{malformed}"], "malformed YAML"),
        (["--slo", "ttft_p99=fast"], "bad SLO"),
        (["--model", "acme/NoSuchModel-3B"], "unknown model"),
        (["--gpu", "RTX-9999"], "unknown GPU"),
        (["--gpus", "two"], "bad --gpus"),
        (["--objectives", "nope"], "objectives file not found"),
        (
            ["--model", "meta-llama/Llama-3.1-70B-Instruct"],
            "use tensor parallelism (TP >= 2), e.g. --space tp",
        ),
        (
            ["--space", "tp", "--gpu", "L4"],
            "does not fit on 4 L4s (tensor_parallel_size 4) with the KV cache of one max_model_len request: "
            "use tensor parallelism (TP >= 8), add it to the space's tensor_parallel_size",
        ),
        (["--target-rate", "0"], "argument --target-rate: value must be positive"),
        (["--target-rate", "1e308"], "argument --target-rate: value must be at most 1e+06, got '1e308'"),
        (["--gpu-price", "1e308"], "argument --gpu-price: value must be at most 1000, got '1e308'"),
    ],
)
def test_bad_inputs_give_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    bad_param = tmp_path / "bad_param.yaml"
    bad_param.write_text("params:\n  max_num_sequences: {type: int, low: 1, high: 8}\n")
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("params: [unclosed\n")
    args = [a.format(bad_param=bad_param, malformed=malformed) for a in args]
    try:
        code = main(["run", "--runs-dir", str(tmp_path / "runs"), *args])
    except SystemExit as exc:  # argparse's own (one-line) errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.parametrize("backend", ["sim", "vllm"])
def test_more_gpus_than_the_cluster_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: str
) -> None:
    args = [
        "run",
        "--runs-dir",
        str(tmp_path),
        "--backend",
        backend,
        *(["--serve-cmd", SIM_SERVER] if backend == "vllm" else []),  # the sim backend refuses it
        "--gpus",
        "4",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "autotune run: error: --gpus asks for 4 GPU(s) but the Ray cluster has 2"
    assert not list(tmp_path.rglob("study.db")), "the refused run left a study that would need --resume"


@pytest.mark.parametrize("gpus", [["--gpus", "64"], []], ids=["more-than-there-are", "none-asked"])
def test_gpus_missing_on_the_local_cluster_are_this_machines(tmp_path: Path, gpus: list[str]) -> None:
    """Without --ray-address the run starts its own local Ray cluster: the refusal names this machine,
    not a Ray cluster the user never started ("... but the Ray cluster has 0")."""
    if not gpus and shutil.which("nvidia-smi"):
        pytest.skip("this machine has GPUs: the run would start")
    cmd = [sys.executable, "-m", "autotune.cli", "run", "--runs-dir", str(tmp_path), "--backend", "vllm"]
    # A real command that is not the simulator: the run needs real GPUs, as the docker backend's does.
    done = subprocess.run(
        [*cmd, "--serve-cmd", f"{sys.executable} -m http.server", *gpus],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    found = r"(this machine has \d+ GPU\(s\)|no GPU was found on this machine)"
    asked = "--gpus asks for 64 GPU\\(s\\)" if gpus else "the vllm backend needs GPUs"
    assert re.fullmatch(f"autotune run: error: {asked} but {found}", done.stderr.strip()), done.stderr


def test_sim_server_as_serve_command_needs_no_gpu(tmp_path: Path) -> None:
    """Without a GPU, `--backend vllm --serve-cmd "autotune sim-server" --gpus 1,3` gets 2 virtual GPUs,
    and Ray assigns exactly those devices."""
    workload = tmp_path / "tiny.yaml"
    workload.write_text("name: tiny\nnum_requests: 16\nrequest_rate: inf\nprompt_len: 64\noutput_len: 16\n")
    cmd = [sys.executable, "-m", "autotune.cli", "run", "--space", "small", "--workload", str(workload)]
    cmd += ["--backend", "vllm", "--serve-cmd", SIM_SERVER, "--gpus", "1,3", "--n-trials", "3"]
    cmd += ["--repeats", "0"]  # re-measuring on a real backend: tests/test_estimate.py
    cmd += ["--slo", "ttft_p99=10s", "--runs-dir", str(tmp_path), "--study", "virt", "--quiet"]
    env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    assert counted_trials(tmp_path / "virt" / "study.db", "virt") == (3, 0)
    assert (tmp_path / "virt" / "trials" / "0" / "server.log").stat().st_size > 0  # a real server ran
    assert "autotune: estimate: about " in done.stderr and "GPU-hours for 3 trials" in done.stderr
    study = optuna.load_study(study_name="virt", storage=f"sqlite:///{tmp_path / 'virt' / 'study.db'}")
    used = {g for t in study.trials for g in t.user_attrs.get("gpu_ids", ())}
    assert used and used <= {1, 3}  # the --gpus devices, as Ray assigned them
    with (tmp_path / "virt" / "trials.csv").open() as f:
        nodes = {row["node_ip"] for row in csv.DictReader(f) if row["node_ip"]}
    assert nodes == {"127.0.0.1"}  # the cluster autotune started listens on loopback, not every interface


@pytest.mark.usefixtures("ray_cluster")
def test_parallel_run_is_consistent_and_writes_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["run", "--space", "small", "--slo", "ttft_p99=2s", "--n-trials", "8", "--parallel", "2"]
    args += ["--target-rate", "100", "--gpu-price", "2.5"]
    assert main([*args, "--runs-dir", str(tmp_path), "--study", "par", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    run_dir = tmp_path / "par"
    for name in ("study.db", "trials.csv", "pareto.csv", "best.json", "best.sh", "pareto.png", "report.html"):
        assert (run_dir / name).stat().st_size > 0, name
    info = load_run(run_dir)
    study = optuna.load_study(study_name=info.study, storage=run_storage(info))
    trials = study.get_trials()
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    counted = [
        t
        for t in trials
        if t.state == TrialState.COMPLETE
        and t.user_attrs.get("launched", True)
        and "duplicate_of" not in t.user_attrs
    ]
    assert len(counted) == 8 and trials[0].user_attrs["baseline"] is True
    # two trials were in flight at once: some trial started before an earlier one was told
    spans = sorted((t.datetime_start, t.datetime_complete) for t in counted)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))
    best = json.loads((run_dir / "best.json").read_text())
    shell = (run_dir / "best.sh").read_text().splitlines()[-1]
    assert (
        parse_command(shell.removeprefix("exec ").removesuffix(' "$@"')).params()
        == parse_command(best["command"]).params()
    )
    assert "Feasible Pareto front" in out and "vllm serve" in out
    assert best["sizing"]["target_rate"] == 100 and best["sizing"]["replicas"] >= 1 and "replicas" in out
    assert best["sizing"]["usd_per_mtok"] > 0 and "simulated GPU time spent" in out
    from optuna_dashboard import get_note

    note = get_note(study)
    assert "ttft_p99=2s" in note and f"trial #{best['trial']}" in note  # the study's dashboard note


def test_ctrl_c_before_the_first_trial_says_how_to_continue(tmp_path: Path) -> None:
    """Interrupted while the guided run estimates and predicts (before its tuner starts): the study
    exists, so the same command is refused without --resume; the interrupt's line says to add it."""
    cmd = [sys.executable, "-m", "autotune.cli", "run", "--space", "small", "--slo", "ttft_p99=2s"]
    cmd += ["--guide", "sim", "--gpu-hours", "1", "--noise", "0.02", "--n-trials", "2"]
    cmd += ["--runs-dir", str(tmp_path), "--study", "early", "--quiet"]
    env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    seen = ""
    while "estimating the run's GPU time" not in seen and proc.poll() is None:
        seen += proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, seen + err
    assert counted_trials(tmp_path / "early" / "study.db", "early") == (0, 0)
    assert "autotune run: 0 finished trials kept in" in err and "the same command with --resume" in err


def test_a_stop_a_finalizer_swallowed_during_the_estimate_still_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM while Python runs a weakref callback during the estimate: its KeyboardInterrupt is
    discarded ("Exception ignored in ..."), yet the run stops before its first trial, exit 130."""
    import weakref

    import autotune.commands.run as run_command

    estimate = run_command.run_estimate

    class Doomed:
        pass

    def estimate_then_stop(*args: object) -> object:
        doomed = Doomed()
        weakref.finalize(doomed, signal.raise_signal, signal.SIGTERM)  # to this thread
        del doomed  # the callback runs here, and the handler's KeyboardInterrupt is lost
        return estimate(*args)

    monkeypatch.setattr(run_command, "run_estimate", estimate_then_stop)
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: None)  # not pytest's warning
    args = ["run", "--space", "small", "--load", "fixed", "--runs-dir", str(tmp_path)]
    code = main([*args, "--study", "lost", "--n-trials", "2", "--quiet"])
    err = capsys.readouterr().err
    assert code == 130, err
    assert "autotune run: 0 finished trials kept in" in err and err.endswith("autotune run: interrupted\n")
    assert counted_trials(tmp_path / "lost" / "study.db", "lost") == (0, 0)


def test_ctrl_c_while_the_last_results_are_written_says_where_the_trials_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Ctrl-C once every trial had ended, as the results were written, said only "interrupted"."""
    from autotune.outputs import report

    write_all = report.write_all

    def interrupted_once(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(report, "write_all", write_all)
        signal.raise_signal(signal.SIGINT)  # held until the results are written (deferred_ctrl_c)
        return write_all(*args, **kwargs)

    monkeypatch.setattr(report, "write_all", interrupted_once)
    argv = ["run", "--space", "small", "--slo", "ttft_p99=2s", "--load", "fixed", "--n-trials", "2"]
    code = main([*argv, "--runs-dir", str(tmp_path), "--study", "late", "--quiet", "--parallel", "1"])
    err = capsys.readouterr().err
    assert code == 130, err
    assert "autotune run: 2 finished trials kept in " in err and err.endswith("autotune run: interrupted\n")
    assert (tmp_path / "late" / "trials.csv").exists()


def test_a_resume_without_the_storage_the_run_used_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run on --storage resumed without it was asked whether its study.db was deleted or moved."""
    shared = tmp_path / "shared.db"
    argv = ["run", "--space", "small", "--slo", "ttft_p99=2s", "--load", "fixed", "--n-trials", "1"]
    argv += ["--runs-dir", str(tmp_path / "runs"), "--study", "s", "--quiet", "--parallel", "1"]
    assert main([*argv, "--storage", f"sqlite:///{shared}"]) == 0
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"autotune run: error: {tmp_path / 'runs' / 's'} keeps its study in another storage (run.json: "
        f"sqlite:///{shared}): pass --storage with it (its password too, which run.json does not keep); "
        "nothing was changed\n"
    )
    assert not (tmp_path / "runs" / "s" / "study.db").exists()


def test_a_resume_of_a_study_past_its_n_trials_says_no_trial_will_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said "1 trial, 2 finished before this resume" and printed the whole summary again, as if it ran."""
    argv = ["run", "--space", "small", "--slo", "ttft_p99=2s", "--load", "fixed", "--runs-dir", str(tmp_path)]
    argv += ["--study", "done", "--parallel", "1"]
    assert main([*argv, "--n-trials", "2", "--quiet"]) == 0
    capsys.readouterr()
    assert main([*argv, "--n-trials", "1", "--resume"]) == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first.endswith("; --n-trials 1 reached already: no new trial (raise it for more))"), first
    assert counted_trials(tmp_path / "done" / "study.db", "done") == (2, 0)


def test_ctrl_c_keeps_finished_trials_and_resume_continues(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "autotune.cli", "run", "--space", "small", "--slo", "ttft_p99=2s"]
    # At a fixed load (short trials): this is about Ctrl-C, not about what a trial measures.
    cmd += ["--load", "fixed", "--runs-dir", str(tmp_path), "--study", "intr", "--n-trials", "200"]
    env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    db = tmp_path / "intr" / "study.db"
    deadline = time.monotonic() + 120
    while counted_trials(db, "intr")[0] < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "finished trials kept" in err and "--resume" in err
    done, running = counted_trials(db, "intr")
    assert done >= 3 and running == 0  # finished trials kept, the cancelled one marked FAIL
    assert (tmp_path / "intr" / "trials.csv").exists()  # partial results written on the way out

    target = done + 2
    resume = subprocess.run(
        [*cmd[:-1], str(target), "--resume"], capture_output=True, text=True, env=env, timeout=180
    )
    assert resume.returncode == 0, resume.stderr
    kept = re.search(r"(\d+) finished trials kept in \S+ \(((\d+) measured[^)]*)\)", err)
    assert kept and int(kept[3]) == done, err  # the Ctrl-C line and the resume count alike
    assert f"{target} trials, {kept[1]} finished before this resume: {kept[2]})" in resume.stderr
    assert counted_trials(db, "intr") == (target, 0)
    study = optuna.load_study(study_name="intr", storage=f"sqlite:///{db}")
    assert sum(bool(t.user_attrs.get("baseline")) for t in study.trials) == 1


@pytest.mark.usefixtures("ray_cluster")
def test_grid_sampler_stops_when_the_grid_is_done(tmp_path: Path) -> None:
    space = tmp_path / "grid.yaml"
    space.write_text(
        "fixed: {model: meta-llama/Llama-3.1-8B-Instruct, gpu: H100, max_model_len: 8192}\n"
        "params:\n"
        "  max_num_seqs: {type: categorical, choices: [64, 256]}\n"
        "  max_num_batched_tokens: {type: categorical, choices: [2048, 8192]}\n"
    )
    args = ["run", "--space", str(space), "--sampler", "grid", "--n-trials", "50", "--quiet"]
    args += ["--workload", "concurrency", "--load", "fixed", "--runs-dir", str(tmp_path), "--study", "g"]
    assert main(args) == 0
    study = optuna.load_study(study_name="g", storage=f"sqlite:///{tmp_path / 'g' / 'study.db'}")
    configs = {(t.params["max_num_seqs"], t.params["max_num_batched_tokens"]) for t in study.trials}
    assert configs == {(64, 2048), (64, 8192), (256, 2048), (256, 8192)}
    assert len(study.trials) <= 5  # the four grid points and the baseline, then it stops asking


def test_another_load_or_objectives_is_another_default_study(tmp_path: Path) -> None:
    """A study keeps its load and objectives: runs that differ only in them get their own default names
    (they were refused as a --resume of the first), and the defaults keep today's name."""
    base = ["run", "--space", "small", "--n-trials", "1", "--quiet", "--runs-dir", str(tmp_path)]
    for extra in ([], ["--load", "fixed"], ["--objectives", "throughput"]):
        assert main([*base, *extra]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "llama-3.1-8b-instruct-h100-chat-fixed-small",
        "llama-3.1-8b-instruct-h100-chat-small",
        "llama-3.1-8b-instruct-h100-chat-throughput-small",
    ]


def test_a_gpu_alias_is_shown_recorded_and_named_by_the_catalog_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--gpu h100-80gb` is the H100: the header, run.json and the default study name say "H100", so a
    resume typed with another spelling finds the study the first run made."""
    base = ["run", "--space", "small", "--n-trials", "1", "--quiet", "--runs-dir", str(tmp_path)]
    assert main([*base, "--gpu", "h100-80gb"]) == 0
    assert "on H100, workload" in capsys.readouterr().err
    (run_dir,) = tmp_path.iterdir()
    assert run_dir.name == "llama-3.1-8b-instruct-h100-chat-small"
    assert json.loads((run_dir / "run.json").read_text())["gpu"] == "H100"
    assert main([*base[:4], "2", *base[5:], "--gpu", "h100", "--resume"]) == 0
    assert "on H100, workload" in capsys.readouterr().err
    assert json.loads((run_dir / "run.json").read_text())["gpu"] == "H100"


def test_a_resume_with_an_edited_workload_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The study records its workload's content: the same file edited since is another workload (it was
    resumed, one study mixing two); the bundled file of the same content resumes it."""
    workload = tmp_path / "wl.yaml"
    workload.write_text((Path(__file__).parents[1] / "workloads" / "chat.yaml").read_text())
    base = ["run", "--space", "small", "--quiet", "--runs-dir", str(tmp_path), "--study", "ed"]
    assert main([*base, "--workload", str(workload), "--n-trials", "1"]) == 0
    workload.write_text(workload.read_text().replace("mean: 1000,", "mean: 2000,"))
    capsys.readouterr()
    assert main([*base, "--workload", str(workload), "--n-trials", "2", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'ed' was run with workload chat of other content" in err, err
    assert counted_trials(tmp_path / "ed" / "study.db", "ed") == (1, 0)
    assert main([*base, "--workload", "chat", "--n-trials", "2", "--resume"]) == 0


def test_a_resume_with_another_seed_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The trials drew their requests with the run's --seed: a resume with another (or without one, after
    a seeded run) measured the next trials on other requests in the same front."""
    base = ["run", "--space", "small", "--quiet", "--runs-dir", str(tmp_path), "--study", "sd"]
    assert main([*base, "--n-trials", "1", "--seed", "3"]) == 0
    capsys.readouterr()
    assert main([*base, "--n-trials", "2", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'sd' was run with --seed 3, not 0" in err, err
    assert counted_trials(tmp_path / "sd" / "study.db", "sd") == (1, 0)
    assert main([*base, "--n-trials", "2", "--seed", "3", "--resume"]) == 0
    assert counted_trials(tmp_path / "sd" / "study.db", "sd")[0] == 2


def _told(**attrs: object) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(value=0.0, user_attrs=attrs)


def test_counts_name_each_kind_of_finished_trial() -> None:
    """A config rejected before launch is a finished trial but not measured, and one that failed to
    start (it never served) is launched, counted by --n-trials, but not measured: the Ctrl-C line, the
    resume line and the summary say so rather than '3 finished trials' beside '2 measured', or '2
    configs measured' where both crashed at startup."""
    tally = Tally(maximize=True)
    rejected = {"launched": False, "failure": "invalid_config"}
    for attrs in ({"feasible": True}, {"failure": "kv_cache_oom"}, rejected):
        tally.record(_told(**attrs))
    assert tally.kinds_text() == "1 measured, 1 failed to start, 1 rejected before launch"
    assert (tally.finished, tally.done, tally.measured) == (3, 2, 1)  # --n-trials counts the launched ones


def test_the_summary_says_launched_configs_that_never_served_were_not_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = type("Out", (), {"cost": None})()
    crashed = RunSummary(completed=2, rejected=0, told=2, wall_s=1.0, unstarted=2)
    normal = RunSummary(completed=50, rejected=10, told=60, wall_s=59.0)
    for summary in (crashed, normal):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("autotune.outputs.report.summary_text", lambda _: "")
            print_summary((out, []), summary, tmp_path)
    said = capsys.readouterr().out
    assert "2 configs launched, 0 measured (2 failed to start), 0 duplicate suggestions" in said
    assert (
        "50 configs measured, 0 duplicate suggestions answered from earlier results, 10 suggestions" in said
    )


def test_the_summary_counts_one_of_a_kind_in_the_singular(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """'1 duplicate suggestions' read as a typo: one of each is singular, in the cost sentence too."""
    from autotune.outputs.cost import CostView

    cost = CostView(0.2, saved_abort_h=0.03, saved_screen_h=0.1, aborted=1, screened=1, simulated=True)
    out = type("Out", (), {"cost": cost})()
    one = RunSummary(completed=1, rejected=1, told=3, wall_s=1.0, duplicates=1, repeated=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("autotune.outputs.report.summary_text", lambda _: "")
        print_summary((out, []), one, tmp_path)
    said = capsys.readouterr().out
    assert "1 config measured, 1 duplicate suggestion answered from earlier results, 1 suggestion " in said
    assert "; 1 re-measurement of the top" in said
    assert "by early abort (1 trial)" in said and "by screening (1 config not launched)" in said
