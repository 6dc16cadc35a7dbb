"""A running trial's live state, written into its folder for the driver's progress display."""

from __future__ import annotations

import json
import time
from pathlib import Path

from autotune.core.json_out import json_text

PROBE_FILE = "probe.json"


def write_probe(trial_dir: Path | None, probe: int, max_probes: int, rate: float) -> None:
    """Record which capacity probe a trial is on (read by the driver's progress display)."""
    if trial_dir is None:
        return
    trial_dir.mkdir(parents=True, exist_ok=True)
    data = {"probe": probe, "max": max_probes, "rate": rate, "at": time.time()}
    (trial_dir / PROBE_FILE).write_text(json_text(data))


def read_probe(trial_dir: Path | None) -> str:
    """ "probe 3/8 at 12 req/s" from a trial's probe.json, "" when there is none (yet)."""
    if trial_dir is None:
        return ""
    try:
        data = json.loads((trial_dir / PROBE_FILE).read_text())
        return f"probe {int(data['probe'])}/{int(data['max'])} at {float(data['rate']):.3g} req/s"
    except (OSError, ValueError, KeyError, TypeError):
        return ""
