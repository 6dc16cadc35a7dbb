"""The `docker` backend against a real Docker Engine.

No registry is reachable, so the session builds a local stand-in for vllm/vllm-openai from
tests/docker/ (a static busybox that chroots into the host root and runs `autotune sim-server`).
Without an engine (or without a static busybox to build the image) these tests skip.
"""

from __future__ import annotations

import _thread
import csv
import dataclasses
import math
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import autotune
from autotune.backends.docker import DockerBackend
from autotune.backends.docker_engine import (
    LABEL_OWNER_PID,
    LABEL_TRIAL,
    EngineLost,
    docker_client,
    reap_orphans,
)
from autotune.cli import main
from autotune.core.config import EngineConfig
from autotune.core.errors import AutotuneError, FailureKind, SetupLost
from autotune.core.procs import pid_alive
from autotune.trial.task import evaluate_trial
from autotune.workloads.spec import LengthDist, WorkloadSpec

IMAGE = "autotune-sim-test:latest"
DOCKER_DIR = Path(__file__).parent / "docker"
CONFIG = EngineConfig(model="meta-llama/Llama-3.1-8B-Instruct", max_model_len=4096)
WORKLOAD = WorkloadSpec(
    name="tiny",
    num_requests=8,
    request_rate=math.inf,
    prompt_len=LengthDist("fixed", 64),
    output_len=LengthDist("fixed", 8),
)

TINY_YAML = "name: tiny\nnum_requests: 8\nrequest_rate: inf\nprompt_len: 64\noutput_len: 8\n"


@pytest.fixture(scope="session")
def docker() -> Iterator:
    """A client of the local Docker Engine, or skip."""
    try:
        client = docker_client()
    except AutotuneError as exc:
        pytest.skip(str(exc))
    yield client
    client.close()


@pytest.fixture(scope="session")
def sim_image(docker) -> str:
    """The local test image (built once per session, in about a second)."""
    busybox = shutil.which("busybox")
    if busybox is None or not _is_static(Path(busybox)):
        pytest.skip("no static busybox to build the test image (apt-get install busybox-static)")
    with tempfile.TemporaryDirectory() as context:
        for item in DOCKER_DIR.iterdir():
            shutil.copy(item, context)
        shutil.copy(busybox, Path(context) / "busybox")
        docker.images.build(path=context, tag=IMAGE, buildargs={"PYTHON": sys.executable}, rm=True)
    return IMAGE


def _is_static(path: Path) -> bool:
    """True when the ELF binary has no program interpreter (the dynamic loader's path is in its head)."""
    return b"ld-linux" not in path.read_bytes()[:8192]


def _backend(image: str, **options) -> DockerBackend:
    """The backend on the test image: the host root at /host (read-only), no HF cache."""
    return DockerBackend(
        "H100",
        image=image,
        hf_cache=None,
        extra_volumes={"/": "/host"},
        startup_timeout_s=60.0,
        benchmark_timeout_s=60.0,
        stop_grace_s=3.0,
        **options,
    )


def _autotune_containers(docker) -> list:
    """Containers this test process started (by the owner label)."""
    return docker.containers.list(all=True, filters={"label": f"{LABEL_OWNER_PID}={os.getpid()}"})


@pytest.mark.parametrize("network_host", [False, True], ids=["published-port", "host-network"])
def test_trial_in_a_container_over_real_http(
    docker, sim_image: str, tmp_path: Path, network_host: bool
) -> None:
    result = _backend(sim_image, network_host=network_host).evaluate(CONFIG, WORKLOAD, trial_dir=tmp_path)
    assert result.ok, (result.failure, result.message, result.log_tail)
    assert result.benchmark.completed == 8 and result.benchmark.total_output_tokens == 8 * 8
    assert result.benchmark.server["num_gpu_blocks"] > 0
    assert "--load-format dummy" in " ".join(result.server.command)
    first, *rest = (tmp_path / "server.log").read_text().splitlines()
    assert rest  # the container's logs were captured, after the line that says what was launched
    assert first.startswith(f"# autotune: docker run {sim_image} --model ") and "--load-format dummy" in first
    assert _autotune_containers(docker) == []


def test_a_saturation_sized_burst_reaches_the_container_past_dockers_port_proxy(
    docker, sim_image: str, tmp_path: Path
) -> None:
    """4,096 requests at once, the size of vLLM's defaults' saturation burst (4 x 1,024 sequences):
    through the published port's proxy (docker-proxy) every one failed ("peer closed connection"), and
    the defaults' trial with it; at the container's own address all are served."""
    burst = dataclasses.replace(WORKLOAD, num_requests=4096)
    result = _backend(sim_image).evaluate(CONFIG, burst, trial_dir=tmp_path)
    assert result.ok, (result.failure, result.message)
    assert result.benchmark.completed == 4096
    assert _autotune_containers(docker) == []


def test_the_container_gets_vllm_api_key_by_name_and_the_client_sends_it(
    docker, sim_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-container-key-93e1d7"
    monkeypatch.setenv("VLLM_API_KEY", key)  # the server requires it only if the container got it
    # the autotune under test inside the container (the venv's editable install may be another checkout)
    backend = _backend(sim_image, env={"PYTHONPATH": str(Path(autotune.__file__).parents[1])})
    result = backend.evaluate(CONFIG, WORKLOAD, trial_dir=tmp_path)
    assert result.ok, (result.failure, result.message, result.log_tail)
    log = (tmp_path / "server.log").read_text()
    assert "api_key='***'" in log  # the server's startup line: it required a key
    assert key not in log + repr(result) + " ".join(result.server.command)
    assert _autotune_containers(docker) == []


def test_invalid_config_in_a_container_is_classified(docker, sim_image: str, tmp_path: Path) -> None:
    config = CONFIG.replace(max_num_seqs=512, max_num_batched_tokens=256)
    result = _backend(sim_image).evaluate(config, WORKLOAD, trial_dir=tmp_path)
    assert result.failure is FailureKind.INVALID_CONFIG
    assert result.message.startswith(
        "max_num_batched_tokens (256) must be greater than or equal to max_num_seqs"
    )
    assert result.startup_s < 10.0
    assert _autotune_containers(docker) == []


@pytest.mark.usefixtures("ray_cluster")
def test_an_engine_that_cannot_give_gpus_halts_the_run_naming_the_toolkit(
    docker, sim_image: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each trial's container asks for its GPU and the engine refuses it alike, naming the container:
    the run halts after three (exit 1) with the refusal and what to install."""
    if "nvidia" in docker.info().get("Runtimes", {}):
        pytest.skip("this engine has the NVIDIA runtime: it can give containers GPUs")
    (tmp_path / "tiny.yaml").write_text(TINY_YAML)
    args = ["run", "--space", "small", "--workload", str(tmp_path / "tiny.yaml"), "--guide", "none"]
    args += ["--backend", "docker", "--image", sim_image, "--gpus", "1", "--n-trials", "6", "--quiet"]
    assert main([*args, "--runs-dir", str(tmp_path), "--study", "no-gpu"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("autotune run: error: halted: the first 3 configs launched all failed alike")
    assert (
        'could not select device driver "" with capabilities: [[gpu]]' in err
        and "NVIDIA Container Toolkit" in err
    )
    with open(tmp_path / "no-gpu" / "trials.csv") as f:
        assert len(list(csv.DictReader(f))) == 3
    assert _autotune_containers(docker) == []


def test_ctrl_c_during_a_trial_removes_the_container(docker, sim_image: str, tmp_path: Path) -> None:
    def interrupt_once_running() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not [
            c for c in _autotune_containers(docker) if c.status == "running"
        ]:
            time.sleep(0.1)
        time.sleep(1.5)  # past startup, into the (hung) benchmark
        _thread.interrupt_main()

    interrupter = threading.Thread(target=interrupt_once_running, daemon=True)
    interrupter.start()
    # The container's command is the image's entrypoint arguments: sim-server's fault flags go there.
    config = CONFIG.replace(hang_after=2)
    with pytest.raises(KeyboardInterrupt):
        _backend(sim_image).evaluate(config, WORKLOAD, trial_dir=tmp_path)
    interrupter.join()
    assert _autotune_containers(docker) == []


@pytest.mark.usefixtures("ray_cluster")
def test_force_cancelled_trial_leaves_no_container(docker, sim_image: str, tmp_path: Path) -> None:
    from autotune.dispatch.executor import Executor

    def trial_containers() -> set[str]:
        return {c.id for c in docker.containers.list(all=True, filters={"label": LABEL_TRIAL})}

    others = trial_containers()  # e.g. another study's
    executor = Executor(_backend(sim_image), WORKLOAD, [], cpu_slots=1)
    executor.submit(0, CONFIG.replace(hang_after=2), 0, tmp_path)
    deadline = time.monotonic() + 30
    while not trial_containers() - others and time.monotonic() < deadline:
        time.sleep(0.1)
    assert trial_containers() - others, "the trial's container never appeared"
    time.sleep(1.5)  # past startup, into the (hung) benchmark
    # The forced cancel a deadline ends with when the polite one did not stop the trial in time.
    executor._cancel(executor._jobs[0].ref, force=True)
    assert trial_containers() - others == set()


def test_an_owner_that_exited_is_dead_even_before_it_is_reaped() -> None:
    # A worker Ray killed stays a zombie until its parent reaps it: its container is an orphan already.
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while pid_alive(str(child.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(str(child.pid))
    assert Path(f"/proc/{child.pid}").exists()  # not reaped yet: a zombie
    child.wait()
    assert not pid_alive(str(child.pid)) and pid_alive(str(os.getpid()))


def test_reap_orphans_removes_only_containers_of_dead_owners(docker, sim_image: str) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is now free: the owner of the orphan "died"
    orphan = docker.containers.create(sim_image, labels={LABEL_OWNER_PID: str(dead.pid), LABEL_TRIAL: "x"})
    alive = docker.containers.create(sim_image, labels={LABEL_OWNER_PID: str(os.getpid()), LABEL_TRIAL: "y"})
    try:
        assert reap_orphans(docker) >= 1
        remaining = {c.id for c in docker.containers.list(all=True)}
        assert orphan.id not in remaining and alive.id in remaining
    finally:
        alive.remove(force=True)
        if orphan.id in {c.id for c in docker.containers.list(all=True)}:
            orphan.remove(force=True)


def test_reap_orphans_tolerates_containers_removed_while_it_lists_them(docker, sim_image: str) -> None:
    """Concurrent trials create and remove their containers while one reaps: a container gone between
    the engine's list and the reaper's look at it failed the reaping trial (NotFound: 404)."""
    labels = {LABEL_OWNER_PID: str(os.getpid()), LABEL_TRIAL: "churn"}  # a live owner's: never reaped
    pool = [docker.containers.create(sim_image, labels=labels) for _ in range(8)]
    stop = threading.Event()

    def churn() -> None:
        # Remove the oldest and create another, as trials end and start, until the reaper is done.
        while not stop.is_set():
            pool.pop(0).remove(force=True)
            pool.append(docker.containers.create(sim_image, labels=labels))

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        for _ in range(60):
            assert reap_orphans(docker) == 0
    finally:
        stop.set()
        churner.join()
        for container in pool:
            container.remove(force=True)


def test_missing_image_is_one_clear_error(docker) -> None:
    with pytest.raises(AutotuneError, match="not available locally"):
        _backend("autotune-no-such-image:0").evaluate(CONFIG, WORKLOAD)


def test_unreachable_engine_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    backend = _backend(IMAGE)
    assert pickle.loads(pickle.dumps(backend)) == backend  # Ray ships backends to workers
    with pytest.raises(AutotuneError, match="^Docker engine not reachable: "):
        backend.evaluate(CONFIG, WORKLOAD)


def test_an_engine_unreachable_at_a_trials_start_stops_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the run, an engine that does not answer is a usage error; once the run checked it, a
    trial that cannot reach it found it gone: the run stops (SetupLost), not just that trial."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    backend = _backend(IMAGE)
    with pytest.raises(AutotuneError, match="^Docker engine not reachable: ") as before_the_run:
        backend.preflight()
    assert not isinstance(before_the_run.value, SetupLost)
    with pytest.raises(EngineLost, match="^Docker engine not reachable: "):
        evaluate_trial(backend, CONFIG, WORKLOAD, [], 0, (), None)
