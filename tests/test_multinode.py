"""Trials on a real multi-node Ray cluster on this machine (tests/ray_keeper.py: a head without GPUs
and worker nodes with fake GPUs), served over HTTP by `autotune sim-server` through `--backend vllm`.

The driver (`autotune run --ray-address`) and the cluster run as subprocesses: a multi-node cluster
cannot share this process with the single local Ray of tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

KEEPER = Path(__file__).with_name("ray_keeper.py")
MAX_MODEL_LEN = 3071  # an unusual value: marks this module's servers in the process table
SPACE = f"""
fixed: {{model: meta-llama/Llama-3.1-8B-Instruct, gpu: H100, max_model_len: {MAX_MODEL_LEN}}}
params:
  tensor_parallel_size: {{type: categorical, choices: [1, 2, 4]}}
  max_num_seqs: {{type: categorical, choices: [8, 16, 24, 32, 48, 64]}}
"""
WORKLOAD = "name: tiny\nload: fixed\nnum_requests: 8\nrequest_rate: inf\nprompt_len: 32\noutput_len: 8\n"
# Ray's memory monitor kills tasks when the *machine* is nearly full; on a shared test machine that
# is other people's memory, not this test's.
ENV = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1", "RAY_memory_monitor_refresh_ms": "0"}


class Keeper:
    """A running tests/ray_keeper.py cluster."""

    def __init__(self, proc: subprocess.Popen[str], info: dict[str, Any]) -> None:
        self.proc = proc
        self.address: str = info["address"]
        self.workers: list[dict[str, Any]] = info["workers"]

    def kill(self, index: int) -> None:
        """SIGKILL worker node `index` (its raylet and workers), like a machine lost."""
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(f"kill {index}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "killed"

    def stop(self) -> None:
        """Shut the whole cluster down (idempotent)."""
        if self.proc.poll() is None:
            with contextlib.suppress(BrokenPipeError):
                assert self.proc.stdin
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.terminate()  # the keeper shuts its cluster down on SIGTERM too
                self.proc.wait(30)


@contextlib.contextmanager
def keeper(*gpus: int, env: dict[str, str] | None = None) -> Iterator[Keeper]:
    """A cluster with one worker node per entry of `gpus` (its fake GPU count), always shut down; its
    processes get `env` (default ENV)."""
    cmd = [sys.executable, str(KEEPER), *map(str, gpus)]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env or ENV,
    )
    try:
        assert proc.stdout
        line = proc.stdout.readline()
        assert line, "the cluster did not start"
        cluster = Keeper(proc, json.loads(line))
        yield cluster
    finally:
        Keeper(proc, {"address": "", "workers": []}).stop()


def run_args(tmp_path: Path, address: str, n_trials: int, startup_delay: float) -> list[str]:
    (tmp_path / "space.yaml").write_text(SPACE)
    (tmp_path / "tiny.yaml").write_text(WORKLOAD)
    serve = f"{sys.executable} -m autotune.cli sim-server --startup-delay {startup_delay}"
    args = [sys.executable, "-m", "autotune.cli", "run", "--space", str(tmp_path / "space.yaml")]
    args += ["--workload", str(tmp_path / "tiny.yaml"), "--backend", "vllm", "--serve-cmd", serve]
    args += ["--ray-address", address, "--sampler", "grid", "--n-trials", str(n_trials), "--no-screen"]
    # No re-measurements at the end (--repeats 0): a node lost under one would crash no trial.
    args += ["--repeats", "0"]
    return [*args, "--slo", "ttft_p99=10s", "--runs-dir", str(tmp_path), "--study", "mn", "--quiet"]


def trials(tmp_path: Path) -> list[FrozenTrial]:
    try:
        study = optuna.load_study(study_name="mn", storage=f"sqlite:///{tmp_path / 'mn' / 'study.db'}")
    except Exception:  # noqa: BLE001  (not created yet, or locked for a moment)
        return []
    return study.get_trials(deepcopy=False)


def finished(tmp_path: Path) -> dict[int, FrozenTrial]:
    """COMPLETE trials that ran a server (not rejected before launch)."""
    return {
        t.number: t
        for t in trials(tmp_path)
        if t.state == TrialState.COMPLETE and t.user_attrs.get("launched", True)
    }


def measured(done: dict[int, FrozenTrial]) -> list[FrozenTrial]:
    """The finished trials that measured a config (what --n-trials counts): not the duplicates."""
    return [t for t in done.values() if "duplicate_of" not in t.user_attrs]


def crashed_on(tmp_path: Path, node_id: str) -> bool:
    """Whether a trial was told as crashed on that node."""
    return any(
        t.user_attrs.get("failure") == "crashed" and t.user_attrs.get("node_id") == node_id
        for t in trials(tmp_path)
    )


def _stat(pid: int, field: int) -> int | None:
    """A numeric field of /proc/<pid>/stat, counted from the one after the command name (None: gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[field])
    except (OSError, IndexError, ValueError):
        return None


def _parent(pid: int) -> int:
    return _stat(pid, 1) or 0


def _age_s(pid: int) -> float:
    """Seconds since the process started (infinite when it is gone)."""
    started = _stat(pid, 19)
    if started is None:
        return float("inf")
    return float(Path("/proc/uptime").read_text().split()[0]) - started / os.sysconf("SC_CLK_TCK")


def servers_under(raylet_pid: int, younger_than_s: float = float("inf")) -> list[int]:
    """This module's sim-server processes started by a worker of the node whose raylet is given, at most
    `younger_than_s` old."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "sim-server" not in cmdline or f"--max-model-len {MAX_MODEL_LEN}" not in cmdline:
                continue
            pid = int(proc.name)
            while pid > 1 and pid != raylet_pid:
                pid = _parent(pid)
            if pid == raylet_pid and _age_s(int(proc.name)) < younger_than_s:
                found.append(int(proc.name))
    return found


def wait_for(condition: Any, proc: subprocess.Popen[str], limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {what} within {limit_s:g} s"
        time.sleep(0.2)


def test_ray_places_trials_survives_a_lost_node_stops_with_the_cluster_and_resumes_on_a_new_one(
    tmp_path: Path,
) -> None:
    with keeper(2, 3) as cluster:
        node_gpus = {w["node_id"]: w["gpus"] for w in cluster.workers}
        lost = cluster.workers[1]
        # 3 s of server startup per trial: the node is killed while a trial on it is still starting,
        # not in the gap between two (an idle host runs the whole grid in under 20 s).
        cmd = run_args(tmp_path, cluster.address, n_trials=14, startup_delay=3)
        run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        try:
            wait_for(lambda: len(finished(tmp_path)) >= 2, run, 120, "2 finished trials")
            # a server still in its 3 s startup: one found later may be a finished trial's, shutting
            # down, and a node killed then loses no trial
            starting = "a trial starting on the 3-GPU node"
            wait_for(lambda: servers_under(lost["raylet_pid"], younger_than_s=1.5), run, 60, starting)
            before = finished(tmp_path)
            cluster.kill(1)
            wait_for(lambda: crashed_on(tmp_path, lost["node_id"]), run, 120, "the lost node's crash")
            # the run goes on without the node: one more trial finishes
            count = len(finished(tmp_path))
            wait_for(lambda: len(finished(tmp_path)) > count, run, 120, "a trial after the loss")
            cluster.stop()
            gone = time.monotonic()
            _, err = run.communicate(timeout=60)
        finally:
            if run.poll() is None:
                run.kill()
    # the whole cluster gone: a clean stop with one line, in seconds
    assert run.returncode == 1, err
    assert time.monotonic() - gone < 30
    last = err.strip().splitlines()[-1]
    assert "the Ray cluster is gone" in last and "--resume" in last, err
    every = trials(tmp_path)
    assert not [t for t in every if t.state == TrialState.RUNNING]
    after = finished(tmp_path)
    for number, trial in before.items():  # nothing finished was lost with the node or the cluster
        assert after[number].values == trial.values

    crashed = [t for t in every if t.user_attrs.get("failure") == "crashed"]
    assert crashed and all("was lost mid-trial" in t.user_attrs["message"] for t in crashed), crashed
    assert {t.user_attrs["node_id"] for t in crashed} == {lost["node_id"]}
    assert f"(Ray node {lost['node_id'][:8]})" in crashed[0].user_attrs["message"]  # the node is named
    for t in crashed:  # charged the time its server held the node's GPUs, on the devices it had there
        assert t.user_attrs["gpu_seconds"] > 0 and t.user_attrs["gpu_ids"], t.user_attrs

    too_big = [t for t in every if t.params.get("tensor_parallel_size") == 4]
    assert too_big and all(t.user_attrs["launched"] is False for t in too_big)  # told before launch
    message = too_big[0].user_attrs["message"]
    assert "needs 4 GPUs on one node; the largest node of the Ray cluster has 3" in message

    placed = [t for t in after.values() if "duplicate_of" not in t.user_attrs and t not in crashed]
    assert any(t.user_attrs["config"]["tensor_parallel_size"] == 2 for t in placed)
    windows = []
    for t in placed:
        node, gpus = t.user_attrs["node_id"], t.user_attrs["gpu_ids"]
        assert node in node_gpus  # a worker node (the head has no GPU)
        assert len(gpus) == t.user_attrs["config"]["tensor_parallel_size"]  # TP devices, on one node
        assert set(gpus) <= set(range(node_gpus[node])), (gpus, node_gpus[node])  # devices it has
        log = tmp_path / "mn" / "trials" / str(t.number) / "server.log"  # came back to the driver
        pinned = ",".join(map(str, gpus))
        assert log.read_text().startswith(f"# autotune: CUDA_VISIBLE_DEVICES={pinned} "), log
        start, end = t.user_attrs["info"]["ran_at"]
        windows.append((node, set(gpus), start, end))
    overlaps = 0
    for i, (node_a, gpus_a, start_a, end_a) in enumerate(windows):
        for node_b, gpus_b, start_b, end_b in windows[i + 1 :]:
            if node_a == node_b and start_a < end_b and start_b < end_a:
                overlaps += 1
                assert not gpus_a & gpus_b  # concurrent trials on one node never share a device
    # Usually several pairs overlap; on a heavily loaded host the trials can happen to run one after the
    # other, which leaves nothing to compare (not a failure of placement). The executor tests prove that
    # trials do run at once (a rendezvous of two tasks).
    if not overlaps:
        print("test_multinode: no two trials overlapped on one node this time")
    with open(tmp_path / "mn" / "trials.csv") as f:
        rows = {int(r["trial"]): r for r in csv.DictReader(f)}
    assert rows[placed[0].number]["node_id"] == placed[0].user_attrs["node_id"]
    assert rows[placed[0].number]["gpu_ids"] == ",".join(map(str, placed[0].user_attrs["gpu_ids"]))

    # --n-trials counts measured configs: a duplicate (told an earlier result) is not one
    target = len(measured(after)) + 1
    with keeper(2) as cluster:  # a new cluster: --resume continues there
        cmd = run_args(tmp_path, cluster.address, n_trials=target, startup_delay=0)
        resumed = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, env=ENV, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    assert len(measured(finished(tmp_path))) == target


@pytest.mark.parametrize("address", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}"])
def test_an_unreachable_ray_address_fails_in_seconds_with_one_line(tmp_path: Path, address: str) -> None:
    from autotune.backends.server import free_port

    address = address.format(port=free_port())
    cmd = [sys.executable, "-m", "autotune.cli", "run", "--space", "small", "--ray-address", address]
    start = time.monotonic()
    done = subprocess.run(
        [*cmd, "--runs-dir", str(tmp_path)], capture_output=True, text=True, env=ENV, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"autotune run: error: cannot join the Ray cluster at {address}: nothing answers at "
        f"{address.removeprefix('ray://')} within 3 s"
    ]
    assert time.monotonic() - start < 15


@pytest.mark.parametrize("gpus", ["0,1", "0", "00"])
def test_device_ids_on_a_cluster_are_refused_in_one_line(tmp_path: Path, gpus: str) -> None:
    """Device ids, a lone 0 (device 0) included, name devices of this machine: refused before any join
    (the address answers nothing, which would be the error otherwise)."""
    from autotune.backends.server import free_port

    cmd = [sys.executable, "-m", "autotune.cli", "run", "--space", "small", "--backend", "vllm"]
    cmd += ["--serve-cmd", f"{sys.executable} -m autotune.cli sim-server"]
    cmd += ["--ray-address", f"127.0.0.1:{free_port()}", "--gpus", gpus]
    done = subprocess.run(
        [*cmd, "--runs-dir", str(tmp_path)], capture_output=True, text=True, env=ENV, timeout=60
    )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"autotune run: error: --gpus {gpus} with --ray-address: "), line
    assert "--gpus with device ids picks devices of this machine" in line and "give a count >= 1" in line
    assert not list(tmp_path.rglob("study.db"))


TOKEN = "0123456789abcdef" * 4  # the test cluster's own token: ~/.ray/auth_token is left alone
NO_AUTH = {k: v for k, v in ENV.items() if not k.startswith("RAY_AUTH_")}
FIX = "set RAY_AUTH_MODE=token, with the head's token (its ~/.ray/auth_token) in ~/.ray/auth_token here"


def test_a_cluster_that_wants_rays_auth_token_is_told_in_one_line_at_once(tmp_path: Path) -> None:
    """A head with token authentication (Ray 2.60's default once its machine has a token): a driver
    without RAY_AUTH_MODE=token is told what to set, in one line and at once, without Ray's ~20 s of
    retries and their log; with the mode and no token, it is told that; with both, it joins."""
    with keeper(env=NO_AUTH | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}) as cluster:
        cmd = [sys.executable, "-m", "autotune.cli", "run", "--space", "small", "--runs-dir", str(tmp_path)]
        cmd += ["--ray-address", cluster.address]
        start = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, env=NO_AUTH, timeout=120)
        assert time.monotonic() - start < 15
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines() == [
            f"autotune run: error: cannot join the Ray cluster at {cluster.address}: the cluster requires "
            f"Ray's auth token: {FIX}, or in RAY_AUTH_TOKEN or a file RAY_AUTH_TOKEN_PATH names "
            "(docs/gpus.md)"
        ], done.stderr
        assert not list(tmp_path.rglob("study.db"))

        no_token = NO_AUTH | {"RAY_AUTH_MODE": "token", "HOME": str(tmp_path)}  # no ~/.ray/auth_token
        done = subprocess.run(cmd, capture_output=True, text=True, env=no_token, timeout=120)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert "RAY_AUTH_MODE=token is set but this machine has no Ray auth token" in line, line

        join = (
            "import ray, sys; from autotune.dispatch.ray_cluster import start_ray; "
            "session = start_ray(sys.argv[1], 1); print(ray.cluster_resources()['CPU']); session.close()"
        )
        token = NO_AUTH | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}
        done = subprocess.run(
            [sys.executable, "-c", join, cluster.address],
            capture_output=True,
            text=True,
            env=token,
            timeout=120,
        )
        assert done.returncode == 0 and done.stdout.strip() == "1.0", done.stderr
