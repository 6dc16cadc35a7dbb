"""Failure classification from a server's exit code and log: vLLM's own messages, verbatim."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.backends.failures import BENCHMARK, MAX_MESSAGE_CHARS, STARTUP, classify
from autotune.backends.server_metrics import parse_prometheus, server_figures
from autotune.core.errors import FailureKind
from autotune.core.secrets import scrub, scrub_args

CHUNKED = (
    "max_num_batched_tokens (2048) is smaller than max_model_len (8192). This effectively limits the "
    "maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. Please "
    "increase max_num_batched_tokens or decrease max_model_len."
)
SEQS = "max_num_batched_tokens (128) must be greater than or equal to max_num_seqs (256)."
NO_KV = (
    "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
    "initializing the engine."
)
MAX_LEN = (
    "To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (9.53 GiB). Based on the available "
    "memory, the estimated maximum model length is 78048. Try increasing `gpu_memory_utilization` or "
    "decreasing `max_model_len` when initializing the engine."
)
FREE_MEM = (
    "Free memory on device (70.1/79.19 GiB) on startup is less than desired GPU memory utilization "
    "(0.95, 75.23 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
)
CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.02 GiB is free."
)
TRACEBACK = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'


def vllm_log(line: str, prefix: str = "(EngineCore_0 pid=42) ERROR 05-01 12:00:00 [core.py:700] ") -> str:
    """A log that looks like vLLM's: info lines, a traceback, the error with vLLM's log prefix."""
    return (
        "INFO 05-01 11:59:58 [api_server.py:1] vLLM API server version 0.11.0\n"
        + TRACEBACK
        + prefix
        + line
        + "\nINFO 05-01 12:00:01 [launcher.py:9] Shutting down\n"
    )


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        (CHUNKED, FailureKind.INVALID_CONFIG),
        (SEQS, FailureKind.INVALID_CONFIG),
        (NO_KV, FailureKind.KV_CACHE_OOM),
        (MAX_LEN, FailureKind.KV_CACHE_OOM),
        (FREE_MEM, FailureKind.STARTUP_OOM),
        (CUDA_OOM, FailureKind.STARTUP_OOM),
    ],
)
def test_startup_messages_are_classified_with_vllms_words(message: str, kind: FailureKind) -> None:
    got_kind, got_message = classify(1, vllm_log("ValueError: " + message), STARTUP)
    assert got_kind is kind
    assert message in got_message or got_message in message
    assert "\n" not in got_message and not got_message.startswith("(EngineCore")


def test_pydantic_wrapped_scheduler_error_keeps_only_vllms_message() -> None:
    log = (
        TRACEBACK
        + "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig\n"
        + f"  Value error, {SEQS} [type=value_error, input_value=ArgsKwargs((), {{}}), "
        + "input_type=ArgsKwargs]\n"
    )
    assert classify(1, log, STARTUP) == (FailureKind.INVALID_CONFIG, SEQS)


def test_other_pydantic_value_errors_are_invalid_config() -> None:
    log = "  Value error, block_size must be one of [1, 8, 16, 32] [type=value_error]\n"
    assert classify(1, log, STARTUP) == (
        FailureKind.INVALID_CONFIG,
        "block_size must be one of [1, 8, 16, 32]",
    )


def test_argparse_rejection_is_invalid_config() -> None:
    log = "usage: vllm serve [-h] ...\nvllm serve: error: unrecognized arguments: --max-num-sqs 8\n"
    kind, message = classify(2, log, STARTUP)
    assert kind is FailureKind.INVALID_CONFIG
    assert message == "error: unrecognized arguments: --max-num-sqs 8"


def test_cuda_oom_while_serving_is_oom_under_load() -> None:
    kind, message = classify(1, vllm_log(CUDA_OOM), BENCHMARK)
    assert kind is FailureKind.OOM_UNDER_LOAD
    assert message.startswith("torch.OutOfMemoryError: CUDA out of memory.")


@pytest.mark.parametrize(
    "line",
    [
        "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): "
        "address already in use",
        "OSError: [Errno 98] Address already in use",
        "driver failed programming external connectivity: Bind for 127.0.0.1:8000 failed: "
        "port is already allocated",
    ],
)
def test_port_in_use(line: str) -> None:
    kind, message = classify(1, line + "\n", STARTUP)
    assert kind is FailureKind.PORT_IN_USE
    assert message == " ".join(line.split())


def test_unknown_startup_exit_is_a_crash_with_the_exit_code_and_last_error_line() -> None:
    log = vllm_log("RuntimeError: NCCL error: unhandled system error") + "some trailing info line\n"
    kind, message = classify(1, log, STARTUP)
    assert kind is FailureKind.CRASHED
    assert message == "server exited with code 1: RuntimeError: NCCL error: unhandled system error"


def test_a_startup_exit_with_no_error_line_gives_the_logs_last_line() -> None:
    """A wrapper script's reason names no error (chroot's message): without it only the exit code was
    left. The header autotune writes (the launched command) is not the server's line."""
    reason = "chroot: cannot change root directory to '/srv': Operation not permitted"
    log = f"# autotune: /tmp/serve.sh meta-llama/Llama-3.1-8B-Instruct --port 8000\nstarting\n{reason}\n\n"
    assert classify(1, log, STARTUP) == (
        FailureKind.CRASHED,
        f"server exited with code 1; its last log line: {reason}",
    )
    assert classify(1, "# autotune: /tmp/serve.sh --port 8000\n", STARTUP) == (
        FailureKind.CRASHED,
        "server exited with code 1",
    )
    long = classify(1, "x" * 1000, STARTUP)[1]
    assert len(long) == MAX_MESSAGE_CHARS and long.endswith("...")


def test_bare_value_error_at_startup_is_invalid_config_but_not_while_serving() -> None:
    log = vllm_log("ValueError: Unknown quantization method: foo")
    assert classify(1, log, STARTUP) == (FailureKind.INVALID_CONFIG, "Unknown quantization method: foo")
    assert classify(1, log, BENCHMARK)[0] is FailureKind.CRASHED


def test_death_by_signal_mid_run_is_a_crash() -> None:
    assert classify(-9, "INFO serving\n", BENCHMARK) == (FailureKind.CRASHED, "server was killed by SIGKILL")
    assert classify(137, "", BENCHMARK) == (FailureKind.CRASHED, "server exited with code 137")
    assert classify(None, "", STARTUP) == (FailureKind.ERROR, "server failed")


def test_prometheus_figures_from_two_scrapes() -> None:
    before = parse_prometheus(
        '# HELP vllm:num_preemptions_total preemptions\nvllm:num_preemptions_total{model_name="m"} 3.0\n'
        'vllm:prefix_cache_queries_total{model_name="m"} 100\n'
        'vllm:prefix_cache_hits_total{model_name="m"} 10\n'
    )
    after = parse_prometheus(
        'vllm:num_preemptions_total{model_name="m"} 10.0\n'
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="27000",gpu_memory_utilization="0.9"} 1.0\n'
        'vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.25\n'
        'vllm:prefix_cache_queries_total{model_name="m"} 300\n'
        'vllm:prefix_cache_hits_total{model_name="m"} 110\n'
    )
    figures = server_figures(before, after, peak_kv=0.8)
    assert figures == {
        "num_preemptions": 7,
        "num_gpu_blocks": 27000,
        "peak_kv_cache_usage": 0.8,
        "prefix_cache_hit_rate": 0.5,
    }
    assert server_figures([], after, peak_kv=None)["peak_kv_cache_usage"] == 0.25


def test_secrets_never_reach_logs() -> None:
    env = {"HF_TOKEN": "hf_abcdefgh123", "PATH": "/usr/bin"}
    assert scrub("token is hf_abcdefgh123 here", env) == "token is *** here"
    assert scrub_args(["vllm", "serve", "m", "--api-key", "s3cret!", "--hf-token=xyz123", "--port", "1"]) == [
        "vllm", "serve", "m", "--api-key", "***", "--hf-token=***", "--port", "1",
    ]  # fmt: skip


def test_docker_engine_lost_mid_trial_is_a_classified_crash(tmp_path: Path) -> None:
    """The SDK against an engine that does not answer (a refused socket): the trial is `crashed` with
    Docker's exit status 125 and why, and stopping it does not raise (the next start reaps it)."""
    import docker

    from autotune.backends.docker import ENGINE_LOST_EXIT_CODE, _Container

    client = docker.DockerClient(base_url="tcp://127.0.0.1:9", version="1.41", timeout=2)
    handle = _Container(
        client.containers.prepare_model({"Id": "0" * 64}), "http://127.0.0.1:9", tmp_path / "s.log", 1
    )
    assert handle.exit_code() == ENGINE_LOST_EXIT_CODE
    kind, message = classify(handle.exit_code(), handle.log_text(), BENCHMARK)
    assert kind is FailureKind.CRASHED
    assert message.startswith("server exited with code 125") and "Docker engine lost mid-trial" in message
    handle.stop()
