"""GPU catalog: memory, bf16 peak, HBM bandwidth and TP interconnect of the GPUs the simulator knows.

`memory_gib` is what `torch.cuda.mem_get_info` reports as total memory (what vLLM multiplies by
`gpu_memory_utilization`), not the marketing figure; `cuda_context_gib` is what is already in use when
vLLM checks free memory at startup (CUDA context, cuBLAS handles). Peak FLOP/s are dense bf16 tensor-core
figures from NVIDIA's datasheets; interconnect bandwidth is per direction (NVLink, else PCIe).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.core.errors import AutotuneError

GIB = 1024**3


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model, as the memory and cost models see it."""

    name: str  # as torch.cuda.get_device_name reports it
    memory_gib: float  # total device memory as torch reports it
    bf16_flops: float  # dense bf16 tensor-core peak, FLOP/s
    hbm_bytes_per_s: float  # device memory bandwidth
    interconnect_bytes_per_s: float  # per direction, for TP all-reduce
    interconnect_latency_s: float  # per all-reduce call (NVLink custom all-reduce vs NCCL over PCIe)
    cuda_context_gib: float = 0.61  # in use before vLLM allocates anything (seen on H100: 78.57/79.18 free)
    # The architecture: the simulator's calibration may scale its achieved tensor throughput
    # (`compute_scale_<arch>` in autotune/sim/calibration.py: 1.0 for Hopper, which reaches the same
    # fraction of its peak as A100 in cuBLAS, benchmarks/h100_step_kernels.json; docs/simulator.md).
    arch: str = ""
    aliases: tuple[str, ...] = ()

    @property
    def short_name(self) -> str:
        """The catalog's short name ("H100"): what --gpu shows and studies are named by, whatever alias
        was typed."""
        return self.aliases[0] if self.aliases else self.name

    @property
    def memory_bytes(self) -> int:
        """Total device memory in bytes."""
        return int(self.memory_gib * GIB)

    @property
    def is_a100(self) -> bool:
        """vLLM keeps the small batch defaults on A100s whatever their memory."""
        return "A100" in self.name.upper()


_CATALOG: tuple[GpuSpec, ...] = (
    GpuSpec(
        name="NVIDIA H100 80GB HBM3",
        memory_gib=79.18,
        bf16_flops=989e12,
        hbm_bytes_per_s=3.35e12,
        interconnect_bytes_per_s=450e9,
        interconnect_latency_s=8e-6,
        arch="hopper",
        aliases=("H100", "h100-80gb", "h100-sxm", "h100-80gb-sxm", "h100-sxm5"),
    ),
    GpuSpec(
        name="NVIDIA H200",
        memory_gib=139.81,
        bf16_flops=989e12,
        hbm_bytes_per_s=4.8e12,
        interconnect_bytes_per_s=450e9,
        interconnect_latency_s=8e-6,
        arch="hopper",
        aliases=("H200", "h200-141gb", "h200-sxm"),
    ),
    GpuSpec(
        name="NVIDIA B200",
        memory_gib=179.06,
        bf16_flops=2.25e15,
        hbm_bytes_per_s=8.0e12,
        interconnect_bytes_per_s=900e9,
        interconnect_latency_s=8e-6,
        arch="blackwell",
        aliases=("B200", "b200-180gb"),
    ),
    GpuSpec(
        name="NVIDIA A100-SXM4-80GB",
        memory_gib=79.15,
        bf16_flops=312e12,
        hbm_bytes_per_s=2.039e12,
        interconnect_bytes_per_s=300e9,
        interconnect_latency_s=10e-6,
        arch="ampere",
        aliases=("A100", "A100-80GB", "a100-80gb-sxm", "A100-SXM4-80GB", "a100-80g"),
    ),
    GpuSpec(
        name="NVIDIA A100-SXM4-40GB",
        memory_gib=39.39,
        bf16_flops=312e12,
        hbm_bytes_per_s=1.555e12,
        interconnect_bytes_per_s=300e9,
        interconnect_latency_s=10e-6,
        arch="ampere",
        aliases=("A100-40GB", "a100-40gb-sxm", "A100-SXM4-40GB", "a100-40g"),
    ),
    GpuSpec(
        name="NVIDIA L40S",
        memory_gib=44.39,
        bf16_flops=362e12,
        hbm_bytes_per_s=864e9,
        interconnect_bytes_per_s=25e9,
        interconnect_latency_s=30e-6,
        arch="ada",
        aliases=("L40S", "l40s-48gb"),
    ),
    GpuSpec(
        name="NVIDIA L4",
        memory_gib=22.03,
        bf16_flops=121e12,
        hbm_bytes_per_s=300e9,
        interconnect_bytes_per_s=25e9,
        interconnect_latency_s=30e-6,
        arch="ada",
        aliases=("L4", "l4-24gb"),
    ),
    GpuSpec(
        name="NVIDIA A10G",
        memory_gib=21.99,
        bf16_flops=70e12,
        hbm_bytes_per_s=600e9,
        interconnect_bytes_per_s=25e9,
        interconnect_latency_s=30e-6,
        arch="ampere",
        aliases=("A10G", "a10g-24gb"),
    ),
    GpuSpec(
        name="NVIDIA H100 NVL",
        # nvidia-smi's 95,830 MiB (93.58 GiB) less the 0.47 GiB torch does not report on an H100 SXM
        # (81,559 MiB -> 79.18 GiB). Datasheet: 94 GB HBM3, 3.9 TB/s, 1,671 TFLOPS bf16 with sparsity
        # (835 dense) at NVL clocks, 350-400 W (the SXM's 700 W is not modelled as a difference).
        memory_gib=93.12,
        bf16_flops=835e12,
        hbm_bytes_per_s=3.9e12,
        interconnect_bytes_per_s=300e9,  # NVLink bridge between pairs (600 GB/s both directions)
        interconnect_latency_s=8e-6,
        arch="hopper",
        aliases=("H100-NVL", "h100-nvl-94gb"),
    ),
)


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def _index() -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for gpu in _CATALOG:
        for name in (gpu.name, *gpu.aliases):
            index[_key(name)] = gpu
    return index


def known_gpus() -> list[str]:
    """The short names of the catalog's GPUs."""
    return [gpu.short_name for gpu in _CATALOG]


def known_gpus_text() -> str:
    """The GPUs autotune knows, for --help."""
    return f"known GPUs: {', '.join(known_gpus())}"


def get_gpu(name: str | GpuSpec) -> GpuSpec:
    """A GPU by name or alias ("H100", "h100-80gb", "NVIDIA H100 80GB HBM3"); AutotuneError if unknown."""
    if isinstance(name, GpuSpec):
        return name
    gpu = _index().get(_key(name))
    if gpu is None:
        raise AutotuneError(f"unknown GPU {name!r}; known: {', '.join(known_gpus())}")
    return gpu
