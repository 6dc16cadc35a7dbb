"""The simulator's startup: catalogs, the KV-cache size, and vLLM's verbatim startup errors."""

from __future__ import annotations

import json

import pytest

from autotune.catalog.gpus import get_gpu
from autotune.catalog.models import get_model
from autotune.core.config import EngineConfig
from autotune.core.errors import AutotuneError, EngineStartupError, FailureKind
from autotune.sim.engine import SimEngine
from autotune.sim.memory import cuda_graph_sizes

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
# vLLM's log for Llama-3.1-8B-Instruct on one H100 80GB at gpu_memory_utilization 0.9 (default budget):
# "Available KV cache memory: 51.38 GiB" = 3288 blocks of 128 tokens (llm-d/llm-d-benchmark,
# config_explorer/empirical-vllm-memory-results.md; see docs/simulator.md for the derivation).
REFERENCE_KV_TOKENS = 420_864


def engine(model: str = LLAMA_8B, gpu: str = "H100", **flags: object) -> SimEngine:
    return SimEngine(EngineConfig(model=model).replace(**flags), gpu)


def startup_error(model: str = LLAMA_8B, gpu: str = "H100", **flags: object) -> EngineStartupError:
    with pytest.raises(EngineStartupError) as info:
        engine(model, gpu, **flags)
    return info.value


def test_kv_tokens_llama_8b_h100_within_10_percent_of_vllm_log() -> None:
    tokens = engine().memory.kv_cache_tokens
    assert abs(tokens - REFERENCE_KV_TOKENS) / REFERENCE_KV_TOKENS < 0.10


def test_kv_cache_follows_utilization_budget_dtype_and_tp() -> None:
    base = engine(max_model_len=8192).memory
    assert engine(max_model_len=8192, gpu_memory_utilization=0.5).memory.num_gpu_blocks < base.num_gpu_blocks
    assert (
        engine(max_model_len=8192, max_num_batched_tokens=16384).memory.num_gpu_blocks < base.num_gpu_blocks
    )
    fp8 = engine(max_model_len=8192, kv_cache_dtype="fp8").memory
    assert fp8.kv_bytes_per_token * 2 == base.kv_bytes_per_token
    assert fp8.kv_cache_tokens == pytest.approx(2 * base.kv_cache_tokens, rel=0.01)
    tp2 = engine(max_model_len=8192, tensor_parallel_size=2).memory
    assert tp2.kv_bytes_per_token * 2 == base.kv_bytes_per_token
    assert tp2.kv_cache_tokens > 2 * base.kv_cache_tokens  # half the KV per token and half the weights


def test_block_sizes_64_and_128_start_with_the_same_kv_tokens_in_fewer_blocks() -> None:
    """vLLM 0.11 starts them on CUDA (FlashAttention takes any multiple of 16; the CUDA platform has no
    limit past it): the same KV memory in pages of 64 or 128 tokens."""
    tokens = engine(max_model_len=8192).memory.kv_cache_tokens
    for size in (64, 128):
        memory = engine(max_model_len=8192, block_size=size).memory
        assert memory.num_gpu_blocks == pytest.approx(tokens / size, abs=1)


def test_vllm_defaults_are_resolved_per_gpu() -> None:
    h100 = engine().config
    assert (h100.max_num_seqs, h100.max_num_batched_tokens, h100.max_model_len) == (1024, 8192, 131072)
    a100 = engine(gpu="A100-80GB", max_model_len=8192).config
    assert (a100.max_num_seqs, a100.max_num_batched_tokens) == (256, 2048)


def test_cuda_graph_sizes_follow_vllm() -> None:
    sizes = cuda_graph_sizes(1024)
    assert sizes[:4] == (1, 2, 4, 8) and sizes[-1] == 512 and len(sizes) == 3 + 31 + 17
    assert cuda_graph_sizes(8) == (1, 2, 4, 8, 16)
    small, large = engine(max_num_seqs=8).memory, engine(max_num_seqs=512).memory
    assert small.cuda_graph_bytes < large.cuda_graph_bytes


def test_chunked_prefill_off_with_small_budget_fails_verbatim() -> None:
    err = startup_error(enable_chunked_prefill=False, max_num_batched_tokens=4096, max_model_len=8192)
    assert str(err) == (
        "max_num_batched_tokens (4096) is smaller than max_model_len (8192). This effectively limits the "
        "maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. Please "
        "increase max_num_batched_tokens or decrease max_model_len."
    )
    assert err.kind == FailureKind.INVALID_CONFIG


def test_budget_below_max_num_seqs_fails_verbatim() -> None:
    err = startup_error(max_num_batched_tokens=256, max_num_seqs=512, max_model_len=8192)
    assert str(err) == "max_num_batched_tokens (256) must be greater than or equal to max_num_seqs (512)."


def test_no_memory_for_kv_cache_fails_verbatim() -> None:
    err = startup_error(LLAMA_70B, "A100-80GB", tensor_parallel_size=2, gpu_memory_utilization=0.85)
    assert str(err) == (
        "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine."
    )
    assert err.kind == FailureKind.KV_CACHE_OOM


def test_max_length_request_that_does_not_fit_fails_with_estimate() -> None:
    err = startup_error(LLAMA_70B, "A100-80GB", tensor_parallel_size=2, gpu_memory_utilization=0.95)
    text = str(err)
    assert text.startswith(
        "To serve at least one request with the models's max seq len (131072), (20.00 GiB KV"
    )
    assert "which is larger than the available KV cache memory (" in text
    estimate = int(text.split("estimated maximum model length is ")[1].split(".")[0])
    assert 0 < estimate < 131072 and estimate % 16 == 0
    assert err.kind == FailureKind.KV_CACHE_OOM
    # The estimate is right: that max_model_len starts.
    assert engine(LLAMA_70B, "A100-80GB", tensor_parallel_size=2, gpu_memory_utilization=0.95,
                  max_model_len=estimate).memory.kv_cache_tokens >= estimate  # fmt: skip


def test_free_memory_below_requested_fails_verbatim() -> None:
    err = startup_error(gpu_memory_utilization=1.0)
    assert str(err) == (
        "Free memory on device (78.57/79.18 GiB) on startup is less than desired GPU memory utilization "
        "(1.0, 79.18 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
    )


def test_utilization_near_one_ooms_at_cuda_graph_capture_or_sampler_warmup() -> None:
    err = startup_error(gpu_memory_utilization=0.98)
    assert str(err).startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ")
    assert err.kind == FailureKind.STARTUP_OOM
    # Fewer captured graphs and a smaller sampler warm-up leave enough headroom at the same utilization.
    assert engine(gpu_memory_utilization=0.98, max_num_seqs=32).memory.num_gpu_blocks > 0
    assert engine(gpu_memory_utilization=0.97).memory.num_gpu_blocks > 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"max_model_len": 200000}, "User-specified max_model_len (200000) is greater than the derived "
         "max_model_len (max_position_embeddings=131072 or model_max_length=None in model's config.json)."),
        ({"tensor_parallel_size": 3}, "Total number of attention heads (32) must be divisible by tensor "
         "parallel size (3)."),
        ({"block_size": 12}, "argument --block-size: invalid choice: 12 (choose from 1, 8, 16, 32, 64, "
         "128)"),
        ({"block_size": 256}, "argument --block-size: invalid choice: 256"),
        # vLLM's arguments take 8; FlashAttention's KV cache layout refuses it once the cache is sized
        ({"block_size": 8}, "Block size must be a multiple of 16."),
        ({"gpu_memory_utilization": 1.5}, "GPU memory utilization must be less than 1.0. Got 1.5."),
        ({"gpu_memory_utilization": 0.0}, "GPU memory utilization must be greater than 0. Got 0.0."),
        ({"kv_cache_dtype": "int4"}, "argument --kv-cache-dtype: invalid choice: 'int4'"),
    ],
)  # fmt: skip
def test_config_validation_errors(flags: dict[str, object], message: str) -> None:
    err = startup_error(**flags)
    assert str(err).startswith(message)
    assert err.kind == FailureKind.INVALID_CONFIG


def test_catalogs_resolve_names_and_reject_unknown_ones() -> None:
    assert get_gpu("NVIDIA H100 80GB HBM3") is get_gpu("h100-80gb") is get_gpu("H100")
    assert get_gpu("A100-40GB").is_a100 and not get_gpu("H200").is_a100
    with pytest.raises(AutotuneError, match=r"unknown GPU 'B300'; known: H100, H200"):
        get_gpu("B300")
    llama = get_model("meta-llama/Meta-Llama-3.1-8B-Instruct")
    assert llama.num_params == pytest.approx(8.03e9, rel=0.005)
    assert get_model("Llama-3.1-70B").num_params == pytest.approx(70.55e9, rel=0.005)
    assert get_model("Qwen/Qwen2.5-72B-Instruct").max_position_embeddings == 32768
    assert get_model("mistralai/Mistral-7B-Instruct-v0.3").vocab_size == 32768
    with pytest.raises(AutotuneError, match="unknown model 'acme/Nope-1B'"):
        get_model("acme/Nope-1B")


def test_model_from_local_config_json(tmp_path) -> None:
    config = {
        "num_hidden_layers": 16, "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8,
        "intermediate_size": 8192, "vocab_size": 128256, "max_position_embeddings": 131072,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = get_model(str(tmp_path))
    assert (model.num_layers, model.head_dim, model.tie_word_embeddings) == (16, 64, True)
    assert model.num_params == pytest.approx(1.24e9, rel=0.01)  # Llama-3.2-1B
    assert SimEngine(EngineConfig(model=str(tmp_path), max_model_len=8192), "L4").memory.num_gpu_blocks > 0
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(AutotuneError, match="lacks 'num_attention_heads'"):
        get_model(str(tmp_path))


def test_qwen3_catalog_matches_vllms_logged_weights() -> None:
    """llm-d's startup logs: Qwen3-0.6B 1.12 GiB, Qwen3-32B 61.03 GiB of weights on one GPU."""
    assert get_model("Qwen/Qwen3-0.6B").weight_bytes() / 2**30 == pytest.approx(1.12, abs=0.02)
    assert get_model("Qwen/Qwen3-32B").weight_bytes() / 2**30 == pytest.approx(61.03, abs=0.05)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"num_local_experts": 8, "num_experts_per_tok": 2}, "mixture-of-experts model"),  # Mixtral
        ({"quantization_config": {"quant_method": "fp8"}}, r"quantized weights \(quantization_config: fp8\)"),
    ],
)
def test_models_it_cannot_represent_are_refused_with_one_line(tmp_path, extra: dict, message: str) -> None:
    config = {
        "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 32768, **extra,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(AutotuneError, match=message):
        get_model(str(tmp_path))
