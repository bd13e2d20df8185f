"""Training across sites joined by WAN links: how data-parallel replicas in several data
centres synchronise, and how close each way gets to one site's throughput.

Each site holds whole replicas (model parallelism inside a site, data parallelism across,
as :mod:`sim.spec.groups` places it) and steps on its own devices (sites may differ in
size, GPU and NICs: :func:`site_shares`); BSP across sites waits for the slowest site.
Ways to synchronise:

- ``flat``: BSP with one all-reduce over every replica, as if the sites were one cluster
  whose groups cross the WAN (the one-step tiers with the WAN in the fabric,
  :mod:`sim.network.wan`);
- ``hierarchical``: BSP; each site reduces inside (its own one-step result, the in-site
  all-reduce overlapped with backward as usual), then the sites all-reduce the reduced
  gradient over the WAN, every rank of a site its shard at once, then each site gathers
  (part of its in-site all-reduce); the WAN phase is not overlapped;
- ``two-stage`` (OSP-style, as the synchronisation strategy of that name): each step the
  sites exchange the ``fraction`` of the gradient that matters most before the step ends,
  and the rest under the next step's compute (it must be in before the next exchange);
- ``diloco``: each site trains its own replica group for ``H`` inner steps (in-site BSP),
  then the sites all-reduce the pseudo-gradient (``fp32``, ``bf16``, ``fp16`` or ``int8``)
  over the WAN as ``hierarchical`` does, and take an outer step: the WAN is paid once every
  ``H`` steps, exposed;
- ``streaming-diloco`` (Douillard et al. 2025): the model in ``fragments`` synchronised in
  turn, one every ``H / fragments`` inner steps, each overlapped with ``overlap`` inner
  steps; exposed is what a fragment's exchange takes beyond its overlap, or, when the WAN
  cannot carry every fragment within ``H`` steps, the difference.

In the DES (``fidelity="des"``) every step is the DES's, and the WAN exchange runs as
flows on the topology (the ranks holding each piece of the gradient, every piece at once,
sharing NICs and WAN links, with the WAN's jitter drawn); the exchange still follows the
in-site step (not overlapped), as in the closed form.

Throughput is tokens (samples) per second of the whole job; the single-site figure is the
same plan on one cluster holding every node. With the WAN as fast as a NIC and as near as a
switch, ``flat`` is that figure. These are throughput figures: what ``H`` and compression
cost in convergence is the statistical model's business (:mod:`sim.cost.convergence`;
DiLoCo's inner steps to a loss over BSP's, measured on a small language model:
:func:`sim.strategies.accuracy.steps_over_bsp`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from sim.api import simulate
from sim.cost.sync import outer_step_s
from sim.errors import SpecError
from sim.layout.placement import SITE_PLACEMENT, group_span, site_aware
from sim.layout.sync import PAYLOAD_BYTES, gradient
from sim.network.wan import jitter_s, ring_wan
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.workload import Workload

__all__ = ["SiteSync", "SiteResult", "SiteSteps", "site_steps", "simulate_sites",
           "SITE_SYNCS", "single_site", "site_replicas", "site_shares", "batch_split",
           "wan_sweep", "at_hour", "over_a_day"]

SITE_SYNCS = ("flat", "hierarchical", "two-stage", "diloco", "streaming-diloco")


@dataclass(frozen=True)
class SiteSync:
    kind: str = "hierarchical"  # flat, hierarchical, diloco, streaming-diloco
    H: int = 1  # diloco: inner steps between outer syncs
    fragments: int = 1  # streaming-diloco: parts of the model synchronised in turn
    overlap: int = 1  # streaming-diloco: inner steps a fragment's exchange may hide behind
    dtype: str = "fp32"  # diloco: what the pseudo-gradient travels as
    fraction: float = 0.1  # two-stage: share of the gradient that crosses before the step ends

    def __post_init__(self) -> None:
        if self.kind not in SITE_SYNCS:
            raise SpecError("sync.kind", f"must be one of {', '.join(SITE_SYNCS)}, got "
                            f"{self.kind!r}")
        for name in ("H", "fragments", "overlap"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 10**6:
                raise SpecError(f"sync.{name}", f"must be an integer in 1..1,000,000, got {v!r}")
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, int | float) \
                or not 0 < self.fraction <= 1:
            raise SpecError("sync.fraction", f"must be in (0, 1], got {self.fraction!r}")
        if self.dtype not in PAYLOAD_BYTES:
            raise SpecError("sync.dtype", f"must be one of {', '.join(PAYLOAD_BYTES)}, got "
                            f"{self.dtype!r}")
        if self.overlap > self.H:
            raise SpecError("sync.overlap", f"at most H = {self.H} inner steps, got "
                            f"{self.overlap}")
        if self.kind == "streaming-diloco" and self.fragments > self.H:
            raise SpecError("sync.fragments", f"at most H = {self.H} (one fragment an inner "
                            f"step at most), got {self.fragments}")

    def label(self) -> str:
        if self.kind in ("flat", "hierarchical"):
            return self.kind
        if self.kind == "two-stage":
            return f"two-stage {self.fraction:g}"
        extra = f", {self.fragments} fragments, overlap {self.overlap}" \
            if self.kind == "streaming-diloco" else ""
        return f"{self.kind} H={self.H}{extra}, {self.dtype}"


@dataclass
class SiteResult:
    sync: SiteSync
    tokens_per_s: float  # the whole job's
    step_s: float  # per (inner) step, WAN time spread over the steps it serves
    inner_step_s: float  # one site's BSP step (diloco), or the flat/hierarchical step
    wan_s_per_sync: float  # one exchange over the WAN (diloco: the whole pseudo-gradient)
    exposed_wan_s_per_step: float
    single_site_tokens_per_s: float
    notes: list[str] = field(default_factory=list)
    site_step_s: dict[str, float] = field(default_factory=dict)  # each site's own step

    @property
    def of_single_site(self) -> float:
        return self.tokens_per_s / self.single_site_tokens_per_s

    def to_dict(self) -> dict[str, Any]:
        return {"sync": self.sync.label(), "tokens_per_s": self.tokens_per_s,
                "step_s": self.step_s, "inner_step_s": self.inner_step_s,
                "wan_s_per_sync": self.wan_s_per_sync,
                "exposed_wan_s_per_step": self.exposed_wan_s_per_step,
                "single_site_tokens_per_s": self.single_site_tokens_per_s,
                "of_single_site": self.of_single_site, "notes": self.notes,
                "site_step_s": self.site_step_s}


def single_site(cluster: ClusterSpec) -> ClusterSpec:
    """Every node in one site: the cluster without its WAN."""
    return dataclasses.replace(cluster, name=f"{cluster.name} (one site)", sites=(), wan=(),
                               inter_node=dataclasses.replace(cluster.inter_node, pod_gpus=0))


def _site_cluster(cluster: ClusterSpec, i: int) -> ClusterSpec:
    """Site ``i`` as a cluster of its own: its nodes, device and rates."""
    site, one = cluster.sites[i], single_site(cluster)
    name = f"{cluster.name}:{site.name}"
    if not cluster.node_groups:
        return dataclasses.replace(one, name=name, nodes=site.nodes)
    g = cluster.node_groups[i]  # (sites naming their own device or rates are the groups)
    gbps, nics = cluster.node_nics(sum(s.nodes for s in cluster.sites[:i]))
    return dataclasses.replace(
        one, name=name, nodes=site.nodes, gpu=g.gpu, node_groups=(),
        inter_node=dataclasses.replace(one.inter_node, nic_Gbps=gbps, nics_per_node=nics),
        intra_node=dataclasses.replace(one.intra_node, bandwidth_GBps=g.intra_GBps))


def site_replicas(cluster: ClusterSpec, plan: Plan) -> list[list[int]]:
    """The data-parallel replicas at each site (checked: every replica at one site)."""
    from sim.layout.placement import stage_devices
    from sim.spec.plan import validate

    if len(cluster.sites) < 2:
        raise SpecError("cluster.sites", "needs two or more sites joined by WAN links")
    validate(plan, cluster=cluster)  # every GPU of the cluster, no more
    table = plan.placement
    held: list[list[int]] = [[] for _ in cluster.sites]
    for d in range(plan.dp):
        where = {cluster.site_of_node((r if isinstance(table, str) else table[r])
                                      // cluster.gpus_per_node)
                 for st in range(plan.pp) for r in stage_devices(plan, d, st)}
        if len(where) > 1:
            raise SpecError("plan.placement", f"replica {d} spans sites "
                            f"{', '.join(cluster.sites[i].name for i in sorted(where))}: "
                            "each site must hold whole replicas (tp x pp x cp ranks) for "
                            "its own step")
        held[where.pop()].append(d)
    if plan.ep > 1 and group_span(plan, cluster, "ep").cross_pod:
        raise SpecError("plan.placement", "ep groups span sites: each site must hold whole "
                        "expert-parallel groups for its own step (their all-to-alls would "
                        "cross the WAN every layer)")
    return held


def batch_split(cluster: ClusterSpec, plan: Plan) -> str:
    """Micro-batches a replica at each site, e.g. ``e 5, w 2`` (``5/6`` where they differ)."""
    mbr = plan.replica_microbatches
    return ", ".join(f"{s.name} {'/'.join(map(str, sorted({mbr[d] for d in reps})))}"
                     for s, reps in zip(cluster.sites, site_replicas(cluster, plan),
                                        strict=True))


def site_shares(cluster: ClusterSpec, plan: Plan, held: list[list[int]] | None = None
                ) -> list[tuple[ClusterSpec, Plan]]:
    """Each site as a cluster of its own, with its share of the plan: the replicas whose
    ranks all sit there (every replica must sit at one site; ``held``: the
    :func:`site_replicas` already found) and their micro-batches."""
    held = held if held is not None else site_replicas(cluster, plan)
    out = []
    for i, reps in enumerate(held):
        micro = [plan.replica_microbatches[d] for d in reps]
        order = plan.placement if isinstance(plan.placement, str) else SITE_PLACEMENT
        try:  # (an explicit rank table is the whole cluster's: inside a site, whole replicas)
            share = dataclasses.replace(
                plan, dp=len(reps), global_batch_size=sum(micro) * plan.micro_batch_size,
                micro_batches_per_replica=tuple(micro) if len(set(micro)) > 1 else None,
                placement=order)
        except SpecError as e:
            raise SpecError(e.field, f"{e.rule} (site {cluster.sites[i].name}'s share: "
                            f"dp {len(reps)})") from None
        out.append((_site_cluster(cluster, i), share))
    return out


def _wan_allreduce_s(cluster: ClusterSpec, nbytes: float, ranks: tuple[int, ...]) -> float:
    """The sites all-reduce ``nbytes`` (one replica's, site ``i``'s share spread over its
    ``ranks[i]`` ranks): a ring over the sites, 2 (S - 1) latency steps, ``2 (S - 1) / S``
    of the bytes over the tightest WAN link; and no rank's NIC share slower than that (the
    ranks of a smaller site carry larger shards)."""
    s = len(cluster.sites)
    rate, latency = ring_wan(cluster)
    share = 2 * (s - 1) / s * nbytes
    rank_s = 0.0
    for first, r in zip((0, *cluster.site_starts), ranks, strict=True):
        rank_Bps = cluster.node_nics(first)[1] * cluster.nic_Bps(first) / cluster.gpus_per_node
        rank_s = max(rank_s, share / max(r, 1) / rank_Bps)
    step_latency = latency + jitter_s(cluster, max(max(ranks), 1))
    return max(share / rate, rank_s) + 2 * (s - 1) * step_latency


def _wan_allreduce_des(cluster: ClusterSpec, nbytes: float, ranks: tuple[int, ...]) -> float:
    """The same exchange as flows on the topology: the gradient cut wherever a site's shard
    ends (rank ``k`` of site ``i`` holds ``[k / ranks[i], (k + 1) / ranks[i])``), each piece
    all-reduced by a ring over the sites among the ranks holding it (rank ``i`` of every
    site when the sites are alike), every piece at once, the flows sharing the NICs and WAN
    links max-min and paying their latency and jitter."""
    from fractions import Fraction

    import simpy

    from sim.network.engine import CommEngine
    from sim.network.flows import Network
    from sim.network.topology import build_topology

    topo = build_topology(cluster)
    env = simpy.Environment()
    engine = CommEngine(env, topo, Network(env, topo.cap, topo.lat))
    starts = [0, *(n * cluster.gpus_per_node for n in cluster.site_starts)]
    cuts = sorted({Fraction(k, r) for r in ranks for k in range(r + 1)})
    for a, b in zip(cuts, cuts[1:], strict=False):
        group = [start + int(a * r) for start, r in zip(starts, ranks, strict=True)]
        w = b - a  # (a whole 1/r as nbytes / r, exactly as alike sites always had)
        env.process(engine.run("all_reduce", "ring", group, nbytes * w.numerator / w.denominator))
    env.run()
    return float(env.now)


@dataclass(frozen=True)
class SiteSteps:
    """What every way to synchronise shares and no WAN rate changes: the plan (site-aware),
    one cluster's step (the reference), each site's share and step, one replica's
    gradient."""

    plan: Plan
    ref: Any  # sim.result.Result of the single cluster
    names: tuple[str, ...]  # the sites'
    sites: tuple[ClusterSpec, ...]  # each site as a cluster of its own
    inner: tuple[Any, ...]  # sim.result.Result of each site's share
    grad: Any  # sim.layout.sync.Gradient of one replica

    @property
    def inner_s(self) -> float:
        """The slowest site's step: BSP across sites waits for it."""
        return max(r.iteration_time_s for r in self.inner)

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(c.world_size for c in self.sites)


def site_steps(model: ModelSpec | Workload, cluster: ClusterSpec, plan: Plan,
               fidelity: str = "analytic") -> SiteSteps:
    """The :class:`SiteSteps` of a plan on a cluster of sites (checked); alike sites with
    alike shares are simulated once."""
    if len(cluster.sites) < 2:
        raise SpecError("cluster.sites", "needs two or more sites joined by WAN links")
    plan = site_aware(plan, cluster)  # the same rank order for the one-site reference
    ref = simulate(model, single_site(cluster), plan, fidelity=fidelity)
    shares = site_shares(cluster, plan)
    seen: dict[tuple, Any] = {}
    inner = []
    for c, p in shares:
        key = (dataclasses.replace(c, name=""), p)
        if key not in seen:
            seen[key] = simulate(model, c, p, fidelity=fidelity)
        inner.append(seen[key])
    return SiteSteps(plan, ref, tuple(x.name for x in cluster.sites),
                     tuple(c for c, _ in shares), tuple(inner),
                     gradient(model, shares[0][1]))  # grad: activation dtype


def simulate_sites(model: ModelSpec | Workload, cluster: ClusterSpec, plan: Plan,
                   sync: SiteSync, fidelity: str = "analytic",
                   steps: SiteSteps | None = None) -> SiteResult:
    """Throughput of ``plan`` across ``cluster``'s sites synchronised by ``sync``;
    ``steps``: :func:`site_steps` of the same model, plan and sites (any WAN rates), when
    the caller tries several ways or rates."""
    st = steps or site_steps(model, cluster, plan, fidelity)
    plan, ref = st.plan, st.ref
    if sync.kind == "flat":
        r = simulate(model, cluster, plan, fidelity=fidelity)
        wan = max(0.0, r.iteration_time_s - ref.iteration_time_s)
        return SiteResult(sync, r.tokens_per_s, r.iteration_time_s, r.iteration_time_s,
                          wan, wan, ref.tokens_per_s, list(r.warnings))
    grad, t, ranks = st.grad, st.inner_s, st.ranks
    warnings = _site_notes(st)
    exchange = _wan_allreduce_s if fidelity == "analytic" else _wan_allreduce_des
    if sync.kind == "hierarchical":
        wan = exchange(cluster, grad.raw_bytes, ranks)
        return _result(sync, plan, t, t + wan, wan, wan, ref.tokens_per_s, warnings, st)
    if sync.kind == "two-stage":  # the important share blocks, the rest runs under the next step
        first = exchange(cluster, grad.raw_bytes * sync.fraction, ranks)
        rest = exchange(cluster, grad.raw_bytes * (1 - sync.fraction), ranks) \
            if sync.fraction < 1 else 0.0
        step = first + max(t, rest)
        return _result(sync, plan, t, step, first + rest, step - t, ref.tokens_per_s,
                       warnings, st)
    # DiLoCo: the pseudo-gradient in its dtype, then the outer step on each rank's shard
    nbytes = grad.elements * PAYLOAD_BYTES[sync.dtype]
    outer = max(outer_step_s(c.gpu, grad.elements / c.world_size) for c in st.sites)
    if sync.kind == "diloco":
        wan = exchange(cluster, nbytes, ranks) + outer
        step, exposed = t + wan / sync.H, wan / sync.H
    else:
        frag = exchange(cluster, nbytes / sync.fragments, ranks) + outer / sync.fragments
        wan = frag * sync.fragments
        window = sync.H * t + sync.fragments * max(0.0, frag - sync.overlap * t)
        per_H = max(window, wan)
        step, exposed = per_H / sync.H, per_H / sync.H - t
    return _result(sync, plan, t, step, wan, exposed, ref.tokens_per_s, warnings, st)


def _site_notes(st: SiteSteps) -> list[str]:
    """The sites' warnings, and how long the faster sites wait for the slowest."""
    out = list(dict.fromkeys(w for r in st.inner for w in r.warnings))
    t = st.inner_s
    waits = [(n, 1 - r.iteration_time_s / t) for n, r in zip(st.names, st.inner, strict=True)]
    if max(w for _, w in waits) > 0.01:
        slow = min(waits, key=lambda x: x[1])[0]
        hint = " (trainsim sites --balance splits the batch by site speed, as far as whole " \
            "micro-batches go)" if st.plan.zero_stage <= 1 and st.plan.ep == 1 \
            and st.plan.micro_batches_per_replica is None else ""
        out.append(f"sites wait for {slow} each step: " + ", ".join(
            f"{n} idle {w:.0%}" for n, w in waits if w > 0.01) + hint)
    return out


def _result(sync: SiteSync, plan: Plan, inner_s: float, step: float, wan: float,
            exposed: float, single: float, warnings: Any, st: SiteSteps) -> SiteResult:
    tokens = plan.global_batch_size * plan.seq_len / step
    return SiteResult(sync, tokens, step, inner_s, wan, exposed, single, list(warnings),
                      {n: r.iteration_time_s for n, r in zip(st.names, st.inner, strict=True)})


def wan_sweep(cluster: ClusterSpec, Gbps: float) -> ClusterSpec:
    """The cluster with every WAN link at ``Gbps`` (their latencies kept)."""
    if not math.isfinite(Gbps) or Gbps <= 0:
        raise SpecError("Gbps", f"must be a positive number, got {Gbps!r}")
    return dataclasses.replace(cluster, wan=tuple(
        dataclasses.replace(w, Gbps=Gbps, bandwidth_by_hour=()) for w in cluster.wan))


def at_hour(cluster: ClusterSpec, hour: int) -> ClusterSpec:
    """The cluster with every WAN link at its rate during ``hour`` of the day."""
    return dataclasses.replace(cluster, wan=tuple(
        dataclasses.replace(w, Gbps=w.Gbps_at(hour), bandwidth_by_hour=())
        for w in cluster.wan))


def over_a_day(model: ModelSpec | Workload, cluster: ClusterSpec, plan: Plan,
               sync: SiteSync, fidelity: str = "analytic") -> dict[str, Any]:
    """Each hour's throughput with the WAN links at that hour's rates; the day's tokens
    over its seconds (the mean of the hourly rates) and the worst hour."""
    steps = site_steps(model, cluster, plan, fidelity)  # the same every hour
    hours = [simulate_sites(model, at_hour(cluster, h), plan, sync, fidelity, steps)
             for h in range(24)]
    tokens = sum(r.tokens_per_s * 3600 for r in hours) / (24 * 3600)
    worst = min(range(24), key=lambda h: hours[h].tokens_per_s)
    return {"sync": sync.label(), "tokens_per_s": tokens,
            "of_single_site": tokens / hours[0].single_site_tokens_per_s,
            "worst_hour": worst, "worst_tokens_per_s": hours[worst].tokens_per_s,
            "hourly_tokens_per_s": [r.tokens_per_s for r in hours]}
