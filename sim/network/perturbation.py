"""What faults change in one simulation, as a typed object the tiers take
(:func:`sim.network.failures.fault_inputs` builds it from a user's
:class:`~sim.spec.faults.Faults`). SimPy-free, so that ``sim.api`` stays light to import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: importing the topology would load networkx with sim
    from sim.network.topology import Topology

__all__ = ["LinkFailure", "Perturbation", "NO_PERTURBATION"]


@dataclass(frozen=True)
class LinkFailure:
    """Links (both directions of a cable, or every link of a vertex) that stop carrying
    traffic at ``time_s`` into the step; ``name`` as the user wrote it."""

    time_s: float
    link_ids: tuple[int, ...]
    name: str


@dataclass(frozen=True)
class Perturbation:
    """What faults change in one simulation, typed: the topology with slowed links' capacities
    divided (``None``: the cluster's own), each device's compute scale (index = device;
    1.2 = every compute 20% longer; ``None``: all 1), and links failing mid-step. The
    default changes nothing."""

    topology: Topology | None = None
    compute_scale: tuple[float, ...] | None = None
    link_failures: tuple[LinkFailure, ...] = ()

    def with_scale(self, compute_scale: Sequence[float] | None) -> Perturbation:
        """The same perturbation with ``compute_scale`` in place of its own."""
        scale = None if compute_scale is None else tuple(compute_scale)
        return dataclasses.replace(self, compute_scale=scale)


NO_PERTURBATION = Perturbation()
