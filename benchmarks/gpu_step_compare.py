"""`benchmarks/gpu_step_check.py --compare`: the simulator's GPU-kernel step terms (CostModel's own, the
ones autotune/sim/costs.py's step_time adds) next to the kernel timings `--measure` wrote on a GPU host,
as ratios sim / measured, per model and shape (see gpu_step_check.py for what was measured and how)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class SimTerms:
    """CostModel (its step terms: gemm_s, prefill_attention_s, decode_attention_s) for one model on one
    GPU at one TP size, plus the per-layer and lm_head views the comparison needs, which CostModel does
    not have: its GEMM FLOP term split by layer and by sampled row."""

    def __init__(self, name: str, gpu_name: str, tp: int) -> None:
        from autotune.catalog.gpus import get_gpu
        from autotune.catalog.models import get_model
        from autotune.sim import costs
        from autotune.sim.calibration import DEFAULT_CALIBRATION as cal

        self.model = model = get_model(name)
        self.gpu = gpu = get_gpu(gpu_name)
        self.tp = tp
        self.kv_bytes_per_token = model.kv_bytes_per_token(tp)
        self.cost_model = costs.CostModel(model, gpu, tp, self.kv_bytes_per_token, cal)
        self.compute_scale = cal.compute_scale(gpu)
        self.peak = gpu.bf16_flops * self.compute_scale
        self.bw = gpu.hbm_bytes_per_s * cal.bw_eff
        self.layers = model.num_layers

    def layer_gemm_s(self, m: int) -> tuple[float, float]:
        """(FLOP-bound, weight-streaming) seconds of one layer's GEMMs at M tokens: the step's FLOP term
        without the lm_head, split evenly over the layers, and one layer's weights at the model's rate."""
        md = self.model
        flops = self.cost_model.gemm_flops_s(m, 0) / self.layers
        return flops, md.layer_params * md.dtype_bytes / self.tp / self.bw


def fmt(x: float, width: int = 8, digits: int = 1) -> str:
    return f"{x:{width}.{digits}f}"


def measured(path: Path, quick_models: Iterable[str]) -> dict[str, Any]:
    """The timings `--measure` wrote to `path`, of models in the simulator's catalog (not the tiny
    `quick_models` of a logic test): anything else is one AutotuneError line."""
    from autotune.catalog.models import get_model
    from autotune.core.errors import AutotuneError
    from autotune.core.inputs import read_json

    data = read_json(path, "--compare file")
    if not all(isinstance(data, dict) and isinstance(data.get(k), dict) for k in ("header", "models")):
        raise AutotuneError(f"--compare file {path}: not what --measure writes (a header and models)")
    quick = [name for name in data["models"] if name in quick_models]
    if quick:
        raise AutotuneError(
            f"--compare file {path} holds {', '.join(quick)}: written by --measure --quick, a test of the "
            "logic on tiny shapes, not timings to compare with the simulator"
        )
    for name in data["models"]:
        get_model(name)
    return data


def compare(data: dict[str, Any], gpu: str) -> None:
    """Print the simulator's terms on `gpu` next to `data`'s timings (`measured`)."""
    from autotune.catalog.models import get_model
    from autotune.sim.calibration import DEFAULT_CALIBRATION as cal

    head = data["header"]
    print(f"measured: {head['device']}, torch {head['torch']}, CUDA {head['cuda']}, {head['date']}")
    print(
        f"simulator: GPU entry {gpu!r}; gemm_eff {cal.gemm_eff}, gemm_half_m {cal.gemm_half_m:g}, "
        f"attn_eff {cal.attn_eff}, bw_eff {cal.bw_eff} (the built-in calibration)"
    )
    print(
        "Only the GPU-kernel part of a step is compared. CostModel's step time also holds the CPU side\n"
        f"(step_base_s {cal.step_base_s * 1e3:.1f} ms + per_seq_s per request + the eager launch penalty) "
        "and, at TP>1, the\nall-reduces, none of which is here. Measured: plain-torch kernels (cuBLAS GEMMs, "
        "torch SDPA, unfused\nnorms / rotary / SiLU) on random bf16 weights, one TP rank; vLLM's kernels "
        "(FlashAttention 3, fused\nelementwise ops) differ. Sim terms are CostModel's own (the ones its "
        "step_time adds).\nsim/meas > 1: the simulator charges more time.\n"
    )
    summary = []
    for name, entry in data["models"].items():
        shape, tp = entry["shape"], entry["shape"]["tp"]
        sim = SimTerms(name, gpu, tp)
        md = get_model(name)
        catalog = dict(
            layers=md.num_layers,
            hidden=md.hidden_size,
            heads=md.num_attention_heads,
            kv_heads=md.num_key_value_heads,
            head_dim=md.head_dim,
            inter=md.intermediate_size,
            vocab=md.vocab_size,
            tp=tp,
        )
        if catalog != shape:
            raise SystemExit(
                f"{name}: measured shapes {shape} differ from autotune/catalog/models.py {catalog}"
            )
        L = sim.layers  # noqa: N806
        eff_tflops = sim.peak * cal.gemm_eff / 1e12
        print(f"=== {name}, TP={tp} (one rank), {L} layers")
        print(
            f"sim: GEMMs at {sim.gpu.bf16_flops / 1e12:.0f} (peak) x {sim.compute_scale} "
            f"(compute_scale_{sim.gpu.arch}) x "
            f"{cal.gemm_eff} (gemm_eff) = {eff_tflops:.0f} TFLOP/s, x M/(M+{cal.gemm_half_m:g});\n"
            f"     weights and KV at {sim.bw / 1e9:.0f} GB/s; prefill attention at "
            f"{sim.peak * cal.attn_eff / 1e12:.0f} TFLOP/s"
        )

        print(
            "\n(a) one layer's GEMMs (qkv + o + gate_up + down), per layer; sim = max(FLOP term, weight term)"
        )
        print(
            "    step = a prefill step of M tokens, one row sampled: L x layer + lm_head(1 row) vs sim's "
            "GEMM term"
        )
        print(
            f"{'M':>6} {'meas us':>9} {'TFLOP/s':>8} {'wGB/s':>6} {'sim flop':>9} {'sim wts':>8} "
            f"{'sim us':>8} "
            f"{'sim/meas':>8} | {'step meas':>10} {'sim':>10} {'sim/meas':>8}"
        )
        lm_by_rows = {row["rows"]: row["us"] for row in entry["lm_head"]}
        gemm_ratio = {}
        for row in entry["gemm"]:
            m = row["m"]
            flop_s, wts_s = sim.layer_gemm_s(m)
            sim_us = max(flop_s, wts_s) * 1e6
            gemm_ratio[m] = sim_us / row["total_us"]
            step_meas = L * row["total_us"] + lm_by_rows.get(1, math.nan)
            step_sim = sim.cost_model.gemm_s(m, 1) * 1e6
            print(
                f"{m:6d} {fmt(row['total_us'], 9)} {fmt(row['tflops'])} {row['weight_gbps']:6.0f} "
                f"{fmt(flop_s * 1e6, 9)} {fmt(wts_s * 1e6)} {fmt(sim_us)} {gemm_ratio[m]:8.2f} | "
                f"{step_meas / 1e3:7.2f} ms {step_sim / 1e3:7.2f} ms {step_sim / step_meas:8.2f}"
            )

        print(
            "\n(c) lm_head at R sampled rows (tokens = R), vs sim's FLOP term and the lm_head's "
            "weight streaming"
        )
        print(
            f"{'R':>6} {'meas us':>9} {'TFLOP/s':>8} {'GB/s':>6} {'sim flop':>9} {'sim wts':>8} "
            f"{'sim/meas':>8}"
        )
        for row in entry["lm_head"]:
            rr = row["rows"]
            flop_s = sim.cost_model.gemm_flops_s(rr, rr) - sim.cost_model.gemm_flops_s(rr, 0)
            wts_s = md.vocab_size * md.hidden_size * md.dtype_bytes / tp / sim.bw
            print(
                f"{rr:6d} {fmt(row['us'], 9)} {fmt(row['tflops'])} {row['gbps']:6.0f} {fmt(flop_s * 1e6, 9)} "
                f"{fmt(wts_s * 1e6)} {max(flop_s, wts_s) * 1e6 / row['us']:8.2f}"
            )

        print(
            "\n(b) prefill of M tokens (one chunk, no cached prefix), per layer: SDPA per backend, "
            "whole layer"
        )
        print(
            "    TFLOP/s of the fastest backend, counted as costs.py counts (4 x heads x head_dim x M(M+1)/2)"
        )
        print(
            f"{'M':>6} {'flash us':>9} {'cudnn us':>9} {'effic us':>9} {'best':>6} {'TFLOP/s':>8} "
            f"{'sim us':>8} "
            f"{'/flash':>6} {'/best':>6} | {'layer us':>9} {'sim g+a':>9} {'sim/meas':>8}"
        )
        attn_ratio, layer_ratio = {}, {}
        for row in entry["prefill"]:
            m, best, times = row["m"], row["best"], row["attn_us"]
            sim_attn = sim.cost_model.prefill_attention_s(m * (m + 1) / 2, m) / L * 1e6
            cells = " ".join(
                fmt(times[b], 9) if times.get(b) is not None else f"{'-':>9}"
                for b in ("flash", "cudnn", "efficient")
            )
            if best is None:
                print(f"{m:6d} {cells}  no backend")
                continue
            attn_ratio[m] = sim_attn / times[best]
            flash = sim_attn / times["flash"] if times.get("flash") else math.nan
            sim_layer = max(sim.layer_gemm_s(m)) * 1e6 + sim_attn
            layer_ratio[m] = sim_layer / row["layer_us"]
            print(
                f"{m:6d} {cells} {best:>6} {fmt(row['attn_tflops'])} {fmt(sim_attn)} {flash:6.2f} "
                f"{attn_ratio[m]:6.2f} | {fmt(row['layer_us'], 9)} {fmt(sim_layer, 9)} {layer_ratio[m]:8.2f}"
            )

        print(
            "\n(b) decode: B requests with C tokens of context each; SDPA (fastest backend) and whole layer,"
        )
        print(
            "    per layer; then the step's kernels: L x layer + lm_head(B rows) vs sim's GEMM + "
            "attention terms"
        )
        print(
            f"{'B':>5} {'C':>5} {'attn us':>8} {'KV GB/s':>8} {'sim us':>8} {'sim/meas':>8} | "
            f"{'layer us':>9} "
            f"{'sim g+a':>8} {'sim/meas':>8} | {'step meas':>10} {'sim':>9} {'sim/meas':>8}"
        )
        decode_ratio = {}
        for row in entry["decode"]:
            b, c, best = row["b"], row["c"], row["best"]
            if best is None:
                print(f"{b:5d} {c:5d} no backend")
                continue
            t = row["attn_us"][best]
            sim_attn = sim.cost_model.decode_attention_s(b * c) / L * 1e6
            sim_layer = max(sim.layer_gemm_s(b)) * 1e6 + sim_attn
            step_meas = L * row["layer_us"] + lm_by_rows.get(b, math.nan)
            step_sim = (sim.cost_model.gemm_s(b, b) + sim.cost_model.decode_attention_s(b * c)) * 1e6
            decode_ratio[(b, c)] = (sim_attn / t, step_sim / step_meas)
            print(
                f"{b:5d} {c:5d} {fmt(t)} {row['kv_gbps']:8.0f} {fmt(sim_attn)} {sim_attn / t:8.2f} | "
                f"{fmt(row['layer_us'], 9)} {fmt(sim_layer)} {sim_layer / row['layer_us']:8.2f} | "
                f"{step_meas / 1e3:7.2f} ms {step_sim / 1e3:6.2f} ms {step_sim / step_meas:8.2f}"
            )
        large = max((r["tflops"] for r in entry["gemm"] if r["m"] >= 4096), default=math.nan)
        small = [r["weight_gbps"] for r in entry["gemm"] if r["m"] <= 8]
        small_gbps = statistics.median(small) if small else math.nan
        summary.append(
            (
                name,
                tp,
                large,
                eff_tflops,
                small_gbps,
                sim.bw / 1e9,
                gemm_ratio,
                attn_ratio,
                layer_ratio,
                decode_ratio,
            )
        )
        print()

    print(
        "=== summary (GPU-kernel terms only; sim/meas > 1: the simulator charges more time than the kernels)"
    )
    print(
        f"{'model':25} {'TP':>2} {'GEMM TFLOP/s':>12} {'sim':>4} {'wGB/s M<=8':>10} {'sim':>5} "
        f"{'GEMM sim/meas M=1 64 512 8192':>29} {'attn M=1k 4k 16k':>16} {'layer M=4k':>10}"
    )
    for name, tp, tflops, sim_tflops, gbps, sim_gbps, g, a, lr, _ in summary:
        gs = " ".join(f"{g.get(m, math.nan):.2f}" for m in (1, 64, 512, 8192))
        at = " ".join(f"{a.get(m, math.nan):.2f}" for m in (1024, 4096, 16384))
        print(
            f"{name:25} {tp:2d} {tflops:12.0f} {sim_tflops:4.0f} {gbps:10.0f} {sim_gbps:5.0f} {gs:>29} "
            f"{at:>16} {lr.get(4096, math.nan):10.2f}"
        )
    print(
        "(GEMM TFLOP/s: the layer's four GEMMs together, best M >= 4096; wGB/s: their weight bytes / "
        "time, median over M <= 8)"
    )
    print(f"\n{'model':25} decode sim/meas at (B, C): attention / the step's kernels (L layers + lm_head)")
    for name, *_, d in summary:
        shown = ((1, 2048), (32, 2048), (256, 2048), (8, 8192))
        print(
            f"{name:25} "
            + "  ".join(f"({b},{c}) {d[b, c][0]:.2f}/{d[b, c][1]:.2f}" for b, c in shown if (b, c) in d)
        )
