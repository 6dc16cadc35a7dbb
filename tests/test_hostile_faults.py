"""What a deployer meets (real processes, real files, relative paths): the documented commands from a
fresh clone's root, SIGTERM and SIGHUP whatever Ctrl-C's disposition, a killed driver's Ray processes,
two --resume started together, a run folder whose study.db is gone, SLO limits written back."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import optuna
import pytest
from study_db import counted_trials

from autotune.measure.slo import parse_slo

AUTOTUNE = str(Path(sys.executable).parent / "autotune")
ENV = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1"}
TINY = "num_requests: 8\nload: fixed\nprompt_len: 64\noutput_len: 8\n"  # a trial takes milliseconds


def _lines(err: str) -> list[str]:
    """The error lines (not the run's announcements)."""
    return [line for line in err.splitlines() if line.strip() and not line.startswith("autotune: ")]


def test_the_documented_commands_work_from_a_fresh_clone(repo: Path, tmp_path: Path) -> None:
    if shutil.which("git") is None or not (repo / ".git").exists():
        pytest.skip("needs git and a git checkout")
    clone = tmp_path / "autotune"
    subprocess.run(["git", "clone", "--quiet", str(repo), str(clone)], check=True, timeout=60)

    def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [AUTOTUNE, *args], cwd=clone, capture_output=True, text=True, env=ENV, timeout=timeout
        )

    # The README's first command, on a small budget, with the default relative runs/.
    run = cli(
        "run", "--space", "search_spaces/vllm.yaml", "--slo", "ttft_p99=2s", "--n-trials", "2", "--quiet"
    )
    assert run.returncode == 0, run.stderr
    (run_dir,) = (clone / "runs").glob("*/run.json")
    relative = f"runs/{run_dir.parent.name}"
    assert f"Results: {relative}/" in run.stdout  # what the run prints is what the user types next
    exported = cli("export", relative, "--format", "flags")
    assert exported.returncode == 0 and "--max-num-seqs" in exported.stdout, exported.stderr
    bench = cli("bench", "--set", "max_num_seqs=256", "--set", "max_num_batched_tokens=8192", "--json")
    assert bench.returncode == 0, bench.stderr
    dashboard = subprocess.Popen(
        [AUTOTUNE, "dashboard", relative],
        cwd=clone,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        line = dashboard.stdout.readline() if dashboard.stdout else ""
        assert "http://127.0.0.1:" in line, dashboard.stderr.read() if dashboard.poll() is not None else line
        url = line.split(": ", 1)[1].strip()
        assert httpx.get(url + "api/studies", timeout=30).status_code == 200
    finally:
        dashboard.send_signal(signal.SIGINT)
        dashboard.communicate(timeout=30)
    assert dashboard.returncode == 0
    # Nothing was written outside the run folder: no stray study.db in the clone's root.
    status = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
        cwd=clone,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert status and all(s.startswith(f"!! {relative}/") for s in status), status


def _background_run(
    tmp_path: Path, *extra: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], int]:
    """A long run started from a script with `&` (its SIGINT ignored, as the shell does for background
    jobs), returned with its pid once 2 trials are COMPLETE."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    cmd = f"{AUTOTUNE} run --space small --workload tiny.yaml --study s --n-trials 100000 --quiet"
    script = f"{cmd} {' '.join(extra)} & echo $! > pid; wait $!"
    shell = subprocess.Popen(
        ["bash", "-c", script],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**ENV, **(env or {})},
        # SIGHUP at its default, whatever this test runs under (`nohup` would pass on an ignored one,
        # which the run rightly keeps ignoring)
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while counted_trials(tmp_path / "runs" / "s" / "study.db", "s")[0] < 2 and time.monotonic() < deadline:
        assert shell.poll() is None, shell.communicate()
        time.sleep(0.3)
    pid = int((tmp_path / "pid").read_text())
    assert _sigint_ignored(pid), "the shell ignores Ctrl-C for a background job"
    return shell, pid


def _sigint_ignored(pid: int) -> bool:
    mask = next(
        line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigIgn")
    )
    return bool(int(mask.split()[1], 16) & (1 << (signal.SIGINT - 1)))


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_ends_a_background_run_whose_ctrl_c_is_ignored(
    stop: signal.Signals, tmp_path: Path
) -> None:
    shell, pid = _background_run(tmp_path)
    os.kill(pid, stop)
    try:
        _, err = shell.communicate(timeout=60)  # the old code ignored SIGTERM here until SIGKILL
    finally:
        if shell.poll() is None:  # a run that did not stop is not left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            shell.wait(timeout=30)
    assert shell.returncode == 130, err
    assert "finished trials kept" in err and "--resume continues" in err and "Traceback" not in err
    done, running = counted_trials(tmp_path / "runs" / "s" / "study.db", "s")
    assert done >= 2 and running == 0
    assert (tmp_path / "runs" / "s" / "trials.csv").stat().st_size > 0


def _marked(mark: str, cwd: Path) -> list[str]:
    """The processes (pid and command) whose environment carries AUTOTUNE_TEST_MARK=mark or that run in
    `cwd` (Ray's agents do not always get the driver's environment, but they keep its folder)."""
    needle, found = f"AUTOTUNE_TEST_MARK={mark}".encode(), []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (
                needle in (entry / "environ").read_bytes()
                or Path(os.readlink(entry / "cwd")) == cwd.resolve()
            ):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{entry.name} {command[:300]}")
        except OSError:
            continue
    return found


def _gone(mark: str, cwd: Path, within_s: float) -> list[str]:
    deadline = time.monotonic() + within_s
    while (left := _marked(mark, cwd)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def _driver(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """A run in the background, as a shell starts one: Ctrl-C ignored, stopped by the signal a test sends."""
    return subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_stopped_or_killed_driver_leaves_no_server_nor_ray_process(
    stop: signal.Signals, tmp_path: Path
) -> None:
    """The process backend (a real `autotune sim-server` per trial, Ray tasks): SIGTERM stops the run
    cleanly, SIGKILL stops it dead; either way every server and Ray process it started is gone."""
    mark = f"{os.getpid()}-{stop.name}"
    env = {**ENV, "AUTOTUNE_TEST_MARK": mark, "PATH": f"{Path(AUTOTUNE).parent}:{os.environ['PATH']}"}
    (tmp_path / "tiny.yaml").write_text(TINY)
    cmd = [AUTOTUNE, "run", "--backend", "vllm", "--serve-cmd", "autotune sim-server", "--gpus", "1"]
    cmd += ["--space", "small", "--workload", "tiny.yaml", "--study", "p", "--n-trials", "1000", "--quiet"]
    proc = _driver(cmd, tmp_path, env)
    try:
        deadline = time.monotonic() + 180
        db = tmp_path / "runs" / "p" / "study.db"
        while counted_trials(db, "p")[0] < 1 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.5)
        while not any("sim-server" in p for p in _marked(mark, tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.1)  # between two trials no server runs: stop the run while one does
        proc.send_signal(stop)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    if stop == signal.SIGTERM:
        assert proc.returncode == 130 and "finished trials kept" in err, err
        assert "Token authentication" not in err  # Ray's notice stays out of the run's output
    assert not _gone(mark, tmp_path, within_s=20), _marked(mark, tmp_path)


def test_a_killed_simulated_run_leaves_no_worker_process(tmp_path: Path) -> None:
    """The simulated backend's trials run on worker processes; SIGKILL of the driver (the OOM killer)
    gives it no chance to end them, and they exit by themselves within seconds."""
    mark = f"{os.getpid()}-workers"
    shell, pid = _background_run(tmp_path, env={"AUTOTUNE_TEST_MARK": mark})
    try:
        workers = [p for p in _marked(mark, tmp_path) if "multiprocessing" in p]
        assert workers, _marked(mark, tmp_path)  # the run's trials are on worker processes
        os.kill(pid, signal.SIGKILL)
        shell.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not _gone(mark, tmp_path, within_s=15), _marked(mark, tmp_path)


def test_two_resumes_started_together_one_drives(tmp_path: Path) -> None:
    """Resumes racing for one study's lease: taken atomically, exactly one of them gets it, each round."""
    script = tmp_path / "race.py"
    script.write_text(RACE)
    db = f"sqlite:///{tmp_path / 'study.db'}"
    subprocess.run([sys.executable, str(script), db, "0", "create"], check=True, timeout=120, env=ENV)
    for round_ in range(2):
        start = time.time() + 4  # every process has imported everything by then
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), db, str(start)], env=ENV, stderr=subprocess.PIPE, text=True
            )
            for _ in range(3)
        ]
        codes = [p.wait(timeout=120) for p in procs]
        errors = [p.stderr.read() for p in procs if p.stderr]
        assert sorted(codes) == [0, 2, 2], (round_, codes, errors)


# A driver as `autotune run` opens its study: start_study with its driver, then the lease. Exit 0 when
# it drives the study (it holds it a moment, as a run would), 2 when refused.
RACE = """
import sys, time
import optuna
from autotune.core.errors import AutotuneError
from autotune.store.lease import Lease, new_driver
from autotune.tune.study import StudySettings
from autotune.tune.study_open import start_study

settings = StudySettings(["output_throughput"], ["maximize"], [], "m", "H100", "w", "sim")
url, start = sys.argv[1], float(sys.argv[2])
if sys.argv[3:] == ["create"]:
    start_study("s", url, settings, optuna.samplers.RandomSampler(), False, {})
    sys.exit(0)
time.sleep(max(0.0, start - time.time()))
try:
    driver = new_driver()
    study = start_study("s", url, settings, optuna.samplers.RandomSampler(), True, {}, None, driver)
    lease = Lease(study, driver=driver).start()
except AutotuneError as exc:
    print(exc, file=sys.stderr)
    sys.exit(2)
time.sleep(2)
lease.release()
"""


def test_a_new_run_never_overwrites_the_results_of_a_lost_study(tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY)
    cmd = [AUTOTUNE, "run", "--space", "small", "--workload", "tiny.yaml", "--study", "l", "--quiet"]

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cmd, *extra], cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=180
        )

    assert run("--n-trials", "3", "--repeats", "0").returncode == 0
    folder = tmp_path / "runs" / "l"
    before = (folder / "trials.csv").read_text()
    (folder / "study.db").unlink()
    again = run("--n-trials", "1")
    assert again.returncode == 2, again.stderr
    (line,) = _lines(again.stderr)
    assert "holds the results" in line and "nothing was changed" in line
    assert (folder / "trials.csv").read_text() == before and not (folder / "study.db").exists()


@pytest.mark.parametrize(
    "text", ["ttft_p99=0.001ms", "itl_p99=0.0015ms", "tpot_p99=999.5ms", "e2el_p99=1234.5678s"]
)
def test_an_slo_is_written_back_as_the_same_limit(text: str) -> None:
    """A study keeps its SLOs as text and reads them back (--resume, the report): the same limits."""
    slo = parse_slo(text)
    assert parse_slo(str(slo)) == slo


def test_progress_to_a_file_shows_a_long_trial_is_alive(tmp_path: Path) -> None:
    """Without a TTY a line comes when a trial ends and, while one runs, every `every_s` seconds."""
    from autotune.tune.progress import Progress, ProgressState

    log = tmp_path / "run.log"
    with log.open("w") as stream:  # a file: not a TTY
        progress = Progress(stream, every_s=0.2)
        running = ProgressState(done=0, total=5, running=[(0, {"max_num_seqs": 256})], running_since={0: 0.0})
        progress.show(running)
        progress.show(running)  # nothing new, too soon: no line
        time.sleep(0.25)
        progress.show(dataclasses.replace(running, running_since={0: 540.0}))  # 9 minutes into the trial
        progress.show(ProgressState(done=1, total=5))
    lines = log.read_text().splitlines()
    assert len(lines) == 3, lines
    assert "running #0 9m00s seqs=256" in lines[1] and lines[2].startswith("1/5")


def test_another_slo_on_the_same_model_is_another_study(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The default study name includes the SLOs: a second SLO is a new study, not a refused --resume."""
    from autotune.cli import main

    (tmp_path / "tiny.yaml").write_text(TINY)
    argv = [
        "run",
        "--space",
        "small",
        "--workload",
        str(tmp_path / "tiny.yaml"),
        "--n-trials",
        "1",
        "--quiet",
    ]
    for slo in ("ttft_p99=2s", "ttft_p99=500ms,itl_p99=50ms"):
        assert main([*argv, "--runs-dir", str(tmp_path / "runs"), "--slo", slo]) == 0, capfd.readouterr().err
    names = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert names == [
        "llama-3.1-8b-instruct-h100-tiny-fixed-small-ttft-p99-2s",
        "llama-3.1-8b-instruct-h100-tiny-fixed-small-ttft-p99-500ms-itl-p99-50ms",
    ]


# `python serve.py sim-server ...`: every launch after the first 30 s slow to start (the re-measurement's).
SLOW_AFTER_FIRST = """
import os, sys
from pathlib import Path
count = Path("launches")
n = int(count.read_text()) if count.exists() else 0
count.write_text(str(n + 1))
extra = ["--startup-delay", "30"] if n else []
os.execv(sys.executable, [sys.executable, "-m", "autotune.cli", *sys.argv[1:], *extra])
"""


@pytest.mark.parametrize("phase", ["trial", "repeat", "killed", "killed-repeat"])
def test_a_stopped_trial_or_repeat_keeps_the_gpu_time_it_held(phase: str, tmp_path: Path) -> None:
    """SIGTERM while the second server starts (a real server per run): the second trial, or the top
    config's re-measurement, measured nothing, and the time its server held the GPU is kept as spent
    (the trial's `gpu_seconds`, with the config it was launched with and where it ran; the repeats'
    spend). SIGKILL
    instead (`killed...`): nothing runs to record it, so the resume does, up to the dead driver's last
    lease renewal."""
    killed, repeat = phase.startswith("killed"), phase.endswith("repeat")
    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "serve.py").write_text(SLOW_AFTER_FIRST)
    serve = f"{sys.executable} serve.py sim-server"
    cmd = [AUTOTUNE, "run", "--backend", "vllm", "--serve-cmd", serve, "--gpus", "1", "--space", "small"]
    cmd += ["--workload", "tiny.yaml", "--study", "r", "--sampler", "random"]
    trials, repeats = ("1", "1") if repeat else ("2", "0")
    proc = _driver([*cmd, "--n-trials", trials, "--repeats", repeats], tmp_path, ENV)
    try:
        deadline = time.monotonic() + 120
        launches = tmp_path / "launches"
        while not (launches.exists() and launches.read_text() == "2") and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        second = time.time()
        # the second server starting (30 s): held, nothing measured; SIGKILL waits for a lease renewal
        time.sleep(8 if killed else 3)
        proc.send_signal(signal.SIGKILL if killed else signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
        held = time.time() - second
    finally:
        if proc.poll() is None:
            proc.kill()
    if killed:
        assert proc.returncode == -signal.SIGKILL
        resume = [*cmd, "--n-trials", "1", "--repeats", "0", "--resume"]
        resumed = subprocess.run(resume, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 0, resumed.stderr
    else:
        assert proc.returncode == 130, err
    study = optuna.load_study(study_name="r", storage=f"sqlite:///{tmp_path / 'runs' / 'r' / 'study.db'}")
    if repeat:
        assert not study.user_attrs.get("remeasured"), study.user_attrs  # no repeat finished
        assert 3 - killed <= study.user_attrs.get("remeasured_gpu_seconds", 0) <= held + 1, study.user_attrs
        assert not study.user_attrs["remeasuring"]  # charged once: none left in flight
        return
    cut = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert [t.user_attrs.get("failure") for t in cut] == ["interrupted"], [t.user_attrs for t in cut]
    # from its launch to the signal; killed, to the last renewal before it (every 5 s: one in the 8 s)
    assert 2 <= cut[0].user_attrs["gpu_seconds"] <= held + 1
    assert cut[0].user_attrs["config"]["max_model_len"] == 8192  # as launched: it exports as it ran
    if not killed:  # where it held its GPU, as its Ray task told at its start (trials.csv shows it)
        assert cut[0].user_attrs["gpu_ids"] == [0] and cut[0].user_attrs["node_ip"], cut[0].user_attrs
