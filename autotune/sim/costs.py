"""The duration of one engine step: a roofline of the batch's FLOPs and bytes plus fixed overheads.

A step runs every scheduled token through the model once. Its GPU time is, per rank,

  GEMMs      max(2 * matmul_params/TP * tokens / (peak * GEMM_EFF), weights/TP / (bw * BW_EFF))
  attention  prefill chunks: max(4 * layers * heads/TP * head_dim * (q x kv pairs) / (peak * ATTN_EFF),
                                  their KV bytes / (bw * BW_EFF))
             + decodes: the same max over their one query per context token (memory-bound: the KV read)
  TP         2 all-reduces per layer of tokens x hidden bf16: ring 2(TP-1)/TP x bytes / link + latency

plus, per layer, the kernels whose time does not shrink with the batch (norms, rotary embedding,
activation, the attention launch: a few microseconds each even at one token), and the CPU side of a
step (scheduler, input preparation, sampling): a fixed base, a per-request part, and a launch penalty
per layer when the batch has more tokens than the largest captured CUDA graph (vLLM captures
`min(2 * max_num_seqs, 512)` tokens at most; beyond that the model runs eagerly, its kernels launched
from Python one by one, `vllm/v1/worker/gpu_model_runner.py`).
The prefill and decode parts of attention are added, not overlapped: the decodes' KV reads do not hide
behind the chunks' FLOPs (GPUStack's Qwen3-14B runs at 4K context are 10-18 % slower than the
overlapped form gives; docs/simulator.md). The efficiency factors are fitted on the train split of
benchmarks/fidelity_points.yaml (docs/simulator.md, "Fidelity").
"""

from __future__ import annotations

from autotune.catalog.gpus import GpuSpec
from autotune.catalog.models import ModelSpec
from autotune.sim.memory import MAX_CUDA_GRAPH_SIZE

GEMM_EFF = 0.60  # achieved / peak bf16 for large GEMMs (prefill)
GEMM_HALF_M = 32  # tokens at which a GEMM reaches half of GEMM_EFF (tile and wave quantization)
ATTN_EFF = 0.60  # FlashAttention prefill achieved / peak
BW_EFF = 0.80  # achieved / peak HBM bandwidth for weight and KV streaming
PER_LAYER_S = 20e-6  # per layer and step: the kernels whose time does not shrink with the batch
STEP_BASE_S = 2.2e-3  # scheduler + input prep + sampling + output processing per step
PER_SEQ_S = 6.5e-6  # per scheduled request: block tables, sampling metadata, output processing
EAGER_PER_LAYER_S = 40e-6  # kernel-launch cost per layer when the batch exceeds the CUDA-graph sizes


class CostModel:
    """Step durations for one model on one GPU type at one TP size (coefficients precomputed)."""

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        tp: int,
        kv_bytes_per_token: int,
        max_graph_tokens: int = MAX_CUDA_GRAPH_SIZE,
    ) -> None:
        peak = gpu.bf16_flops * gpu.compute_scale
        bw = gpu.hbm_bytes_per_s * BW_EFF
        layer_params = model.num_layers * model.layer_params
        # Per scheduled token: every layer's matmuls; per sampled row: the lm_head.
        self._s_per_token = 2 * layer_params / tp / (peak * GEMM_EFF)
        self._s_per_sampled = 2 * model.vocab_size * model.hidden_size / tp / (peak * GEMM_EFF)
        self._weights_s = model.weight_bytes(tp) / bw
        attn_flops_per_pair = 4 * model.num_layers * (model.num_attention_heads // tp) * model.head_dim
        self._s_per_attn_pair = attn_flops_per_pair / (peak * ATTN_EFF)
        self._s_per_kv_token = kv_bytes_per_token / bw
        self._s_per_decode_pair = attn_flops_per_pair / (peak * GEMM_EFF)
        if tp > 1:
            ring = 2 * (tp - 1) / tp
            self._allreduce_per_token = (
                2 * model.num_layers * ring * model.hidden_size * 2 / (gpu.interconnect_bytes_per_s)
            )
            self._allreduce_fixed = 2 * model.num_layers * gpu.interconnect_latency_s
        else:
            self._allreduce_per_token = 0.0
            self._allreduce_fixed = 0.0
        self._eager_s = model.num_layers * EAGER_PER_LAYER_S
        self._layers_s = model.num_layers * PER_LAYER_S
        self._max_graph_tokens = max_graph_tokens

    def step_time(
        self,
        num_tokens: int,
        num_seqs: int,
        num_sampled: int,
        decode_context: int,
        prefill_pairs: float,
        prefill_context: int,
    ) -> float:
        """Seconds for one step.

        num_tokens: tokens scheduled (decodes + prefill chunks); num_seqs: requests scheduled;
        num_sampled: rows sampled (decodes + prefills that finish this step);
        decode_context: sum of the decodes' context lengths (KV read, one query each);
        prefill_pairs: sum over chunks of chunk x (context before + (chunk + 1) / 2) query-key pairs;
        prefill_context: tokens of KV the chunks read (cached prefix + earlier chunks + themselves).
        """
        return (
            self.gemm_s(num_tokens, num_sampled)
            + (
                self.prefill_attention_s(prefill_pairs, prefill_context)
                + self.decode_attention_s(decode_context)
            )
            + self.comm_s(num_tokens)
            + self.cpu_s(num_tokens, num_seqs)
        )

    # The terms step_time adds (public so that benchmarks/gpu_step_compare.py compares them one by one).
    def gemm_s(self, num_tokens: int, num_sampled: int) -> float:
        """The matmuls: FLOP-bound or weight-streaming, whichever takes longer."""
        return max(self.gemm_flops_s(num_tokens, num_sampled), self._weights_s)

    def gemm_flops_s(self, num_tokens: int, num_sampled: int) -> float:
        """The matmuls' FLOP-bound time: every layer per token, the lm_head per sampled row."""
        # Small-M GEMMs (decode batches, short chunks) fall short of the large-GEMM efficiency.
        return (num_tokens * self._s_per_token + num_sampled * self._s_per_sampled) * (
            1.0 + GEMM_HALF_M / max(num_tokens, 1)
        )

    def prefill_attention_s(self, prefill_pairs: float, prefill_context: int) -> float:
        """The prefill chunks' attention: FLOP-bound or KV-read-bound."""
        return max(prefill_pairs * self._s_per_attn_pair, prefill_context * self._s_per_kv_token)

    def decode_attention_s(self, decode_context: int) -> float:
        """The decodes' attention: one query per context token (memory-bound: the KV read)."""
        return decode_context * max(self._s_per_decode_pair, self._s_per_kv_token)

    def comm_s(self, num_tokens: int) -> float:
        """The TP all-reduces (0 at TP=1)."""
        return num_tokens * self._allreduce_per_token + self._allreduce_fixed

    def cpu_s(self, num_tokens: int, num_seqs: int) -> float:
        """Fixed costs: per-layer small kernels, a base, a part per scheduled request, eager launches."""
        cpu = self._layers_s + STEP_BASE_S + num_seqs * PER_SEQ_S
        if num_tokens > self._max_graph_tokens:
            cpu += self._eager_s
        return cpu
