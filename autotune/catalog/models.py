"""Model catalog (shapes from the models' Hugging Face config.json) and loading a local config.json."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.core.errors import AutotuneError
from autotune.core.inputs import read_json
from autotune.core.values import positive_int

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


@dataclass(frozen=True)
class ModelSpec:
    """The shapes of a dense decoder-only transformer (Llama/Qwen2/Mistral family)."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    dtype_bytes: int = 2

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: attention, gated MLP, two RMSNorms."""
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        attn = self.hidden_size * (q + 2 * kv) + q * self.hidden_size
        if self.attention_bias:
            attn += q + 2 * kv
        mlp = 3 * self.hidden_size * self.intermediate_size
        return attn + mlp + 2 * self.hidden_size

    @property
    def embedding_params(self) -> int:
        """Input embedding plus lm_head (one matrix when tied)."""
        matrices = 1 if self.tie_word_embeddings else 2
        return matrices * self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Total parameter count derived from the shapes."""
        return self.num_layers * self.layer_params + self.embedding_params + self.hidden_size

    @property
    def matmul_params(self) -> int:
        """Parameters every token multiplies through: all layers plus the lm_head (not the lookup)."""
        return self.num_layers * self.layer_params + self.vocab_size * self.hidden_size

    def weight_bytes(self, tp: int = 1) -> int:
        """Weight bytes per tensor-parallel rank (everything but the norms is sharded, vocab included)."""
        return self.num_params * self.dtype_bytes // tp

    def kv_bytes_per_token(self, tp: int = 1, kv_dtype_bytes: int | None = None) -> int:
        """KV-cache bytes one token takes on one rank, all layers (K and V)."""
        kv_heads = max(1, self.num_key_value_heads // tp)
        per = self.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
        return 2 * self.num_layers * kv_heads * self.head_dim * per


def _llama(name: str, layers: int, hidden: int, heads: int, inter: int, **kw: Any) -> ModelSpec:
    defaults: dict[str, Any] = {
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
    }
    defaults.update(kw)
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=inter,
        **defaults,
    )


def _qwen3(name: str, layers: int, hidden: int, heads: int, inter: int, **kw: Any) -> ModelSpec:
    return _llama(name, layers, hidden, heads, inter, vocab_size=151936, max_position_embeddings=40960, **kw)


# Base architectures; "-Instruct" variants share them (Qwen2.5 Instruct configs say 32768 positions).
_CATALOG: tuple[ModelSpec, ...] = (
    _llama("meta-llama/Llama-3.1-8B", 32, 4096, 32, 14336),
    _llama("meta-llama/Llama-3.1-70B", 80, 8192, 64, 28672),
    _llama("meta-llama/Llama-3.3-70B", 80, 8192, 64, 28672),
    _llama(
        "Qwen/Qwen2.5-7B", 28, 3584, 28, 18944, num_key_value_heads=4, vocab_size=152064, attention_bias=True
    ),
    _llama("Qwen/Qwen2.5-72B", 80, 8192, 64, 29568, vocab_size=152064, attention_bias=True),
    _llama("mistralai/Mistral-7B-v0.3", 32, 4096, 32, 14336, vocab_size=32768, max_position_embeddings=32768),
    # Qwen3 dense (config.json on the Hub): head_dim 128 whatever the width, 8 KV heads, 40960 positions.
    _qwen3("Qwen/Qwen3-0.6B", 28, 1024, 16, 3072, tie_word_embeddings=True),
    _qwen3("Qwen/Qwen3-1.7B", 28, 2048, 16, 6144, tie_word_embeddings=True),
    _qwen3("Qwen/Qwen3-4B", 36, 2560, 32, 9728, tie_word_embeddings=True),
    _qwen3("Qwen/Qwen3-8B", 36, 4096, 32, 12288),
    _qwen3("Qwen/Qwen3-14B", 40, 5120, 40, 17408),
    _qwen3("Qwen/Qwen3-32B", 64, 5120, 64, 25600),
)
_INSTRUCT_OVERRIDES = {
    "qwen2.5-7b": {"max_position_embeddings": 32768},
    "qwen2.5-72b": {"max_position_embeddings": 32768},
}


def _short(name: str) -> str:
    """'meta-llama/Meta-Llama-3.1-8B-Instruct' -> 'llama-3.1-8b' (org, 'meta-' and version suffix dropped)."""
    key = name.strip().rstrip("/").split("/")[-1].lower()
    if key.startswith("meta-"):
        key = key[len("meta-") :]
    for suffix in ("-v0.1", "-v0.2", "-v0.3"):
        key = key.replace(suffix, "")
    return key


def _lookup(name: str) -> ModelSpec | None:
    key = _short(name)
    instruct = key.endswith("-instruct")
    base_key = key.removesuffix("-instruct")
    for spec in _CATALOG:
        if _short(spec.name) == base_key:
            if instruct and base_key in _INSTRUCT_OVERRIDES:
                return dataclasses.replace(spec, **_INSTRUCT_OVERRIDES[base_key])
            return spec
    return None


def known_models() -> list[str]:
    """The catalog's model ids."""
    return [spec.name for spec in _CATALOG]


def known_models_text() -> str:
    """The models the simulator knows, for --help (not learnt only by typing a wrong name)."""
    return (
        f"simulated models: {', '.join(known_models())} (their -Instruct variants too), or a local folder "
        "with a Hugging Face config.json; a real backend takes any model vLLM serves"
    )


def qualified_name(name: str) -> str:
    """A catalog model typed without its organization, with it ('Qwen3-8B' -> 'Qwen/Qwen3-8B'): the id
    that `vllm serve` and the exports need. A local folder as an absolute path: a relative one would
    name another folder (or a Hub id) from wherever best.sh or an export is run. Any other name as given:
    an org/name id, a model the catalog does not know."""
    local = Path(name).expanduser()
    if local.exists():
        # abspath, not resolve: a symlinked model folder keeps the name the user gave it
        return os.path.abspath(local)
    if "/" in name:
        return name
    spec = _lookup(name)
    if spec is None or "/" not in spec.name:
        return name
    org, base = spec.name.split("/")
    typed = name.strip()
    for spelled in (base, f"{base}-Instruct"):  # the catalog's spelling where only the case differs
        if typed.lower() == spelled.lower():
            return f"{org}/{spelled}"
    return f"{org}/{typed}"


def catalog_id(name: str) -> str | None:
    """The catalog model a name stands for ('llama-3.1-8b-instruct' -> 'meta-llama/Llama-3.1-8B'), or
    None for a local config.json or folder and a name the catalog does not know."""
    if Path(name).expanduser().exists():
        return None
    spec = _lookup(name)
    return spec.name if spec else None


def get_model(name_or_path: str) -> ModelSpec:
    """A model by HF id or short name, or from a local directory / config.json; AutotuneError if unknown."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return load_config_json(path / "config.json" if path.is_dir() else path, name=name_or_path)
    spec = _lookup(name_or_path)
    if spec is None:
        raise AutotuneError(
            f"unknown model {name_or_path!r}; known: {', '.join(known_models())} "
            "(or give a local directory with a Hugging Face config.json)"
        )
    return dataclasses.replace(spec, name=name_or_path)


# config.json keys of mixture-of-experts models (Mixtral, Qwen2/3-MoE, DeepSeek, gpt-oss, DBRX ...).
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")


def _refuse_unmodelled(cfg: dict[str, Any], path: Path) -> None:
    """AutotuneError for a model the dense bf16 cost and memory models would get silently wrong.

    A MoE model reads only its routed experts per token and holds all of them in memory; quantized
    weights change both the weight bytes and the GEMM speed. Neither is modelled, so refuse.
    """
    for key in _MOE_KEYS:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            raise AutotuneError(
                f"model config {path} is a mixture-of-experts model ({key}={value}); the simulator models "
                "dense decoder-only models only"
            )
    quant = cfg.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "unknown") if isinstance(quant, dict) else "unknown"
        raise AutotuneError(
            f"model config {path} has quantized weights (quantization_config: {method}); the simulator "
            "models bf16/fp16 weights only"
        )


def load_config_json(path: Path, name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config.json (Llama-like dense models); every shape must be
    a whole number >= 1 (0 layers or a negative width is a broken file, not a model)."""
    if not path.exists():
        raise AutotuneError(f"no config.json at {path}")
    cfg = read_json(path, "model config")
    if not isinstance(cfg, dict):
        raise AutotuneError(f"model config {path} is not a JSON object")
    text_config = cfg.get("text_config", {})
    if not isinstance(text_config, dict):
        raise AutotuneError(f"model config {path}: text_config must be a JSON object")
    cfg = {**text_config, **cfg}
    _refuse_unmodelled(cfg, path)

    def shape(key: str, default: Any = None) -> int:
        value = default if cfg.get(key) is None else cfg[key]
        if value is None:
            raise AutotuneError(f"model config {path} lacks {key!r}")
        return positive_int(value, f"model config {path}: {key}")

    heads, hidden = shape("num_attention_heads"), shape("hidden_size")
    return ModelSpec(
        name=name or str(path.parent),
        num_layers=shape("num_hidden_layers"),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=shape("num_key_value_heads", heads),
        head_dim=shape("head_dim", hidden // heads),
        intermediate_size=shape("intermediate_size"),
        vocab_size=shape("vocab_size"),
        max_position_embeddings=shape("max_position_embeddings", 2048),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
        dtype_bytes=_DTYPE_BYTES.get(str(cfg.get("torch_dtype", "bfloat16")), 2),
    )


def load_model(name: str) -> ModelSpec:
    """The model spec of the simulator's catalog or of a local config.json; one line when unusable."""
    try:
        return get_model(name)
    except AutotuneError:
        raise
    except (ArithmeticError, AttributeError, KeyError, TypeError, ValueError) as exc:
        # A config.json with zero heads, a non-mapping text_config...: the catalog's reader raises.
        raise AutotuneError(
            f"model {name!r}: not a usable Hugging Face config.json ({type(exc).__name__}: {exc})"
        ) from None


def known_max_model_len(model: str, configured: int | None, backend: str) -> int | None:
    """The max_model_len a server of `model` will have: the configured one, else the model's own
    (the simulator's catalog or a local config.json); None when unknown (a real model outside it)."""
    if configured is not None:
        return configured
    try:
        return int(load_model(model).max_position_embeddings)
    except AutotuneError:
        if backend == "sim":
            raise
        return None
