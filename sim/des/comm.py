"""A step's collectives: which devices take part, which algorithm runs, and how the units
meet to start one.

Every collective's flows stand, with reduction, for those of the groups of its kind that run
at the same time on that stage (``copies``, see :mod:`sim.network.engine`). A collective
whose links nothing else uses (TP inside a node, typically) is simulated once per shape and
then replayed as a delay; where the profile measured it, its measured time wins, as in the
analytic tier.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import simpy

from sim.des.context import Context, Proc, Unit
from sim.layout.placement import group_span, groups_of
from sim.network.alphabeta import default_algorithm, fabric_for
from sim.network.engine import CommEngine
from sim.network.flows import Network
from sim.spec.experts import is_folded

__all__ = ["Collectives"]


class Collectives:
    """The collectives of one step, over its :class:`~sim.des.context.Context`."""

    def __init__(self, x: Context) -> None:
        self.x = x
        self._meetings: dict[tuple, list[Any]] = {}
        self._memo: dict[tuple, tuple[float, np.ndarray, np.ndarray, np.ndarray]] = {}
        self._measured_cache: dict[tuple, float | None] = {}
        self._copies: dict[tuple, list[list[int]]] = {}
        self._group_cache: dict[tuple[str, int], list[int]] = {}
        self.folded = is_folded(x.p)
        self._unit_of: dict[int, int] | None = None
        self.exclusive = self._exclusive_kinds()
        self.detour_nodes: set[int] = set()  # nodes whose links re-routed flows may cross
        # What one rank issues, per data-parallel replica and stage:
        # (replica, stage, group, collective) -> [count, bytes]. Reduced, replica 0 stands
        # for every replica.
        self.issued: dict[tuple[int, int, str, str], list[float]] = {}

    def note(self, u: Unit, group: str, coll: str, size: float, times: float = 1) -> None:
        """Count ``times`` collectives of ``size`` bytes that each rank of ``u`` issues (for
        the account of a step's collectives; context-parallel rank 0 is counted)."""
        if u.cp:
            return
        entry = self.issued.setdefault((u.dp, u.stage, group, coll), [0, 0.0])
        entry[0] += times
        entry[1] += times * size

    def _exclusive_kinds(self) -> set[str]:
        """Kinds whose groups stay inside a node while no other kind puts two ranks on one
        node: their links carry nothing else, so one simulation per shape is exact."""
        spans = {k: group_span(self.x.p, self.x.c, k) for k in ("tp", "cp", "ep", "dp", "pp")}
        out = set()
        for k, span in spans.items():
            others = [s for o, s in spans.items() if o != k and s.size > 1]
            if span.nodes == 1 and all(s.per_node == 1 for s in others):
                out.add(k)
        return out

    def memoised(self, kind: str, devices: list[int]) -> bool:
        """Whether this group's collective is simulated once per shape: an exclusive kind,
        on no node that re-routed flows may cross."""
        return kind in self.exclusive and not (
            self.detour_nodes and any(self.x.topo.node_of(d) in self.detour_nodes
                                      for d in devices))

    # Groups ---------------------------------------------------------------------------------
    def _group(self, kind: str, unit: Unit, t: int) -> list[int]:
        """Devices of the ``kind`` group of the unit's ``t``-th TP rank (cached)."""
        x = self.x
        base = unit.rank0 + t * x.strides["tp"]
        key = (kind, base)
        if key not in self._group_cache:
            ranks = next(g for g in groups_of(x.p, kind, {"pp": unit.stage}) if base in g)
            self._group_cache[key] = [x.dev(r) for r in ranks]
        return self._group_cache[key]

    def mix(self, devices: list[int]) -> frozenset[int]:
        """The symmetry classes of a group's devices."""
        return frozenset(self.x.dev_class[d] for d in devices)

    def all_copies(self, kind: str, stage: int, devices: list[int]) -> list[list[int]]:
        """Groups of ``kind`` on the stage that run at the same time as ``devices``' (of the
        same TP index, and with the same mix of symmetry classes); the group that runs them
        is the first. For TP: the groups of the units of the class."""
        x = self.x
        tp_index = x.tp_index.get(devices[0], 0)
        mix = self.mix(devices)
        key = (kind, stage, tp_index, mix)
        if key not in self._copies:
            groups = groups_of(x.p, kind, {"pp": stage})
            self._copies[key] = [
                devs for devs in ([x.dev(r) for r in g] for g in groups
                                  if kind == "tp" or x.tp_coord(g[0]) == tp_index)
                if self.mix(devs) == mix]
        return self._copies[key]

    def groups(self, unit: Unit, kind: str) -> list[list[int]]:
        """The groups this unit takes part in: its TP group, or for other kinds the group of
        each of its TP ranks (they may share links with its TP group, so even a reduced
        simulation runs them all)."""
        if kind == "tp":
            return [self.x.tp_devices(unit.rank0)]
        groups = [self._group(kind, unit, t) for t in range(self.x.p.tp)]
        if self.folded and kind in ("ep", "edp"):  # TP ranks of the unit may share a group
            groups = list({tuple(g): g for g in groups}.values())
        return groups

    def group_size(self, kind: str) -> int:
        p = self.x.p
        return {"tp": p.tp, "cp": p.cp, "ep": p.ep, "dp": p.dp * p.cp,
                "edp": p.expert_replicas}[kind]

    def members(self, kind: str, devices: list[int]) -> int:
        """Units that meet in one group of ``kind`` (unreduced): one per rank, except in a
        folded expert grid, where a unit's TP ranks may share the group."""
        if not (self.folded and kind in ("ep", "edp")):
            return self.group_size(kind)
        if self._unit_of is None:
            x = self.x
            self._unit_of = {x.dev(r): r - x.tp_coord(r) * x.strides["tp"]
                             for r in range(x.p.world_size)}
        return len({self._unit_of[d] for d in devices})

    def algorithm(self, kind: str, coll: str, size: float) -> str:
        chosen = self.x.p.algorithm("dp" if kind == "edp" else kind)
        if chosen != "auto":
            return chosen
        span = group_span(self.x.p, self.x.c, kind)
        return default_algorithm(coll, fabric_for(self.x.c, span), size)

    # Running one ----------------------------------------------------------------------------
    def memo_time(self, kind: str, coll: str, algorithm: str, devices: list[int],
                  size: float, copies: list[list[int]] | None, times: float = 1) -> float:
        """Seconds of a collective run alone on the network (for kinds whose links carry
        nothing else), simulated once per shape; each of the ``times`` replays adds its
        link traffic to this simulation's statistics."""
        x = self.x
        key = (kind, coll, algorithm, tuple(devices), size)
        if key not in self._memo:
            env = simpy.Environment()
            net = Network(env, x.topo.cap, x.topo.lat)
            env.process(CommEngine(env, x.topo, net).run(coll, algorithm, devices, size,
                                                         copies, x.dev_class.__getitem__))
            env.run()
            used = (net.stats.bytes > 0).nonzero()[0]
            self._memo[key] = (env.now, used, net.stats.bytes[used], net.stats.busy_s[used])
        seconds, used, moved, busy = self._memo[key]
        x.net.stats.bytes[used] += times * moved
        x.net.stats.busy_s[used] += times * busy
        return seconds

    def _run(self, kind: str, coll: str, algorithm: str, devices: list[int], size: float,
             copies: list[list[int]] | None) -> simpy.Event:
        x = self.x
        if self.memoised(kind, devices):
            seconds = self.memo_time(kind, coll, algorithm, devices, size, copies)
            measured = self.measured(kind, coll, size)
            return x.env.timeout(seconds if measured is None else measured)
        return x.env.process(x.engine.run(coll, algorithm, devices, size, copies,
                                          x.dev_class.__getitem__))

    def measured(self, kind: str, coll: str, size: float) -> float | None:
        """The profile's time for a collective whose links carry nothing else (measured
        there alone too), as the analytic tier uses it; ``None`` without a profile fit."""
        key = (kind, coll, size)
        if key not in self._measured_cache:
            span = group_span(self.x.p, self.x.c, kind)
            self._measured_cache[key] = self.x.cost.collective(coll, span.size,
                                                               span.nodes > 1, size)
        return self._measured_cache[key]

    def collective(self, unit: Unit, kind: str, coll: str, size: float, tag: tuple
                   ) -> simpy.Event:
        """Event: the unit's part of a collective over its ``kind`` groups is done (in full
        mode once every member unit has arrived)."""
        x = self.x
        if size <= 0 or self.group_size(kind) == 1:
            return x.env.timeout(0)
        self.note(unit, kind, coll, size)
        algorithm = self.algorithm(kind, coll, size)
        done = []
        key: tuple
        for g in self.groups(unit, kind):
            if x.reduce:  # the classes of the group meet; its first copy runs them all
                copies = self.all_copies(kind, unit.stage, g)
                group, members = copies[0], 1 if kind == "tp" else len(self.mix(g))
                key = (kind, coll, unit.stage, x.tp_index[g[0]], self.mix(g), tag)
            else:
                copies, group, members = None, g, 1 if kind == "tp" else self.members(kind, g)
                key = (kind, coll, tuple(g), tag)
            done.append(self.meeting(key, members, partial(
                self._run, kind, coll, algorithm, group, size, copies))[1])
        return simpy.AllOf(x.env, done)

    def meeting(self, key: tuple, members: int, start: Callable[[], simpy.Event]
                ) -> list[Any]:
        """[arrived, done event, start time]: ``start`` runs once all ``members`` arrived."""
        x = self.x
        entry = self._meetings.setdefault(key, [0, x.env.event(), 0.0])
        entry[0] += 1
        if entry[0] == members:
            entry[2] = x.env.now
            start().callbacks.append(partial(_succeed, entry[1]))
        return entry

    def blocking(self, u: Unit, kind: str, coll: str, size: float, tag: tuple) -> Proc:
        """The unit waits for a collective on its critical path."""
        x = self.x
        t0 = x.env.now
        yield from x.wait(u, kind, self.collective(u, kind, coll, size, tag), f"{kind} {coll}")
        x.acct[u].comm_total[kind] += x.env.now - t0

    def blocking_all(self, u: Unit, kind: str, parts: list[tuple[str, float]], tag: tuple
                     ) -> Proc:
        """The unit waits for collectives that run at once (one, or DeepEP's two parts)."""
        if len(parts) == 1:
            yield from self.blocking(u, kind, parts[0][0], parts[0][1], tag)
            return
        x = self.x
        t0 = x.env.now
        events = [self.collective(u, kind, coll, size, tag + (coll,)) for coll, size in parts]
        yield from x.wait(u, kind, simpy.AllOf(x.env, events),
                          f"{kind} {'+'.join(c for c, _ in parts)}")
        x.acct[u].comm_total[kind] += x.env.now - t0

    def solo(self, u: Unit, kind: str, coll: str, size: float, times: float) -> float:
        """A memoised collective's seconds; it is replayed ``times`` (all TP groups of the
        unit, or for other kinds the groups of all its TP ranks, are credited: their links
        carry the bytes)."""
        algorithm = self.algorithm(kind, coll, size)
        self.note(u, kind, coll, size, times)
        total = 0.0
        for group in self.groups(u, kind):
            copies = self.all_copies(kind, u.stage, group) if self.x.reduce else None
            total = max(total, self.memo_time(kind, coll, algorithm, group, size, copies,
                                              times))
        measured = self.measured(kind, coll, size)  # as _run: the profile's time wins
        return total if measured is None else measured


def _succeed(done: simpy.Event, _started: simpy.Event) -> None:
    done.succeed()
