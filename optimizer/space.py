"""The search space: every valid plan of a model on a cluster, generated valid by
construction (degrees are drawn only from divisors that satisfy every rule), so nothing is
built and then rejected. A test checks that every generated plan passes ``sim.validate``.

Dimensions: ``tp`` (divides heads and kv heads, at most one node), ``cp`` (divides
``seq_len / 2``, at most 8), ``pp`` (divides the layers), ``dp`` the rest, ``ep`` (divides dp
and the experts), micro-batch size (divides the per-replica batch, at most 8), schedule
(1F1B; interleaved with every ``vpp`` that divides the layers per stage when the
micro-batches are a multiple of ``pp``; DualPipeV with ``2 pp`` micro-batches), ZeRO
stage (2 and 3 only without pipelining, as in Megatron-LM and DeepSpeed's pipeline
engine), recompute (none, full, the attention core only without flash attention; an MoE
plan with none that does not fit in memory re-runs the norms and expert activations
instead where that fits),
sequence parallelism (with ``tp > 1``; required with EP), context parallelism's exchange
(the ring; the all-gather for torchtitan; the local moves try the others), and the
placement: the default
``tp-cp-ep-dp-pp`` (TP innermost, pipeline outermost) or ``tp-cp-ep-pp-dp`` (pipeline stages
of a replica on neighbouring nodes). Uneven layer splits and collective algorithms are
explored by the local moves of the search, not enumerated.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from optimizer.constraints import Constraints
from sim.errors import SpecError
from sim.layout.memory import memory_verdict
from sim.layout.stages import even_split
from sim.spec.cluster import ClusterSpec
from sim.spec.experts import check_experts_model
from sim.spec.limits import MAX_DUALPIPEV_RANK_MICROBATCHES
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["SearchSpace", "divisors", "plans"]

PLACEMENTS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")


def divisors(n: int, limit: int | None = None) -> list[int]:
    """Divisors of ``n`` up to ``limit``, ascending: ``divisors(12, 6) == [1, 2, 3, 4, 6]``."""
    return [d for d in range(1, min(n, limit or n) + 1) if n % d == 0]


@dataclass(frozen=True)
class SearchSpace:
    model: ModelSpec
    cluster: ClusterSpec
    global_batch_size: int
    seq_len: int
    dtype: str = "bf16"
    max_micro_batch: int = 8
    max_cp: int = 8
    attention: str = "flash"  # implementation choices held fixed, not searched
    overlap_grad_reduce: bool = True
    constraints: Constraints = Constraints()  # framework, ZeRO ceiling, fixed degrees, ...

    def _tps(self) -> list[int]:
        m = self.model
        return [t for t in divisors(self.cluster.world_size, self.cluster.gpus_per_node)
                if m.num_heads % t == 0 and m.kv_heads % t == 0]

    def _cps(self, rest: int) -> list[int]:
        limit = max(self.max_cp, self.constraints.fixed_value("cp") or 0)
        return [c for c in divisors(rest, limit) if (self.seq_len // 2) % c == 0
                and (c == 1 or self.seq_len % (2 * c) == 0)]

    def _experts(self, tp: int, cp: int, dp: int) -> list[tuple[int, int | None]]:
        """(ep, etp) of an MoE model: experts on the tensor-parallel group (etp null, ``ep``
        splitting the rest of the stage) or, with tp > 1, not tensor-parallel at all (etp 1,
        an expert group may take in the TP ranks): the rules of :mod:`sim.spec.experts`."""
        if not self.model.is_moe:
            return [(1, None)]
        out: list[tuple[int, int | None]] = []
        for etp in ([tp, 1] if tp > 1 else [1]):
            out += [(ep, None if etp == tp else etp) for ep in divisors(tp * cp * dp // etp)
                    if self.model.num_experts % ep == 0
                    and all((etp * ep) % q == 0 or q % (etp * ep) == 0 for q in (tp * cp, tp))]
        return out

    def _keep(self, name: str, values: list[int]) -> list[int]:
        fixed = self.constraints.fixed_value(name)
        return values if fixed is None else [v for v in values if v == fixed]

    def degrees(self) -> Iterator[tuple[int, int, int, int, int, int | None]]:
        """(tp, cp, pp, dp, ep, etp) with tp*cp*pp*dp = world and every divisibility rule."""
        world, layers = self.cluster.world_size, self.model.num_layers
        # a layer count no pipeline depth >= 4 of the cluster divides (94, 61, 126 layers)
        # is split unevenly over any depth; others keep depths that divide it
        uneven = not any(layers % q == 0 for q in divisors(world) if q >= 4)
        for tp in self._keep("tp", self._tps()):
            for cp in self._keep("cp", self._cps(world // tp)):
                for pp in self._keep("pp", divisors(world // (tp * cp))):
                    dp = world // (tp * cp * pp)
                    if pp > layers or (layers % pp and not uneven) \
                            or self.global_batch_size % dp or self._keep("dp", [dp]) != [dp]:
                        continue
                    for ep, etp in self._experts(tp, cp, dp):
                        if self._keep("ep", [ep]):
                            yield tp, cp, pp, dp, ep, etp

    def _schedules(self, pp: int, micro: int) -> list[tuple[str, int]]:
        """1F1B, interleaved 1F1B with each vpp that divides the layers a stage holds
        (and, when pp does not divide the layers, each power of two up to them), and
        DualPipeV (at least ``2 pp`` micro-batches and layers); layers that the virtual
        stages do not divide are split as evenly as they go
        (:func:`sim.layout.stages.even_split`)."""
        out = [("1f1b", 1)]
        per_stage = self.model.num_layers // pp
        vpps = set(divisors(per_stage))
        if self.model.num_layers % pp:  # uneven anyway: the powers of two too, as published
            vpps |= {2 ** k for k in range(1, per_stage.bit_length()) if 2 ** k <= per_stage}
        if pp > 1 and micro % pp == 0:
            out += [("interleaved-1f1b", v) for v in sorted(vpps) if v > 1]
        if pp > 1 and 2 * pp <= micro <= MAX_DUALPIPEV_RANK_MICROBATCHES // pp \
                and self.model.num_layers >= 2 * pp:
            out.append(("dualpipev", 2))  # DualPipeV: two stages a rank, in a V
        vpp = self.constraints.fixed_value("vpp")
        return out if vpp is None else [(s, v) for s, v in out if v == vpp]

    def _recomputes(self) -> tuple[str, ...]:
        """none and full; selective (the attention core) only without flash attention, where
        the core keeps the s x s scores (with it the core keeps nothing worth re-running)."""
        return ("none", "full") if self.attention == "flash" else ("none", "selective", "full")

    def _lightened(self, plan: Plan) -> Plan:
        """A plan with no recomputation that does not fit in memory (the device's, or the
        user's budget), with selective recomputation of an MoE model's norms, expert
        activations or both (the cheapest that fits) instead: it costs little, and where
        the plain plan fits it only costs. Dense layers have no norm to re-run under flash
        attention (fused into the next linear layer,
        :func:`sim.spec.recompute.recomputed_norms`), and Megatron-LM's fp8 refuses both
        modules."""
        if plan.recompute != "none" or not self.model.is_moe or plan.dtype == "fp8":
            return plan
        if self._fits(plan):
            return plan
        for modules in (("layernorm",), ("moe_act",), ("layernorm", "moe_act")):  # cheapest
            lighter = dataclasses.replace(plan, recompute="selective", recompute_modules=modules)
            if self._fits(lighter):
                return lighter
        return plan

    def _fits(self, plan: Plan) -> bool:
        peak, capacity = memory_verdict(self.model, self.cluster, plan)
        budget = self.constraints.max_memory_gib
        return peak <= (capacity if budget is None else min(capacity, budget))

    def _tail(self, tp: int, pp: int, moe_sp: bool, cp: int
              ) -> Iterator[tuple[int, str, bool, str]]:
        """(zero stage, recompute, sequence parallel, placement)."""
        zeros = tuple(z for z in ((0, 1, 2, 3) if pp == 1 else (0, 1))
                      if z <= self.constraints.max_zero_stage)
        recomputes = self._recomputes()
        sps: tuple[bool, ...] = (True,) if tp > 1 and moe_sp else \
            ((False, True) if tp > 1 else (False,))
        if (self.seq_len // cp) % tp:  # SP splits the local sequence over TP
            sps = tuple(sp for sp in sps if not sp)
        places = PLACEMENTS if pp > 1 else PLACEMENTS[:1]
        yield from itertools.product(zeros, recomputes, sps, places)

    def _overlapped(self, plan: Plan) -> Plan:
        """The plan with Megatron-LM's all-to-all overlap (merged forward/backward steps)
        wherever its rules (:mod:`sim.spec.experts`) allow it and it still fits in memory (a
        merged step holds one more micro-batch): trainsim's model never makes a step slower
        with it."""
        try:
            merged = dataclasses.replace(plan, moe_overlap="a2a")
            check_experts_model(merged, self.model)
        except SpecError:
            return plan
        peak, capacity = memory_verdict(self.model, self.cluster, merged)
        return merged if peak <= capacity else plan

    def __iter__(self) -> Iterator[Plan]:
        for tp, cp, pp, dp, ep, etp in self.degrees():
            per_replica = self.global_batch_size // dp
            limit = max(self.max_micro_batch,
                        self.constraints.fixed_value("micro_batch_size") or 0)
            for mbs in self._keep("micro_batch_size", divisors(per_replica, limit)):
                micro = per_replica // mbs
                tails = self._tail(tp, pp, self.model.is_moe, cp)
                for (schedule, vpp), tail in itertools.product(self._schedules(pp, micro),
                                                               tails):
                    zero, recompute, sp, placement = tail
                    plan = Plan(self.global_batch_size, self.seq_len, mbs, dp, tp, pp, cp, ep,
                                vpp, schedule, zero, recompute, sp, self.dtype, placement,
                                layers_per_stage=even_split(self.model.num_layers, pp * vpp),
                                attention=self.attention, etp=etp,
                                overlap_grad_reduce=self.overlap_grad_reduce,
                                cp_comm=self._cp_comm(cp))
                    plan = self._overlapped(self._lightened(plan))
                    if self.constraints.framework == "any" \
                            or self.constraints.admits(plan, self.model):
                        yield plan

    def _cp_comm(self, cp: int) -> str:
        """Context parallelism's exchange: the K/V ring (hidden behind the attention core
        where it is long), or the all-gather for torchtitan, which runs no other; the
        search's local moves try the others where the ring is exposed."""
        return "allgather" if cp > 1 and self.constraints.framework == "torchtitan" else "p2p"


def plans(model: ModelSpec, cluster: ClusterSpec, global_batch_size: int, seq_len: int,
          dtype: str = "bf16") -> Iterator[Plan]:
    return iter(SearchSpace(model, cluster, global_batch_size, seq_len, dtype))
