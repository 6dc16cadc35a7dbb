"""The realities benchmarks/guided_search.py tunes against: the simulated engine with a perturbed
calibration, each as large as the simulator's real errors (docs/simulator.md), two with a mechanism the
guide's model lacks (the Calibration's reality-only fields), and two held out (never used to choose
the method). A reality's measurement of a config is the capacity search on the simulated engine with
its calibration (benchmarks/guided_search_trials.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.sim.calibration import DEFAULT_CALIBRATION, Calibration

D = DEFAULT_CALIBRATION
API = ("intake_per_request_s", "chat_intake_extra_s", "output_per_token_s", "completions_fixed_s")


def _scaled(**factors: float) -> dict[str, float]:
    """Constants of the built-in calibration times factors (name=factor), clipped to 1.0 for effs."""
    out = {}
    for name, factor in factors.items():
        value = getattr(D, name) * factor
        out[name] = min(value, 1.0) if name.endswith("_eff") else value
    return out


def _api(factor: float) -> dict[str, float]:
    return _scaled(**{name: factor for name in API})


@dataclass(frozen=True)
class Reality:
    """A named perturbation of the built-in calibration (the guide's)."""

    name: str
    values: dict[str, float]
    group: str  # "tuned" (the method was looked at on these), "structural", "held-out" or "identity"

    def calibration(self) -> Calibration:
        return D.replace(**self.values)


REALITIES: tuple[Reality, ...] = (
    Reality("identity", {}, "identity"),
    Reality("eff-30%", _scaled(gemm_eff=0.7, attn_eff=0.7), "tuned"),
    Reality("eff+30%", _scaled(gemm_eff=1.3, attn_eff=1.3), "tuned"),
    Reality("cpu-x2", _scaled(step_base_s=2.0, per_seq_s=2.0), "tuned"),
    Reality("cpu-x0.5-api-x3", {**_scaled(step_base_s=0.5, per_seq_s=0.5), **_api(3.0)}, "tuned"),
    Reality("bw-25%-act+20%", _scaled(bw_eff=0.75, profile_base_gib=1.2, profile_hidden_bytes=1.2), "tuned"),
    Reality(
        "mixed",
        {**_scaled(gemm_eff=0.8, bw_eff=1.15, step_base_s=1.5, profile_hidden_bytes=0.8), **_api(2.0)},
        "tuned",
    ),
    Reality("batch-cpu (structural)", {"reality_seq_pair_s": 3e-8}, "structural"),
    Reality("batch-attention (structural)", {"reality_attn_per_seq": 2e-3}, "structural"),
    Reality(
        "held-out A",
        {**_scaled(gemm_eff=0.85, bw_eff=0.85, step_base_s=1.3), "reality_seq_pair_s": 1e-8},
        "held-out",
    ),
    Reality(
        "held-out B",
        {**_scaled(bw_eff=1.1, attn_eff=0.8), **_api(1.5), "reality_attn_per_seq": 4e-3},
        "held-out",
    ),
)
QUICK = ("identity", "eff-30%", "cpu-x2", "batch-cpu (structural)")


def realities(quick: bool) -> list[Reality]:
    """Every reality, or QUICK's few."""
    return [r for r in REALITIES if not quick or r.name in QUICK]
