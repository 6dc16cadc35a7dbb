"""The study's storage: URLs, preflight checks, and the one-driver lease."""

from autotune.store.lease import Lease
from autotune.store.storage import connect_storage, preflight_storage

__all__ = ["Lease", "connect_storage", "preflight_storage"]
