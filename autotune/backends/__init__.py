"""Backends evaluate one EngineConfig on one workload and return a TrialResult."""
