"""What every part of the analytic tier's iteration reads: the model, cluster, plan and
cost model, each group's fabric, the layers' times, and one collective's seconds."""

from __future__ import annotations

from sim.cost import compute as cm
from sim.cost.costmodel import CostModel
from sim.layout.placement import group_span
from sim.network.algorithms import collective_time
from sim.network.alphabeta import Fabric, fabric_for
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["Ctx"]


class Ctx:
    """Inputs shared by every stage, computed once per call."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel,
                 local: ClusterSpec | None = None) -> None:
        self.m, self.c, self.p, self.cost = model, cluster, plan, cost
        self.fabric: dict[str, Fabric] = {  # a replica's own groups on its own node fabric
            g: fabric_for(local if local and g in ("tp", "cp", "pp", "emb") else cluster,
                          group_span(plan, cluster, g))
            for g in ("tp", "cp", "ep", "pp", "dp", "edp", "emb")}
        self.dense = cm.layer_time(cost, model, plan)
        self.moe = cm.layer_time(cost, model, plan, moe=True) if model.is_moe else self.dense
        self.e = plan.activation_bytes
        self.tokens = plan.local_tokens
        self.overlap = cluster.comm_overlap
        self.buckets: list[list[tuple[float, float]]] | None = None  # per rank, when needed
        self.chunk_buckets: list[list[list[tuple[float, float]]]] | None = None  # and chunk
        self.bucket_s: dict[tuple[str, float, float], float] = {}

    def coll(self, group: str, kind: str, size: float) -> float:
        """Seconds of one collective: measured (profile fit) if the cost model has it,
        else the alpha-beta link model with the plan's algorithm."""
        fabric = self.fabric[group]
        if fabric.span.size > 1 and size > 0:
            measured = self.cost.collective(kind, fabric.span.size, fabric.span.nodes > 1, size)
            if measured is not None:
                return measured
        algo = self.p.algorithm("dp" if group == "edp" else group)
        return collective_time(kind, fabric, size, algo)

    def off_dp_links(self, waits: dict[str, float]) -> float:
        """Seconds of ``waits`` (blocking collectives by group) whose links data-parallel
        traffic does not use: a group inside one node while every data-parallel group
        crosses nodes, whose NICs bound it (ZeRO-2/3's traffic goes on beside such
        collectives, as in the DES; where a data-parallel group has several ranks in a node
        its hops inside the node share NVLink with them, which the DES charges and this
        leaves out)."""
        spans = [self.fabric[g].span for g in ("dp", "edp") if self.fabric[g].span.size > 1]
        crosses = bool(spans) and all(s.nodes > 1 for s in spans)
        return sum(s for g, s in waits.items() if crosses and self.fabric[g].span.nodes == 1)
