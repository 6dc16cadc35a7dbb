"""Startup screening: configs the memory model predicts will fail to start are not launched.

Before a trial is launched, the simulator's startup memory model (sim/memory.py, the one the simulated
engine uses) predicts whether vLLM would come up with the config on this GPU. A config predicted to die
of a startup-memory failure is told to the study as a violation with the predicted vLLM message, and
costs no GPU time. The model is an estimate, so only clear failures are screened (`kv_fraction`,
`capture_factor`; why these margins: docs/measurement.md, "Failed and screened configs").
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from autotune.catalog.gpus import GIB, GpuSpec, get_gpu
from autotune.catalog.models import ModelSpec, get_model
from autotune.core.config import PARALLEL_SIZES, EngineConfig
from autotune.core.errors import AutotuneError, EngineStartupError, FailureKind
from autotune.measure.result import TrialResult
from autotune.sim.calibration import DEFAULT_CALIBRATION, Calibration
from autotune.sim.memory import MemoryPlan, least_budget_bytes, plan_memory, validate_config
from autotune.tune.space import SearchSpace, violations

PREFIX = "predicted by the memory model: "
# the flags whose smallest value needs the least memory to start (the KV of one request, activations)
_LEAN_AT_LEAST = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size")
# A device large enough for any config: the memory plan on it gives a config's needs (weights,
# activations, KV bytes per token, CUDA graphs, sampler), which do not depend on the device's size.
_ROOMY_GIB = 1e6
_ROOMY_UTILIZATION = 0.5


@dataclass(frozen=True)
class Margins:
    """How clear a predicted startup failure must be to be screened (see the module docstring)."""

    kv_fraction: float = 0.05  # KV shortfall beyond this fraction of the GPU's memory
    capture_factor: float = 1.25  # graphs + sampler warm-up beyond this multiple of the memory left


DEFAULT_MARGINS = Margins()


@dataclass(frozen=True)
class Screening:
    """A config predicted to fail to start: vLLM's failure kind and message, as the model predicts them."""

    kind: FailureKind
    vllm_message: str

    @property
    def message(self) -> str:
        """The reason stored on the trial."""
        return PREFIX + self.vllm_message

    def result(self, config: EngineConfig) -> TrialResult:
        """The trial's outcome: the predicted failure, with no GPU time spent."""
        return TrialResult(config=config, failure=self.kind, message=self.message)


class MemoryScreen:
    """Predicts startup-memory failures of configs of one model on one GPU type (with the memory model's
    constants of `calibration`)."""

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        margins: Margins = DEFAULT_MARGINS,
        calibration: Calibration = DEFAULT_CALIBRATION,
    ) -> None:
        self.model = model
        self.gpu = gpu
        self.margins = margins
        self.calibration = calibration

    def check(self, config: EngineConfig) -> Screening | None:
        """The predicted failure if `config` clearly fails to start on this GPU, else None (launch it)."""
        resolved = config.with_vllm_defaults(
            self.gpu.memory_gib, self.gpu.name, self.model.max_position_embeddings
        )
        try:
            validate_config(resolved, self.model)
        except EngineStartupError:
            return None  # an invalid flag, not memory: the validity rules or vLLM itself report it
        try:
            plan_memory(resolved, self.model, self.gpu, self.calibration)
        except EngineStartupError as exc:
            if self._clear_failure(resolved):
                return Screening(kind=FailureKind(exc.kind), vllm_message=str(exc))
        return None

    def _clear_failure(self, resolved: EngineConfig) -> bool:
        """Whether the predicted failure stays a failure within the margins."""
        try:
            needs = self._needs(resolved)
        except EngineStartupError:
            return True  # it does not start even on the roomy GPU: no margin saves it
        total = self.gpu.memory_bytes
        requested = int(total * resolved.gpu_memory_utilization)
        free = total - int(self.gpu.cuda_context_gib * GIB)
        kv_available = requested - needs.weights_bytes - needs.non_torch_bytes - needs.activation_bytes
        assert resolved.max_model_len is not None
        blocks = -(-resolved.max_model_len // resolved.block_size)
        kv_needed = blocks * resolved.block_size * needs.kv_bytes_per_token
        kv_short = kv_needed - kv_available > self.margins.kv_fraction * total
        capture = needs.cuda_graph_bytes + needs.sampler_bytes
        capture_short = capture > self.margins.capture_factor * (free - requested)
        return kv_short or capture_short

    def _needs(self, resolved: EngineConfig) -> MemoryPlan:
        roomy = dataclasses.replace(self.gpu, memory_gib=_ROOMY_GIB)
        roomy_config = resolved.replace(gpu_memory_utilization=_ROOMY_UTILIZATION)
        return plan_memory(roomy_config, self.model, roomy, self.calibration)


def make_screen(
    model: str,
    gpu: str,
    margins: Margins = DEFAULT_MARGINS,
    calibration: Calibration = DEFAULT_CALIBRATION,
) -> MemoryScreen | None:
    """The screen for a model and GPU type, or None when either is outside the catalogs (no screening)."""
    try:
        return MemoryScreen(get_model(model), get_gpu(gpu), margins, calibration)
    except AutotuneError:
        return None


def describe(screen: MemoryScreen | None, enabled: bool = True) -> str:
    """One line for the run header: whether and how configs are screened before launch."""
    if not enabled:
        return "startup screening off (--no-screen)"
    if screen is None:
        return "startup screening skipped: the model or GPU is not in the simulator's catalogs"
    m = screen.margins
    return (
        f"startup screening on: configs the memory model predicts to fail to start are not launched "
        f"(margins: KV {m.kv_fraction:.0%} of GPU memory, CUDA graphs {m.capture_factor:.0%})"
    )


def check_tensor_parallel(space: SearchSpace, calibration: Calibration = DEFAULT_CALIBRATION) -> None:
    """Every TP of the space must divide the model's heads, and the leanest config must start at the
    largest TP (required_tp): one clear AutotuneError, not N startup failures."""
    tps = _parallel_values(space, "tensor_parallel_size")
    problem = indivisible_tp(space.model, tps)
    if problem is not None:
        raise AutotuneError(f"{space.model}: {problem}")
    largest = max(tps)
    needed = required_tp(space, largest, calibration)
    if needed is not None:
        where = (
            f"one {space.gpu}" if largest == 1 else f"{largest} {space.gpu}s (tensor_parallel_size {largest})"
        )
        # the shipped tp space goes up to 4: past that, or already on a TP space, the space must grow
        fix = (
            "e.g. --space tp"
            if largest == 1 and needed <= 4
            else "add it to the space's tensor_parallel_size"
        )
        raise AutotuneError(
            f"{space.model} does not fit on {where} with the KV cache of one max_model_len request: "
            f"use tensor parallelism (TP >= {needed}), {fix}"
        )


def check_model_len(space: SearchSpace, max_position_embeddings: int | None) -> None:
    """A max_model_len past the model's context fails vLLM's startup check whatever the other flags: a
    space whose every value does is one clear AutotuneError, not N invalid_config trials (None: the
    context is unknown, vLLM checks)."""
    values = space.flag_values().get("max_model_len")
    if max_position_embeddings is None or not values or min(values) <= max_position_embeddings:
        return
    raise AutotuneError(
        f"max_model_len {_span([int(v) for v in values])} is more than {space.model}'s context "
        f"(max_position_embeddings {max_position_embeddings}): vLLM refuses to start every config of the "
        f"space; lower max_model_len to {max_position_embeddings} or less"
    )


# The scheduler rules' most lenient value of each flag they read: a config breaking a rule there breaks
# it everywhere in the space (each rule asks for a larger budget, fewer sequences, chunked prefill on or
# a shorter max_model_len).
LENIENT = {
    "max_num_batched_tokens": max,
    "max_num_seqs": min,
    "enable_chunked_prefill": max,
    "max_model_len": min,
}


def check_rules(space: SearchSpace, max_position_embeddings: int | None) -> None:
    """A space whose every config breaks one of vLLM's scheduler rules (`violations`) is one clear
    AutotuneError, not a run whose every suggestion is rejected before launch: its most lenient corner
    (LENIENT) breaks it."""
    values = space.flag_values()
    corner = {name: pick(values[name]) for name, pick in LENIENT.items() if name in values}
    broken = violations(space.config(corner), max_position_embeddings)
    if broken:
        raise AutotuneError(f"every config of the space breaks vLLM's rule: {broken[0]}")


def check_gpu_count(space: SearchSpace, gpus: int) -> str | None:
    """With --gpus N: refuse (one AutotuneError) a space none of whose configs fits on N GPUs, rather than
    reject every suggestion; when only some do, a note (the tuner rejects the others before launch)."""
    sizes = {name: _parallel_values(space, name) for name in PARALLEL_SIZES}
    needs = sorted({math.prod(combo) for combo in itertools.product(*sizes.values())})
    if needs[-1] <= gpus:
        return None
    shown = {name: values for name, values in sizes.items() if name in space.names or max(values) > 1}
    text = " x ".join(f"{name} {_span(values)}" for name, values in shown.items())
    if needs[0] > gpus:
        raise AutotuneError(f"{text} needs {_span(needs)} GPUs; --gpus gives {gpus}")
    return f"{text} needs {_span(needs)} GPUs; --gpus gives {gpus}: configs needing more are not launched"


def _parallel_values(space: SearchSpace, name: str) -> list[int]:
    """The values parallel size `name` takes in the space, in the space's order (1 when unset)."""
    param = next((p for p in space.params if p.name == name), None)
    if param is not None:
        return [int(v) for v in param.grid_values()]
    return [int(space.fixed.get(name) or 1)]


def _span(values: Sequence[int]) -> str:
    """The values as a span, lowest to highest ("2..4"), or the one value ("2")."""
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}..{high}"


def indivisible_tp(model: str, tps: Iterable[int]) -> str | None:
    """vLLM's startup error for the first TP that does not divide the model's attention heads (every
    config with it fails), or None when all do or the model is outside the catalogs."""
    try:
        heads = get_model(model).num_attention_heads
    except AutotuneError:
        return None
    tp = next((tp for tp in tps if heads % tp), None)
    if tp is None:
        return None
    return (
        f"tensor_parallel_size {tp}: Total number of attention heads ({heads}) must be divisible by tensor "
        f"parallel size ({tp})."
    )


def required_tp(
    space: SearchSpace, max_tp: int, calibration: Calibration = DEFAULT_CALIBRATION
) -> int | None:
    """The smallest power-of-two tensor parallelism at which the space's leanest config could start, when
    the space's largest TP (`max_tp`) is below it; None when it fits or the model or GPU is unknown.

    A config starts only if its gpu_memory_utilization budget holds its weights, non-torch memory,
    activations and the KV cache of one max_model_len request (sim/memory.py, least_budget_bytes); when
    the leanest config's does not, no config's does: the run says so once instead of N startup failures.
    """
    try:
        model, gpu = get_model(space.model), get_gpu(space.gpu)
        lean = _leanest_config(space, model, gpu)
        free = gpu.memory_bytes - int(gpu.cuda_context_gib * GIB)  # a budget past it is refused at startup
        room = min(int(gpu.memory_bytes * lean.gpu_memory_utilization), free)

        def fits(tp: int) -> bool:
            return least_budget_bytes(lean.replace(tensor_parallel_size=tp), model, calibration) <= room

        if fits(max(1, max_tp)):
            return None
    except (AutotuneError, EngineStartupError):  # unknown model or GPU, an invalid flag: not decided here
        return None
    tp = 1
    while not fits(tp) and tp < 64:
        tp *= 2
    return tp


def _leanest_config(space: SearchSpace, model: ModelSpec, gpu: GpuSpec) -> EngineConfig:
    """The space's config needing the least memory to start, resolved as vLLM would: the smallest budget,
    max_num_seqs, max_model_len and block size, a compact KV dtype if the space has one, the highest
    gpu_memory_utilization, and chunked prefill on (an unset budget then defaults lowest)."""
    values = space.flag_values()
    lean = {name: min(values[name]) for name in _LEAN_AT_LEAST if name in values}
    if "gpu_memory_utilization" in values:
        lean["gpu_memory_utilization"] = max(values["gpu_memory_utilization"])
    compact = [dtype for dtype in values.get("kv_cache_dtype", []) if dtype != "auto"]
    if compact:
        lean["kv_cache_dtype"] = compact[0]
    config = space.config({}).replace(**lean, enable_chunked_prefill=True)
    return config.with_vllm_defaults(gpu.memory_gib, gpu.name, model.max_position_embeddings)
