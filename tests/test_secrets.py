"""No secret on disk: a server that echoes its --api-key and its environment leaves none in server.log,
the trial's message and log tail (what study.db, trials.csv and the report store), or its command;
the tuned --max-num-batched-tokens stays visible everywhere."""

from __future__ import annotations

import sys
from pathlib import Path

from autotune.backends.process import ProcessBackend
from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind
from autotune.core.secrets import masked, scrub, scrub_args, secret_args
from autotune.store.urls import for_run_file
from autotune.workloads.spec import LengthDist, WorkloadSpec

CONFIG = EngineConfig(model="meta-llama/Llama-3.1-8B-Instruct", max_num_batched_tokens=8192, max_num_seqs=64)
WORKLOAD = WorkloadSpec(
    name="w", num_requests=2, prompt_len=LengthDist("fixed", mean=16), output_len=LengthDist("fixed", mean=4)
)
API_KEY = "sk-live-abcdef123456"
HF_TOKEN = "hf_not_a_real_token_98765"
DB_PASSWORD = "pg-pass-24680"


def test_only_secret_flags_are_masked() -> None:
    args = ["vllm", "serve", "m", "--max-num-batched-tokens", "8192", "--api-key", API_KEY]
    args += ["--hf-token=" + HF_TOKEN, "--long-prefill-token-threshold", "512", "--port", "1"]
    assert scrub_args(args) == [
        "vllm", "serve", "m", "--max-num-batched-tokens", "8192", "--api-key", "***",
        "--hf-token=***", "--long-prefill-token-threshold", "512", "--port", "1",
    ]  # fmt: skip
    assert secret_args(args) == [API_KEY, HF_TOKEN]
    text = f"key {API_KEY} url postgresql://user:{DB_PASSWORD}@db:5432/x token {HF_TOKEN}"
    clean = scrub(text, {"HF_TOKEN": HF_TOKEN, "PATH": "/usr/bin"}, [API_KEY])
    assert clean == "key *** url postgresql://user:***@db:5432/x token ***"
    assert "8192" in scrub("--max-num-batched-tokens 8192", {"MAX_NUM_BATCHED_TOKENS": "8192"})


def test_secret_environment_assignments_in_a_command_are_masked() -> None:
    """`env HF_TOKEN=... vllm serve ...` as a serve command: the assignment's value is a secret, another
    assignment (CUDA_VISIBLE_DEVICES=0) is not."""
    args = [
        "env",
        f"HF_TOKEN={HF_TOKEN}",
        "CUDA_VISIBLE_DEVICES=0",
        f"VLLM_API_KEY={API_KEY}",
        "vllm",
        "serve",
    ]
    assert scrub_args(args) == [
        "env",
        "HF_TOKEN=***",
        "CUDA_VISIBLE_DEVICES=0",
        "VLLM_API_KEY=***",
        "vllm",
        "serve",
    ]
    assert secret_args(args) == [HF_TOKEN, API_KEY]


def test_storage_password_is_never_printed_nor_recorded(tmp_path: Path) -> None:
    url = f"postgresql://user:{DB_PASSWORD}@127.0.0.1:5432/studies"
    assert DB_PASSWORD not in masked(f"cannot open storage {url}")
    assert for_run_file(url, tmp_path) == "postgresql://user@127.0.0.1:5432/studies"
    assert for_run_file(f"sqlite:///{tmp_path}/study.db", tmp_path) == "sqlite:///study.db"


def test_a_server_echoing_its_secrets_leaves_none_on_disk(tmp_path: Path) -> None:
    # A stand-in server that prints its arguments and environment (vLLM logs its non-default args), then
    # fails, so its log tail is kept in the result.
    probe = (
        "import os, sys; print('args:', *sys.argv[1:]); print('env:', os.environ['HF_TOKEN']); "
        f"print('db: postgresql://u:{DB_PASSWORD}@h/db'); sys.exit(3)"
    )
    backend = ProcessBackend(
        "H100", serve_cmd=(sys.executable, "-c", probe, "--api-key", API_KEY), env={"HF_TOKEN": HF_TOKEN}
    )
    result = backend.evaluate(CONFIG, WORKLOAD, trial_dir=tmp_path)
    assert result.failure is FailureKind.CRASHED and "exited with code 3" in result.message
    log = (tmp_path / "server.log").read_text()
    stored = repr(result) + log
    for secret in (API_KEY, HF_TOKEN, DB_PASSWORD):
        assert secret not in stored
    assert "--api-key *** " in log and "env: ***" in log and "postgresql://u:***@h/db" in log
    assert "--max-num-batched-tokens 8192" in log and "--max-num-batched-tokens 8192" in result.log_tail
    assert "8192" in result.server.command
