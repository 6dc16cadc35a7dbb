"""Which calibration each part of a run uses (commands/run_guide.py, shared_calibration): on the simulated
backend the simulator's calibration is the reality the guide must not read; on a real backend one
calibration of the GPU, given with either option, serves the guide, the startup screen and the
pre-run estimate."""

from __future__ import annotations

import argparse

import pytest

from autotune.commands.run_guide import shared_calibration
from autotune.sim.calibration import DEFAULT_CALIBRATION, Calibration

SIM = Calibration(**{**DEFAULT_CALIBRATION.to_dict(), "gemm_eff": 0.4})
GUIDE = Calibration(**{**DEFAULT_CALIBRATION.to_dict(), "gemm_eff": 0.5})


def _args(backend: str, sim: bool, guide: bool) -> argparse.Namespace:
    return argparse.Namespace(
        backend=backend,
        sim_calibration="sim.yaml" if sim else None,
        guide_calibration="g.yaml" if guide else None,
    )


@pytest.mark.parametrize(
    ("backend", "sim", "guide", "expected"),
    [
        ("sim", True, False, (SIM, DEFAULT_CALIBRATION)),  # the reality stays the backend's
        ("sim", False, True, (DEFAULT_CALIBRATION, GUIDE)),
        ("vllm", True, False, (SIM, SIM)),  # `autotune calibrate`'s file guides a real run too
        ("docker", False, True, (GUIDE, GUIDE)),  # a guided run's file screens the next one too
        ("vllm", True, True, (SIM, GUIDE)),  # both given: each where it was asked for
    ],
)
def test_each_part_of_a_run_gets_its_calibration(
    backend: str, sim: bool, guide: bool, expected: tuple[Calibration, Calibration]
) -> None:
    given = (SIM if sim else DEFAULT_CALIBRATION, GUIDE if guide else DEFAULT_CALIBRATION)
    assert shared_calibration(_args(backend, sim, guide), *given) == expected


def test_an_unguided_real_run_keeps_its_calibration_and_no_guide() -> None:
    assert shared_calibration(_args("vllm", True, False), SIM, None) == (SIM, None)
