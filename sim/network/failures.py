"""Faults resolved on one cluster's topology, and failed links in the DES.

A :class:`~sim.spec.faults.Faults` (the user's description) becomes numbers for one cluster
(:func:`resolve`), and those a typed :class:`Perturbation` that a simulation tier takes
(:func:`fault_inputs`):

* a **compute scale** per device (1.3 = every compute duration 30% longer): the product of
  its fixed GPU factor, its node's, and any drawn ones;
* a **link scale** per link id (2 = half the capacity), from fixed factors on named links
  and drawn ones (one draw per cable, both directions alike);
* **failures**: link ids that stop carrying traffic at a simulated time.

How draws are seeded and how links are named: :mod:`sim.spec.faults`.

A failed link: every flow crossing it, in flight or started later, is re-routed on a
shortest path (hops) of the graph without the failed links (:class:`Detour`); a flow with
no such path raises :class:`CannotComplete`, which the DES reports as a step that cannot
complete.

>>> vertex_name(("nic", 3, 0)), vertex_name(7)
('nic3.0', 'gpu7')
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np
import simpy

from sim.errors import SpecError
from sim.layout.placement import rank_coords
from sim.network.flows import AsymmetricFlows, Flow, Members, Network
from sim.network.perturbation import LinkFailure, Perturbation
from sim.network.topology import Topology, build_topology, vertex_name
from sim.spec.cluster import ClusterSpec
from sim.spec.faults import Faults
from sim.spec.plan import Plan

__all__ = ["Resolved", "CannotComplete", "Detour", "resolve", "vertex_name", "link_ids",
           "stage_scales", "perturbed_topology", "install_failures", "FaultInputs",
           "fault_inputs"]


class CannotComplete(RuntimeError):
    """A flow has no path left: the step cannot complete."""


@dataclass
class Resolved:
    """A :class:`Faults` for one cluster."""

    compute_scale: list[float] | None
    link_scale: dict[int, float] = field(default_factory=dict)
    failures: list[LinkFailure] = field(default_factory=list)


# Names on the topology ----------------------------------------------------------------------
def link_ids(topo: Topology, name: str, option: str) -> list[int]:
    """Link ids (both directions) of ``A-B`` (or ``A->B``, as result tables name links),
    or of every link touching vertex ``A``."""
    names = {vertex_name(v): v for v in topo.graph.nodes}
    ends = [name] if name in names else name.split("->" if "->" in name else "-")
    unknown = [e for e in ends if e not in names]
    if len(ends) > 2 or unknown:
        raise SpecError(option, f"{name!r} is not a link or vertex of {topo.cluster.name} "
                        "(links are A-B of vertices gpuN, swN, nicN.K, podN, core, railP.K, "
                        "spineJ, rtN)")
    g = topo.graph
    if len(ends) == 1:
        v = names[ends[0]]
        return sorted(g.edges[e]["lid"] for e in [*g.out_edges(v), *g.in_edges(v)])
    a, b = names[ends[0]], names[ends[1]]
    if not g.has_edge(a, b):
        raise SpecError(option, f"there is no link between {ends[0]} and {ends[1]}")
    return [topo.lid(a, b), topo.lid(b, a)]


# Resolving ----------------------------------------------------------------------------------
def _index(option: str, scope: str, name: str, count: int, cluster: ClusterSpec) -> int:
    i = int(name)
    if i >= count:
        raise SpecError(option, f"{scope} {i} is not in {cluster.name} ({scope}s 0..{count - 1})")
    return i


def resolve(faults: Faults, cluster: ClusterSpec, topo: Topology) -> Resolved:
    """Per-device compute scale, per-link capacity divisors and failures on ``topo``."""
    with np.errstate(over="ignore", under="ignore"):  # _check_finite rejects 0 and inf
        scale, links = _fixed(faults, cluster, topo)
        _check_finite(scale, links, "--straggler")
        _drawn(faults, cluster, topo, scale, links)
    _check_finite(scale, links, "--straggler-dist")
    failures = [LinkFailure(t, tuple(link_ids(topo, name, "--fail-link")), name)
                for name, t in faults.failures]
    compute = None if np.all(scale == 1.0) else [float(x) for x in scale]
    return Resolved(compute, links, sorted(failures, key=lambda f: f.time_s))


def _fixed(faults: Faults, cluster: ClusterSpec, topo: Topology
           ) -> tuple[np.ndarray, dict[int, float]]:
    """Per-device compute scale and per-link divisors of the fixed factors."""
    world, per_node = cluster.world_size, cluster.gpus_per_node
    scale = np.ones(world)
    links: dict[int, float] = {}
    for scope, name, factor in faults.factors:
        if scope == "gpu":
            scale[_index("--straggler", scope, name, world, cluster)] *= factor
        elif scope == "node":
            i = _index("--straggler", scope, name, cluster.nodes, cluster)
            scale[i * per_node:(i + 1) * per_node] *= factor
        else:
            for lid in link_ids(topo, name, "--straggler"):
                links[lid] = links.get(lid, 1.0) * factor
    return scale, links


def _drawn(faults: Faults, cluster: ClusterSpec, topo: Topology, scale: np.ndarray,
           links: dict[int, float]) -> None:
    """Multiply in the seeded draws, one distribution after the other."""
    rng = np.random.default_rng(faults.seed)
    for d in faults.dists:
        if d.scope == "gpu":
            scale *= d.draw(rng, cluster.world_size)
        elif d.scope == "node":
            scale *= np.repeat(d.draw(rng, cluster.nodes), cluster.gpus_per_node)
        else:
            cables = d.draw(rng, len(topo.links) // 2)  # add_link appends both directions
            for lid in range(len(topo.links)):
                links[lid] = links.get(lid, 1.0) * float(cables[lid // 2])


def _check_finite(scale: np.ndarray, links: dict[int, float], option: str) -> None:
    """Factors that multiply (or draw) to 0 or infinity leave no time to simulate."""
    values = np.concatenate([scale, np.fromiter(links.values(), float, len(links))])
    bad = values[~(np.isfinite(values) & (values > 0))]
    if bad.size:
        raise SpecError(option, f"the slow-down factors come out at {bad[0]:g} on a device or "
                        "link; each must stay finite and > 0 (smaller factors or SIGMA)")


def stage_scales(plan: Plan, compute_scale: Sequence[float] | None,
                 dev: Any = None) -> list[float] | None:
    """Per pipeline stage, its slowest rank's compute scale: a TP group runs at its slowest
    device, and the data-parallel gradient sync waits for the slowest replica (the
    analytic tier's approximation)."""
    if compute_scale is None:
        return None
    sizes, strides = rank_coords(plan)
    out = [0.0] * plan.pp
    for r in range(plan.world_size):
        stage = r // strides["pp"] % sizes["pp"]
        out[stage] = max(out[stage], compute_scale[dev(r) if dev else r])
    return out


def perturbed_topology(topo: Topology, link_scale: dict[int, float]) -> Topology:
    """A copy of ``topo`` whose link ``i`` carries ``cap[i] / link_scale[i]``."""
    if not link_scale:
        return topo
    cap = [c / link_scale.get(i, 1.0) for i, c in enumerate(topo.cap)]
    return dataclasses.replace(topo, cap=cap, _routes={}, _router_paths={},
                               slowed=dict(link_scale))


# Failures in the DES ------------------------------------------------------------------------
class Detour:
    """Re-routes flows around failed links: shortest paths (hops) on the graph without
    them, cached per endpoint pair."""

    def __init__(self, topo: Topology, confined: set[int] | None = None) -> None:
        self.topo = topo
        self.confined = confined  # nodes a detour may cross beyond its own route's ends
        self.failed: set[int] = set()
        self.names: dict[int, str] = {}
        self._paths: dict[tuple[object, object], tuple[int, ...]] = {}
        g = topo.graph
        self.view = nx.subgraph_view(
            g, filter_edge=lambda u, v: g.edges[u, v]["lid"] not in self.failed)

    def fail(self, lids: Sequence[int], label: str) -> None:
        self.failed.update(lids)
        self.names.update(dict.fromkeys(lids, label))
        self._paths.clear()

    def path(self, src: object, dst: object, lid: int) -> tuple[int, ...]:
        key = (src, dst)
        if key not in self._paths:
            try:
                hops = nx.shortest_path(self.view, src, dst)
            except nx.NetworkXNoPath:
                raise CannotComplete(
                    f"no path from {vertex_name(src)} to {vertex_name(dst)} without the failed "
                    f"link(s) {self.names[lid]}") from None
            if self.confined is not None:
                self._check_confined(hops)
            self._paths[key] = tuple(self.topo.lid(a, b) for a, b in itertools.pairwise(hops))
        return self._paths[key]

    def _check_confined(self, hops: list[object]) -> None:
        """A reduced step memoises collectives inside nodes and assumed re-routed traffic
        crosses GPUs and switches only on the failed links' nodes: a detour through another
        node's GPU or switch breaks that (NICs and routers carry no memoised collective:
        their shared traffic is checked flow by flow)."""
        for v in hops[1:-1]:
            node = self.topo.node_of(v) if isinstance(v, int) else \
                v[1] if isinstance(v, tuple) and v[0] == "sw" else None
            if node is not None and node not in (self.confined or ()):
                raise AsymmetricFlows(f"a re-routed flow crosses {vertex_name(v)} on node "
                                      f"{node}, away from the failed links")

    def __call__(self, flow: Flow) -> None:
        """Re-route ``flow`` in place if it crosses a failed link (an aggregate: each of its
        members that does)."""
        m = flow.members
        if m is not None:  # shared with the collective's cached plan: replaced, not edited
            if not self.failed.intersection(flow.lid.tolist()):
                return
            flow.members = Members([self._around(p) for p in m.paths], m.copy, m.scale,
                                   m.coupled, m.check)
            links, weights = flow.members.union()
            flow.links, flow.lid, flow.w = links, links, weights
            flow.weights = weights  # what the few-flows filling reads
            return
        lids = self._around(tuple(int(i) for i in flow.lid))
        if lids != tuple(flow.links):
            flow.links = lids
            flow.lid = np.asarray(lids, dtype=np.int64)
            flow.w = np.full(len(lids), float(flow.w[0]))
            flow.weights = flow.w  # what the few-flows filling reads

    def _around(self, path: tuple[int, ...]) -> tuple[int, ...]:
        """``path``, or a shortest one around the failed links if it crosses one."""
        hit = [i for i in path if i in self.failed]
        if not hit:
            return path
        src, dst = self.topo.links[path[0]][0], self.topo.links[path[-1]][1]
        return self.path(src, dst, hit[0])


def install_failures(env: simpy.Environment, net: Network, topo: Topology,
                     failures: Sequence[LinkFailure], confined: set[int] | None = None
                     ) -> None:
    """Fail each link at its time on ``net`` (flows on it re-routed; :class:`CannotComplete`
    raised out of ``env.run()`` when one has no path). ``confined``: the nodes re-routed
    flows may cross (else :class:`AsymmetricFlows`), for a reduced step."""
    detour = Detour(topo, confined)
    for f in failures:
        label = f"{f.name} (failed at {f.time_s:g} s)"
        env.process(_fail_at(env, net, detour, f.time_s, f.link_ids, label))


def _fail_at(env: simpy.Environment, net: Network, detour: Detour, time_s: float,
             lids: Sequence[int], label: str) -> Generator[simpy.Event, Any, None]:
    yield env.timeout(time_s)
    detour.fail(lids, label)
    net.reroute(detour)


# What a simulation tier takes ---------------------------------------------------------------
@dataclass(frozen=True)
class FaultInputs:
    """``faults`` resolved for one simulation: the analytic tier's per-stage scale, the
    DES's :class:`Perturbation`, whether to reduce (as asked), notes for the result's warnings and
    a summary for its ``simulation`` dict."""

    stage_scale: list[float] | None
    perturbation: Perturbation
    reduce: bool
    notes: list[str]
    info: dict[str, Any]


def fault_inputs(faults: Faults, cluster: ClusterSpec, plan: Plan, fidelity: str,
                 reduce: bool) -> FaultInputs:
    """Resolve ``faults`` on ``cluster``'s topology for a ``fidelity`` simulation."""
    topo = build_topology(cluster)
    r = resolve(faults, cluster, topo)
    links = bool(r.link_scale) or bool(r.failures)
    pl = plan.placement
    dev = None if isinstance(pl, str) else pl.__getitem__
    scale = r.compute_scale
    info: dict[str, Any] = {"faults": faults.to_dict() | {
        "slowest_gpu_scale": max(scale) if scale else 1.0,
        "slowest_link_scale": max(r.link_scale.values(), default=1.0)}}
    notes = []
    if fidelity != "des" and links:
        notes.append("the analytic tier ignores link slow-downs and failures "
                     "(use --fidelity des)")
    perturbation = Perturbation(perturbed_topology(topo, r.link_scale),
                                None if scale is None else tuple(scale), tuple(r.failures))
    return FaultInputs(stage_scales(plan, scale, dev), perturbation, reduce, notes, info)
