"""The progress display: elapsed time, every running trial on its own line, its capacity probe."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from autotune.trial.live import read_probe, write_probe
from autotune.tune.progress import Progress, ProgressState, clock, render, render_lines


def state(**changes: object) -> ProgressState:
    base = ProgressState(done=3, total=10, feasible=2, best=4210.0, baseline=4000.0, elapsed_s=725.0)
    running = [(i, {"max_num_seqs": 64 * i, "enable_chunked_prefill": True}) for i in (4, 5, 6)]
    base.running = running  # type: ignore[assignment]
    base.running_since = {4: 301.0, 5: 65.0, 6: 2.0}
    base.probes = {4: "probe 3/8 at 12 req/s"}
    for key, value in changes.items():
        setattr(base, key, value)
    return base


def test_every_running_trial_gets_a_line_with_its_time_and_probe() -> None:
    lines = render_lines(state(), width=200)
    assert "12m05s" in lines[0] and "3/10" in lines[0]
    assert lines[1:] == [
        "  running #4 5m01s probe 3/8 at 12 req/s seqs=256 chunked=on",
        "  running #5 1m05s seqs=320 chunked=on",
        "  running #6 2 s seqs=384 chunked=on",
    ]
    plain = render(state(), bar=False)  # logs (no TTY): one line, every running trial in it
    assert "#4 5m01s probe 3/8" in plain and "#6 2 s" in plain
    assert clock(7384) == "2h03m"


def test_the_tty_display_redraws_all_its_lines_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "121")  # the display fits the terminal's width: one known here
    stream = io.StringIO()
    progress = Progress(stream, tty=True)
    progress.show(state())
    progress.show(state(running=[]))
    written = stream.getvalue()
    # the second draw moved the cursor up over the 4 lines of the first one and cleared to the end
    assert "\x1b[3F\r\x1b[J" in written
    assert written.rstrip().endswith(render(state(running=[]), width=len(render(state(running=[]))) + 5))


def test_probe_file_round_trip(tmp_path: Path) -> None:
    assert read_probe(tmp_path) == "" and read_probe(None) == ""
    write_probe(tmp_path / "7", probe=2, max_probes=8, rate=24.0)
    assert read_probe(tmp_path / "7") == "probe 2/8 at 24 req/s"
