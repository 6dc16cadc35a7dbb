"""The guided search's options: its budget, its stop rule and the parts the benchmark's ablations turn off
(benchmarks/guided_search.py; docs/guided-search.md)."""

from __future__ import annotations

from dataclasses import dataclass

RESOLUTION = 0.03  # the capacity search's resolution: a gain below it is a tie (docs/guided-search.md)
Z_UPPER = 1.645  # one-sided 95 % bound of the stop rule


@dataclass(frozen=True)
class GuidedOptions:
    """The guided run's budget and stop rule."""

    gpu_hours: float | None = None  # budget (None: only --n-trials bounds the run)
    resolution: float = RESOLUTION
    z: float = Z_UPPER
    first_trial_gpu_s: float | None = None  # expected cost of a trial before any is measured
    local: bool = True  # False: the residual is one global bias (benchmarks/guided_search.py's ablation)
    operating_point: bool = True  # the residual also varies with the predicted batch and step time
    learn_noise: bool = True  # False: the measurement's noise stays at the resolution (an ablation)
    # a trial's capacity search starts below the corrected predicted capacity: off, it cost more GPU
    # time than the plain search on the benchmark (docs/guided-search-experiments.md)
    bracket: bool = False
    # among configs scored equal (the guide's estimates tie on plateaus), the nearest vLLM's defaults;
    # off: the first in the table (it helped the L4 case and cost the 70B: docs/guided-search-experiments.md)
    prefer_defaults: bool = False
    # a pick by best prediction takes the first of the configs within the resolution of the best; off:
    # it helped the 70B case and cost the L4 (docs/guided-search-experiments.md, "The guide's top
    # searched in full")
    resolution_ties: bool = False
    # the stop trusts the guide's own predictions once its model replays every measured trial's saturation
    # bursts (tune/guide_check.py); off: the residual model's prior bounds every untried config (ablation)
    check_bursts: bool = True
    # ... and, where only the fast estimate's error keeps it from stopping, searches the configs that
    # error covers in full on the simulator (_settle); off: the error bounds them (ablation)
    settle: bool = True
    # ... and reads its residuals within those batches as one speed level and the measurement's noise (a
    # second measured config's residual is noise there, not structure to spread); off: the residual GP's
    level: bool = True
