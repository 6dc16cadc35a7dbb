"""What a run leaves: results files, report.html, plots, costs, exports and the dashboard; and the
estimate of a real-GPU run before it starts."""

from autotune.outputs.estimate import estimate_run
from autotune.outputs.export import render
from autotune.outputs.outcome import Outcome, outcome
from autotune.outputs.report import summary_text, write_all
from autotune.outputs.run_info import load_run

__all__ = ["Outcome", "estimate_run", "load_run", "outcome", "render", "summary_text", "write_all"]
