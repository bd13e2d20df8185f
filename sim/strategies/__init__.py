"""Data-parallel synchronisation strategies over many steps: ``simulate_sync`` and its
result (:mod:`sim.strategies.simulate`, :mod:`sim.strategies.result`)."""

from sim.strategies.result import SyncResult
from sim.strategies.simulate import build_setup, covering_steps, simulate_sync

__all__ = ["simulate_sync", "build_setup", "covering_steps", "SyncResult"]
