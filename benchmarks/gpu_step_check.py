"""A real-hardware check of the simulator's GPU-kernel step terms (autotune/sim/costs.py).

Two modes:

    python3 benchmarks/gpu_step_check.py --measure OUT.json   # on a GPU host; needs torch only
    python benchmarks/gpu_step_check.py --compare benchmarks/h100_step_kernels.json  # here

--measure times plain-torch kernels on random bf16 weights with the per-rank layer shapes of models in
the simulator's catalog (copied into MODELS below, so that this mode runs without autotune; --compare
checks them against autotune/catalog/models.py): one decoder layer's linear GEMMs (qkv, o, gate_up, down,
each torch.nn.functional.linear, i.e. cuBLAS), the lm_head GEMM at the sampled rows, SDPA attention
(prefill: causal over M tokens; decode: B single-token queries against C cached tokens each), and a whole
decoder layer forward (RMSNorm, simple rotary, SDPA, SiLU-gated MLP). Each point is the median of
repeats timed with CUDA events, after warm-ups, with L2 flushed (a 256 MiB write) and the stream held
by a spin kernel before each repeat, so that the timings are the kernels' own, with cold weights as in a
real forward pass, and no CPU launch gaps (as under vLLM's CUDA graphs).

--compare prints, for the same shapes, what CostModel gives for the GEMM and attention terms on the
simulator's H100 entry next to the measured times (ratios sim / measured): CostModel's own terms (the
ones step_time adds), split per layer where a layer is measured. Only the GPU-kernel part of a step is
compared: the simulator's step also holds the CPU side (step_base_s, per_seq_s, the eager launch
penalty), which plain kernels do not measure, and vLLM's fused kernels (FlashAttention 3, fused RMSNorm /
SiLU / rotary) differ from plain torch.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from arguments import Parser, user_errors  # beside this script, as the next two
from gpu_step_clock import FLUSH_MIB, SPIN_CYCLES
from gpu_step_kernels import Measurer, per_rank

MEMORY_FRACTION = 0.70  # of the device: 55 GiB on an 80 GB H100

# Shapes from autotune/catalog/models.py (Hugging Face config.json); tp is the tensor-parallel size whose
# per-rank shapes are measured (heads, KV heads, MLP width and vocabulary are split by tp).
MODELS: dict[str, dict[str, int]] = {
    "meta-llama/Llama-3.1-8B": dict(
        layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=14336, vocab=128256, tp=1
    ),
    "Qwen/Qwen3-14B": dict(
        layers=40, hidden=5120, heads=40, kv_heads=8, head_dim=128, inter=17408, vocab=151936, tp=1
    ),
    "Qwen/Qwen3-32B": dict(
        layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128, inter=25600, vocab=151936, tp=1
    ),
    "meta-llama/Llama-3.1-70B": dict(
        layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, inter=28672, vocab=128256, tp=2
    ),
}
QUICK_MODELS: dict[str, dict[str, int]] = {
    "tiny": dict(layers=2, hidden=256, heads=8, kv_heads=2, head_dim=32, inter=512, vocab=1000, tp=1),
    "tiny-tp2": dict(layers=2, hidden=256, heads=8, kv_heads=2, head_dim=32, inter=512, vocab=1000, tp=2),
}


def measure(args: argparse.Namespace) -> None:
    import torch

    warnings.filterwarnings("ignore")
    start = time.monotonic()
    deadline = start + args.budget_s
    device = args.device
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_per_process_memory_fraction(MEMORY_FRACTION)
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True  # torch's default
        props = torch.cuda.get_device_properties(device)
        name, sms, mem = props.name, props.multi_processor_count, round(props.total_memory / 2**30, 2)
    else:
        name, sms, mem = "cpu", None, None
    models = QUICK_MODELS if args.quick else MODELS
    if args.models:
        models = {k: v for k, v in models.items() if any(s.lower() in k.lower() for s in args.models)}
    result: dict[str, Any] = {
        "header": {
            "device": name,
            "multiprocessors": sms,
            "memory_gib": mem,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if cuda else None,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "script": "benchmarks/gpu_step_check.py --measure",
            "dtype": "bfloat16, random weights (randn x 0.02) and activations (randn)",
            "method": (
                "CUDA events; per point 2 warm-ups, then 7-25 repeats (about 0.15 s), median; before each "
                f"repeat a {FLUSH_MIB} MiB write flushes L2 and a spin kernel (torch.cuda._sleep "
                f"{SPIN_CYCLES} cycles) holds the stream while the CPU queues the repeat, so no launch gaps "
                "are timed. GEMMs: torch.nn.functional.linear (cuBLAS), qkv/o/gate_up/down back to back, "
                "each timed. Attention: SDPA per backend (flash, cudnn, efficient), GQA via enable_gqa "
                "where a backend takes it, else K/V repeated outside the timed region; decode: the query "
                "heads of one KV head as that head's queries (B, kv_heads, group, d) against a (B, kv_heads,"
                " C, d) cache. Layer: RMSNorm, qkv, rotary, SDPA (fastest backend), o, RMSNorm, gate_up, "
                "SiLU*up, down, residuals; decode also writes the step's K/V into the cache. Qwen3's "
                "q/k norms are left out. Shapes per tensor-parallel rank. Times in microseconds."
            ),
            "flops_convention": (
                "GEMM 2*M*N*K; attention as costs.py counts it: 4*heads*head_dim*pairs, prefill pairs "
                "M*(M+1)/2, decode pairs B*C; GB/s counts weights + inputs + outputs (GEMM), K+V (decode)"
            ),
        },
        "models": {},
    }
    if cuda:  # clocks up, cuBLAS / cuDNN initialised
        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        for _ in range(40):
            a @ a
        torch.cuda.synchronize()
        del a
    measurer = Measurer(torch, device, args.quick)
    for name, shape in models.items():
        print(f"{name} (tp={shape['tp']}): {per_rank(shape)}", flush=True)
        result["models"][name] = measurer.model(name, shape, deadline)
        result["header"]["elapsed_s"] = round(time.monotonic() - start, 1)
        result["header"]["repeats"] = measurer.clock.repeats
        Path(args.measure).write_text(json.dumps(result, indent=1) + "\n")  # each model as it completes
    print(
        f"wrote {args.measure} in {time.monotonic() - start:.0f} s ({measurer.clock.repeats} timed repeats)"
    )


def main() -> None:
    parser = Parser(__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--measure", metavar="OUT.json", help="time the kernels here (needs torch) and write OUT.json"
    )
    mode.add_argument(
        "--compare", metavar="IN.json", help="print the simulator's terms next to IN.json's timings"
    )
    parser.add_argument(
        "--device", default="cuda", help="--measure: torch device (cpu with --quick tests the logic)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="--measure: tiny shapes and grids (a logic test)"
    )
    parser.add_argument("--models", nargs="*", help="--measure: only models whose name contains one of these")
    parser.add_argument(
        "--budget-s", type=float, default=300.0, help="--measure: stop adding points after this"
    )
    parser.add_argument("--gpu", default="H100", help="--compare: the simulator's GPU entry")
    args = parser.parse_args()
    if args.measure:
        try:
            import torch
        except ImportError as exc:
            parser.error(f"--measure needs PyTorch (pip install torch): {exc}")
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            parser.error(
                f"--device {args.device}: torch sees no CUDA GPU here (--device cpu --quick tests the logic)"
            )
        measure(args)
        return
    from gpu_step_compare import compare, measured  # they import autotune: --measure runs without it

    from autotune.catalog.gpus import get_gpu

    with user_errors(parser):
        get_gpu(args.gpu)
        data = measured(Path(args.compare), QUICK_MODELS)
    compare(data, args.gpu)


if __name__ == "__main__":
    sys.exit(main())
