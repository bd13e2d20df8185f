"""Symmetry classes: which data-parallel replicas one simulated representative stands for.

A *replica* is one (data-parallel, context-parallel) index: the pipeline of units that runs
one share of the batch. Replicas are partitioned into classes by colour refinement:

1. start from what each replica is given: the compute scale of its unit at every stage,
   its micro-batches, and the slowed or failing links that touch its devices or NICs;
2. split a class while two of its replicas sit in collective groups (data-parallel,
   expert data-parallel, context-parallel, expert-parallel) whose sets of classes differ:
   a group's collective starts when its slowest class arrives, so replicas in different
   mixes of classes may finish at different times;
3. repeat until nothing splits.

The reduced step simulates one representative per class (its first replica) at every
stage. A collective is started once every class in its group has arrived, its flows carry
the copies of every group with the same mix of classes, and a flow class (same bytes, same
classes at both ends, same path latency) becomes one aggregate flow with the member paths
it stands for (:mod:`sim.network.engine`). The refinement only proves that members of a
class get the same compute and the same collective partners; that the network treats them
alike is checked while the step runs (:func:`sim.network.flows.check_aggregates`), and the
step is run again unreduced where it does not. A healthy cluster is one class, the
reduction the tier always had; ``reduce=False`` makes every replica its own class.

>>> c = Classes.of_list([[(0, 0), (2, 0)], [(1, 0)]])
>>> c.reps, c.of[(2, 0)], c.singletons
([(0, 0), (1, 0)], 0, False)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from sim.layout.placement import groups_of, rank_coords
from sim.spec.plan import Plan

__all__ = ["Replica", "Classes", "replica_of", "replicas_by_rank", "replica_groups", "refine"]

Replica = tuple[int, int]  # (data-parallel index, context-parallel index)
KINDS = ("dp", "edp", "cp", "ep")


@dataclass(frozen=True)
class Classes:
    """A partition of the replicas: ``members[c]`` in order, its first the representative;
    ``of`` maps a replica to its class."""

    members: tuple[tuple[Replica, ...], ...]
    of: dict[Replica, int]

    @classmethod
    def of_list(cls, members: list[list[Replica]]) -> Classes:
        ordered = sorted((sorted(m) for m in members), key=lambda m: m[0])
        return cls(tuple(tuple(m) for m in ordered),
                   {r: i for i, m in enumerate(ordered) for r in m})

    @property
    def reps(self) -> list[Replica]:
        return [m[0] for m in self.members]

    @property
    def singletons(self) -> bool:
        return all(len(m) == 1 for m in self.members)

    @classmethod
    def one(cls, plan: Plan) -> Classes:
        """Every replica in one class (a symmetric step)."""
        return cls.of_list([[(d, c) for d in range(plan.dp) for c in range(plan.cp)]])

    @classmethod
    def each(cls, plan: Plan) -> Classes:
        """Every replica its own class (the unreduced step)."""
        return cls.of_list([[(d, c)] for d in range(plan.dp) for c in range(plan.cp)])


def replica_of(plan: Plan, rank: int) -> Replica:
    """The replica a logical rank belongs to."""
    sizes, strides = rank_coords(plan)
    return _replica(sizes, strides, sizes["ep"], rank)


def replicas_by_rank(plan: Plan) -> list[Replica]:
    """The replica of every logical rank, in rank order."""
    sizes, strides = rank_coords(plan)
    return [_replica(sizes, strides, sizes["ep"], r) for r in range(plan.world_size)]


def _replica(sizes: dict[str, int], strides: dict[str, int], ep: int, rank: int) -> Replica:
    e = rank // strides["ep"] % sizes["ep"]
    return rank // strides["dp"] % sizes["dp"] * ep + e, rank // strides["cp"] % sizes["cp"]


def replica_groups(plan: Plan) -> dict[str, list[list[Replica]]]:
    """Per kind spanning replicas, its groups as replicas (the same at every stage and
    tensor-parallel index: taken at stage 0, TP rank 0)."""
    sizes, strides = rank_coords(plan)
    out = {}
    for kind in KINDS:
        groups = [g for g in groups_of(plan, kind, {"pp": 0})
                  if g[0] // strides["tp"] % sizes["tp"] == 0]
        rows = [[replica_of(plan, r) for r in g] for g in groups]
        if rows and len(rows[0]) > 1:
            out[kind] = rows
    return out


def refine(plan: Plan, given: Callable[[Replica], Hashable]) -> Classes:
    """Colour refinement of the replicas from ``given`` (what each is given: scales,
    micro-batches, perturbed links) by the class mixes of their collective groups."""
    replicas = [(d, c) for d in range(plan.dp) for c in range(plan.cp)]
    groups = replica_groups(plan)
    where = {kind: {r: i for i, g in enumerate(rows) for r in g}
             for kind, rows in groups.items()}
    colour = _canon({r: given(r) for r in replicas})
    while True:
        mixes = {kind: [frozenset(colour[r] for r in g) for g in rows]
                 for kind, rows in groups.items()}
        new = _canon({r: (colour[r],) + tuple(mixes[k][where[k][r]] for k in sorted(groups))
                      for r in replicas})
        if len(set(new.values())) == len(set(colour.values())):
            break
        colour = new
    members: dict[int, list[Replica]] = {}
    for r in replicas:
        members.setdefault(colour[r], []).append(r)
    return Classes.of_list(list(members.values()))


def _canon(labels: dict[Replica, Hashable]) -> dict[Replica, int]:
    """Labels as small integers, numbered in order of first appearance."""
    ids: dict[Hashable, int] = {}
    return {r: ids.setdefault(v, len(ids)) for r, v in labels.items()}
