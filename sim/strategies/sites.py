"""Training across sites joined by WAN links: how data-parallel replicas in several data
centres synchronise, and how close each way gets to one site's throughput.

The plan's data parallelism is split evenly over the sites (``dp / S`` replicas each, model
parallelism inside a site, as :mod:`sim.spec.groups` places it). Ways to synchronise:

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
flows on the topology (rank ``i`` of each site with rank ``i`` of the others, every rank at
once, sharing NICs and WAN links, with the WAN's jitter drawn); the exchange still follows
the in-site step (not overlapped), as in the closed form.

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
from sim.layout.placement import site_aware
from sim.layout.sync import PAYLOAD_BYTES, gradient
from sim.network.wan import jitter_s, ring_wan
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.workload import Workload

__all__ = ["SiteSync", "SiteResult", "SiteSteps", "site_steps", "simulate_sites",
           "SITE_SYNCS", "single_site", "site_of", "wan_sweep", "at_hour", "over_a_day"]

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

    @property
    def of_single_site(self) -> float:
        return self.tokens_per_s / self.single_site_tokens_per_s

    def to_dict(self) -> dict[str, Any]:
        return {"sync": self.sync.label(), "tokens_per_s": self.tokens_per_s,
                "step_s": self.step_s, "inner_step_s": self.inner_step_s,
                "wan_s_per_sync": self.wan_s_per_sync,
                "exposed_wan_s_per_step": self.exposed_wan_s_per_step,
                "single_site_tokens_per_s": self.single_site_tokens_per_s,
                "of_single_site": self.of_single_site, "notes": self.notes}


def single_site(cluster: ClusterSpec) -> ClusterSpec:
    """Every node in one site: the cluster without its WAN."""
    return dataclasses.replace(cluster, name=f"{cluster.name} (one site)", sites=(), wan=(),
                               inter_node=dataclasses.replace(cluster.inter_node, pod_gpus=0))


def site_of(cluster: ClusterSpec, plan: Plan) -> tuple[ClusterSpec, Plan]:
    """One site's cluster and its share of the plan (``dp / S`` replicas)."""
    s = len(cluster.sites)
    if plan.dp % s or plan.global_batch_size % s:
        raise SpecError("plan.dp", f"must split evenly over the {s} sites (dp and the global "
                        f"batch divisible by {s}), got dp={plan.dp}, "
                        f"global_batch_size={plan.global_batch_size}")
    first = cluster.sites[0]
    site = dataclasses.replace(
        single_site(cluster), name=f"{cluster.name}:{first.name}", nodes=first.nodes,
        gpu=first.gpu or cluster.gpu, node_groups=())
    return site, dataclasses.replace(plan, dp=plan.dp // s,
                                     global_batch_size=plan.global_batch_size // s)


def _wan_allreduce_s(cluster: ClusterSpec, nbytes: float, ranks_per_site: int) -> float:
    """The sites all-reduce ``nbytes`` (one replica's, shards spread over a site's ranks):
    a ring over the sites, 2 (S - 1) latency steps, ``2 (S - 1) / S`` of the bytes over the
    tightest WAN link; and no rank's NIC share slower than that."""
    s = len(cluster.sites)
    rate, latency = ring_wan(cluster)
    per_rank = 2 * (s - 1) / s * nbytes / max(ranks_per_site, 1)
    nic = cluster.nic_GBps_per_gpu * 1e9
    step_latency = latency + jitter_s(cluster, max(ranks_per_site, 1))
    return max(2 * (s - 1) / s * nbytes / rate, per_rank / nic) + 2 * (s - 1) * step_latency


def _wan_allreduce_des(cluster: ClusterSpec, nbytes: float, ranks_per_site: int) -> float:
    """The same exchange as flows on the topology: rank ``i`` of every site all-reduces its
    shard with rank ``i`` of the others (a ring over the sites), every rank at once, the
    flows sharing the NICs and WAN links max-min and paying their latency and jitter."""
    import simpy

    from sim.network.engine import CommEngine
    from sim.network.flows import Network
    from sim.network.topology import build_topology

    topo = build_topology(cluster)
    env = simpy.Environment()
    engine = CommEngine(env, topo, Network(env, topo.cap, topo.lat))
    per_site = cluster.world_size // len(cluster.sites)
    for i in range(ranks_per_site):
        group = [s * per_site + i for s in range(len(cluster.sites))]
        env.process(engine.run("all_reduce", "ring", group, nbytes / ranks_per_site))
    env.run()
    return float(env.now)


@dataclass(frozen=True)
class SiteSteps:
    """What every way to synchronise shares and no WAN rate changes: the plan (site-aware),
    one cluster's step (the reference), one site's step and one replica's gradient."""

    plan: Plan
    ref: Any  # sim.result.Result of the single cluster
    site: ClusterSpec
    inner: Any  # sim.result.Result of one site's share
    grad: Any  # sim.layout.sync.Gradient of one replica


def site_steps(model: ModelSpec | Workload, cluster: ClusterSpec, plan: Plan,
               fidelity: str = "analytic") -> SiteSteps:
    """The :class:`SiteSteps` of a plan on a cluster of sites (checked)."""
    if len(cluster.sites) < 2:
        raise SpecError("cluster.sites", "needs two or more sites joined by WAN links")
    if any(s.gpu and s.gpu != (cluster.sites[0].gpu or cluster.gpu) for s in cluster.sites):
        raise SpecError("cluster.sites", "sites with different GPUs are not modelled across "
                        "the WAN yet: give every site the same gpu")
    plan = site_aware(plan, cluster)  # the same rank order for the one-site reference
    ref = simulate(model, single_site(cluster), plan, fidelity=fidelity)
    site, splan = site_of(cluster, plan)
    inner = simulate(model, site, splan, fidelity=fidelity)
    return SiteSteps(plan, ref, site, inner, gradient(model, splan))  # grad: activation dtype


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
    site, inner, grad = st.site, st.inner, st.grad
    t = inner.iteration_time_s
    ranks = site.world_size
    exchange = _wan_allreduce_s if fidelity == "analytic" else _wan_allreduce_des
    if sync.kind == "hierarchical":
        wan = exchange(cluster, grad.raw_bytes, ranks)
        return _result(sync, plan, t, t + wan, wan, wan, ref.tokens_per_s, inner.warnings)
    if sync.kind == "two-stage":  # the important share blocks, the rest runs under the next step
        first = exchange(cluster, grad.raw_bytes * sync.fraction, ranks)
        rest = exchange(cluster, grad.raw_bytes * (1 - sync.fraction), ranks) \
            if sync.fraction < 1 else 0.0
        step = first + max(t, rest)
        return _result(sync, plan, t, step, first + rest, step - t, ref.tokens_per_s,
                       inner.warnings)
    # DiLoCo: the pseudo-gradient in its dtype, then the outer step on each rank's shard
    nbytes = grad.elements * PAYLOAD_BYTES[sync.dtype]
    outer = outer_step_s(site.gpu, grad.elements / ranks)
    if sync.kind == "diloco":
        wan = exchange(cluster, nbytes, ranks) + outer
        step, exposed = t + wan / sync.H, wan / sync.H
    else:
        frag = exchange(cluster, nbytes / sync.fragments, ranks) + outer / sync.fragments
        wan = frag * sync.fragments
        window = sync.H * t + sync.fragments * max(0.0, frag - sync.overlap * t)
        per_H = max(window, wan)
        step, exposed = per_H / sync.H, per_H / sync.H - t
    return _result(sync, plan, t, step, wan, exposed, ref.tokens_per_s, inner.warnings)


def _result(sync: SiteSync, plan: Plan, inner_s: float, step: float, wan: float,
            exposed: float, single: float, warnings: Any) -> SiteResult:
    tokens = plan.global_batch_size * plan.seq_len / step
    return SiteResult(sync, tokens, step, inner_s, wan, exposed, single, list(warnings))


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
