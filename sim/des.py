"""The discrete-event tier: one training iteration simulated in SimPy.

A *unit* is one tensor-parallel group at one pipeline stage (its ranks run in lock step).
Each unit runs its stage's schedule (:mod:`sim.schedule`): per micro-batch and virtual
stage, per layer, compute (from the cost model) and the layer's collectives — TP
all-reduces or all-gather/reduce-scatter, the context-parallel K/V ring beside the
attention, expert all-to-alls; the embedding's and output layer's TP collectives — and
between them Megatron-LM's blocking batched point-to-point calls
(:func:`sim.schedule.stage_program`), whose transfers start once sender and receiver are
both in their calls and run as flows on the network. Gradients are reduced in buckets on a
separate data-parallel stream while backward goes on; ZeRO-3 prefetches each layer's
weights; the first and last stage all-reduce the tied embedding's gradient; the optimizer
step ends it.

Reduction (default): one unit per stage; every collective's flows stand for those of the
groups of its kind that run at the same time on that stage (see :mod:`sim.des_comm`), and
a collective whose links nothing else uses (TP inside a node, typically) is simulated once
per shape and then replayed as a delay. ``reduce=False`` simulates every unit and every
flow; on symmetric cases both give the same iteration time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import simpy

from sim import compute as cm
from sim.alphabeta import default_algorithm, fabric_for
from sim.cluster import ClusterSpec
from sim.costmodel import CostModel
from sim.des_comm import CommEngine
from sim.links import link_table
from sim.memory import layer_rank_params, rank_params
from sim.model import ModelSpec
from sim.network import Network
from sim.placement import group_span, groups_of, rank_coords
from sim.plan import Plan, replica_plan
from sim.result import Timing
from sim.schedule import Exchange, Msg, stage_program
from sim.stages import StageLayers, edge_tp_collectives, virtual_stage_layers
from sim.topology import Topology, build_topology

__all__ = ["simulate_des", "dp_bucket_params", "reducible", "CATEGORIES"]

CATEGORIES = ("compute", "tp", "cp", "ep", "pp", "dp", "optimizer", "bubble")
Proc = Generator[Any, Any, Any]


class _CountingEnv(simpy.Environment):
    """A SimPy environment that counts the events it processes."""

    processed = 0

    def step(self) -> None:
        self.processed += 1
        super().step()


@dataclass(frozen=True)
class Unit:
    stage: int
    dp: int  # data-parallel index (expert-parallel index is dp % ep)
    cp: int
    rank0: int  # logical rank of its first tensor-parallel rank


@dataclass
class _Acct:
    spent: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    comm_total: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("tp", "cp", "ep", "pp", "dp"), 0.0))
    end: float = 0.0
    pipeline_end: float = 0.0


class _Step:
    """One simulated iteration."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel,
                 topo: Topology, reduce: bool, record: bool,
                 compute_scale: Sequence[float] | None = None,
                 comm: CommEngine | None = None, devices: Sequence[int] | None = None) -> None:
        """``comm`` (its environment and network) is shared when several jobs run on one
        fabric (:mod:`sim.multijob`); ``devices`` maps the plan's devices to the cluster's
        (the job's slice of a larger cluster)."""
        self.m, self.c, self.p, self.cost, self.topo = model, cluster, plan, cost, topo
        self.reduce, self.record, self.devices = reduce, record, devices
        env = comm.env if comm else _CountingEnv()
        assert isinstance(env, _CountingEnv)  # a shared one counts events too
        self.env = env
        self.net = comm.net if comm else Network(self.env, topo.cap, topo.lat)
        self.comm = comm or CommEngine(self.env, topo, self.net)
        self.sizes, self.strides = rank_coords(plan)
        self.dense_t = cm.layer_time(cost, model, plan)
        self.moe_t = cm.layer_time(cost, model, plan, moe=True) if model.is_moe else self.dense_t
        self.vs_layers = self._virtual_layers()
        self.units = self._units()
        self.scale = {u: self._unit_scale(u, compute_scale) for u in self.units}
        self.acct = {u: _Acct() for u in self.units}
        self.timeline: list[dict[str, Any]] = []
        self._meetings: dict[tuple, list[Any]] = {}
        self._memo: dict[tuple, tuple[float, list[tuple[int, float, float]]]] = {}
        self._measured_cache: dict[tuple, float | None] = {}
        self._copies: dict[tuple, list[list[int]]] = {}
        self._dp_stream = {u: simpy.Resource(self.env, 1) for u in self.units}
        # Devices whose collectives run on the cores that compute (CPU ranks, gloo): a unit's
        # background collectives (gradient reduction, ZeRO-3 gathers) hold its core, and
        # compute waits for them instead of running beside them.
        self._core = {u: simpy.Resource(self.env, 1) for u in self.units} \
            if cluster.comm_overlap == 0 else None
        self._dp_jobs: dict[Unit, list[simpy.Process]] = {u: [] for u in self.units}
        self._pending: dict[Unit, list[float]] = {}
        self._group_cache: dict[tuple[str, int], list[int]] = {}
        self._seq: dict[Unit, int] = {}
        self._p2p_copies: dict[tuple[int, int], list[list[int]]] = {}
        self._tp_index = {self.dev(r): self._tp_coord(r) for r in range(plan.world_size)}
        self.exclusive = self._exclusive_kinds()
        self.bucket_params = dp_bucket_params(plan)

    # Layout -------------------------------------------------------------------------------
    def dev(self, rank: int) -> int:
        pl = self.p.placement
        d = rank if isinstance(pl, str) else pl[rank]
        return d if self.devices is None else self.devices[d]

    def _virtual_layers(self) -> list[list[bool]]:
        """Per virtual stage, each layer's MoE flag."""
        out, start = [], 0
        m = self.m
        for n in virtual_stage_layers(self.p, m):
            out.append([m.is_moe and (i + 1) % m.moe_layer_step == 0
                        and i not in m.mlp_only_layers for i in range(start, start + n)])
            start += n
        return out

    def _rank0(self, stage: int, dp: int, cp: int) -> int:
        s, ep = self.strides, self.p.ep
        return (stage * s["pp"] + cp * s["cp"] + (dp % ep) * s["ep"] + (dp // ep) * s["dp"])

    def _units(self) -> list[Unit]:
        p = self.p
        dps, cps = (range(1), range(1)) if self.reduce else (range(p.dp), range(p.cp))
        return [Unit(s, d, c, self._rank0(s, d, c)) for s in range(p.pp) for d in dps
                for c in cps]

    def _unit_scale(self, u: Unit, compute_scale: Sequence[float] | None) -> float:
        """A TP group runs in lock step: its compute takes its slowest device's time."""
        if compute_scale is None:
            return 1.0
        return max(compute_scale[d] for d in self._tp_devices(u.rank0))

    def _tp_devices(self, rank0: int) -> list[int]:
        return [self.dev(rank0 + t * self.strides["tp"]) for t in range(self.p.tp)]

    def _exclusive_kinds(self) -> set[str]:
        """Kinds whose groups stay inside a node while no other kind puts two ranks on one
        node: their links carry nothing else, so one simulation per shape is exact."""
        spans = {k: group_span(self.p, self.c, k) for k in ("tp", "cp", "ep", "dp", "pp")}
        out = set()
        for k, span in spans.items():
            others = [s for o, s in spans.items() if o != k and s.size > 1]
            if span.nodes == 1 and all(s.per_node == 1 for s in others):
                out.add(k)
        return out

    # Groups and collectives ---------------------------------------------------------------
    def _group(self, kind: str, unit: Unit, t: int) -> list[int]:
        """Devices of the ``kind`` group of the unit's ``t``-th TP rank (cached)."""
        base = unit.rank0 + t * self.strides["tp"]
        key = (kind, base)
        if key not in self._group_cache:
            ranks = next(g for g in groups_of(self.p, kind, {"pp": unit.stage}) if base in g)
            self._group_cache[key] = [self.dev(r) for r in ranks]
        return self._group_cache[key]

    def _all_copies(self, kind: str, stage: int, devices: list[int]) -> list[list[int]]:
        """Groups of ``kind`` on the stage that the reduced simulation does not run itself:
        for TP the other units' groups; for the other kinds, those of the same TP index
        (each unit runs the groups of all its TP ranks)."""
        tp_index = self._tp_index.get(devices[0], 0)
        key = (kind, stage, tp_index)
        if key not in self._copies:
            groups = groups_of(self.p, kind, {"pp": stage})
            self._copies[key] = [[self.dev(r) for r in g] for g in groups
                                 if kind == "tp" or self._tp_coord(g[0]) == tp_index]
        return self._copies[key]

    def _tp_coord(self, rank: int) -> int:
        return rank // self.strides["tp"] % self.p.tp

    def _algorithm(self, kind: str, coll: str, size: float) -> str:
        chosen = self.p.algorithm("dp" if kind == "edp" else kind)
        if chosen != "auto":
            return chosen
        span = group_span(self.p, self.c, kind)
        return default_algorithm(coll, fabric_for(self.c, span), size)

    def memo_time(self, kind: str, coll: str, algorithm: str, devices: list[int],
                  size: float, copies: list[list[int]] | None, times: float = 1) -> float:
        """Seconds of a collective run alone on the network (for kinds whose links carry
        nothing else), simulated once per shape; each of the ``times`` replays adds its
        link traffic to this simulation's statistics."""
        key = (kind, coll, algorithm, tuple(devices), size)
        if key not in self._memo:
            env = simpy.Environment()
            net = Network(env, self.topo.cap, self.topo.lat)
            env.process(CommEngine(env, self.topo, net).run(coll, algorithm, devices, size,
                                                            copies))
            env.run()
            used = [int(i) for i in (net.stats.bytes > 0).nonzero()[0]]
            self._memo[key] = (env.now, [(i, float(net.stats.bytes[i]),
                                          float(net.stats.busy_s[i])) for i in used])
        seconds, links = self._memo[key]
        for i, b, busy in links:
            self.net.stats.bytes[i] += times * b
            self.net.stats.busy_s[i] += times * busy
        return seconds

    def _run(self, kind: str, coll: str, algorithm: str, devices: list[int], size: float,
             stage: int) -> simpy.Event:
        copies = self._all_copies(kind, stage, devices) if self.reduce else None
        if kind in self.exclusive:
            seconds = self.memo_time(kind, coll, algorithm, devices, size, copies)
            measured = self._measured(kind, coll, size)
            return self.env.timeout(seconds if measured is None else measured)
        return self.env.process(self.comm.run(coll, algorithm, devices, size, copies))

    def _measured(self, kind: str, coll: str, size: float) -> float | None:
        """The profile's time for a collective whose links carry nothing else (measured
        there alone too), as the analytic tier uses it; ``None`` without a profile fit."""
        key = (kind, coll, size)
        if key not in self._measured_cache:
            span = group_span(self.p, self.c, kind)
            self._measured_cache[key] = self.cost.collective(coll, span.size, span.nodes > 1,
                                                             size)
        return self._measured_cache[key]

    def _groups(self, unit: Unit, kind: str) -> list[list[int]]:
        """The groups this unit takes part in: its TP group, or for other kinds the group of
        each of its TP ranks (they may share links with its TP group, so even a reduced
        simulation runs them all)."""
        if kind == "tp":
            return [self._tp_devices(unit.rank0)]
        return [self._group(kind, unit, t) for t in range(self.p.tp)]

    def collective(self, unit: Unit, kind: str, coll: str, size: float, tag: tuple
                   ) -> simpy.Event:
        """Event: the unit's part of a collective over its ``kind`` groups is done (in full
        mode once every member unit has arrived)."""
        if size <= 0 or self._group_size(kind) == 1:
            return self.env.timeout(0)
        algorithm = self._algorithm(kind, coll, size)
        members = 1 if self.reduce or kind == "tp" else self._group_size(kind)
        done = [self._meet((kind, coll, tuple(g), tag), members,
                           partial(self._run, kind, coll, algorithm, g, size, unit.stage))
                for g in self._groups(unit, kind)]
        return simpy.AllOf(self.env, done)

    def _group_size(self, kind: str) -> int:
        return {"tp": self.p.tp, "cp": self.p.cp, "ep": self.p.ep,
                "dp": self.p.dp * self.p.cp, "edp": self.p.dp // self.p.ep * self.p.cp}[kind]

    def _meet(self, key: tuple, members: int, start: Callable[[], simpy.Event]) -> simpy.Event:
        return self._meeting(key, members, start)[1]

    def _meeting(self, key: tuple, members: int, start: Callable[[], simpy.Event]
                 ) -> list[Any]:
        """[arrived, done event, start time]: ``start`` runs once all ``members`` arrived."""
        entry = self._meetings.setdefault(key, [0, self.env.event(), 0.0])
        entry[0] += 1
        if entry[0] == members:
            entry[2] = self.env.now
            start().callbacks.append(partial(_succeed, entry[1]))
        return entry

    # Accounting ---------------------------------------------------------------------------
    def _add(self, u: Unit, what: str, seconds: float) -> None:
        self.acct[u].spent[what] += seconds

    def _log(self, u: Unit, stream: str, name: str, start: float) -> None:
        if self.record and self.env.now > start:
            self.timeline.append({"unit": u, "device": self.dev(u.rank0), "stream": stream,
                                  "name": name, "start": start, "end": self.env.now})

    def _wait(self, u: Unit, what: str, event: simpy.Event, name: str = "") -> Proc:
        t0 = self.env.now
        value = yield event
        self._add(u, what, self.env.now - t0)
        self._log(u, "compute" if what == "compute" else what, name or what, t0)
        return value

    def _compute(self, u: Unit, seconds: float, name: str) -> Proc:
        if self._core is None:
            yield from self._wait(u, "compute", self.env.timeout(seconds * self.scale[u]), name)
            return
        with self._core[u].request() as core:
            yield from self._wait(u, "dp", core, "core busy with dp")
            yield from self._wait(u, "compute", self.env.timeout(seconds * self.scale[u]),
                                  name)

    def _on_core(self, u: Unit, start: Callable[[], simpy.Event]) -> Proc:
        """Run a background collective; on a device without overlap it holds the core.
        Returns when it started (after any wait for the core)."""
        if self._core is None:
            t0 = self.env.now
            yield start()
            return t0
        with self._core[u].request() as core:
            yield core
            t0 = self.env.now
            yield start()
            return t0

    def _blocking(self, u: Unit, kind: str, coll: str, size: float, tag: tuple) -> Proc:
        t0 = self.env.now
        yield from self._wait(u, kind, self.collective(u, kind, coll, size, tag),
                              f"{kind} {coll}")
        self.acct[u].comm_total[kind] += self.env.now - t0

    # Per-layer work ----------------------------------------------------------------------
    @property
    def _act(self) -> float:
        return float(self.p.activation_bytes)

    def _tp_ops(self) -> list[str]:
        """One TP pass over a layer: 2 all-reduces, or 2 all-gathers + 2 reduce-scatters."""
        if self.p.tp == 1:
            return []
        return ["all_gather", "reduce_scatter"] * 2 if self.p.sequence_parallel else \
            ["all_reduce"] * 2

    def _tp_bytes(self) -> float:
        return self.p.local_tokens * self.m.hidden_size * self._act

    def _ep_bytes(self) -> float:
        tokens = self.p.local_tokens / (self.p.tp if self.p.sequence_parallel else 1)
        return tokens * self.m.top_k * self.m.hidden_size * self._act

    def _cp_bytes(self) -> float:
        """Ring all-gather size of one pass: every rank's K and V chunk."""
        return self.p.cp * 2 * self.p.local_tokens * self.m.kv_dim / self.p.tp * self._act

    def _comm_passes(self, u: Unit, moe: bool, passes: int, tag: tuple) -> Proc:
        """``passes`` forward-shaped TP passes and, for an MoE layer, expert all-to-alls."""
        for i in range(passes):
            for j, coll in enumerate(self._tp_ops()):
                yield from self._blocking(u, "tp", coll, self._tp_bytes(), tag + (i, j))
            if moe and self.p.ep > 1:
                for j in range(2):
                    yield from self._blocking(u, "ep", "all_to_all", self._ep_bytes(),
                                              tag + (i, "ep", j))

    def _with_cp(self, u: Unit, seconds: float, cp_bytes: float, tag: tuple, name: str
                 ) -> Proc:
        """Compute beside the context-parallel K/V ring; the ring's excess is exposed."""
        if self.p.cp == 1:
            yield from self._compute(u, seconds, name)
            return
        t0 = self.env.now
        if self._core is not None:  # no overlap: the ring, then the compute
            yield from self._wait(u, "cp", self.collective(u, "cp", "all_gather", cp_bytes,
                                                           tag), "cp ring")
            self.acct[u].comm_total["cp"] += self.env.now - t0
            yield from self._compute(u, seconds, name)
            return
        ring = self.collective(u, "cp", "all_gather", cp_bytes, tag)
        ring_end: list[float] = []
        ring.callbacks.append(lambda _e: ring_end.append(self.env.now))
        yield from self._compute(u, seconds, name)
        yield from self._wait(u, "cp", ring, "cp ring")
        self.acct[u].comm_total["cp"] += ring_end[0] - t0

    def _fast(self, u: Unit, layers: list[bool], backward: bool
              ) -> tuple[float, float, float] | None:
        """(compute, tp, ep) seconds of a whole chunk when nothing in it interacts with
        other traffic (TP and EP memoised, no CP, no ZeRO-3)."""
        p = self.p
        solo_tp = p.tp == 1 or "tp" in self.exclusive
        solo_ep = p.ep == 1 or "ep" in self.exclusive
        if p.cp > 1 or p.zero_stage == 3 or not (solo_tp and solo_ep):
            return None
        passes = (2 if p.recompute == "full" else 1) if backward else 1
        moe_layers = sum(layers)
        tp1 = sum(self._solo(u, "tp", c, self._tp_bytes(), passes * len(layers))
                  for c in self._tp_ops())
        ep1 = 2 * self._solo(u, "ep", "all_to_all", self._ep_bytes(),
                             2 * passes * moe_layers) \
            if p.ep > 1 and moe_layers else 0.0
        compute = sum((lt.backward + self._recompute(lt)) if backward else lt.forward
                      for lt in (self.moe_t if moe else self.dense_t for moe in layers))
        return compute, passes * len(layers) * tp1, passes * moe_layers * ep1

    def _solo(self, u: Unit, kind: str, coll: str, size: float, times: float) -> float:
        """A memoised collective's seconds; it is replayed ``times`` (all TP groups of the
        unit, or for other kinds the groups of all its TP ranks, are credited: their links
        carry the bytes)."""
        algorithm = self._algorithm(kind, coll, size)
        total = 0.0
        for group in self._groups(u, kind):
            copies = self._all_copies(kind, u.stage, group) if self.reduce else None
            total = max(total, self.memo_time(kind, coll, algorithm, group, size, copies,
                                              times))
        measured = self._measured(kind, coll, size)  # as _run: the profile's time wins
        return total if measured is None else measured

    def _recompute(self, lt: cm.LayerTime) -> float:
        return {"full": lt.forward, "selective": lt.attention_forward}.get(self.p.recompute,
                                                                           0.0)

    # Forward and backward of one chunk -----------------------------------------------------
    def _extras(self, vs: int) -> tuple[float, float]:
        """(forward, backward) seconds of the embedding (first virtual stage) and the output
        layer and loss (last)."""
        fwd = bwd = 0.0
        if vs == 0:
            f, b = self.cost.embedding(self.p.local_tokens, self.m.hidden_size,
                                       self.m.vocab_size, self.p.activation_dtype)
            fwd, bwd = fwd + f, bwd + b
        if vs == len(self.vs_layers) - 1:
            total = cm.logits_time(self.cost, self.m, self.p)
            fwd, bwd = fwd + total / 3, bwd + 2 * total / 3
        return fwd, bwd

    def forward(self, u: Unit, vs: int, mb: int) -> Proc:
        layers = self.vs_layers[vs]
        fwd_extra, _ = self._extras(vs)
        fast = self._fast(u, layers, backward=False)
        if fast:
            compute, tp, ep = fast
            yield from self._compute(u, compute + fwd_extra, f"F{mb} v{vs}")
            yield from self._replay(u, tp, ep)
            yield from self._edge(u, vs, "F", ("F", mb, vs))
            return
        yield from self._compute(u, fwd_extra, f"F{mb} v{vs} extra")
        gather = self._z3_gather(u, layers, 0, ("F", mb, vs))
        for i, moe in enumerate(layers):
            lt = self.moe_t if moe else self.dense_t
            if gather is not None:
                yield from self._wait(u, "dp", gather, "zero3 gather")
                gather = self._z3_gather(u, layers, i + 1, ("F", mb, vs))
            yield from self._with_cp(u, lt.forward, self._cp_bytes(), ("Fcp", mb, vs, i),
                                     f"F{mb} v{vs} L{i}")
            yield from self._comm_passes(u, moe, 1, ("F", mb, vs, i))
        yield from self._edge(u, vs, "F", ("F", mb, vs))

    def backward(self, u: Unit, vs: int, mb: int) -> Proc:
        layers = self.vs_layers[vs]
        _, bwd_extra = self._extras(vs)
        reduce_now = self._reduces_after(u, mb)
        # replicas meet in the gradient reduction after their last micro-batch, whichever
        # it is (uneven splits); ZeRO-2 reduces after every one
        gtag = ("B", mb if self.p.zero_stage == 2 else "last", vs)
        fast = None if reduce_now else self._fast(u, layers, backward=True)
        if fast:
            compute, tp, ep = fast
            yield from self._compute(u, compute + bwd_extra, f"B{mb} v{vs}")
            yield from self._replay(u, tp, ep)
            yield from self._edge(u, vs, "B", ("B", mb, vs))
            return
        passes = 2 if self.p.recompute == "full" else 1
        gather = self._z3_gather(u, layers, len(layers) - 1, ("B", mb, vs))
        for i in reversed(range(len(layers))):
            moe = layers[i]
            lt = self.moe_t if moe else self.dense_t
            if gather is not None:
                yield from self._wait(u, "dp", gather, "zero3 gather")
                gather = self._z3_gather(u, layers, i - 1, ("B", mb, vs))
            seconds = lt.backward + self._recompute(lt)
            yield from self._with_cp(u, seconds, 2 * self._cp_bytes(), ("Bcp", mb, vs, i),
                                     f"B{mb} v{vs} L{i}")
            yield from self._comm_passes(u, moe, passes, ("B", mb, vs, i))
            if self.p.zero_stage == 3:
                self._z3_reduce(u, moe, ("B", mb, vs, i))
            elif reduce_now:
                self._grad_ready(u, *layer_rank_params(self.m, self.p, moe), gtag)
        yield from self._compute(u, bwd_extra, f"B{mb} v{vs} extra")
        yield from self._edge(u, vs, "B", ("B", mb, vs))
        if reduce_now and self.p.zero_stage < 3:
            self._grad_ready(u, self._extra_params(vs), 0.0, gtag)
            self._flush(u, gtag)

    def _edge(self, u: Unit, vs: int, which: str, tag: tuple) -> Proc:
        """The TP collectives of the embedding (first virtual stage) or of the output layer
        and loss (last) in pass ``which`` (:func:`sim.stages.edge_tp_collectives`)."""
        ends = (vs == 0, vs == len(self.vs_layers) - 1)
        for i, (when, coll, size) in enumerate(edge_tp_collectives(self.m, self.p, *ends)):
            if when == which:
                yield from self._blocking(u, "tp", coll, size, tag + ("edge", i))

    def _replay(self, u: Unit, tp: float, ep: float) -> Proc:
        """Memoised TP and EP collectives of a whole chunk, as one delay each."""
        if tp > 0:
            yield from self._wait(u, "tp", self.env.timeout(tp), "tp (memoised)")
            self.acct[u].comm_total["tp"] += tp
        if ep > 0:
            yield from self._wait(u, "ep", self.env.timeout(ep), "ep (memoised)")
            self.acct[u].comm_total["ep"] += ep

    def _extra_params(self, vs: int) -> float:
        """Embedding and output-layer parameters held by a virtual stage."""
        m, out = self.m, 0.0
        vh = m.vocab_size * m.hidden_size / self.p.tp
        if vs == 0:
            out += vh + (m.max_seq_len * m.hidden_size
                         if m.position_embedding == "learned" else 0)
        if vs == len(self.vs_layers) - 1 and (not m.tied_embeddings or vs != 0):
            out += vh
        return out

    # Data parallelism --------------------------------------------------------------------
    def _reduces_after(self, u: Unit, mb: int) -> bool:
        """Whether gradients are reduced during this micro-batch's backward."""
        p = self.p
        if p.zero_stage == 2:
            return True
        return p.overlap_grad_reduce and mb == p.replica_microbatches[u.dp] - 1

    def _grad_ready(self, u: Unit, dense: float, expert: float, tag: tuple) -> None:
        pending = self._pending.setdefault(u, [0.0, 0.0])
        pending[0] += dense
        pending[1] += expert
        if pending[0] + pending[1] >= self.bucket_params:
            self._flush(u, tag)

    def _flush(self, u: Unit, tag: tuple) -> None:
        dense, expert = self._pending.get(u, [0.0, 0.0])
        self._pending[u] = [0.0, 0.0]
        if dense + expert <= 0:
            return
        coll = "all_reduce" if self.p.zero_stage == 0 else "reduce_scatter"
        seq = self._seq[u] = self._seq.get(u, 0) + 1
        job = self.env.process(self._dp_job(u, coll, dense, expert, tag + (seq,)))
        self._dp_jobs[u].append(job)

    def _dp_job(self, u: Unit, coll: str, dense: float, expert: float, tag: tuple) -> Proc:
        with self._dp_stream[u].request() as turn:
            yield turn
            t0 = yield from self._on_core(u, lambda: simpy.AllOf(self.env, [
                self.collective(u, "dp", coll, dense * self._act, tag + ("dense",)),
                self.collective(u, "edp", coll, expert * self._act, tag + ("expert",))]))
            self.acct[u].comm_total["dp"] += self.env.now - t0
            self._log(u, "dp", f"dp {coll}", t0)

    def _z3_gather(self, u: Unit, layers: list[bool], i: int, tag: tuple
                   ) -> simpy.Event | None:
        if self.p.zero_stage != 3 or not 0 <= i < len(layers):
            return None
        dense, expert = layer_rank_params(self.m, self.p, layers[i])

        def start() -> simpy.Event:
            return simpy.AllOf(self.env, [
                self.collective(u, "dp", "all_gather", dense * self._act, tag + (i, "gd")),
                self.collective(u, "edp", "all_gather", expert * self._act, tag + (i, "ge"))])
        if self._core is None:
            return start()
        return self.env.process(self._in_stream(u, start))

    def _in_stream(self, u: Unit, start: Callable[[], simpy.Event]) -> Proc:
        """Without overlap the gathers queue with the reductions on the one data-parallel
        stream (gloo runs a process group's collectives in issue order), so a unit never
        holds its core for one while a peer holds its own for the other."""
        with self._dp_stream[u].request() as turn:
            yield turn
            yield from self._on_core(u, start)

    def _z3_reduce(self, u: Unit, moe: bool, tag: tuple) -> None:
        dense, expert = layer_rank_params(self.m, self.p, moe)
        job = self.env.process(self._dp_job(u, "reduce_scatter", dense, expert, tag))
        self._dp_jobs[u].append(job)

    def finish(self, u: Unit, stage: StageLayers) -> Proc:
        """Remaining gradient reduction, the embedding group's all-reduce, the optimizer
        step, ZeRO-1/2's weight gather."""
        p = self.p
        if not p.overlap_grad_reduce and p.zero_stage < 2:
            dense, expert = rank_params(self.m, p, stage)
            self._pending[u] = [dense, expert]
            self._flush(u, ("tail",))
        if self._dp_jobs[u]:
            yield from self._wait(u, "dp", simpy.AllOf(self.env, self._dp_jobs[u]), "dp wait")
        yield from self._embedding_allreduce(u)
        dense, expert = rank_params(self.m, p, stage)
        shards = (p.dense_replicas, p.expert_replicas) if p.zero_stage >= 1 else (1, 1)
        seconds = cm.optimizer_time(self.cost, dense / shards[0] + expert / shards[1])
        yield from self._wait(u, "optimizer", self.env.timeout(seconds * self.scale[u]),
                              "optimizer")
        if p.zero_stage in (1, 2):
            t0 = self.env.now
            yield from self._wait(u, "dp", simpy.AllOf(self.env, [
                self.collective(u, "dp", "all_gather", dense * self._act, ("zero-ag", "d")),
                self.collective(u, "edp", "all_gather", expert * self._act,
                                ("zero-ag", "e"))]), "zero gather")
            self.acct[u].comm_total["dp"] += self.env.now - t0

    # Pipeline ----------------------------------------------------------------------------
    def _exchange(self, u: Unit, x: Exchange) -> Proc:
        """One of Megatron-LM's blocking batched point-to-point calls: each transfer starts
        once its sender and receiver are both in their calls, and the call returns when all
        of its transfers are done. Waiting for a peer to arrive is bubble, the transfers
        pipeline communication. Without sequence parallelism each TP rank received 1/tp of
        a tensor, so the TP group then all-gathers each one (Megatron-LM's scatter/gather),
        which counts as pipeline communication too."""
        t0 = self.env.now
        meetings = [self._post(u, self._peer(u, msg[2]), msg) for msg in x.sends]
        meetings += [self._post(self._sender(u, msg), u, msg) for msg in x.recvs]
        yield simpy.AllOf(self.env, [m[1] for m in meetings])
        started = max(m[2] for m in meetings)
        self._add(u, "bubble", max(0.0, started - t0))
        self._add(u, "pp", self.env.now - max(t0, started))
        self.acct[u].comm_total["pp"] += self.env.now - max(t0, started)
        self._log(u, "pp", "p2p", t0)
        if self.p.tp > 1 and not self.p.sequence_parallel:
            for msg in x.recvs:
                t1 = self.env.now
                yield from self._wait(u, "pp", self.collective(
                    u, "tp", "all_gather", self._tp_bytes(), ("gather",) + msg), "pp gather")
                self.acct[u].comm_total["pp"] += self.env.now - t1

    def _post(self, a: Unit, b: Unit, msg: Msg) -> list[Any]:
        """The meeting of sender ``a`` and receiver ``b`` over ``msg``."""
        return self._meeting(("p2p", a, b, msg), 2,
                             lambda: self.env.process(self._transfer(a, b, msg)))

    def _peer(self, u: Unit, vs: int) -> Unit:
        stage = vs % self.p.pp
        return Unit(stage, u.dp, u.cp, self._rank0(stage, u.dp, u.cp))

    def _sender(self, u: Unit, msg: Msg) -> Unit:
        """Who sends ``msg`` to ``u``: the previous virtual stage for an activation, the
        next one for a gradient."""
        return self._peer(u, msg[2] - 1 if msg[0] == "F" else msg[2] + 1)

    def _pairs(self, a: Unit, b: Unit) -> list[int]:
        """Devices (sender, receiver, sender, receiver, ...) of a stage boundary: each TP
        rank sends its 1/tp share of the activation (Megatron's scatter/gather)."""
        out = []
        for x, y in zip(self._tp_devices(a.rank0), self._tp_devices(b.rank0), strict=True):
            out += [x, y]
        return out

    def _boundary_copies(self, a: Unit, b: Unit) -> list[list[int]]:
        key = (a.stage, b.stage)
        if key not in self._p2p_copies:
            p = self.p
            self._p2p_copies[key] = [
                self._pairs(Unit(a.stage, d, c, self._rank0(a.stage, d, c)),
                            Unit(b.stage, d, c, self._rank0(b.stage, d, c)))
                for d in range(p.dp) for c in range(p.cp)]
        return self._p2p_copies[key]

    def _transfer(self, u: Unit, v: Unit, msg: Msg) -> Proc:
        sent_at = self.env.now
        size = self.p.local_tokens * self.m.hidden_size * self._act / self.p.tp
        copies = self._boundary_copies(u, v) if self.reduce else None
        yield self.env.process(self.comm.run("p2p", "ring", self._pairs(u, v), size, copies))
        if self.record:
            self.timeline.append({"unit": u, "device": self.dev(u.rank0), "stream": "send",
                                  "name": f"send {msg[0]}{msg[1]}", "start": sent_at,
                                  "end": self.env.now, "to_device": self.dev(v.rank0)})

    def _embedding_allreduce(self, u: Unit) -> Proc:
        """Megatron-LM's embedding group: with tied embeddings and pp > 1 the last stage
        holds a copy of the word embedding, and after the data-parallel reduction each
        first-stage rank all-reduces its vocab x hidden / tp gradient (training dtype) with
        the last-stage rank of the same tp/dp/cp coordinates, before the optimizer step."""
        p = self.p
        if not self.m.tied_embeddings or p.pp == 1 or 0 < u.stage < p.pp - 1:
            return
        size = self.m.vocab_size * self.m.hidden_size / p.tp * self._act
        span = group_span(p, self.c, "emb")
        algorithm = default_algorithm("all_reduce", fabric_for(self.c, span), size)
        meetings = []
        for t in range(p.tp):
            pair = self._embedding_pair(u.dp, u.cp, t)
            copies = [self._embedding_pair(d, c, t) for d in range(p.dp)
                      for c in range(p.cp)] if self.reduce else None
            meetings.append(self._meeting(
                ("emb", tuple(pair)), 2, partial(self._all_reduce, algorithm, pair, size,
                                                 copies)))
        t0 = self.env.now
        yield simpy.AllOf(self.env, [m[1] for m in meetings])
        started = max(m[2] for m in meetings)
        self._add(u, "bubble", started - t0)
        self._add(u, "pp", self.env.now - started)
        self.acct[u].comm_total["pp"] += self.env.now - started
        self._log(u, "pp", "embedding all-reduce", started)

    def _all_reduce(self, algorithm: str, devices: list[int], size: float,
                    copies: list[list[int]] | None) -> simpy.Process:
        return self.env.process(self.comm.run("all_reduce", algorithm, devices, size, copies))

    def _embedding_pair(self, dp: int, cp: int, t: int) -> list[int]:
        """Devices of the ``t``-th TP rank of the first and of the last stage."""
        first, last = self._rank0(0, dp, cp), self._rank0(self.p.pp - 1, dp, cp)
        offset = t * self.strides["tp"]
        return [self.dev(first + offset), self.dev(last + offset)]

    def unit(self, u: Unit, stage: StageLayers) -> Proc:
        for item in stage_program(replica_plan(self.p, u.dp), u.stage):
            if isinstance(item, Exchange):
                yield from self._exchange(u, item)
                continue
            kind, mb, chunk = item
            run = self.forward if kind == "F" else self.backward
            yield from run(u, chunk * self.p.pp + u.stage, mb)
        self.acct[u].pipeline_end = self.env.now
        yield from self.finish(u, stage)
        self.acct[u].end = self.env.now


def dp_bucket_params(plan: Plan) -> float:
    """Parameters per data-parallel gradient bucket: Megatron-LM's DDP bucket size."""
    return max(40e6, 1e6 * plan.dp)


def _succeed(done: simpy.Event, _started: simpy.Event) -> None:
    done.succeed()


def _links(step: _Step, seconds: float, top: int | None = 10) -> list[dict[str, Any]]:
    """The busiest links: utilisation = bytes / (capacity x iteration)."""
    return link_table(step.topo, step.net.stats.bytes, step.net.stats.busy_s, seconds, top)


def _communication(a: _Acct) -> dict[str, dict[str, float]]:
    out = {}
    for kind in ("tp", "cp", "ep", "pp", "dp"):
        exposed = a.spent[kind]
        out[kind] = {"exposed_s": exposed,
                     "overlapped_s": max(0.0, a.comm_total[kind] - exposed)}
    return out


def reducible(plan: Plan, compute_scale: Sequence[float] | None,
              dev: Callable[[int], int] | None = None) -> bool:
    """Whether one unit per stage can stand for all: every replica runs as many
    micro-batches and every rank of a pipeline stage has the same compute scale (``dev``
    maps a logical rank to its device)."""
    if len(set(plan.replica_microbatches)) > 1:
        return False
    if compute_scale is None:
        return True
    dev = dev or (lambda r: r)
    sizes, strides = rank_coords(plan)
    seen: dict[int, float] = {}
    for r in range(plan.world_size):
        stage = r // strides["pp"] % sizes["pp"]
        if seen.setdefault(stage, compute_scale[dev(r)]) != compute_scale[dev(r)]:
            return False
    return True


def _why_full(plan: Plan, link_failures: bool) -> str:
    if link_failures:  # re-routed flows are not copies of one another
        return "a failed link breaks the symmetry of the data-parallel replicas"
    if len(set(plan.replica_microbatches)) > 1:
        return "data-parallel replicas run different numbers of micro-batches"
    return "ranks of one pipeline stage run at different speeds"


def _run_with_failures(step: _Step, failures: Sequence[tuple[float, Sequence[int], str]]
                       ) -> Timing | None:
    """Run the step with links failing; the Timing of a step that cannot complete."""
    from sim.faults import CannotComplete, install_failures

    step.exclusive = set()  # re-routed flows may cross any link: nothing is memoised
    install_failures(step.env, step.net, step.topo, failures)
    try:
        step.env.run()
    except CannotComplete as exc:
        info = {"reduced": step.reduce, "units": len(step.units),
                "events": step.env.processed, "completed": False,
                "cannot_complete": f"{exc}; the step stalls at {step.env.now:.6g} s"}
        zero = dict.fromkeys(CATEGORIES, 0.0)
        return Timing(math.inf, math.inf, zero, _communication(_Acct()), [], info, [])
    return None


def simulate_des(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel,
                 reduce: bool = True, record: bool = False,
                 topology: Topology | None = None,
                 compute_scale: Sequence[float] | None = None,
                 top_links: int | None = 10,
                 link_failures: Sequence[tuple[float, Sequence[int], str]] = ()) -> Timing:
    """Simulate one iteration; ``record`` keeps the per-unit timeline (for traces);
    ``top_links`` busiest links are reported (``None``: every used link).
    ``compute_scale`` multiplies every compute duration of each device (index = device;
    1.2 is 20% slower): stragglers, or other GPU types relative to the cost model's.
    Reduction needs every rank of a stage to have the same scale; where they differ the
    simulation runs in full and says so. ``link_failures`` (time_s, link ids, name) fail
    links mid-step (:mod:`sim.faults`; the step then runs unreduced): when a flow has no
    path left the step cannot complete, and the Timing says so with an infinite iteration
    time."""
    from sim.stages import pipeline_rank_layers

    if compute_scale is not None:
        if len(compute_scale) != cluster.world_size:
            raise ValueError(f"compute_scale has {len(compute_scale)} entries for "
                             f"{cluster.world_size} devices")
        if any(not (x > 0) for x in compute_scale):
            raise ValueError("compute_scale entries must be > 0")
    pl = plan.placement
    full_needed = reduce and (bool(link_failures) or not reducible(
        plan, compute_scale, None if isinstance(pl, str) else (lambda r: pl[r])))
    step = _Step(model, cluster, plan, cost, topology or build_topology(cluster),
                 reduce and not full_needed, record, compute_scale)
    stages = pipeline_rank_layers(plan, model)
    procs = [step.env.process(step.unit(u, stages[u.stage])) for u in step.units]
    if link_failures:
        stalled = _run_with_failures(step, link_failures)
        if stalled is not None:
            return stalled
    else:
        step.env.run()
    stuck = [u for u, proc in zip(step.units, procs, strict=True) if proc.is_alive]
    if stuck:  # an internal error, never a time: every unit must finish its step
        raise RuntimeError(f"discrete-event step deadlocked at {step.env.now:.6g} s with "
                           f"{len(stuck)} of {len(step.units)} units unfinished "
                           f"(first: stage {stuck[0].stage}, dp {stuck[0].dp})")
    critical = max(step.units, key=lambda u: (step.acct[u].end, -u.stage))
    a = step.acct[critical]
    breakdown = dict(a.spent)
    info: dict[str, Any] = {"reduced": step.reduce, "units": len(step.units),
                            "events": step.env.processed}
    if full_needed:
        info["not_reduced_because"] = _why_full(plan, bool(link_failures))
    return Timing(a.end, a.pipeline_end, breakdown, _communication(a),
                  _links(step, a.end, top_links),
                  info, step.timeline)
