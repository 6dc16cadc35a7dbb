"""Running the designed set: on one server that is already running (`--url`), or on the configs a
backend launches (`--backend vllm|docker`: vLLM's defaults, then another token budget and max_num_seqs,
and with two GPUs a TP=2 config), each config measured on its own server."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.backends.server_metrics import KvSampler
from autotune.calibrate.design import (
    SECOND_CONFIG_RUNS,
    ConfigUnderTest,
    designed_points,
    least_seconds,
    predicted_seconds,
    resolved_config,
    second_config_flags,
    sized,
)
from autotune.calibrate.measure import ServerInfo, measure_points, probe_server
from autotune.catalog.models import catalog_id, get_model
from autotune.core.config import EngineConfig
from autotune.core.errors import AutotuneError, RunFailure
from autotune.sim.calibration import Calibration

Progress = Callable[[str], None]
TP_CONFIG_RUNS = ("light-c1", "burst")
SHARES = (0.6, 0.3, 0.1)  # of the GPU time: vLLM's defaults, the second config, the TP config
# A peak of requests running below this share of what the load allowed says the server capped it:
# a burst's first short requests finish while the last are admitted, so a default server stays above.
RUNNING_SHORTFALL = 0.5
KV_FULL = 0.9  # a KV cache this full caps the running requests too: then the shortfall says nothing


@dataclass(frozen=True)
class Target:
    """What is calibrated: the model (a catalog name or a config.json), the GPU, the flags the server
    was started with (`--set`: for --url what autotune cannot read from the server)."""

    model: str | None
    gpu: str
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class Measured:
    """The measured points and what they cost, filled as each point is measured (what a failure or
    Ctrl-C leaves is kept)."""

    points: list[dict[str, Any]] = field(default_factory=list)
    gpu_seconds: float = 0.0  # the runs' (simulated on a time-scaled sim-server)
    startup_seconds: float = 0.0  # launching servers (backends only)
    notes: list[str] = field(default_factory=list)

    def add(self, point: dict[str, Any], gpu_seconds: float) -> None:
        """One measured point and its run's GPU seconds."""
        self.points.append(point)
        self.gpu_seconds += gpu_seconds


def catalog_model(target: Target, info: ServerInfo) -> str:
    """The model the simulator replays: --model, else the served one if the catalog knows it. A --model
    that is another catalog model than the served one is refused: every point would replay the wrong
    model (a served alias, or a config.json, is taken as --model says)."""
    served, given = catalog_id(info.model), catalog_id(target.model or info.model)
    if served and given and served != given:
        raise AutotuneError(
            f"--model {target.model}: the server at {info.shown} serves {info.model}, another model (drop "
            "--model to calibrate the served one)"
        )
    name = target.model or info.model
    try:
        get_model(name)
    except AutotuneError:
        raise AutotuneError(
            f"the server serves {info.model!r}, which the simulator's catalog does not know: pass --model "
            "(a catalog name or the model's config.json)"
        ) from None
    return name


def check_settings(settings: dict[str, Any], info: ServerInfo) -> None:
    """A --set the server's own report contradicts is refused in one line: the replays ran the server's
    value instead, silently (one equal to it is fine)."""
    reported = info.flags()
    for name, value in settings.items():
        if name in reported and reported[name] != value:
            raise AutotuneError(
                f"--set {name}={value}: the server at {info.shown} reports {name} {reported[name]} (drop "
                "the --set, or restart the server with it; nothing was measured)"
            )


def on_url(
    info: ServerInfo, target: Target, gpu_minutes: float, prior: Calibration, say: Progress, out: Measured
) -> None:
    """The designed set on the server `info` describes (probe_server: checked before anything runs),
    measured into `out`."""
    model = catalog_model(target, info)
    flags = {**target.settings, **info.flags()}
    max_len = info.max_model_len or get_model(model).max_position_embeddings
    say(
        f"server {info.shown}: {info.model} on {target.gpu}; flags {_flags(flags)} (from /v1/models, "
        "/metrics and --set; the rest: vLLM's defaults for the GPU)"
    )
    if info.time_scale != 1.0:
        say(
            f"the server's simulated clock runs {info.time_scale:g}x real time: times are put back on it, "
            f"and the HTTP path's own time (the client's and the server's CPU) counts {info.time_scale:g}x "
            "over on it: the fit takes it for the GPU's (keep the scale small: docs/simulator.md)"
        )
    config = ConfigUnderTest("server", flags, max_len)
    ((_, points),) = _planned([config], (1.0,), target, model, gpu_minutes, prior, (say, out.notes))
    sampled: dict[str, KvSampler] = {}
    measure_points(info, points, say, out.add, sampled)
    assumed = assumed_max_num_seqs(flags, model, target.gpu)
    fewer = fewer_running(points, sampled, assumed)
    if fewer is not None:
        say(f"warning: {fewer}")
        out.notes.append(fewer)
    if info.kv_tokens is None:
        out.notes.append(
            "the server's /metrics has no vllm:cache_config_info: the memory terms stay at their prior"
        )
    out.notes.append(
        "one config shows one token budget and max_num_seqs: --backend launches a second one to separate "
        "the memory terms and the chunked-prefill costs"
    )


def assumed_max_num_seqs(flags: dict[str, Any], model: str, gpu: str) -> int:
    """The max_num_seqs the replays assume: the flags', else vLLM's default for the GPU."""
    return int(resolved_config(flags, model, gpu).max_num_seqs or 0)


def fewer_running(points: list[dict[str, Any]], sampled: dict[str, KvSampler], assumed: int) -> str | None:
    """A warning when the server ran clearly fewer requests at once (vllm:num_requests_running, sampled
    during the runs) than the load and the assumed max_num_seqs allowed, its KV cache not full: it was
    started with another --max-num-seqs, which /metrics does not say. None when it did not, or no
    sample says."""
    peaks = [s.peak_running for s in sampled.values() if s.peak_running is not None]
    if not peaks or any((s.peak_kv or 0.0) >= KV_FULL for s in sampled.values()):
        return None
    serve = [p for p in points if p["kind"] == "serve"]
    allowed = max(min(assumed, p.get("concurrency") or p["requests"]) for p in serve)
    seen = max(peaks)
    if seen >= RUNNING_SHORTFALL * allowed:
        return None
    return (
        f"the server ran at most {seen} requests at once, below the max_num_seqs {assumed} assumed: was "
        f"it started with --max-num-seqs {seen}? pass --set max_num_seqs={seen} (and any other scheduler "
        "flag /metrics does not show): the fit replayed every run with the wrong one"
    )


def on_backend(
    backend: Any,
    target: Target,
    gpu_ids: Sequence[int],
    gpu_minutes: float,
    prior: Calibration,
    say: Progress,
    out: Measured,
) -> None:
    """The designed set on the configs the backend launches, one server each (stopped after), measured
    into `out`."""
    if target.model is None:
        raise AutotuneError("--backend needs --model: the model to launch")
    model = target.model
    max_len = int(target.settings.get("max_model_len") or get_model(model).max_position_embeddings)
    configs = [
        ConfigUnderTest("defaults", dict(target.settings), max_len),
        ConfigUnderTest(
            "budget",
            {**target.settings, **second_config_flags(target.settings, model, target.gpu)},
            max_len,
            SECOND_CONFIG_RUNS,
            chosen=True,
        ),
    ]
    if len(gpu_ids) >= 2:
        configs.append(
            ConfigUnderTest(
                "tp2", {**target.settings, "tensor_parallel_size": 2}, max_len, TP_CONFIG_RUNS, chosen=True
            )
        )
    # Sized before any launch: a config the prior predicts does not start is refused before GPU time is spent.
    designed = _planned(configs, SHARES, target, model, gpu_minutes, prior, (say, out.notes))
    for config, points in designed:
        tp = int(config.flags.get("tensor_parallel_size", 1))
        started = time.monotonic()
        say(f"launching config {config.label}: {_flags(config.flags) or 'vLLM defaults'}")
        with backend.session(
            EngineConfig(model=model).replace(**config.flags), list(gpu_ids)[:tp]
        ) as session:
            out.startup_seconds += time.monotonic() - started
            if not session.alive:
                failed = session.measure(None)
                raise RunFailure(f"config {config.label} did not start: {failed.failure}: {failed.message}")
            info = probe_server(session.base_url)
            flags = {**config.flags, **info.flags()}
            points = [{**p, "flags": flags} for p in points]
            measure_points(info, points, say, out.add)


def _planned(
    configs: Sequence[ConfigUnderTest],
    shares: Sequence[float],
    target: Target,
    model: str,
    gpu_minutes: float,
    prior: Calibration,
    said: tuple[Progress, list[str]],
) -> list[tuple[ConfigUnderTest, list[dict[str, Any]]]]:
    """The configs to run and their designed points, each sized to its least set plus its share of what
    --gpu-minutes leaves over (as `prior` predicts). Refused in one line, nothing measured, when the
    user's config is predicted not to start or the least sets need more than --gpu-minutes (it is a cap:
    GPU time is money); a config calibrate chose that is predicted not to start is skipped (`said`: the
    progress and the report's notes say so)."""
    kept, least, kept_shares = [], [], []
    for config, share in zip(configs, shares, strict=False):
        points = designed_points(model, target.gpu, [config])
        seconds = least_seconds(points, prior)
        if seconds <= 0 and not config.chosen:
            _refuse_not_starting(points)
        if seconds <= 0:
            _skip(config, target.gpu, said)
            continue
        kept.append((config, points))
        least.append(seconds)
        kept_shares.append(share)
    need = sum(least)
    if need > gpu_minutes * 60:
        floor = math.ceil(need / 6) / 10  # minutes, rounded up to a tenth
        raise AutotuneError(
            f"the designed set needs at least {floor:g} GPU-minutes here, as the prior calibration "
            f"predicts; --gpu-minutes {gpu_minutes:g} affords none of it: give --gpu-minutes {floor:g} or "
            "more (nothing was measured)"
        )
    spare = gpu_minutes * 60 - need
    return [
        (config, _sized(points, seconds + spare * share / sum(kept_shares), prior, said[0]))
        for (config, points), seconds, share in zip(kept, least, kept_shares, strict=True)
    ]


def _skip(config: ConfigUnderTest, gpu: str, said: tuple[Progress, list[str]]) -> None:
    """A config calibrate chose that the prior predicts does not start: said, noted, not run."""
    line = (
        f"config {config.label} ({_flags(config.flags)}), one calibrate chose, is skipped: the prior "
        f"calibration predicts it does not start on {gpu}; the constants it separates stay less pinned"
    )
    said[0](line)
    said[1].append(line)


def _refuse_not_starting(points: list[dict[str, Any]]) -> None:
    """Its runs would replay as failures whatever the constants: nothing measured there could be fitted."""
    first = points[0]
    raise AutotuneError(
        f"the prior calibration predicts that {first['model']} does not start on {first['gpu']} with "
        f"{_flags(first['flags']) or 'vLLM defaults'}: nothing measured there could be fitted (check "
        "--model, --gpu and --set; nothing was measured)"
    )


def _sized(
    points: list[dict[str, Any]], seconds: float, prior: Calibration, say: Progress
) -> list[dict[str, Any]]:
    out = sized(points, seconds, prior)
    predicted = sum(predicted_seconds(out, prior))
    runs = sum(p["kind"] == "serve" for p in out)
    say(f"designed set: {runs} runs, {predicted / 60:.1f} GPU-minutes as the prior calibration predicts")
    return out


def _flags(flags: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in flags.items())
