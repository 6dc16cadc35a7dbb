"""The duration of one engine step: a roofline of the batch's FLOPs and bytes plus fixed overheads.

A step runs every scheduled token through the model once. Its GPU time is, per rank,

  GEMMs      max(2 * matmul_params/TP * tokens / (peak * gemm_eff), weights/TP / (bw * bw_eff))
  attention  prefill chunks: max(4 * layers * heads/TP * head_dim * (q x kv pairs) / (peak * attn_eff),
                                  their KV bytes / (bw * bw_eff))
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
overlapped form gives; docs/simulator.md). The efficiency factors and fixed costs are the
Calibration's (autotune/sim/calibration.py: gemm_eff, gemm_half_m, attn_eff, bw_eff, per_layer_s,
step_base_s, per_seq_s, eager_per_layer_s, compute_scale_<arch>), fitted on the train split of
benchmarks/fidelity_points.yaml (docs/simulator.md, "Fidelity").
"""

from __future__ import annotations

from autotune.catalog.gpus import GpuSpec
from autotune.catalog.models import ModelSpec
from autotune.sim.calibration import DEFAULT_CALIBRATION, Calibration
from autotune.sim.memory import MAX_CUDA_GRAPH_SIZE


class CostModel:
    """Step durations for one model on one GPU type at one TP size (coefficients precomputed)."""

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        tp: int,
        kv_bytes_per_token: int,
        calibration: Calibration = DEFAULT_CALIBRATION,
        max_graph_tokens: int = MAX_CUDA_GRAPH_SIZE,
    ) -> None:
        cal = calibration
        peak = gpu.bf16_flops * cal.compute_scale(gpu)
        bw = gpu.hbm_bytes_per_s * cal.bw_eff
        layer_params = model.num_layers * model.layer_params
        # Per scheduled token: every layer's matmuls; per sampled row: the lm_head.
        self._s_per_token = 2 * layer_params / tp / (peak * cal.gemm_eff)
        self._s_per_sampled = 2 * model.vocab_size * model.hidden_size / tp / (peak * cal.gemm_eff)
        self._weights_s = model.weight_bytes(tp) / bw
        attn_flops_per_pair = 4 * model.num_layers * (model.num_attention_heads // tp) * model.head_dim
        self._s_per_attn_pair = attn_flops_per_pair / (peak * cal.attn_eff)
        self._s_per_kv_token = kv_bytes_per_token / bw
        self._s_per_decode_pair = attn_flops_per_pair / (peak * cal.gemm_eff)
        self._half_m = cal.gemm_half_m
        self._step_base_s = cal.step_base_s
        self._per_seq_s = cal.per_seq_s
        self._seq_pair_s = cal.reality_seq_pair_s
        self._attn_per_seq = cal.reality_attn_per_seq
        if tp > 1:
            ring = 2 * (tp - 1) / tp
            self._allreduce_per_token = (
                2 * model.num_layers * ring * model.hidden_size * 2 / (gpu.interconnect_bytes_per_s)
            )
            self._allreduce_fixed = 2 * model.num_layers * gpu.interconnect_latency_s
        else:
            self._allreduce_per_token = 0.0
            self._allreduce_fixed = 0.0
        self._eager_s = model.num_layers * cal.eager_per_layer_s
        self._layers_s = model.num_layers * cal.per_layer_s
        self._max_graph_tokens = max_graph_tokens
        self._decode_terms: dict[int, tuple[float, float, float, float]] = {}  # by batch size

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
            * (1.0 + self._attn_per_seq * num_seqs)
            + self.comm_s(num_tokens)
            + self.cpu_s(num_tokens, num_seqs)
        )

    def decode_step_time(self, num_decodes: int, decode_context: int) -> float:
        """`step_time` of a step of `num_decodes` decodes alone, to the last bit (its prefill attention
        is 0.0 there, and x + 0.0 is x): the terms that depend on the batch size alone are kept per size,
        as a low-load window runs the same few sizes for thousands of steps."""
        terms = self._decode_terms.get(num_decodes)
        if terms is None:
            n = num_decodes
            terms = (self.gemm_s(n, n), 1.0 + self._attn_per_seq * n, self.comm_s(n), self.cpu_s(n, n))
            self._decode_terms[n] = terms
        gemm, per_seq, comm, cpu = terms
        return gemm + self.decode_attention_s(decode_context) * per_seq + comm + cpu

    # The terms step_time adds (public so that benchmarks/gpu_step_compare.py compares them one by one).
    def gemm_s(self, num_tokens: int, num_sampled: int) -> float:
        """The matmuls: FLOP-bound or weight-streaming, whichever takes longer."""
        return max(self.gemm_flops_s(num_tokens, num_sampled), self._weights_s)

    def gemm_flops_s(self, num_tokens: int, num_sampled: int) -> float:
        """The matmuls' FLOP-bound time: every layer per token, the lm_head per sampled row."""
        # Small-M GEMMs (decode batches, short chunks) fall short of the large-GEMM efficiency.
        return (num_tokens * self._s_per_token + num_sampled * self._s_per_sampled) * (
            1.0 + self._half_m / max(num_tokens, 1)
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
        cpu = (
            self._layers_s
            + self._step_base_s
            + num_seqs * self._per_seq_s
            + num_seqs * num_seqs * self._seq_pair_s
        )
        if num_tokens > self._max_graph_tokens:
            cpu += self._eager_s
        return cpu
