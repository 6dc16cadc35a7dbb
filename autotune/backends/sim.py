"""SimBackend: evaluates a config on the simulated vLLM engine, in process, with a virtual clock.

GPU time is simulated too, so the tuner can account for it like a real trial: `startup_s` models
`vllm serve` coming up (process and engine init, weight loading, the profile run, CUDA-graph capture
growing with the number of captured sizes; a config that fails stops at the phase that fails) and
`benchmark_s` is the simulated duration of the load. In a session the startup is paid once: only the
first measurement's result carries it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path

from autotune.backends.base import Backend, Workload
from autotune.backends.server_load import TrialLimits
from autotune.catalog.gpus import GIB, get_gpu
from autotune.catalog.models import get_model
from autotune.core.config import EngineConfig
from autotune.core.errors import EngineStartupError, FailureKind
from autotune.measure.early_abort import replay_abort_time
from autotune.measure.result import TrialResult, requests_failed_message
from autotune.measure.server_report import EngineFacts, ServerReport
from autotune.measure.slo import Slo
from autotune.measure.steady_state import load_kind, measure_window
from autotune.sim.calibration import DEFAULT_CALIBRATION, Calibration
from autotune.sim.engine import SimEngine
from autotune.sim.flags import enforce_eager
from autotune.sim.memory import MemoryPlan
from autotune.sim.noise import NoiseModel, StepNoise
from autotune.sim.replay import SimRun, simulate

_BENCHMARK_LIMIT_S = TrialLimits().benchmark_timeout_s


def startup_seconds(cal: Calibration, load_s: float, graphs: int, failure: FailureKind | None) -> float:
    """Simulated `vllm serve` startup (the Calibration's init_s, load_s_per_gib, profile_s,
    graph_capture_s and failed_capture_s, from typical logs on a warm compile cache); a config that
    fails stops at the phase that fails: validation halfway through init, KV sizing after the profile
    run, OOM into CUDA-graph capture."""
    if failure is None:
        return cal.init_s + load_s + cal.profile_s + graphs * cal.graph_capture_s
    if failure == FailureKind.INVALID_CONFIG:
        return cal.init_s / 2
    if failure == FailureKind.KV_CACHE_OOM:
        return cal.init_s + load_s + cal.profile_s
    if failure == FailureKind.STARTUP_OOM:
        return cal.init_s + load_s + cal.profile_s + cal.failed_capture_s
    return cal.init_s


class SimBackend(Backend):
    """The simulated engine as a Backend (picklable: it holds the GPU name, the noise model and the
    calibration, all plain records)."""

    def __init__(
        self,
        gpu: str = "H100",
        noise: NoiseModel = NoiseModel(),  # noqa: B008 (frozen)
        calibration: Calibration = DEFAULT_CALIBRATION,
    ) -> None:
        get_gpu(gpu)  # fail fast on an unknown GPU
        self.gpu = gpu
        self.noise = noise
        self.calibration = calibration

    @property
    def simulated(self) -> bool:
        """Always: this backend is the simulator."""
        return True

    @property
    def runs_servers(self) -> bool:
        """Never: the simulation runs inside the task."""
        return False

    @property
    def noisy(self) -> bool:
        """Only with a noise model: otherwise a config measures the same every time."""
        return self.noise.enabled

    def session(
        self, config: EngineConfig, gpu_ids: Sequence[int] = (), trial_dir: Path | None = None
    ) -> AbstractContextManager[SimSession]:
        """A simulated server for `config`: validated and memory-planned once (nothing to stop)."""
        return contextlib.nullcontext(SimSession(config, self.gpu, self.noise, self.calibration))


class SimSession:
    """A simulated `vllm serve` that started (or failed to) for one config.

    Each measurement simulates on a fresh engine, which is what an idle server is to a load whose
    prompts share nothing with earlier ones (the real path salts its prompts for exactly that).
    """

    def __init__(
        self,
        config: EngineConfig,
        gpu_name: str,
        noise: NoiseModel = NoiseModel(),  # noqa: B008
        calibration: Calibration = DEFAULT_CALIBRATION,
    ) -> None:
        self.config = config
        self._gpu = get_gpu(gpu_name)
        self._noise_model = noise
        self._calibration = cal = calibration
        self._noise: StepNoise | None = None  # drawn at the first measurement, from its seed
        model = get_model(config.model)
        gpu = self._gpu
        resolved = config.with_vllm_defaults(gpu.memory_gib, gpu.name, model.max_position_embeddings)
        load_s = model.weight_bytes(config.tensor_parallel_size) / GIB * cal.load_s_per_gib
        self._failure: TrialResult | None = None
        try:
            memory = SimEngine(config, self._gpu, calibration=cal).memory
        except EngineStartupError as exc:
            kind = FailureKind(exc.kind)
            log = _log_lines(resolved, self._gpu.name, None) + [
                "ERROR [core.py] EngineCore failed to start.",
                exc.log_line(),
            ]
            self._failure = TrialResult(
                config=config,
                failure=kind,
                message=str(exc),
                log_tail="\n".join(log),
                server=ServerReport(resolved=resolved.params()),
            )
            self._startup_s = startup_seconds(cal, load_s, 0, kind)
            return
        self._resolved = resolved
        self._log_tail = "\n".join(_log_lines(resolved, self._gpu.name, memory))
        self._startup_s = startup_seconds(cal, load_s, memory.num_cuda_graphs, None)

    @property
    def alive(self) -> bool:
        """False when the config failed to start."""
        return self._failure is None

    def measure(self, workload: Workload, slos: Sequence[Slo] = (), seed: int = 0) -> TrialResult:
        """Simulate `workload` (the startup failure instead, if any); only the first result has startup_s."""
        startup_s, self._startup_s = self._startup_s, 0.0
        if self._failure is not None:
            return dataclasses.replace(self._failure, startup_s=startup_s)
        requests = workload.requests(seed)
        if self._noise is None:
            self._noise = self._noise_model.session(seed, str(self.config))
        run = simulate(
            self.config,
            self._gpu,
            requests,
            workload.max_concurrency,
            self._noise,
            calibration=self._calibration,
        )
        measure_from = workload.measure_from
        measured = [(rec, req.output_len) for rec, req in zip(run.records, requests, strict=True)]
        measured = [(rec, n) for rec, n in measured if rec.start_time >= measure_from]
        # The sim has the whole run anyway; GPU time is charged as the real path would spend it:
        # until early abort would stop the load (its metrics stay whole: the SLO verdict is the same).
        abort_s = replay_abort_time(slos, [rec for rec, _ in measured], [n for _, n in measured])
        spent_s = run.duration if abort_s is None else min(abort_s, run.duration)
        server = {
            "num_preemptions": run.stats.num_preemptions,
            "num_gpu_blocks": run.memory.num_gpu_blocks,
            "kv_cache_tokens": run.memory.kv_cache_tokens,
            "peak_kv_cache_usage": run.stats.peak_kv_cache_usage,
        }
        if run.stats.prefix_cache_queries:  # as a real server's /metrics gives it (server_metrics.py)
            server["prefix_cache_hit_rate"] = run.stats.prefix_cache_hits / run.stats.prefix_cache_queries
        benchmark, load = measure_window(
            run.records,
            run.duration,
            measure_from,
            slos,
            server,
            load_kind(requests, workload.max_concurrency),
        )
        failed = [r for r in run.records if not r.success]
        return TrialResult(
            config=self.config,
            benchmark=benchmark,
            # vLLM answers a request it cannot serve (longer than max_model_len) with an error: such a
            # run is never feasible, whatever the metrics of the requests that did run say.
            failure=FailureKind.REQUESTS_FAILED if failed else None,
            message=requests_failed_message(failed, len(run.records)) if failed else "",
            log_tail=self._log_tail,
            startup_s=startup_s,
            benchmark_s=spent_s,
            # A real run stops at its benchmark time limit: an abort cannot spare more than that.
            saved_s=max(0.0, min(run.duration, _BENCHMARK_LIMIT_S) - spent_s),
            server=_report(self._resolved, run),
            load=load,
        )


def _report(resolved: EngineConfig, run: SimRun) -> ServerReport:
    """What the simulated server reports: its resolved flags and the engine's figures."""
    stats = run.stats
    engine = EngineFacts(
        num_gpu_blocks=run.memory.num_gpu_blocks,
        kv_cache_tokens=run.memory.kv_cache_tokens,
        num_preemptions=stats.num_preemptions,
        peak_kv_cache_usage=stats.peak_kv_cache_usage,
        prefix_cache_hit_rate=stats.prefix_cache_hits / max(stats.prefix_cache_queries, 1),
        num_steps=run.num_steps,
    )
    return ServerReport(resolved=resolved.params(), engine=engine)


def _log_lines(config: EngineConfig, gpu_name: str, memory: MemoryPlan | None) -> list[str]:
    """A vLLM-like startup log (the lines a user looks for)."""
    lines = [
        f"INFO [core.py] Initializing a V1 LLM engine (simulated on {gpu_name}) with config: "
        f"model='{config.model}', max_seq_len={config.max_model_len}, "
        f"tensor_parallel_size={config.tensor_parallel_size}, kv_cache_dtype={config.kv_cache_dtype}, "
        f"enable_prefix_caching={config.enable_prefix_caching}, "
        f"chunked_prefill_enabled={config.enable_chunked_prefill}, max_num_seqs={config.max_num_seqs}, "
        f"max_num_batched_tokens={config.max_num_batched_tokens}, block_size={config.block_size}, "
        f"gpu_memory_utilization={config.gpu_memory_utilization}, enforce_eager={enforce_eager(config)}",
    ]
    if memory is None:
        return lines
    assert config.max_model_len is not None
    lines += [
        f"INFO [gpu_model_runner.py] Model loading took {memory.weights_bytes / GIB:.4f} GiB",
        f"INFO [gpu_worker.py] Available KV cache memory: {memory.kv_available_bytes / GIB:.2f} GiB",
        f"INFO [kv_cache_utils.py] GPU KV cache size: {memory.kv_cache_tokens:,} tokens",
        f"INFO [kv_cache_utils.py] Maximum concurrency for {config.max_model_len:,} tokens per request: "
        f"{memory.concurrency_for(config.max_model_len):.2f}x",
    ]
    if memory.num_cuda_graphs:  # none captured with --enforce-eager
        took = memory.cuda_graph_bytes / GIB
        lines.append(f"INFO [gpu_model_runner.py] Graph capturing finished, took {took:.2f} GiB")
    return lines
