"""The forward and backward of one chunk (a virtual stage's layers, one micro-batch): per
layer the compute from the cost model and the layer's collectives — TP all-reduces or
all-gather/reduce-scatter, the context-parallel K/V ring beside the attention, expert
all-to-alls — and the embedding's and output layer's TP collectives. A chunk whose work
meets no other traffic (TP memoised; no CP, EP or ZeRO-3) runs as one delay.
"""

from __future__ import annotations

from typing import cast

import simpy

from sim.cost import compute as cm
from sim.cost.overlap import cp_steps, ep_steps, exchange_passes, exposed, held, tp_steps
from sim.des.comm import Collectives
from sim.des.context import Context, Proc, Unit
from sim.des.data_parallel import DataParallel
from sim.des.fused import fused
from sim.layout.memory import chunk_edge_params, layer_rank_params
from sim.layout.placement import group_span
from sim.layout.routing import dispatches, replay_dispatches
from sim.layout.stages import cp_exchanges, edge_tp_collectives, first_stage, last_stage, tp_pass
from sim.spec.recompute import reruns_core, stops_early
from sim.spec.routing import comm_sm_share
from sim.spec.zero import regathers

__all__ = ["Layers"]


_PASS = {"full": "B", "input": "I", "weight": "W"}  # trace names of a backward's parts


def _name(tag: tuple) -> str:
    """A trace name for a layer's pass tag, ``(pass, micro-batch, virtual stage, layer)``:
    ``F3 v0 L2``."""
    return f"{tag[0]}{tag[1]} v{tag[2]} L{tag[3]}"


class Layers:
    """Forward and backward passes over a unit's layers."""

    def __init__(self, x: Context, comm: Collectives, dp: DataParallel) -> None:
        self.x, self.comm, self.dp = x, comm, dp
        # TP collectives fused with their GEMMs (plan.tp_overlap) where a share of the GEMMs
        # hides them; else run as without (a stack's 0, or a CPU whose collectives hold its
        # cores: exactly the plan without it)
        self.tp_fused = x.p.tp_overlap and x.c.gpu.tp_overlap_eff > 0 and x.core is None
        self._ways: dict[tuple[bool, bool], list[list[tuple[str, float]]]] = {}
        # units in a merged forward/backward step (moe_overlap a2a): their expert
        # all-to-alls, started and not waited for, as (start, process) pairs
        self.merged: dict[Unit, list[tuple[float, simpy.Process]]] = {}

    # Sizes and passes -----------------------------------------------------------------------
    def _tp_ops(self, moe: bool = False, replay: bool = False) -> list[tuple[str, float]]:
        """One TP pass over a layer, as (collective, bytes): an all-reduce, or an all-gather
        and a reduce-scatter, per block (:func:`sim.layout.stages.tp_pass`)."""
        act = self.x.tp_bytes()
        return [(kind, act * scale) for kind, scale in tp_pass(self.x.m, self.x.p, moe, replay)]

    def _dispatches(self, forward: bool, replay: bool = False) -> list[list[tuple[str, float]]]:
        """Dispatch and combine of one MoE layer in a forward or backward pass, or in the
        replay (:func:`sim.layout.routing.dispatches`, ``replay_dispatches``)."""
        key = (forward, replay)
        if key not in self._ways:
            x = self.x
            nodes = group_span(x.p, x.c, "ep").nodes
            self._ways[key] = replay_dispatches(x.m, x.p, nodes) if replay else \
                dispatches(x.m, x.p, nodes, forward)
        return self._ways[key]

    def _comm_passes(self, u: Unit, moe: bool, passes: int, tag: tuple,
                     hide: tuple[float, ...] = (), backward: bool = False) -> Proc:
        """``passes`` forward-shaped TP passes and, for an MoE layer, expert all-to-alls:
        waited for, run beside ``hide[i]`` seconds of the pass's shared expert
        (``shared-expert`` overlap), fused with the experts' GEMMs (``operator``), or left
        running in a merged step (``a2a``). In a backward with two passes the first is the
        recomputed forward."""
        x = self.x
        for i in range(passes):
            replay = backward and passes == 2 and i == 0
            forward = not backward or replay
            if self.tp_fused:  # dense layers only (validated)
                steps = tp_steps(x.dense_t, self._tp_ops(False, replay), not forward)
                yield from fused(x, self.comm, u, "tp", steps, tag + (i, "tp"),
                                 f"{_name(tag)} tp", x.c.gpu.tp_overlap_eff)
            else:
                for j, (coll, size) in enumerate(self._tp_ops(moe, replay)):
                    yield from self.comm.blocking(u, "tp", coll, size, tag + (i, j))
            if not (moe and x.p.ep > 1):
                continue
            if x.p.moe_overlap == "operator":
                steps = ep_steps(x.moe_t, self._dispatches(forward, replay), not forward)
                beside = yield from fused(x, self.comm, u, "ep", steps, tag + (i, "ep"),
                                          f"{_name(tag)} experts")
                yield from self._sm_share(u, beside)
            elif u in self.merged:
                self.merged[u].append((x.env.now, x.env.process(
                    self._ep_chain(u, tag + (i,), forward, replay))))
            elif hide:
                t0 = x.env.now
                chain = x.env.process(self._ep_chain(u, tag + (i,), forward, replay))
                yield from x.compute(u, hide[i], f"shared expert {tag}")
                ended = cast(float, chain.value) if chain.triggered else x.env.now
                beside = min(x.env.now, ended) - t0
                yield from x.wait(u, "ep", chain, "ep (beside the shared expert)")
                x.acct[u].comm_total["ep"] += cast(float, chain.value) - t0
                yield from self._sm_share(u, beside)
            else:
                for j, parts in enumerate(self._dispatches(forward, replay)):
                    yield from self.comm.blocking_all(u, "ep", parts, tag + (i, "ep", j))

    def _ep_chain(self, u: Unit, tag: tuple, forward: bool, replay: bool = False) -> Proc:
        """Dispatch then combine, off the unit's critical path; returns when it ended."""
        x = self.x
        for j, parts in enumerate(self._dispatches(forward, replay)):
            events = [self.comm.collective(u, "ep", coll, size,
                                           tag + ("ep", j) + ((coll,) if len(parts) > 1 else ()))
                      for coll, size in parts]
            yield simpy.AllOf(x.env, events)
        return x.env.now

    def merge(self, u: Unit) -> None:
        """A merged forward/backward step starts (``a2a`` overlap)."""
        self.merged[u] = []

    def join(self, u: Unit) -> Proc:
        """The merged step ends once its expert all-to-alls have."""
        x = self.x
        chains = self.merged.pop(u)
        if not chains:
            return
        waited = x.env.now
        yield from x.wait(u, "ep", simpy.AllOf(x.env, [c for _, c in chains]),
                          "ep (merged step)")
        busy, reach = 0.0, float("-inf")  # seconds with any all-to-all of the step running
        for t0, end in sorted((t0, cast(float, c.value)) for t0, c in chains):
            busy += max(0.0, end - max(t0, reach))
            reach = max(reach, end)
        x.acct[u].comm_total["ep"] += busy
        yield from self._sm_share(u, busy - (x.env.now - waited))

    def _sm_share(self, u: Unit, beside: float) -> Proc:
        """Compute that ran ``beside`` seconds next to the exchange had ``S`` of the GPU's
        ``N`` SMs taken by its kernels: ``beside x S / N`` more seconds of it, counted as
        exposed expert-parallel time (as the analytic tier does)."""
        x = self.x
        share = comm_sm_share(x.p, x.c.gpu.sm_count)
        if share and beside > 0:
            yield from x.wait(u, "ep", x.env.timeout(beside * share),
                              "ep (its kernels' SMs slow the compute beside it)")

    def _beside(self, moe: bool, backward: bool) -> tuple[float, ...]:
        """Per comm pass, the seconds of the layer's compute that run beside its exchanges
        rather than before them: the shared expert's (``shared-expert`` overlap with expert
        parallelism), or the GEMMs and the compute beside fused exchanges (``operator``,
        ``tp_overlap``); else nothing."""
        x = self.x
        if self.tp_fused:
            return tuple(held(tp_steps(x.dense_t, self._tp_ops(replay=r), not f))
                         for f, r in exchange_passes(x.p.recompute, backward))
        if moe and x.p.ep > 1 and x.p.moe_overlap == "operator":
            return tuple(held(ep_steps(x.moe_t, self._dispatches(f, r), not f))
                         for f, r in exchange_passes(x.p.recompute, backward))
        if not (moe and x.p.ep > 1 and x.p.moe_overlap == "shared-expert"):
            return ()
        lt = x.moe_t
        if not backward:
            return (lt.shared_forward,)
        return (lt.shared_forward, lt.shared_backward) if x.p.recompute == "full" else \
            (lt.shared_backward,)

    def _with_cp(self, u: Unit, lt: cm.LayerTime, seconds: float, core: float,
                 backward: bool, tag: tuple, name: str) -> Proc:
        """A layer's ``seconds`` of compute, ``core`` of them the attention core's, with
        context parallelism's exchange (:func:`sim.layout.stages.cp_exchanges`): the
        ``p2p`` ring beside the core, its excess exposed; ``allgather`` and ``a2a`` waited
        for, the first before the compute, the rest after it; ``a2a`` under operator
        overlap fused with ``lt``'s projections (:mod:`sim.cost.overlap`)."""
        x = self.x
        parts = cp_exchanges(x.m, x.p, backward)
        if not parts:
            yield from x.compute(u, seconds, name)
            return
        if x.p.cp_comm == "a2a" and x.p.moe_overlap == "operator":
            passes = cp_steps(lt, parts, backward, x.p.recompute == "full")
            yield from x.compute(u, max(0.0, seconds - sum(held(p) for p in passes)), name)
            for j, steps in enumerate(passes):
                yield from fused(x, self.comm, u, "cp", steps, tag + (j,), name)
            return
        if x.p.cp_comm != "p2p":
            split = max(1, len(parts) - 1)  # of two or more, the last after the compute
            for j, (coll, size) in enumerate(parts[:split]):
                yield from self.comm.blocking(u, "cp", coll, size, tag + (j,))
            yield from x.compute(u, seconds, name)
            for j, (coll, size) in enumerate(parts[split:], split):
                yield from self.comm.blocking(u, "cp", coll, size, tag + (j,))
            return
        t0 = x.env.now
        (coll, ring_bytes), = parts
        core = min(core, seconds)  # a shared expert's share may hide part of the layer
        if x.core is not None:  # no overlap: the ring, then the compute
            yield from x.wait(u, "cp", self.comm.collective(u, "cp", coll, ring_bytes, tag),
                              "cp ring")
            x.acct[u].comm_total["cp"] += x.env.now - t0
            yield from x.compute(u, seconds, name)
            return
        ring = self.comm.collective(u, "cp", coll, ring_bytes, tag)
        ring_end: list[float] = []
        ring.callbacks.append(lambda _e: ring_end.append(x.env.now))
        yield from x.compute(u, core, name + " core")
        yield from x.wait(u, "cp", ring, "cp ring")
        x.acct[u].comm_total["cp"] += ring_end[0] - t0
        yield from x.compute(u, seconds - core, name)

    def _fast(self, u: Unit, layers: list[bool], backward: bool
              ) -> tuple[float, float, float] | None:
        """(compute, exposed tp, all tp) seconds of a whole chunk when nothing in it
        interacts with other traffic: TP memoised, no CP, no ZeRO-3, no MoE layer under TP
        (its blocks differ), no expert parallelism (expert all-to-alls never qualify: the
        data-parallel group holds the expert-parallel ranks, so EP links always carry other
        traffic too). Under ``tp_overlap`` each pass's collectives are fused with their
        GEMMs (:func:`sim.cost.overlap.exposed`)."""
        x, p, comm = self.x, self.x.p, self.comm
        solo_tp = p.tp == 1 or comm.memoised("tp", x.tp_devices(u.rank0))
        if p.cp > 1 or p.zero_stage == 3 or p.ep > 1 or not solo_tp or (
                any(layers) and p.tp > 1):
            return None
        compute = sum((lt.backward + self._recompute(lt)) if backward else lt.forward
                      for lt in (x.moe_t if moe else x.dense_t for moe in layers))
        n = len(layers)
        if self.tp_fused:
            share = x.scale[u] * x.c.gpu.tp_overlap_eff
            tp = total = 0.0
            for forward, replay in exchange_passes(x.p.recompute, backward):
                steps = tp_steps(x.dense_t, self._tp_ops(replay=replay), not forward)
                times = [comm.solo(u, "tp", c, size, n) for parts, _, _ in steps
                         for c, size in parts]
                tp, total = tp + n * exposed(times, steps, share), total + n * sum(times)
            return compute, tp, total
        passes = (2 if p.recompute == "full" else 1) if backward else 1
        ops = self._tp_ops()
        replayed = self._tp_ops(replay=True) if passes == 2 else ops
        if replayed == ops:
            tp = passes * n * sum(comm.solo(u, "tp", c, size, passes * n) for c, size in ops)
        else:  # a replay that stops early (sim.layout.stages.tp_pass)
            tp = n * sum(comm.solo(u, "tp", c, size, n) for c, size in ops + replayed)
        return compute, tp, tp

    def _recompute(self, lt: cm.LayerTime) -> float:
        return lt.replay(self.x.p.recompute, stops_early(self.x.p))

    def _extras(self, vs: int) -> tuple[float, float]:
        """(forward, backward) seconds of the embedding (first virtual stage) and the output
        layer and loss (last)."""
        x = self.x
        fwd = bwd = 0.0
        if first_stage(x.p, vs):
            f, b = x.cost.embedding(x.p.local_tokens, x.m.hidden_size, x.m.vocab_size,
                                    x.p.activation_dtype)
            fwd, bwd = fwd + f, bwd + b
        if last_stage(x.p, vs):
            total = cm.logits_time(x.cost, x.m, x.p)
            fwd, bwd = fwd + total / 3, bwd + 2 * total / 3
        return fwd, bwd

    def _weight_extra(self, vs: int) -> float:
        """The output layer's weight gradient (its share of the logits: one GEMM's)."""
        x = self.x
        return cm.logits_weight_time(x.cost, x.m, x.p) if last_stage(x.p, vs) else 0.0

    # Passes -------------------------------------------------------------------------------
    def forward(self, u: Unit, vs: int, mb: int) -> Proc:
        x = self.x
        layers = x.vs_layers[vs]
        fwd_extra, _ = self._extras(vs)
        fast = self._fast(u, layers, backward=False)
        if fast:
            yield from self._whole_chunk(u, vs, mb, "F", fast[0] + fwd_extra, *fast[1:])
            return
        yield from x.compute(u, fwd_extra, f"F{mb} v{vs} extra")
        gather = self.dp.z3_gather(u, layers, 0, ("F", mb, vs))
        for i, moe in enumerate(layers):
            lt = x.moe_t if moe else x.dense_t
            if gather is not None:
                yield from x.wait(u, "dp", gather, "zero3 gather")
                gather = self.dp.z3_gather(u, layers, i + 1, ("F", mb, vs))
            hide = self._beside(moe, backward=False)
            yield from self._with_cp(u, lt, lt.forward - sum(hide), lt.attention_forward, False,
                                     ("Fcp", mb, vs, i), f"F{mb} v{vs} L{i}")
            yield from self._comm_passes(u, moe, 1, ("F", mb, vs, i), hide)
        yield from self._edge(u, vs, "F", ("F", mb, vs))

    def backward(self, u: Unit, vs: int, mb: int, part: str = "full") -> Proc:
        """``part``: ``full``, or DualPipeV's ``input`` gradient (its collectives, no
        gradient for the data-parallel stream) and ``weight`` gradient (the layers' GEMMs
        again, then the gradients handed on)."""
        x, dp = self.x, self.dp
        layers = x.vs_layers[vs]
        _, bwd_extra = self._extras(vs)
        w_extra = self._weight_extra(vs)
        reduce_now = part != "input" and dp.reduces_after(u, mb)
        # replicas meet in the gradient reduction after their last micro-batch, whichever
        # it is (uneven splits); ZeRO-2 reduces after every one
        gtag = ("B", mb if x.p.zero_stage == 2 else "last", vs)
        fast = None if reduce_now or part != "full" else self._fast(u, layers, backward=True)
        if fast:
            yield from self._whole_chunk(u, vs, mb, "B", fast[0] + bwd_extra, *fast[1:])
            return
        yield from self._layers_backward(u, vs, mb, layers, reduce_now, gtag, part)
        extra = {"full": bwd_extra, "input": bwd_extra - w_extra, "weight": w_extra}[part]
        yield from x.compute(u, extra, f"{_PASS[part]}{mb} v{vs} extra")
        if part != "weight":
            yield from self._edge(u, vs, "B", ("B", mb, vs))
        if reduce_now and x.p.zero_stage < 3:
            dp.grad_ready(u, chunk_edge_params(x.m, x.p, vs), 0.0, gtag)
            dp.flush(u, gtag)
        if x.p.zero_stage >= 2 and part != "input":
            yield from dp.settle(u)

    def _layers_backward(self, u: Unit, vs: int, mb: int, layers: list[bool],
                         reduce_now: bool, gtag: tuple, part: str = "full") -> Proc:
        """The layers' backward in reverse, each one's gradient handed to the data-parallel
        stream as it is ready (the weight part: the layers' GEMMs again, no collective of
        its own and no ZeRO-3 gather, the input part having had the weights)."""
        x, dp = self.x, self.dp
        passes = 2 if x.p.recompute == "full" else 1
        if part == "weight":
            for i in reversed(range(len(layers))):
                lt = x.moe_t if layers[i] else x.dense_t
                yield from x.compute(u, lt.weight_grad, f"W{mb} v{vs} L{i}")
                self._hand_on(u, layers[i], reduce_now, gtag, ("B", mb, vs, i))
            return
        gather = dp.z3_gather(u, layers, len(layers) - 1, ("B", mb, vs)) \
            if regathers(x.p) else None  # else kept from the forward
        for i in reversed(range(len(layers))):
            moe = layers[i]
            lt = x.moe_t if moe else x.dense_t
            if gather is not None:
                yield from x.wait(u, "dp", gather, "zero3 gather")
                gather = dp.z3_gather(u, layers, i - 1, ("B", mb, vs))
            hide = self._beside(moe, backward=True)
            weight = lt.weight_grad if part == "input" else 0.0
            seconds = max(0.0, lt.backward + self._recompute(lt) - sum(hide) - weight)
            core = lt.attention_backward + (lt.attention_forward if reruns_core(x.p) else 0.0)
            yield from self._with_cp(u, lt, seconds, core, True, ("Bcp", mb, vs, i),
                                     f"B{mb} v{vs} L{i}")
            yield from self._comm_passes(u, moe, passes, ("B", mb, vs, i), hide, backward=True)
            if part == "full":
                self._hand_on(u, moe, reduce_now, gtag, ("B", mb, vs, i))

    def _hand_on(self, u: Unit, moe: bool, reduce_now: bool, gtag: tuple, tag: tuple) -> None:
        """A layer's gradient to the data-parallel stream: ZeRO-3's reduce-scatter, or
        into the bucket when this backward reduces."""
        x = self.x
        if x.p.zero_stage == 3:
            self.dp.z3_reduce(u, moe, tag)
        elif reduce_now:
            self.dp.grad_ready(u, *layer_rank_params(x.m, x.p, moe), gtag)

    def _edge(self, u: Unit, vs: int, which: str, tag: tuple) -> Proc:
        """The TP collectives of the embedding (first virtual stage) or of the output layer
        and loss (last) in pass ``which`` (:func:`sim.layout.stages.edge_tp_collectives`)."""
        x = self.x
        ends = (first_stage(x.p, vs), last_stage(x.p, vs))
        for i, (when, coll, size) in enumerate(edge_tp_collectives(x.m, x.p, *ends)):
            if when == which:
                yield from self.comm.blocking(u, "tp", coll, size, tag + ("edge", i))

    def _whole_chunk(self, u: Unit, vs: int, mb: int, which: str, compute: float, tp: float,
                     tp_all: float) -> Proc:
        """A chunk on the fast path: its compute, its memoised TP collectives' exposed
        ``tp`` seconds (of ``tp_all``) as one delay, then the embedding's or output layer's
        collectives."""
        x = self.x
        yield from x.compute(u, compute, f"{which}{mb} v{vs}")
        if tp > 0:
            yield from x.wait(u, "tp", x.env.timeout(tp), "tp (memoised)")
        x.acct[u].comm_total["tp"] += tp_all
        yield from self._edge(u, vs, which, (which, mb, vs))
