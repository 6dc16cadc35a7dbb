"""What the figures' legends say: each group counts the points it draws, every SLO limit line drawn is
named, and guide.png's band says which resolution it is."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_study import OBJECTIVES, build_run, ok

from autotune.outputs.guide_view import plot_guide
from autotune.outputs.outcome import outcome
from autotune.outputs.plots import _pyplot, plot_pairs
from autotune.tune.study import records

MAXIMIZE = [o.maximize for o in OBJECTIVES.objectives]


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The figures the plots close once saved, kept open to read (closed at the test's end)."""
    plt = _pyplot()
    close, kept = plt.close, []
    monkeypatch.setattr(plt, "close", kept.append)
    yield kept
    for fig in kept:
        close(fig)


def _legend(ax: Any) -> dict[str, Any]:
    """An axes' legend entries: label -> what it labels."""
    legend = ax.get_legend()
    return {t.get_text(): h for t, h in zip(legend.get_texts(), legend.legend_handles, strict=True)}


def test_the_pareto_legend_counts_the_dots_it_draws_and_names_each_slo_line(
    tmp_path: Path, figures: list[Any]
) -> None:
    """Two front points (diamonds) and one feasible point off it (a dot): "feasible (1)", not (3). With
    a TTFT and an ITL limit, their lines are on different panels: the legend names both."""
    trials = [
        ({"max_num_seqs": 1024, "baseline": True}, ok(4000, 1500, 20)),  # on the front
        ({"max_num_seqs": 256}, ok(4800, 1700, 25)),  # on the front
        ({"max_num_seqs": 64}, ok(3000, 1600, 30)),  # feasible, dominated by the defaults
        ({"max_num_seqs": 8}, ok(5000, 2500, 20)),  # over ttft_p99=2s
    ]
    out = outcome(
        records(build_run(tmp_path, trials)), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s", "itl_p99=50ms"]
    )
    plot_pairs(tmp_path / "pareto.png", out)
    (fig,) = figures
    entries = _legend(fig.axes[0])
    assert "feasible (1)" in entries and "Pareto front (feasible) (2)" in entries
    dots = next(c for c in fig.axes[0].collections if c.get_label() == "feasible (1)")
    assert len(dots.get_offsets()) == 1  # the count is what is drawn
    assert {"SLO p99_ttft_ms", "SLO p99_itl_ms"} <= set(entries)


def test_the_guide_plots_band_names_the_capacity_searchs_target_not_a_trials_resolution(
    tmp_path: Path, figures: list[Any]
) -> None:
    """The report states the recommendation's own resolution (say 2.8 %), which guide.json does not hold:
    the band is the capacity search's 3 % target, and says so rather than "the resolution"."""
    rows = [
        {"trial": 0, "predicted": 611.5, "raw": 600.0, "measured": 620.0, "gpu_hours": 1.9},
        {"trial": 2, "predicted": 274.2, "raw": 250.0, "measured": 242.3, "gpu_hours": 1.6},
    ]
    plot_guide(tmp_path / "guide.png", {"trials": rows}, "output_throughput")
    (fig,) = figures
    band = [label for label in _legend(fig.axes[1]) if label.startswith("within")]
    assert band == ["within ±3% (the capacity search's target resolution)"]


def test_the_guides_error_text_reads_as_its_plot_does() -> None:
    """guide.png plots measured / predicted - 1 (below 0: the guide predicted too much); the report's
    sentence beside it said "+53.4 %" (|log| error, predicted over measured) of points plotted at -35 %."""
    from autotune.outputs.guide_view import error_text

    rows = [
        {"trial": t, "predicted": 101.0, "raw": 153.4, "measured": measured}
        for t, measured in enumerate((99.0, 100.0, 100.0))
    ]
    text = error_text(rows)
    assert "when each trial was chosen: median -1.0% (size 1.0%)" in text
    assert "raw prediction: median -34.8% (size 34.8%)" in text
