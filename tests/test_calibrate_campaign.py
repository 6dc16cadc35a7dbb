"""`autotune calibrate --url` as a campaign on a real sim-server: what a rerun, a failure or an
interrupt leaves (tests/test_calibration.py has the fit's recovery over HTTP)."""

from __future__ import annotations

import pytest

from autotune.calibrate.measure import measure_points, probe_server
from autotune.sim_server.server import start_sim_server

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def test_a_second_campaign_on_one_server_misses_the_first_ones_prefix_cache() -> None:
    """A rerun (after an interrupted calibrate, say) sends other prompts: the server's prefix cache
    must not serve the second campaign's long prompts from the first's (TTFT 123 -> 21 ms did)."""
    point = {"id": "p", "kind": "serve", "model": LLAMA_8B, "gpu": "H100", "flags": {"max_model_len": 4096}}
    point.update(requests=3, prompt=3072, output=4, concurrency=1, measured={"mean_ttft_ms": 0.0})
    with start_sim_server([LLAMA_8B, "--max-model-len", "4096", "--time-scale", "4"]) as server:
        info = probe_server(server.base_url)
        first = measure_points(info, [point])[0][0]["measured"]["mean_ttft_ms"]
        second = measure_points(info, [point])[0][0]["measured"]["mean_ttft_ms"]
    assert second == pytest.approx(first, rel=0.25)
