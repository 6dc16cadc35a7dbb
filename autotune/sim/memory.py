"""vLLM V1's startup: config validation and the memory plan that decides the number of KV blocks.

Follows `vllm/v1/worker/gpu_worker.py` (determine_available_memory, compile_or_warm_up_model) and
`vllm/v1/core/kv_cache_utils.py`. The order of checks is vLLM's: argument/config validation, the
free-memory check, weight loading, the profile run (forward at the token budget plus a dummy sampler
run), KV sizing, then CUDA-graph capture and the sampler warm-up, which allocate on top of the
`gpu_memory_utilization` budget and are where a utilization near 1.0 dies with a CUDA OOM.
Every error message is vLLM's own (see docs/simulator.md and docs/vllm.md, "Startup errors").
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.catalog.gpus import GIB, GpuSpec
from autotune.catalog.models import ModelSpec
from autotune.core.config import (
    BLOCK_SIZE_CHOICES,
    KV_CACHE_DTYPES,
    EngineConfig,
    long_prefill_problem,
    partial_prefill_problem,
)
from autotune.core.errors import EngineStartupError, FailureKind
from autotune.sim.calibration import DEFAULT_CALIBRATION, Calibration
from autotune.sim.flags import enforce_eager

MIB = 1024**2
KERNEL_BLOCK_MULTIPLE = 16  # FlashAttention's pages hold a multiple of 16 tokens
KV_DTYPE_BYTES = {dtype: 1 for dtype in KV_CACHE_DTYPES if dtype != "auto"}  # auto: the model's dtype
MAX_CUDA_GRAPH_SIZE = 512

# The fitted terms (non-torch memory, the profiled activation peak, CUDA graphs, the sampler warm-up) are
# the Calibration's (sim/calibration.py); why the activation peak follows the vocabulary, not the MLP:
# docs/simulator.md, "Memory model".


@dataclass(frozen=True)
class MemoryPlan:
    """Per-rank memory at startup, in bytes, and the KV cache it leaves."""

    total_bytes: int
    free_bytes: int  # free when vLLM starts (total - CUDA context)
    requested_bytes: int  # total * gpu_memory_utilization
    weights_bytes: int
    activation_bytes: int  # profiled peak: forward at the token budget + dummy sampler + workspaces
    non_torch_bytes: int
    kv_available_bytes: int
    kv_bytes_per_token: int
    block_size: int
    num_gpu_blocks: int
    cuda_graph_sizes: tuple[int, ...]
    cuda_graph_bytes: int
    sampler_bytes: int  # sampler warm-up after KV allocation: min(seqs, budget) x vocab logits

    @property
    def kv_cache_tokens(self) -> int:
        """ "GPU KV cache size: N tokens" in vLLM's log."""
        return self.num_gpu_blocks * self.block_size

    @property
    def num_cuda_graphs(self) -> int:
        """How many batch sizes are captured."""
        return len(self.cuda_graph_sizes)

    @property
    def largest_cuda_graph(self) -> int:
        """Tokens of the largest captured batch (0: none, --enforce-eager): a larger step runs eagerly."""
        return largest_graph(self.cuda_graph_sizes)

    def concurrency_for(self, max_model_len: int) -> float:
        """How many max-length requests fit in the KV cache: "Maximum concurrency" in vLLM's log. A request
        holds whole blocks (get_max_concurrency_for_kv_cache_config, vllm/v1/core/kv_cache_utils.py)."""
        return self.num_gpu_blocks / -(-max_model_len // self.block_size)


def cuda_graph_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """Batch sizes vLLM captures: [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)."""
    largest = min(2 * max_num_seqs, MAX_CUDA_GRAPH_SIZE)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)]
    return tuple(s for s in sizes if s <= largest)


def largest_graph(sizes: tuple[int, ...]) -> int:
    """The largest of the captured batch sizes `sizes` (0 when none is captured)."""
    return max(sizes, default=0)


def kv_dtype_bytes(config: EngineConfig, model: ModelSpec) -> int:
    """Bytes per KV element for --kv-cache-dtype."""
    if config.kv_cache_dtype == "auto":
        return model.dtype_bytes
    if config.kv_cache_dtype not in KV_DTYPE_BYTES:
        choices = ", ".join(KV_CACHE_DTYPES)
        raise EngineStartupError(
            f"argument --kv-cache-dtype: invalid choice: '{config.kv_cache_dtype}' (choose from {choices})",
            FailureKind.INVALID_CONFIG.value,
        )
    return KV_DTYPE_BYTES[config.kv_cache_dtype]


LONG_LEN_VARIABLE = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
LONG_LEN_CAUTION = (
    f"{LONG_LEN_VARIABLE} must be used with extreme caution. If the model uses relative position encoding "
    "(RoPE), positions exceeding derived_max_model_len lead to nan. If the model uses absolute position "
    "encoding, positions exceeding derived_max_model_len will cause a CUDA array out-of-bounds error."
)


def long_max_model_len(config: EngineConfig, model: ModelSpec) -> str | None:
    """vLLM's words for a max_model_len past the model's context (vllm/config/model.py
    _get_and_verify_max_len), None within it. An error, or with VLLM_ALLOW_LONG_MAX_MODEL_LEN a warning."""
    if config.max_model_len is None or config.max_model_len <= model.max_position_embeddings:
        return None
    return (
        f"User-specified max_model_len ({config.max_model_len}) is greater than the derived max_model_len "
        f"(max_position_embeddings={model.max_position_embeddings} or model_max_length=None in model's "
        "config.json)."
    )


def validate_config(config: EngineConfig, model: ModelSpec, allow_long_max_model_len: bool = False) -> None:
    """vLLM's argument and config checks (before any GPU work). `config` must be resolved;
    `allow_long_max_model_len`: VLLM_ALLOW_LONG_MAX_MODEL_LEN is set (the sim-server's environment)."""
    invalid = FailureKind.INVALID_CONFIG.value
    u = config.gpu_memory_utilization
    if u > 1:
        raise EngineStartupError(f"GPU memory utilization must be less than 1.0. Got {u}.", invalid)
    if u <= 0:
        raise EngineStartupError(f"GPU memory utilization must be greater than 0. Got {u}.", invalid)
    if config.block_size not in BLOCK_SIZE_CHOICES:
        choices = ", ".join(str(b) for b in BLOCK_SIZE_CHOICES)
        raise EngineStartupError(
            f"argument --block-size: invalid choice: {config.block_size} (choose from {choices})", invalid
        )
    assert config.max_model_len is not None and config.max_num_batched_tokens is not None
    assert config.max_num_seqs is not None
    too_long = long_max_model_len(config, model)
    if too_long is not None and not allow_long_max_model_len:
        raise EngineStartupError(
            f"{too_long} To allow overriding this maximum, set the env var {LONG_LEN_VARIABLE}=1. "
            f"{LONG_LEN_CAUTION}",
            invalid,
        )
    tp = config.tensor_parallel_size
    if tp < 1 or model.num_attention_heads % tp:
        raise EngineStartupError(
            f"Total number of attention heads ({model.num_attention_heads}) must be divisible by tensor "
            f"parallel size ({tp}).",
            invalid,
        )
    budget, seqs, max_len = config.max_num_batched_tokens, config.max_num_seqs, config.max_model_len
    if not config.enable_chunked_prefill and budget < max_len:
        raise EngineStartupError(
            f"max_num_batched_tokens ({budget}) is smaller than max_model_len ({max_len}). This effectively "
            "limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer "
            "sequences. Please increase max_num_batched_tokens or decrease max_model_len.",
            invalid,
        )
    if budget < seqs:
        raise EngineStartupError(
            f"max_num_batched_tokens ({budget}) must be greater than or equal to max_num_seqs ({seqs}).",
            invalid,
        )
    problem = long_prefill_problem(config, max_len)
    if problem:
        raise EngineStartupError(problem, invalid)
    problem = partial_prefill_problem(config)
    if problem:
        raise EngineStartupError(problem, invalid, "NotImplementedError")
    kv_dtype_bytes(config, model)


def activation_bytes(
    model: ModelSpec, tp: int, num_tokens: int, num_sampled: int, cal: Calibration = DEFAULT_CALIBRATION
) -> int:
    """Profiled activation peak: one forward over `num_tokens` plus the dummy sampler over `num_sampled`."""
    hidden = num_tokens * model.hidden_size * cal.profile_hidden_bytes
    sampler = num_sampled * model.vocab_size * cal.profile_sampler_bytes_per_logit
    return int(int(cal.profile_base_gib * GIB) + hidden + sampler)


def graph_pool_bytes(
    model: ModelSpec, tp: int, num_tokens: int, cal: Calibration = DEFAULT_CALIBRATION
) -> int:
    """The largest captured graph's intermediate buffers (kept in the graph pool after capture).

    Unlike the profiled peak, nothing newer calibrates this: it keeps the earlier per-token estimate
    (hidden states, q/k/v, and 14 elements per intermediate unit, bf16), which puts vLLM's documented
    failures at 0.98 on H100 and its neighbours where they were."""
    q_kv = (model.num_attention_heads + 2 * model.num_key_value_heads) * model.head_dim // tp
    per_token = model.dtype_bytes * (
        4 * model.hidden_size + cal.graph_mlp_factor * model.intermediate_size // tp + q_kv
    )
    return int(num_tokens * per_token)


def sampler_bytes(model: ModelSpec, num_sampled: int, cal: Calibration = DEFAULT_CALIBRATION) -> int:
    """Sampler warm-up: logits (gathered to the full vocab on every rank) and a working copy, fp32."""
    return int(num_sampled * model.vocab_size * cal.sampler_warmup_bytes_per_logit)


def non_torch_bytes(tp: int, cal: Calibration = DEFAULT_CALIBRATION) -> int:
    """Memory outside torch's allocator on one rank (NCCL buffers with TP > 1)."""
    return int((cal.non_torch_gib_tp1 if tp == 1 else cal.non_torch_gib_tp) * GIB)


def least_budget_bytes(config: EngineConfig, model: ModelSpec, cal: Calibration = DEFAULT_CALIBRATION) -> int:
    """The part of the gpu_memory_utilization budget `config` (resolved) needs to start at all: weights,
    non-torch memory, the profiled activation peak and the KV blocks of one max_model_len request, what
    plan_memory charges to the budget before anything else can be served."""
    assert config.max_model_len is not None and config.max_num_batched_tokens is not None
    assert config.max_num_seqs is not None
    tp = config.tensor_parallel_size
    num_sampled = min(config.max_num_seqs, config.max_num_batched_tokens)
    activations = activation_bytes(model, tp, config.max_num_batched_tokens, num_sampled, cal)
    blocks = -(-config.max_model_len // config.block_size)
    kv = blocks * config.block_size * model.kv_bytes_per_token(tp, kv_dtype_bytes(config, model))
    return model.weight_bytes(tp) + non_torch_bytes(tp, cal) + activations + kv


def plan_memory(
    config: EngineConfig,
    model: ModelSpec,
    gpu: GpuSpec,
    calibration: Calibration = DEFAULT_CALIBRATION,
    allow_long_max_model_len: bool = False,
) -> MemoryPlan:
    """Validate `config` (resolved) and size the KV cache; raise EngineStartupError like vLLM would.
    `allow_long_max_model_len`: as validate_config's."""
    cal = calibration
    validate_config(config, model, allow_long_max_model_len)
    assert config.max_model_len is not None and config.max_num_batched_tokens is not None
    assert config.max_num_seqs is not None
    tp = config.tensor_parallel_size
    total = gpu.memory_bytes
    free = total - int(gpu.cuda_context_gib * GIB)
    requested = int(total * config.gpu_memory_utilization)
    if free < requested:
        raise EngineStartupError(
            f"Free memory on device ({free / GIB:.2f}/{total / GIB:.2f} GiB) on startup is less than desired "
            f"GPU memory utilization ({config.gpu_memory_utilization}, {requested / GIB:.2f} GiB). Decrease "
            "GPU memory utilization or reduce GPU memory used by other processes.",
            FailureKind.INVALID_CONFIG.value,
        )
    weights = model.weight_bytes(tp)
    non_torch = non_torch_bytes(tp, cal)
    if weights + non_torch > free:
        raise _oom(weights, total, free - non_torch)
    num_sampled = min(config.max_num_seqs, config.max_num_batched_tokens)
    activations = activation_bytes(model, tp, config.max_num_batched_tokens, num_sampled, cal)
    if weights + non_torch + activations > free:
        raise _oom(activations, total, free - weights - non_torch)
    available = requested - weights - non_torch - activations
    if available <= 0:
        raise EngineStartupError(
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
            "initializing the engine.",
            FailureKind.KV_CACHE_OOM.value,
        )
    per_token = model.kv_bytes_per_token(tp, kv_dtype_bytes(config, model))
    page = per_token * config.block_size  # all layers of one block
    num_blocks = available // page
    needed_blocks = -(-config.max_model_len // config.block_size)
    if needed_blocks > num_blocks:
        estimated = num_blocks * config.block_size
        raise EngineStartupError(
            f"To serve at least one request with the models's max seq len ({config.max_model_len}), "
            f"({needed_blocks * page / GIB:.2f} GiB KV cache is needed, which is larger than the available "
            f"KV cache memory ({available / GIB:.2f} GiB). Based on the available memory, the estimated "
            f"maximum model length is {estimated}. Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine.",
            FailureKind.KV_CACHE_OOM.value,
        )
    if config.block_size % KERNEL_BLOCK_MULTIPLE:
        # the KV cache, once sized, takes the page layout of FlashAttention, vLLM's default attention
        # backend on every GPU of the catalog (vllm/v1/attention/backends/flash_attn.py get_kv_cache_shape)
        raise EngineStartupError("Block size must be a multiple of 16.", FailureKind.INVALID_CONFIG.value)
    sizes = () if enforce_eager(config) else cuda_graph_sizes(config.max_num_seqs)
    per_graph_layer = int(cal.cuda_graph_mib_per_layer * MIB)
    pool = graph_pool_bytes(model, tp, largest_graph(sizes), cal) if sizes else 0
    graphs = len(sizes) * model.num_layers * per_graph_layer + pool
    warmup = sampler_bytes(model, num_sampled, cal)
    headroom = free - requested  # what is physically left once the KV cache fills the budget
    if graphs > headroom:
        raise _oom(graphs, total, headroom)
    if graphs + warmup > headroom:
        raise _oom(warmup, total, headroom - graphs)
    return MemoryPlan(
        total_bytes=total,
        free_bytes=free,
        requested_bytes=requested,
        weights_bytes=weights,
        activation_bytes=activations,
        non_torch_bytes=non_torch,
        kv_available_bytes=available,
        kv_bytes_per_token=per_token,
        block_size=config.block_size,
        num_gpu_blocks=num_blocks,
        cuda_graph_sizes=sizes,
        cuda_graph_bytes=graphs,
        sampler_bytes=warmup,
    )


def _oom(tried: int, total: int, free: int) -> EngineStartupError:
    free = max(free, 0)
    return EngineStartupError(
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried / GIB:.2f} GiB. GPU 0 has a "
        f"total capacity of {total / GIB:.2f} GiB of which {free / GIB:.2f} GiB is free. Including "
        f"non-PyTorch memory, this process has {(total - free) / GIB:.2f} GiB memory in use.",
        FailureKind.STARTUP_OOM.value,
    )
