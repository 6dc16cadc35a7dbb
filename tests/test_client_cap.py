"""A request rate under a client concurrency cap: bench and run say when the cap held requests back
(the run is a closed loop, judged on no pace, and its TTFT leaves out the wait for a slot)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cli import main

CAPPED = """name: capped
num_requests: 200
load: fixed
request_rate: 40
max_concurrency: 4
prompt_len: {dist: fixed, mean: 1000}
output_len: {dist: fixed, mean: 250}
"""


@pytest.fixture
def capped(tmp_path: Path) -> str:
    path = tmp_path / "capped.yaml"
    path.write_text(CAPPED)
    return str(path)


def test_bench_says_the_cap_held_the_requests_back(capped: str, capsys: pytest.CaptureFixture[str]) -> None:
    """200 requests over 5 s, four at a time: served far slower than offered, the SLO passed and no
    keep-up verdict was given, nothing said so. A cap the load never reaches gets no note."""
    assert main(["bench", "--workload", capped, "--slo", "ttft_p99=2s"]) == 0
    out, err = capsys.readouterr()
    (note,) = [x for x in err.splitlines() if x.startswith("autotune bench: note: ")]
    assert "the client's concurrency cap (4) held the requests back: offered 40.00 req/s, served " in note
    assert "so the TTFT does not include the wait for a slot" in note
    served = float(note.split("served ")[1].split()[0])
    assert served < 0.5 * 40
    assert "Kept up with the load" not in out and "SLO ttft_p99=2s" in out
    assert main(["bench", "--workload", capped, "--concurrency", "200", "--rate", "2"]) == 0
    assert "note:" not in capsys.readouterr().err


def test_run_at_a_fixed_capped_load_says_so_at_start(
    capped: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its trials are closed loops: judged by their SLOs only, though they may fall behind the rate."""
    args = ["run", "--space", "small", "--n-trials", "1", "--quiet", "--workload", capped]
    assert main([*args, "--runs-dir", str(tmp_path / "runs")]) == 0
    err = capsys.readouterr().err
    assert "autotune: max_concurrency 4 caps the client: a trial serving under the offered 40.00 req/s" in err
