"""The pass-through vLLM flags and the simulated engine (autotune/sim/flags.py): `--enforce-eager` is
modelled (no CUDA graphs), the flags it cannot model are refused rather than simulated as if unset."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from cli import autotune
from test_sim_backend import TinyWorkload

from autotune.backends.sim import SimBackend
from autotune.core.config import BOOL_FLAGS, EngineConfig
from autotune.sim.engine import SimEngine
from autotune.sim.flags import unmodelled
from autotune.sim_server.server import start_sim_server

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
SPACE = """\
fixed:
  model: meta-llama/Llama-3.1-8B-Instruct
  gpu: H100
  max_model_len: 8192
{fixed}params:
  max_num_seqs: {{type: categorical, choices: [32, 256]}}
{params}"""


def test_enforce_eager_captures_no_cuda_graphs_and_launches_every_step() -> None:
    """vLLM's --enforce-eager turns CUDA graphs off (vLLM docs/design/debug_vllm_compile.md): nothing
    is captured at startup nor held for it, and every step pays its kernel launches."""
    config = EngineConfig(model=LLAMA_8B, max_model_len=8192, max_num_seqs=32)
    graphs, eager = SimEngine(config, "H100"), SimEngine(config.replace(enforce_eager=True), "H100")
    assert graphs.memory.num_cuda_graphs > 0 and graphs.memory.cuda_graph_bytes > 0
    assert eager.memory.num_cuda_graphs == 0 and eager.memory.cuda_graph_bytes == 0
    assert eager.memory.num_gpu_blocks == graphs.memory.num_gpu_blocks  # graphs live beside the KV cache
    workload = TinyWorkload(8, max_concurrency=4)  # small decode batches: the launches show
    fast = SimBackend("H100").evaluate(config, workload)
    slow = SimBackend("H100").evaluate(config.replace(enforce_eager=True), workload)
    assert slow.startup_s < fast.startup_s  # no capture
    assert slow.benchmark.latency_ms["itl"]["median"] > 1.05 * fast.benchmark.latency_ms["itl"]["median"]


def test_utilization_that_ooms_at_graph_capture_starts_eagerly() -> None:
    """The usual way out of an OOM at CUDA graph capture is --enforce-eager (at 0.98 the sampler's
    warm-up alone no longer fits either)."""
    config = EngineConfig(model=LLAMA_8B, max_model_len=8192, gpu_memory_utilization=0.975)
    assert not SimBackend("H100").evaluate(config, TinyWorkload(2)).ok
    assert SimBackend("H100").evaluate(config.replace(enforce_eager=True), TinyWorkload(2)).ok


@pytest.mark.parametrize(
    ("params", "found"),
    [
        ({"pipeline_parallel_size": 2, "seed": 3}, ["pipeline_parallel_size=2"]),
        ({"pipeline_parallel_size": 1, "dtype": "bfloat16", "enforce_eager": True}, []),
        ({"quantization": "fp8", "dtype": "float32"}, ["quantization=fp8", "dtype=float32"]),
        ({"async_scheduling": True, "long_prefill_token_threshold": 256}, ["async_scheduling=True"]),
    ],
)
def test_flags_the_engine_cannot_model(params: dict[str, object], found: list[str]) -> None:
    assert unmodelled(params) == found


@pytest.mark.parametrize(
    ("fixed", "params", "said"),
    [
        ("  pipeline_parallel_size: 2\n", "", "pipeline_parallel_size=2"),
        ("", "  async_scheduling: {type: bool}\n", "async_scheduling=True"),
    ],
)
def test_a_simulated_run_refuses_them(tmp_path: Path, fixed: str, params: str, said: str) -> None:
    (tmp_path / "space.yaml").write_text(SPACE.format(fixed=fixed, params=params))
    out = autotune(tmp_path, "run", "--space", "space.yaml", "--n-trials", "2", "--study", "s", check=False)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and "simulated engine does not model" in lines[0]
    assert not (tmp_path / "runs").exists()  # nothing written
    # On a GPU backend the run is not refused, but the simulator cannot guide it: --guide sim says so.
    real = ["--backend", "vllm", "--serve-cmd", "autotune sim-server", "--guide", "sim", "--gpu-hours", "1"]
    out = autotune(tmp_path, "run", "--space", "space.yaml", *real, "--study", "s", check=False)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].count(said) == 1
    assert "--guide sim: search space space.yaml: the simulated engine does not model" in out.stderr


def test_bench_on_the_simulator_refuses_them_too(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text(SPACE.format(fixed="  data_parallel_size: 2\n", params=""))
    out = autotune(tmp_path, "bench", "--space", "space.yaml", check=False)
    assert out.returncode == 2 and "data_parallel_size=2" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_sim_server_serves_enforce_eager_and_refuses_a_dtype_it_cannot_model() -> None:
    """`autotune sim-server` takes vLLM's --enforce-eager (a lone request decodes slower on its engine's
    clock: every step launches its kernels) and refuses a 32-bit --dtype in one line instead of serving
    it as bf16."""
    latency = {}
    for flags in ([], ["--enforce-eager"]):
        args = [LLAMA_8B, "--max-model-len", "8192", "--debug-timings", "--time-scale", "10", *flags]
        with start_sim_server(args) as proc:
            body = {"model": LLAMA_8B, "prompt": [1] * 64, "max_tokens": 64, "ignore_eos": True}
            assert httpx.post(proc.base_url + "/v1/completions", json=body, timeout=30).status_code == 200
            (row,) = httpx.get(proc.base_url + "/debug/requests").json()["requests"]
            latency[bool(flags)] = row["engine_latency"]
            assert ("'enforce_eager': True" in proc.log()) == bool(flags)
    assert latency[True] > 1.05 * latency[False]
    cmd = [sys.executable, "-m", "autotune.commands.sim_server", LLAMA_8B, "--dtype", "float32"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "does not model dtype=float32" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_yes_no_flags_go_on_the_command_line_as_vllm_takes_them() -> None:
    """vLLM 0.11's yes/no flags are BooleanOptionalActions: `--enforce-eager` or `--no-enforce-eager`,
    never a value after the flag; sim-server (a drop-in for `vllm serve`) takes both spellings, and a
    command line with the flag before the model reads back to the same config."""
    from autotune.cli import build_parser

    config = EngineConfig(model=LLAMA_8B).replace(enforce_eager=False, trust_remote_code=True)
    args = config.to_args()
    assert "--no-enforce-eager" in args and "--trust-remote-code" in args
    assert not {"True", "False", "true", "false"} & set(args)
    parsed = build_parser().parse_args(["sim-server", *args])
    assert parsed.enforce_eager is False and parsed.trust_remote_code is True
    flags_first = ["vllm", "serve", "--enforce-eager", "--no-trust-remote-code", LLAMA_8B]
    assert EngineConfig.from_args(flags_first) == EngineConfig(model=LLAMA_8B).replace(
        enforce_eager=True, trust_remote_code=False
    )


def test_sim_server_takes_every_flag_a_trial_may_pass_through() -> None:
    """Each of OTHER_VLLM_FLAGS parses as `vllm serve` takes it (it was "unrecognized arguments" for
    eleven of them: a trial with --scheduling-policy fcfs failed on `--serve-cmd "autotune sim-server"`
    and ran in process); neutral values serve, others are refused as the in-process simulator does."""
    from autotune.cli import build_parser
    from autotune.core.config import OTHER_VLLM_FLAGS

    sample = {"cuda_graph_sizes": [1, 2], "served_model_name": ["a", "b"], "scheduling_policy": "fcfs"}
    sample |= {"prefix_caching_hash_algo": "sha256", "quantization": "fp8", "dtype": "auto"}
    for name in sorted(OTHER_VLLM_FLAGS):
        value = sample.get(name, True if name in BOOL_FLAGS else 1)
        args = EngineConfig(model=LLAMA_8B).replace(**{name: value}).to_args()
        parsed = build_parser().parse_args(["sim-server", *args])
        assert getattr(parsed, name) in (value, str(value)), name
    args = [LLAMA_8B, "-pp", "1", "-dp", "1", "--scheduling-policy", "fcfs", "--swap-space", "4"]
    args += ["--no-async-scheduling", "--max-num-partial-prefills", "1", "--tokenizer", LLAMA_8B]
    with start_sim_server([*args, "--max-model-len", "4096"]) as proc:
        body = {"model": LLAMA_8B, "prompt": [1] * 8, "max_tokens": 2}
        assert httpx.post(proc.base_url + "/v1/completions", json=body, timeout=30).status_code == 200
    cmd = [sys.executable, "-m", "autotune.commands.sim_server", LLAMA_8B, "--pipeline-parallel-size", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "does not model pipeline_parallel_size=2" in done.stderr


def test_sim_server_reads_human_readable_ints_as_vllm_serve() -> None:
    """vLLM parses --max-model-len and --max-num-batched-tokens with `human_readable_int`
    (vllm/engine/arg_utils.py): k/m/g are decimal (fractions allowed), K/M/G binary (whole numbers)."""
    args = [LLAMA_8B, "--max-model-len", "16.5k", "--max-num-batched-tokens", "8K"]
    with start_sim_server(args) as proc:
        assert httpx.get(proc.base_url + "/v1/models").json()["data"][0]["max_model_len"] == 16_500
        assert "max_num_batched_tokens=8192 " in proc.log()
    for value, said in [
        ("1.5K", "Decimals are not allowed with binary suffixes like K. Did you mean to use 1.5k instead?"),
        ("2t", "invalid human_readable_int value: '2t'"),
    ]:
        cmd = [sys.executable, "-m", "autotune.commands.sim_server", LLAMA_8B, "--max-model-len", value]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        assert done.returncode == 2 and f"argument --max-model-len: {said}" in done.stderr
