"""Benchmark an OpenAI-compatible server that is already running (`autotune bench --url`), as
`vllm bench serve --base-url` does: nothing is launched or stopped.

The load is the same as a trial's (token-id prompts, exact output lengths, timings as vllm bench serve
takes them, server figures from two /metrics scrapes), so a deployment can be checked against the
recommendation it came from. No early abort: every request of the workload is measured.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from autotune.backends.base import Workload
from autotune.core.config import EngineConfig
from autotune.core.errors import AutotuneError, FailureKind, one_line
from autotune.core.secrets import masked
from autotune.measure.result import TrialResult
from autotune.measure.slo import Slo, goodput_bounds

REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RemoteServer:
    """An OpenAI-compatible server at `base_url` (e.g. http://10.0.0.5:8000)."""

    base_url: str

    def served_model(self) -> str:
        """The first model id of /v1/models; AutotuneError when the server does not answer."""
        where = masked(self.base_url)
        try:
            response = httpx.get(self.base_url.rstrip("/") + "/v1/models", timeout=10.0)
            if response.is_error:
                raise AutotuneError(
                    f"no OpenAI-compatible server at {where}: GET /v1/models answered "
                    f"{response.status_code} {response.reason_phrase}"
                )
            data = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise AutotuneError(f"no OpenAI-compatible server at {where}: {one_line(exc)}") from None
        models = data.get("data") if isinstance(data, dict) else None
        if not isinstance(models, list) or not all(isinstance(m, dict) and "id" in m for m in models):
            raise AutotuneError(f"no OpenAI-compatible server at {where}: /v1/models is not a model list")
        if not models:
            raise AutotuneError(f"{where}/v1/models lists no model; pass --model")
        return str(models[0]["id"])

    def measure(
        self, config: EngineConfig, workload: Workload, slos: Sequence[Slo] = (), seed: int = 0
    ) -> TrialResult:
        """One warm-up request, then the workload; the failure is the result when the server fails."""
        from autotune.backends.server_load import warmup_request
        from autotune.backends.server_metrics import scrape_metrics, server_figures
        from autotune.measure.loadgen import run_load
        from autotune.measure.metrics import compute_metrics

        url = self.base_url.rstrip("/")
        warmup = asyncio.run(run_load(url, config.model, [warmup_request()]))
        if not warmup.records or not warmup.records[0].success:
            error = warmup.records[0].error if warmup.records else "no answer"
            return TrialResult(
                config=config, failure=FailureKind.ERROR, message=f"warm-up request failed: {error}"
            )
        before = scrape_metrics(url)
        load = asyncio.run(
            run_load(
                url,
                config.model,
                workload.requests(seed),
                max_concurrency=workload.max_concurrency,
                request_timeout_s=REQUEST_TIMEOUT_S,
            )
        )
        server = server_figures(before, scrape_metrics(url), None)
        metrics = compute_metrics(load.records, load.duration, goodput_bounds(slos), server=server)
        failed = [r for r in load.records if not r.success]
        if failed and not metrics.completed:
            return TrialResult(
                config=config,
                benchmark=metrics,
                failure=FailureKind.ERROR,
                message=f"all {len(failed)} requests failed: {failed[0].error}",
            )
        return TrialResult(config=config, benchmark=metrics, benchmark_s=load.duration)
