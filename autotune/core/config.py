"""EngineConfig: the vLLM launch flags a trial uses, and their conversion to and from `vllm serve` args."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.core import values
from autotune.core.errors import AutotuneError

# The vLLM release whose flags, checks and behaviour autotune follows; the docker backend and the export
# default to its image (a pinned tag: `latest` moves under a tuned config).
VLLM_RELEASE = "0.11.0"
VLLM_IMAGE = "vllm/vllm-openai"
DEFAULT_IMAGE = f"{VLLM_IMAGE}:v{VLLM_RELEASE}"
# vLLM's batch defaults (vllm/engine/arg_utils.py get_batch_defaults, OpenAI API server usage context).
LARGE_GPU_MIN_GIB = 70
LARGE_GPU_DEFAULTS = (1024, 8192)  # (max_num_seqs, max_num_batched_tokens) on >= 70 GiB GPUs but A100
SMALL_GPU_DEFAULTS = (256, 2048)
# vLLM's yes/no flags autotune knows: every one a `bool` config field, so an argparse
# BooleanOptionalAction in vLLM 0.11 (`--enforce-eager` / `--no-enforce-eager`, no value: `--enforce-eager
# maybe` reads "maybe" as a second model). A value of them must be true or false (flag_problem).
BOOL_FLAGS = (
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "enforce_eager",
    "trust_remote_code",
    "async_scheduling",
    "enable_expert_parallel",
    "disable_custom_all_reduce",
    "calculate_kv_scales",
)
# Flags vLLM takes as one or more values (nargs="+" in vllm/engine/arg_utils.py: list-typed fields): a
# list is written as separate arguments, `--served-model-name a b`, never as Python's "['a', 'b']".
LIST_FLAGS = ("served_model_name", "cuda_graph_sizes")
# A pass-through flag (`extra`) that the simulated engine's scheduler models (sim/flags.py).
LONG_PREFILL = "long_prefill_token_threshold"
PARTIAL_PREFILL_LIMITS = ("max_num_partial_prefills", "max_long_partial_prefills")  # V0 only


@dataclass(frozen=True)
class EngineConfig:
    """The tuned `vllm serve` flags. None means "vLLM's default for this GPU and model"."""

    model: str
    tensor_parallel_size: int = 1
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    max_model_len: int | None = None
    kv_cache_dtype: str = "auto"
    # Any other `vllm serve` flag (snake_case name -> value), passed through untouched.
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)

    def replace(self, **changes: Any) -> EngineConfig:
        """A copy with some fields changed (unknown names go to `extra`)."""
        known = {f.name for f in dataclasses.fields(self)}
        extra = dict(self.extra)
        fields = {}
        for name, value in changes.items():
            if name in known:
                fields[name] = value
            else:
                extra[name] = value
        return dataclasses.replace(self, extra=extra, **fields)

    def with_vllm_defaults(
        self, gpu_memory_gib: float, gpu_name: str, max_position_embeddings: int
    ) -> EngineConfig:
        """Fill unset fields the way vLLM does at startup (EngineArgs._set_default_args).

        An unset budget gets the GPU's default (at least max_model_len with chunked prefill off, at most
        max_num_seqs * max_model_len); an unset max_num_seqs gets the GPU's default capped by the budget.
        """
        max_model_len = self.max_model_len or max_position_embeddings
        large = gpu_memory_gib >= LARGE_GPU_MIN_GIB and "A100" not in gpu_name.upper()
        default_seqs, default_budget = LARGE_GPU_DEFAULTS if large else SMALL_GPU_DEFAULTS
        seqs = self.max_num_seqs if self.max_num_seqs is not None else default_seqs
        budget = self.max_num_batched_tokens
        if budget is None:
            budget = default_budget if self.enable_chunked_prefill else max(max_model_len, default_budget)
            budget = min(seqs * max_model_len, budget)
        if self.max_num_seqs is None:
            seqs = min(seqs, budget)
        return dataclasses.replace(
            self, max_model_len=max_model_len, max_num_batched_tokens=budget, max_num_seqs=seqs
        )

    def params(self) -> dict[str, Any]:
        """The set flags as {vllm_snake_case_name: value}, without the model and unset (None) ones."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in ("model", "extra"):
                continue
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value
        out.update(self.extra)
        return out

    @property
    def api_name(self) -> str:
        """The model name clients send: vLLM's first `--served-model-name`, else the model."""
        named = self.params().get("served_model_name")
        if isinstance(named, (list, tuple)):
            named = named[0] if named else None
        return str(named) if named else self.model

    def to_args(self) -> list[str]:
        """`vllm serve` arguments (after `vllm serve`): the model, then one flag per set parameter."""
        args = [self.model]
        for name, value in self.params().items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + flag[2:])
            elif isinstance(value, (list, tuple)):
                args += [flag, *(str(v) for v in value)]
            else:
                args += [flag, str(value)]
        return args

    @classmethod
    def from_args(cls, args: list[str]) -> EngineConfig:
        """Parse `vllm serve` arguments (as produced by `to_args`, `vllm serve` itself dropped)."""
        if args and args[0] == "vllm":
            args = args[1:]
        if args and args[0] == "serve":
            args = args[1:]
        model = None
        values: dict[str, Any] = {}
        i = 0
        while i < len(args):
            token = args[i]
            if not token.startswith("--"):
                if model is not None:
                    raise AutotuneError(f"unexpected argument {token!r} in vllm serve command")
                model = token
                i += 1
                continue
            name, _, inline = token[2:].partition("=")
            name = name.replace("-", "_")
            if name == "model":
                model = inline or args[i + 1]
                i += 1 if inline else 2
                continue
            if name.startswith("no_") and not inline:
                values[name[3:]] = False
                i += 1
            elif name in BOOL_FLAGS and not inline:  # a yes/no flag takes no value: the next token is not it
                values[name] = True
                i += 1
            elif inline:
                values[name] = _parse_value(inline)
                i += 1
            elif name in LIST_FLAGS:  # every value up to the next flag
                end = next((j for j in range(i + 1, len(args)) if args[j].startswith("--")), len(args))
                taken = [_parse_value(a) for a in args[i + 1 : end]]
                values[name] = taken[0] if len(taken) == 1 else taken
                i = end
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                values[name] = _parse_value(args[i + 1])
                i += 2
            else:
                values[name] = True
                i += 1
        if model is None:
            raise AutotuneError("vllm serve command has no model")
        return cls(model=model).replace(**values)


# The EngineConfig fields that are `vllm serve` flags (all but the model and the pass-through extras).
ENGINE_FLAGS = tuple(f.name for f in dataclasses.fields(EngineConfig) if f.name not in ("model", "extra"))
# Flags vLLM takes as integers >= 1 (argparse type=int plus its own positivity checks).
POSITIVE_INT_FLAGS = (
    "tensor_parallel_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "max_model_len",
    "pipeline_parallel_size",
    "data_parallel_size",
    "max_num_partial_prefills",
    "max_long_partial_prefills",
)
# `vllm serve` flags a search space may tune or fix and `bench --set` may set, beyond EngineConfig's
# fields (their values pass through to the server: EngineConfig.extra).
OTHER_VLLM_FLAGS = frozenset(
    {
        "dtype",
        "quantization",
        "load_format",
        "seed",
        "swap_space",
        "enforce_eager",
        "max_num_partial_prefills",
        "max_long_partial_prefills",
        "long_prefill_token_threshold",
        "cuda_graph_sizes",
        "scheduling_policy",
        "async_scheduling",
        "pipeline_parallel_size",
        "data_parallel_size",
        "enable_expert_parallel",
        "trust_remote_code",
        "disable_custom_all_reduce",
        "served_model_name",
        "tokenizer",
        "revision",
        "calculate_kv_scales",
        "prefix_caching_hash_algo",
    }
)
# `vllm serve` flags vLLM 0.11 no longer takes (a command with one exits "unrecognized arguments"): a
# space or --set naming one is told why autotune does not know it.
REMOVED_VLLM_FLAGS = {
    "num_scheduler_steps": "multi-step scheduling was removed with vLLM's V0 engine",
    "max_seq_len_to_capture": "removed by vllm-project/vllm#25543; CUDA graphs follow cuda_graph_sizes",
}


def removed_flag_note(name: str) -> str:
    """' (why vLLM no longer has it)' for a removed flag, '' for any other name."""
    why = REMOVED_VLLM_FLAGS.get(name)
    return f" ({why})" if why else ""


# vLLM's defaults of those flags where it is one plain value (vllm/engine/arg_utils.py, EngineArgs): the
# baseline trial ("vLLM's defaults") of a space that tunes them takes these. Where the default depends
# on vLLM's version (async_scheduling, seed) the sampler picks the baseline's value.
OTHER_FLAG_DEFAULTS: dict[str, Any] = {
    "dtype": "auto",
    "load_format": "auto",
    "enforce_eager": False,
    "max_num_partial_prefills": 1,
    "max_long_partial_prefills": 1,
    "long_prefill_token_threshold": 0,
    "scheduling_policy": "fcfs",
    "pipeline_parallel_size": 1,
    "data_parallel_size": 1,
    "enable_expert_parallel": False,
    "disable_custom_all_reduce": False,
}
# Past an int32 no count is a setting: vLLM keeps sequence lengths, block tables and token positions in
# int32 tensors (and 2**63 sequences or a 10**15-token budget only end in an allocation error).
MAX_FLAG_INT = 2**31 - 1
# vLLM's --block-size and --kv-cache-dtype choices (vllm/config/cache.py, BlockSize and CacheDType;
# the KV dtypes are those the simulator models: auto is the model's dtype, fp8 variants one byte).
BLOCK_SIZE_CHOICES = (1, 8, 16, 32, 64, 128)
# Those vLLM 0.11 starts with on NVIDIA's GPUs, every GPU autotune runs on: FlashAttention, its attention
# backend there, takes multiples of 16 ("Block size must be a multiple of 16." once the KV cache is
# sized, the model loaded: vllm/v1/attention/backends/flash_attn.py). vllm/platforms/cuda.py has no
# upper limit (the "up to 32 on CUDA" of --block-size's help is older vLLM's).
CUDA_BLOCK_SIZES = (16, 32, 64, 128)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
_SCALARS = (str, int, float, bool)


def flag_problem(name: str, value: Any, cuda: bool = True) -> str | None:
    """Why `value` cannot be vLLM's `name` flag (as `vllm serve` would refuse it), or None when it can.

    Only the flags autotune models are checked in depth; any other flag needs a finite scalar value (or
    a flat list of them, as for nargs="+" flags): a mapping or null is never a command-line value.
    `cuda`: also refuse what vLLM's arguments take but its CUDA platform refuses at startup.
    """
    shown = f"{name}={values.shown(value)}"
    if name in POSITIVE_INT_FLAGS:
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_FLAG_INT:
            return f"{shown}: expected a whole number from 1 to {MAX_FLAG_INT:,}"
        if name == "block_size" and value not in BLOCK_SIZE_CHOICES:
            return f"{shown}: vLLM's block sizes are {', '.join(map(str, BLOCK_SIZE_CHOICES))}"
        if name == "block_size" and cuda and value not in CUDA_BLOCK_SIZES:
            return (
                f"{shown}: vLLM starts on CUDA with block sizes 16, 32, 64 and 128 only (FlashAttention: "
                "'Block size must be a multiple of 16.')"
            )
    elif name == "gpu_memory_utilization":
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or not 0 < value <= 1:
            return f"{shown}: expected a fraction in (0, 1]"
    elif name in BOOL_FLAGS:
        if not isinstance(value, bool):
            return f"{shown}: expected true or false"
    elif name == "kv_cache_dtype":
        if value not in KV_CACHE_DTYPES:
            return f"{shown}: expected one of {', '.join(KV_CACHE_DTYPES)}"
    elif name == LONG_PREFILL:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_FLAG_INT:
            return f"{shown}: expected a whole number from 0 (no cap) to {MAX_FLAG_INT:,}"
    else:
        items = value if isinstance(value, list) and value else [value]
        if not all(isinstance(v, _SCALARS) for v in items):
            return f"{shown}: expected a value (text, a number, true/false) or a list of them"
        if any(isinstance(v, float) and not math.isfinite(v) for v in items):
            return f"{shown}: expected a finite number"
    return None


def long_prefill_problem(config: EngineConfig, max_model_len: int | None) -> str | None:
    """vLLM's check of a prefill chunk cap longer than any request (`vllm/config/scheduler.py`
    `_verify_args`, made only with concurrent partial prefills: max_num_partial_prefills > 1), with its
    message; None when it passes (or `max_model_len` is unknown)."""
    threshold = config.extra.get(LONG_PREFILL)
    partial = config.extra.get("max_num_partial_prefills", 1)
    concurrent = isinstance(partial, int) and partial > 1
    if concurrent and isinstance(threshold, int) and max_model_len and threshold > max_model_len:
        return (
            f"long_prefill_token_threshold ({threshold}) cannot be greater than the max_model_len "
            f"({max_model_len})."
        )
    return None


def partial_prefill_problem(config: EngineConfig) -> str | None:
    """V1's refusal of concurrent partial prefills (`max_num_partial_prefills` or
    `max_long_partial_prefills` other than 1: a NotImplementedError before the model loads, vLLM 0.11
    on, where there is no V0 engine to fall back to), with its message; None when it passes."""
    if all(config.extra.get(name) in (None, 1) for name in PARTIAL_PREFILL_LIMITS):
        return None
    return (
        "Concurrent Partial Prefill is not supported. We recommend to remove Concurrent Partial Prefill "
        "from your config."
    )


def check_flags(values: dict[str, Any], where: str, cuda: bool = True) -> None:
    """Raise AutotuneError (one line, prefixed by `where`) on the first value vLLM would refuse (`cuda`: see
    flag_problem)."""
    for name, value in values.items():
        problem = flag_problem(name, value, cuda)
        if problem:
            raise AutotuneError(f"{where}: {problem}")


def _parse_value(text: str) -> Any:
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def parse_value(text: str) -> Any:
    """A flag value as typed on a command line: int, then float, then true/false, else the text."""
    return _parse_value(text)


PARALLEL_SIZES = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")


def gpus_per_replica(params: Mapping[str, Any]) -> int:
    """The GPUs one replica of a config takes (its flags, as `EngineConfig.params()` or a trial's `config`
    attr): its tensor- times pipeline- times data-parallel size (one `vllm serve` with data parallelism
    runs that many engines, each on its own GPUs)."""
    return math.prod(max(1, int(params.get(name) or 1)) for name in PARALLEL_SIZES)


def parallel_text(params: Mapping[str, Any]) -> str:
    """The parallel sizes that make a config's GPU count, e.g. "tensor_parallel_size 2 x
    pipeline_parallel_size 2" (the tensor-parallel size alone when the others are unset)."""
    sizes = [f"{name} {params[name]}" for name in PARALLEL_SIZES[1:] if int(params.get(name) or 1) > 1]
    return " x ".join([f"tensor_parallel_size {int(params.get('tensor_parallel_size') or 1)}", *sizes])
