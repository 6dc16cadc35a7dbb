"""The recommendation is marked wherever the front is listed, also when it is not on the front."""

from __future__ import annotations

import re
from pathlib import Path

from test_recommendation import capacity
from test_study import build_run

from autotune.outputs import report
from autotune.outputs.outcome import outcome
from autotune.tune.objectives import load_objectives
from autotune.tune.study import records


def test_kept_defaults_off_the_front_are_listed_with_it_and_marked(tmp_path: Path) -> None:
    """Throughput alone: #1's 1.2 % over the defaults is within their 3 % brackets, so the defaults are
    kept, yet #1 dominates them and is the whole front. The summary's table and report.html's list the
    defaults after the front, marked, and say they are kept, not on it (they were left out of
    report.html's, and listed unmarked as "baseline (feasible)" in the summary's)."""
    objectives = load_objectives("throughput")
    study = build_run(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, capacity(5000, 0.03)),
            ({"max_num_seqs": 828}, capacity(5060, 0.03)),
        ],
        objectives,
    )
    out = outcome(records(study), objectives.names, [True], [])
    assert out.best is not None and out.best.number == 0 and [r.number for r in out.front] == [1]

    lines = report.front_table(out).splitlines()
    assert lines[1].split()[:2] == ["trial", "output_throughput"] and lines[2].split()[0] == "#1"
    note, *kept = lines[3:]
    assert note == (
        "Recommended, not on the front: trial #0 (vLLM's defaults), kept because no config found beats it "
        "by more than the measurement's margin:"
    )
    assert len(kept) == 1 and kept[0].startswith("*  #0") and "baseline (kept)" in kept[0], lines

    report.write_all(tmp_path, out)
    page = (tmp_path / "report.html").read_text()
    section = page[page.index("<h2>Feasible Pareto front") : page.index("<h2>Failures")]
    rows = re.findall(r"<tr class='(\w*)'>(.*?)</tr>", section)
    assert [(css, re.findall(r"<td[^>]*>([^<]*)</td>", cells)[:2]) for css, cells in rows] == [
        ("", ["", "#1"]),
        ("rec", ["★", "#0 (vLLM&#x27;s defaults)"]),
    ]
    assert "The last row: recommended, not on the front: trial #0 (vLLM&#x27;s defaults), kept" in section
