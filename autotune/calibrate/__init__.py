"""Fitting the simulator's calibration to measurements: points files, the designed benchmark set,
measuring it on a server, the least-squares fit and its report."""

from autotune.calibrate.points import Error, Replay, evaluate, load_points, medians

__all__ = ["Error", "Replay", "evaluate", "load_points", "medians"]
