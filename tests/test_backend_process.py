"""The `vllm` backend end to end: real `autotune sim-server` processes, real HTTP on 127.0.0.1.

Every test also checks that no server process (or zombie) is left behind.
"""

from __future__ import annotations

import _thread
import math
import os
import pickle
import re
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from autotune.backends.process import ProcessBackend
from autotune.core.config import EngineConfig
from autotune.core.errors import AutotuneError, FailureKind
from autotune.measure.slo import parse_slos
from autotune.workloads.spec import LengthDist, WorkloadSpec

SIM_SERVER = (sys.executable, "-m", "autotune.cli", "sim-server")
CONFIG = EngineConfig(model="meta-llama/Llama-3.1-8B-Instruct", max_model_len=4096)
PROMPT_LEN, OUTPUT_LEN, NUM_REQUESTS = 64, 64, 12
WORKLOAD = WorkloadSpec(
    name="tiny",
    num_requests=NUM_REQUESTS,
    request_rate=math.inf,
    prompt_len=LengthDist("fixed", PROMPT_LEN),
    output_len=LengthDist("fixed", OUTPUT_LEN),
)


def backend(*extra_args: str, **options) -> ProcessBackend:
    options.setdefault("startup_timeout_s", 60.0)
    options.setdefault("benchmark_timeout_s", 60.0)
    options.setdefault("stop_grace_s", 3.0)
    return ProcessBackend("H100", serve_cmd=(*SIM_SERVER, *extra_args), **options)


def trial_port(trial_dir: Path) -> int:
    """The port of the trial's server, from the command line the backend wrote at the top of its log."""
    header = (trial_dir / "server.log").read_text().splitlines()[0]
    return int(re.search(r"--port (\d+)", header)[1])


def server_processes(port: int) -> list[int]:
    """Pids of live processes whose command line is a server on `port` (zombies included)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--port" in args and args[args.index(b"--port") + 1 : args.index(b"--port") + 2] == [
            str(port).encode()
        ]:
            pids.append(int(entry.name))
    return pids


def parent_pid(pid: int) -> int:
    return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])


def zombie_children() -> list[int]:
    """Pids of this process's children that exited and were never reaped."""
    zombies = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state == "Z" and int(ppid) == os.getpid():
            zombies.append(int(entry.name))
    return zombies


def assert_cleaned_up(trial_dir: Path) -> None:
    assert server_processes(trial_port(trial_dir)) == []
    assert zombie_children() == []


def test_ok_trial_over_real_http(tmp_path: Path) -> None:
    started = time.monotonic()
    result = backend().evaluate(CONFIG, WORKLOAD, slos=parse_slos("ttft_p99=30s"), trial_dir=tmp_path)
    elapsed = time.monotonic() - started
    assert result.ok, (result.failure, result.message, result.log_tail)
    bench = result.benchmark
    assert bench.completed == NUM_REQUESTS and bench.failed == 0
    assert bench.total_input_tokens == NUM_REQUESTS * PROMPT_LEN
    assert bench.total_output_tokens == NUM_REQUESTS * OUTPUT_LEN
    assert 0 < bench.latency_ms["ttft"]["p99"] <= bench.latency_ms["e2el"]["p99"]
    assert bench.latency_ms["itl"]["mean"] > 0 and bench.output_throughput > 0
    assert bench.request_goodput is not None and bench.request_goodput > 0
    # Server-side figures come from the server's own /metrics (vLLM's names).
    assert (
        bench.server["num_gpu_blocks"] > 0
        and result.server.engine.num_gpu_blocks == bench.server["num_gpu_blocks"]
    )
    assert bench.server["num_preemptions"] == 0
    assert 0 < bench.server["peak_kv_cache_usage"] <= 1
    assert result.startup_s > 0 and 0 < result.benchmark_s <= elapsed
    assert result.server.log_path == str(tmp_path / "server.log")
    assert_cleaned_up(tmp_path)


def test_a_config_with_served_model_names_is_measured_under_the_first(tmp_path: Path) -> None:
    """`--served-model-name llama alias` (vLLM's nargs="+"): the server answers to either name and the
    load asks for the first; before, the names went as one word "['llama', 'alias']" and every
    request for the model's path got a 404."""
    config = CONFIG.replace(served_model_name=["llama", "alias"])
    result = backend().evaluate(config, WORKLOAD, trial_dir=tmp_path)
    assert result.ok, (result.failure, result.message, result.log_tail)
    assert result.benchmark.completed == NUM_REQUESTS
    assert "--served-model-name llama alias" in (tmp_path / "server.log").read_text().splitlines()[0]
    assert_cleaned_up(tmp_path)


def test_session_measures_several_loads_on_one_server(tmp_path: Path) -> None:
    with backend().session(CONFIG, trial_dir=tmp_path) as session:
        port = trial_port(tmp_path)
        first, second = (session.measure(WORKLOAD, seed=0) for _ in range(2))
        assert session.alive and trial_port(tmp_path) == port  # the same server: no relaunch
    assert first.ok and second.ok, (first.message, second.message)
    assert first.startup_s > 0 and second.startup_s == 0  # the startup is paid once
    assert first.benchmark_s > 0 and second.benchmark_s > 0
    # The same requests again, but salted: nothing is served from the first load's prefix cache.
    assert second.benchmark.server["prefix_cache_hit_rate"] == 0
    assert second.benchmark.total_input_tokens == first.benchmark.total_input_tokens
    assert_cleaned_up(tmp_path)


def test_session_after_an_early_abort_starts_on_an_idle_server(tmp_path: Path) -> None:
    # One sequence at a time: the early-aborted load would leave seconds of queued requests, but its
    # cancelled streams close their connections and sim-server aborts them, as vLLM does.
    hopeless = WORKLOAD.with_load(max_concurrency=NUM_REQUESTS)
    with backend().session(CONFIG.replace(max_num_seqs=1), trial_dir=tmp_path) as session:
        aborted = session.measure(hopeless, parse_slos("ttft_p90=100ms"))
        single = WorkloadSpec(
            name="one", num_requests=1, prompt_len=LengthDist("fixed", 16), output_len=LengthDist("fixed", 4)
        )
        after = session.measure(single)
    assert aborted.failure is FailureKind.EARLY_ABORT and session.alive
    assert aborted.saved_s > aborted.benchmark_s  # the rest of the load, at its pace so far
    assert after.ok and after.benchmark.latency_ms["ttft"]["p99"] < 100  # an idle server
    assert after.benchmark_s < 1.0  # no wait for leftovers (about 6 s when they ran to the end)
    assert_cleaned_up(tmp_path)


def test_a_dead_server_is_not_relaunched_for_the_next_measurement(tmp_path: Path) -> None:
    with backend("--die-after", "4").session(CONFIG, trial_dir=tmp_path) as session:
        crashed = session.measure(WORKLOAD)
        assert not session.alive
        again = session.measure(WORKLOAD)
    assert crashed.failure is FailureKind.CRASHED and crashed.startup_s > 0
    assert (again.failure, again.message) == (crashed.failure, crashed.message)
    assert again.startup_s == again.benchmark_s == 0 and again.benchmark is None
    assert_cleaned_up(tmp_path)


def test_a_failed_start_is_the_first_measurement(tmp_path: Path) -> None:
    config = CONFIG.replace(enable_chunked_prefill=False, max_num_batched_tokens=1024)
    with backend().session(config, trial_dir=tmp_path) as session:
        assert not session.alive
        first, second = session.measure(WORKLOAD), session.measure(WORKLOAD)
    assert first.failure is second.failure is FailureKind.INVALID_CONFIG
    assert first.startup_s > 0 and second.startup_s == 0
    assert_cleaned_up(tmp_path)


def test_invalid_config_is_classified_at_once_with_vllms_message(tmp_path: Path) -> None:
    config = CONFIG.replace(enable_chunked_prefill=False, max_num_batched_tokens=1024)
    started = time.monotonic()
    result = backend(startup_timeout_s=120.0).evaluate(config, WORKLOAD, trial_dir=tmp_path)
    elapsed = time.monotonic() - started
    assert result.failure is FailureKind.INVALID_CONFIG
    assert result.message.startswith("max_num_batched_tokens (1024) is smaller than max_model_len (4096).")
    assert result.benchmark is None and "is smaller than max_model_len (4096)" in result.log_tail
    assert elapsed < 5.0, f"took {elapsed:.1f} s: the backend waited instead of watching the process"
    assert_cleaned_up(tmp_path)


def test_server_killed_mid_run_is_a_crash_and_leaves_no_process(tmp_path: Path) -> None:
    result = backend("--die-after", "4").evaluate(CONFIG, WORKLOAD, trial_dir=tmp_path)
    assert result.failure is FailureKind.CRASHED, (result.failure, result.message)
    assert "requests failed" in result.message
    assert result.benchmark is not None and result.benchmark.failed > 0  # partial metrics kept
    assert result.log_tail
    assert_cleaned_up(tmp_path)


def test_hung_server_hits_the_benchmark_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    result = backend("--hang-after", "2", benchmark_timeout_s=2.0).evaluate(
        CONFIG, WORKLOAD, trial_dir=tmp_path
    )
    assert result.failure is FailureKind.BENCHMARK_TIMEOUT, (result.failure, result.message)
    assert 2.0 <= result.benchmark_s < 4.0
    assert time.monotonic() - started < 20.0
    assert_cleaned_up(tmp_path)


def test_hung_server_with_an_slo_is_aborted_early(tmp_path: Path) -> None:
    slos = parse_slos("e2el_p99=500ms")
    result = backend("--hang-after", "2", benchmark_timeout_s=30.0).evaluate(
        CONFIG, WORKLOAD, slos=slos, trial_dir=tmp_path
    )
    assert result.failure is FailureKind.EARLY_ABORT, (result.failure, result.message)
    assert "p99_e2el_ms cannot be met" in result.message
    assert result.benchmark is not None and result.benchmark_s < 10.0
    assert_cleaned_up(tmp_path)


def test_slow_start_hits_the_startup_timeout(tmp_path: Path) -> None:
    result = backend("--startup-delay", "60", startup_timeout_s=1.5).evaluate(
        CONFIG, WORKLOAD, trial_dir=tmp_path
    )
    assert result.failure is FailureKind.STARTUP_TIMEOUT
    assert 1.5 <= result.startup_s < 5.0
    assert_cleaned_up(tmp_path)


def wait_until_hung(trial_dir: Path, timeout_s: float = 60.0) -> int:
    """The port of the trial's `--hang-after` server once the benchmark's requests have hung it.

    Hung: /metrics answers, /health does not. (Waiting for /health to answer instead races the
    benchmark: the window between the backend's own health check and the first requests is short.)
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            port = trial_port(trial_dir)
            httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).raise_for_status()
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5)
            except httpx.TimeoutException:
                return port
        except (OSError, httpx.HTTPError, TypeError, IndexError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"no benchmark hung the server within {timeout_s:g} s")


def test_ctrl_c_during_a_trial_stops_the_server(tmp_path: Path) -> None:
    def interrupt_once_serving() -> None:
        wait_until_hung(tmp_path)
        _thread.interrupt_main()

    interrupter = threading.Thread(target=interrupt_once_serving, daemon=True)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        backend("--hang-after", "2").evaluate(CONFIG, WORKLOAD, trial_dir=tmp_path)
    interrupter.join()
    assert_cleaned_up(tmp_path)


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.parametrize("kill", ["force-cancel", "sigkill"])
def test_killed_ray_worker_leaves_no_server(tmp_path: Path, kill: str) -> None:
    # A killed Ray worker runs no `finally`: its server must die with it. Ray's force cancel takes
    # the worker's children along; a worker SIGKILLed (e.g. by the OOM killer) relies on PR_SET_PDEATHSIG.
    import ray

    from autotune.trial.task import evaluate_trial

    task = ray.remote(evaluate_trial).options(num_cpus=1, max_retries=0)
    ref = task.remote(backend("--hang-after", "2"), CONFIG, WORKLOAD, [], 0, (), tmp_path)
    port = wait_until_hung(tmp_path)
    if kill == "force-cancel":
        ray.cancel(ref, force=True)
    else:
        (server,) = server_processes(port)
        worker = parent_pid(server)
        assert worker not in (1, os.getpid())
        os.kill(worker, signal.SIGKILL)
    with pytest.raises(ray.exceptions.RayError):
        ray.get(ref, timeout=30)
    deadline = time.monotonic() + 5
    while server_processes(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server_processes(port) == []


def test_environment_gpu_pinning_and_no_secrets_in_results(tmp_path: Path) -> None:
    # A stand-in server that prints what it was given, then fails: shows the launch environment.
    probe = (
        "import os, sys; e = os.environ; "
        "print('CVD=' + e.get('CUDA_VISIBLE_DEVICES', ''), 'GPU=' + e['AUTOTUNE_SIM_GPU'], e['HF_TOKEN']); "
        "print('args:', *sys.argv[1:]); sys.exit(3)"
    )
    secret = "hf_not_a_real_token_12345"
    result = ProcessBackend(
        "L40S", serve_cmd=(sys.executable, "-c", probe), env={"HF_TOKEN": secret}
    ).evaluate(CONFIG, WORKLOAD, gpu_ids=(2, 3), trial_dir=tmp_path)
    assert result.failure is FailureKind.CRASHED
    assert result.message.startswith("server exited with code 3")
    assert "CVD=2,3 GPU=L40S ***" in result.log_tail
    assert f"args: {CONFIG.model} --tensor-parallel-size 1" in result.log_tail
    assert re.search(r"--port \d+ --host 127\.0\.0\.1$", result.log_tail, re.MULTILINE)
    assert secret not in repr(result)


def test_port_taken_by_someone_else_is_reported(tmp_path: Path) -> None:
    busy = "import sys; sys.exit('OSError: [Errno 98] Address already in use')"
    result = ProcessBackend("H100", serve_cmd=(sys.executable, "-c", busy)).evaluate(
        CONFIG, WORKLOAD, trial_dir=tmp_path
    )
    assert result.failure is FailureKind.PORT_IN_USE
    assert result.message == "OSError: [Errno 98] Address already in use"


def test_backend_is_picklable_and_checks_its_command() -> None:
    original = backend()
    assert pickle.loads(pickle.dumps(original)) == original
    with pytest.raises(AutotuneError, match="'no-such-vllm-binary' not found on PATH: give its full path"):
        ProcessBackend("H100", serve_cmd=("no-such-vllm-binary", "serve")).evaluate(CONFIG, WORKLOAD)
    with pytest.raises(AutotuneError, match="'/nonexistent/prog' is not an executable file"):
        ProcessBackend("H100", serve_cmd=("/nonexistent/prog", "serve")).evaluate(CONFIG, WORKLOAD)
