"""The analytic tier: one training iteration in closed form.

Per pipeline rank and micro-batch: layer compute (roofline, :mod:`sim.cost.compute`) plus the
tensor-, context-, expert- and pipeline-parallel communication on its critical path
(alpha-beta over the fabric each group spans, :mod:`sim.network.alphabeta`), including the
embedding's and output layer's TP collectives on the first and last stage and Megatron-LM's
batched point-to-point calls. The pipeline runs at the pace of its slowest rank:
``m * t_max + (sum(t_r) - t_max) / vpp`` (the bubble of GPipe and 1F1B is ``(pp - 1) / vpp``
stage times). Data-parallel gradient reduction (DDP's buckets) overlaps the last
micro-batch's backward; with tied embeddings and pp > 1 the first and last stage then
all-reduce the embedding's gradient; the optimizer step streams its state through HBM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sim.analytic.context import Ctx
from sim.analytic.data_parallel import DPCost, dp_costs
from sim.analytic.dualpipev import RankTime, StagePasses, dualpipev_pipeline
from sim.cost import compute as cm
from sim.cost.costmodel import CostModel
from sim.cost.overlap import Step, cp_steps, ep_steps, exchange_passes, exposed, tp_steps
from sim.layout.dualpipe import paired_share
from sim.layout.memory import mirror_bytes, rank_params
from sim.layout.routing import dispatches, replay_dispatches
from sim.layout.schedule import warmup_forwards
from sim.layout.stages import (
    StageLayers,
    chain_microbatches,
    cp_exchanges,
    dualpipe_family,
    edge_tp_collectives,
    first_stage,
    last_stage,
    mirrored,
    pipeline_rank_layers,
    tp_pass,
    virtual_stage_moe,
)
from sim.result import Timing
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.recompute import reruns_core, stops_early
from sim.spec.routing import comm_sm_share

__all__ = ["StageCost", "Timing", "stage_costs", "analytic_iteration"]


@dataclass(frozen=True)
class StageCost:
    """Seconds per micro-batch on one pipeline rank, and its once-per-iteration tail."""

    compute_s: float
    tp_s: float
    cp_exposed_s: float
    cp_overlapped_s: float
    ep_s: float
    pp_s: float
    dp: DPCost
    optimizer_s: float
    # the tied embedding's gradient all-reduce (first, last stage); DualPipe: the mirror sum
    embedding_s: float = 0.0
    ep_overlapped_s: float = 0.0  # expert all-to-alls hidden (plan.moe_overlap)
    tp_overlapped_s: float = 0.0  # TP collectives hidden (plan.tp_overlap)

    @property
    def per_microbatch_s(self) -> float:
        return (self.compute_s + self.tp_s + self.cp_exposed_s + self.ep_s + self.pp_s
                + self.dp.mb_exposed_s)

    @property
    def tail_s(self) -> float:
        return self.dp.tail_exposed_s + self.embedding_s + self.optimizer_s


def _tp_per_layer(x: Ctx, moe: bool = False) -> float:
    """TP collectives of one layer, forward + backward (+ the replay if recomputed): the
    attention's and the MLP's, or an MoE layer's (:func:`sim.layout.stages.tp_pass`)."""
    act = x.tokens * x.m.hidden_size * x.e

    def one(replay: bool) -> float:
        return sum((x.coll("tp", kind, act * scale)
                    for kind, scale in tp_pass(x.m, x.p, moe, replay)), 0.0)
    if stops_early(x.p):  # the replay has fewer
        return 2 * one(False) + one(True)
    return one(False) * (3 if x.p.recompute == "full" else 2)


def _tp_fused(x: Ctx, k: float) -> tuple[float, float]:
    """A dense layer's TP collectives under ``tp_overlap``, fused with their GEMMs
    (:func:`sim.cost.overlap.tp_steps`), ``tp_overlap_eff`` of each GEMM hiding its
    collective, compute scaled by ``k``: (exposed, hidden) seconds a micro-batch, forward,
    backward and a full recomputation's replay."""
    act = x.tokens * x.m.hidden_size * x.e
    # the share of each GEMM that hides its collective (the stack's); none on a device
    # whose collectives run on the compute cores
    share = x.c.gpu.tp_overlap_eff if x.overlap > 0 else 0.0
    out = total = 0.0
    for forward, replay in _both_ways(x):
        ops = [(kind, act * scale) for kind, scale in tp_pass(x.m, x.p, False, replay)]
        one, every = _fused_pass(x, "tp", tp_steps(x.dense, ops, not forward), k * share)
        out, total = out + one, total + every
    return out, total - out


def _both_ways(x: Ctx) -> list[tuple[bool, bool]]:
    """A layer's exchange passes in a micro-batch (:func:`sim.cost.overlap.exchange_passes`)."""
    return exchange_passes(x.p.recompute, False) + exchange_passes(x.p.recompute, True)


def _fused_pass(x: Ctx, group: str, steps: list[Step], scale: float) -> tuple[float, float]:
    """(exposed, all) seconds of one pass's fused exchanges on ``group``'s fabric (each
    step's parts run at once: the slowest), compute timed ``scale`` x
    (:func:`sim.cost.overlap.exposed`)."""
    times = [max(x.coll(group, kind, size) for kind, size in parts) for parts, _, _ in steps]
    return exposed(times, steps, scale), sum(times)


def _tp_layers(st: StageLayers, dense_s: float, moe_s: float) -> float:
    return st.total * dense_s if moe_s == dense_s else st.dense * dense_s + st.moe * moe_s


def _tp_edges(x: Ctx, st: StageLayers) -> float:
    """TP collectives of the embedding and the output layer and loss (first, last stage)."""
    return sum(x.coll("tp", coll, size)
               for _, coll, size in edge_tp_collectives(x.m, x.p, st.first, st.last))


def _p2p(x: Ctx, st: StageLayers, rank: int) -> float:
    """Pipeline communication per micro-batch, in Megatron-LM's blocking batched calls
    (:mod:`sim.layout.schedule`): ``calls * alpha + messages * S/beta + receives * gather``. Each
    TP rank sends ``S`` = 1/tp of the activation, and without sequence parallelism the
    receiver all-gathers it. ``messages`` is the most a call sends or receives through the
    rank's NIC, summed over its calls: interleaved 1F1B makes one call per forward +
    backward step, with an activation and a gradient each way (two messages); 1F1B two
    calls with one message each way; GPipe two calls, one message. The end stages have no
    neighbour on one side: one message and one receive fewer per micro-batch (1F1B: one
    call fewer too). They run at their own pace when they are the slowest rank (their
    neighbours wait for them in each call); the pipeline formula takes the slowest rank."""
    p = x.p
    if p.pp == 1:
        return 0.0
    end = 1 if st.first or st.last else 0
    if dualpipe_family(p):  # dualpipev: rank 0 holds both ends, the
        end = 2 if rank in (0, p.pp - 1) else 0  # last rank the turn; dualpipe: both ends
    if p.vpp > 1:
        calls, messages = p.vpp, 2 * p.vpp - end
    elif p.schedule == "gpipe":
        calls, messages = 2, 2
    else:
        calls = messages = 2 - end
    full = x.tokens * x.m.hidden_size * x.e
    gather = x.coll("tp", "all_gather", full) if not p.sequence_parallel else 0.0
    send = x.coll("pp", "send_recv", messages / calls * full / p.tp)
    return calls * send + (2 * p.vpp - end) * gather


def _embedding_allreduce(x: Ctx, st: StageLayers) -> float:
    """Megatron-LM's embedding group: with tied embeddings and pp > 1 the first and last
    stage all-reduce the word embedding's gradient (vocab x hidden / tp, training dtype)
    after the data-parallel reduction, before the optimizer step. Under DualPipe every rank
    instead sums its gradients (ZeRO-1: its shard) with its mirror's, which holds the same
    layers (:func:`mirror_bytes`; the worst pair is the first and last rank's)."""
    if mirrored(x.p):
        return x.coll("emb", "all_reduce", mirror_bytes(x.m, x.p, st))
    if not x.m.tied_embeddings or x.p.pp == 1 or st.first == st.last:  # dualpipev: one
        return 0.0  # rank holds both
    return x.coll("emb", "all_reduce", x.m.vocab_size * x.m.hidden_size / x.p.tp * x.e)


def _cp_per_layer(x: Ctx, layer: cm.LayerTime, k: float = 1.0) -> tuple[float, float]:
    """Context parallelism's exchange of one layer and micro-batch (exposed, overlapped)
    (:func:`sim.layout.stages.cp_exchanges`). Ring attention (``p2p``): (cp-1) K/V hops
    forward, twice that backward, once more after recomputation, hidden behind the
    attention core (each pass's, the recomputed one's too) when it is long enough.
    ``allgather`` and ``a2a``: the core waits for them (``a2a`` under operator overlap:
    fused with the projections, their compute scaled by ``k``)."""
    if x.p.cp == 1:
        return 0.0, 0.0
    if x.p.cp_comm == "a2a" and x.p.moe_overlap == "operator":
        return _cp_operator(x, layer, k)
    if x.p.cp_comm != "p2p":
        return sum(x.coll("cp", kind, size) for b in (False, True)
                   for kind, size in cp_exchanges(x.m, x.p, b)), 0.0
    kv = x.tokens * (x.m.kv_dim + x.m.v_dim) / x.p.tp * x.e
    step = x.coll("cp", "send_recv", kv)
    again = reruns_core(x.p)  # the core (and its ring) re-run
    comm = (x.p.cp - 1) * step * (4 if again else 3)
    forwards = 2 if again else 1
    hide = (forwards * layer.attention_forward + layer.attention_backward) * x.overlap
    return max(0.0, comm - hide), min(comm, hide)


def _cp_operator(x: Ctx, layer: cm.LayerTime, k: float) -> tuple[float, float]:
    """Ulysses' all-to-alls under operator overlap (:mod:`sim.cost.overlap`), compute
    scaled by ``k``: (exposed, hidden) seconds of one layer and micro-batch."""
    out = total = 0.0
    for backward in (False, True):
        for steps in cp_steps(layer, cp_exchanges(x.m, x.p, backward), backward,
                              x.p.recompute == "full"):
            one, every = _fused_pass(x, "cp", steps, k * x.overlap)
            out, total = out + one, total + every
    return out, total - out


def _ep_operator(x: Ctx, k: float) -> tuple[float, float]:
    """One MoE layer's dispatches and combines under operator overlap
    (:mod:`sim.cost.overlap`), compute scaled by ``k``: (exposed, total) seconds a
    micro-batch."""
    nodes = x.fabric["ep"].span.nodes
    out = total = 0.0
    for forward, replay in _both_ways(x):
        ways = replay_dispatches(x.m, x.p, nodes) if replay else \
            dispatches(x.m, x.p, nodes, forward)
        one, every = _fused_pass(x, "ep", ep_steps(x.moe, ways, not forward), k * x.overlap)
        out, total = out + one, total + every
    return out, total


def _ep_pass(x: Ctx, forward: bool, replay: bool = False) -> float:
    """One MoE layer's dispatch and combine in one forward or backward pass, or in
    recomputation's replay (:func:`sim.layout.routing.replay_dispatches`)."""
    if x.p.ep == 1:
        return 0.0
    nodes = x.fabric["ep"].span.nodes
    ways = replay_dispatches(x.m, x.p, nodes) if replay else dispatches(x.m, x.p, nodes,
                                                                         forward)
    return sum(max(x.coll("ep", kind, size) for kind, size in parts) for parts in ways)


def _ep_stage(x: Ctx, st: StageLayers, rank: int, k: float, tp_s: float
              ) -> tuple[float, float]:
    """(exposed, hidden) expert all-to-all seconds per micro-batch on a pipeline rank.

    * ``none``: every dispatch and combine waits.
    * ``shared-expert``: each pass's pair runs beside that pass's shared expert.
    * ``operator``: each pass's pair fused with the experts' GEMMs beside the pass's
      independent compute (:mod:`sim.cost.overlap`).
    * ``a2a``: merged steps run one micro-batch's forward with another's backward, two
      streams: a pair's all-to-alls hide behind both passes' compute and its blocking
      tensor-parallel collectives ``tp_s``, which run on the compute stream
      (``max(0, E - C - T)``; the links they may share are not modelled here, the DES
      shares them).
      The forwards before the first merged step and the backwards after the last (the
      warm-up's, at least one each) wait as ``none``."""
    if x.p.moe_overlap == "operator" and st.moe:
        one, every = _ep_operator(x, k)
        return _sm_share(x, st.moe * one, st.moe * (every - one))
    fwd, bwd = _ep_pass(x, True), _ep_pass(x, False)
    full = x.p.recompute == "full"
    each = [fwd, bwd] + ([_ep_pass(x, True, replay=True)] if full else [])  # and the replay
    total = st.moe * sum(each)
    if x.p.moe_overlap == "shared-expert":
        e = x.moe
        hidden = [e.shared_forward, e.shared_backward] + ([e.shared_forward] if full else [])
        exposed = sum(max(0.0, st.moe * (one - k * h))
                      for one, h in zip(each, hidden, strict=True))
        return _sm_share(x, exposed, total - exposed)
    if x.p.moe_overlap != "a2a" or total == 0:
        return total, 0.0
    compute = k * _stage_compute(x, st) + tp_s
    if dualpipe_family(x.p):  # its program's unpaired passes
        alone = 1.0 - paired_share(x.p.pp, x.p.num_microbatches, rank, mirrored(x.p))
    else:
        passes = x.p.num_microbatches * x.p.vpp
        alone = min(1.0, max(warmup_forwards(x.p, rank), 1) / passes)
    exposed = alone * total + (1 - alone) * max(0.0, total - compute)
    return _sm_share(x, exposed, total - exposed)


def _sm_share(x: Ctx, exposed: float, hidden: float) -> tuple[float, float]:
    """While the exchange runs beside compute its kernels hold ``S`` of the GPU's ``N``
    SMs, so that compute runs at ``(N - S) / N``: each hidden second costs ``S / N`` of a
    second, counted as exposed."""
    return exposed + hidden * comm_sm_share(x.p, x.c.gpu.sm_count), hidden


def _stage_compute(x: Ctx, st: StageLayers) -> float:
    d, e = x.dense, x.moe
    t = st.dense * (d.forward + d.backward) + st.moe * (e.forward + e.backward)
    if x.p.recompute != "none":  # the replay, or the modules it re-runs (sim.spec.recompute)
        early = stops_early(x.p)
        t += st.dense * d.replay(x.p.recompute, early) + st.moe * e.replay(x.p.recompute, early)
    if st.first:
        t += cm.embedding_time(x.cost, x.m, x.p)
    if st.last:
        t += cm.logits_time(x.cost, x.m, x.p)
    return t


def _optimizer(x: Ctx, st: StageLayers) -> float:
    dense, expert = rank_params(x.m, x.p, st)
    shards = (x.p.dense_replicas, x.p.expert_replicas) if x.p.zero_stage >= 1 else (1, 1)
    params = dense / shards[0] + expert / shards[1]
    return cm.optimizer_time(x.cost, params)


def stage_costs(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel,
                stage_scale: Sequence[float] | None = None) -> list[StageCost]:
    """Per pipeline rank; ``stage_scale`` multiplies a stage's compute and optimizer step
    (stragglers: the stage's slowest rank, :func:`sim.network.failures.stage_scales`)."""
    return _stage_costs(Ctx(model, cluster, plan, cost), stage_scale)


def _stage_costs(x: Ctx, stage_scale: Sequence[float] | None) -> list[StageCost]:
    plan, model = x.p, x.m
    tp_d, tp_m = _tp_per_layer(x), _tp_per_layer(x, moe=True)
    tp_hid = 0.0
    fused = _tp_fused(x, 1.0) if plan.tp_overlap else (0.0, 0.0)
    even = _cp_per_layer(x, x.dense), _cp_per_layer(x, x.moe)
    out: list[StageCost] = []
    for st in pipeline_rank_layers(plan, model):
        k = 1.0 if stage_scale is None else stage_scale[len(out)]
        cp_d, cp_e = even if k == 1.0 or plan.moe_overlap != "operator" else (
            _cp_per_layer(x, x.dense, k), _cp_per_layer(x, x.moe, k))  # slower GEMMs hide more
        comp = k * _stage_compute(x, st)
        if plan.tp_overlap:  # dense models only (validated); slower GEMMs hide more
            tp_d, tp_hid = fused if k == 1.0 else _tp_fused(x, k)
        tp = _tp_layers(st, tp_d, tp_m) + _tp_edges(x, st)
        ep = _ep_stage(x, st, len(out), k, tp)
        cp = st.dense * cp_d[0] + st.moe * cp_e[0]
        beside = x.off_dp_links({"tp": tp, "cp": cp, "ep": ep[0]})
        out.append(StageCost(
            comp, tp, cp, st.dense * cp_d[1] + st.moe * cp_e[1],
            ep[0], _p2p(x, st, len(out)), dp_costs(x, st, comp, len(out), beside),
            k * _optimizer(x, st),
            _embedding_allreduce(x, st), ep[1], st.total * tp_hid))
    return out


def _chunk_passes(x: Ctx, vs: int) -> StagePasses:
    """One virtual stage's passes per micro-batch (:class:`StagePasses`). The weight
    gradients are the layers' GEMMs again (``dW = X^T dY`` has a forward GEMM's FLOPs): a
    layer's forward less its attention core, and the output layer's share of the
    logits."""
    flags = virtual_stage_moe(x.p, x.m)[vs]
    times = [x.moe if moe else x.dense for moe in flags]
    again = [t.replay(x.p.recompute, stops_early(x.p)) for t in times]
    f, b = sum(t.forward for t in times), sum(t.backward for t in times) + sum(again)
    w = sum(t.weight_grad for t in times)
    if first_stage(x.p, vs):
        ef, eb = x.cost.embedding(x.tokens, x.m.hidden_size, x.m.vocab_size,
                                  x.p.activation_dtype)
        f, b = f + ef, b + eb
    if last_stage(x.p, vs):
        logits, weight = cm.logits_time(x.cost, x.m, x.p), cm.logits_weight_time(x.cost, x.m, x.p)
        f, b, w = f + logits / 3, b + 2 * logits / 3, w + weight
    fwd, bwd = _ep_pass(x, True), _ep_pass(x, False)
    replay = _ep_pass(x, True, replay=True) if x.p.recompute == "full" else 0.0
    moe = sum(flags)
    return StagePasses(f, b, w, moe * fwd, moe * (bwd + replay))


def _dualpipev(x: Ctx, stages: Sequence[StageCost], bound: bool = False) -> float:
    """The pipeline phase under DualPipeV (:mod:`sim.analytic.dualpipev`), or a lower
    bound on it."""
    passes = [_chunk_passes(x, vs) for vs in range(2 * x.p.pp)]
    ranks = [RankTime(s.per_microbatch_s, s.compute_s, s.ep_s, s.tp_s) for s in stages]
    return dualpipev_pipeline(x.p.pp, x.p.num_microbatches, passes, ranks,
                              x.p.moe_overlap == "a2a", comm_sm_share(x.p, x.c.gpu.sm_count),
                              bound, mirrored(x.p))


def analytic_iteration(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel,
                       stage_scale: Sequence[float] | None = None,
                       dualpipev_bound: bool = False, local: ClusterSpec | None = None
                       ) -> Timing:
    """One iteration; ``dualpipev_bound``: a DualPipeV plan's pipeline phase as the lower
    bound of :func:`sim.analytic.dualpipev.dualpipev_pipeline` (what the search screens
    with), not the time; ``local``: the node fabric of one replica's own nodes."""
    x = Ctx(model, cluster, plan, cost, local)
    stages = _stage_costs(x, stage_scale)
    m, v = chain_microbatches(plan), plan.vpp  # per chain: DualPipe's halves
    times = [s.per_microbatch_s for s in stages]
    slow = max(range(len(stages)), key=lambda r: times[r])
    pipe = m * times[slow] + (sum(times) - times[slow]) / v
    if dualpipe_family(plan):
        pipe = _dualpipev(x, stages, dualpipev_bound)
    tail_rank = max(range(len(stages)), key=lambda r: stages[r].tail_s)
    b, t = stages[slow], stages[tail_rank]
    breakdown = {
        "compute": m * b.compute_s, "tp": m * b.tp_s, "cp": m * b.cp_exposed_s,
        "ep": m * b.ep_s, "pp": m * b.pp_s + t.embedding_s,
        "dp": m * b.dp.mb_exposed_s + t.dp.tail_exposed_s,
        "optimizer": t.optimizer_s, "bubble": pipe - m * times[slow]}
    comm = {
        "tp": {"exposed_s": m * b.tp_s, "overlapped_s": m * b.tp_overlapped_s},
        "cp": {"exposed_s": m * b.cp_exposed_s, "overlapped_s": m * b.cp_overlapped_s},
        "ep": {"exposed_s": m * b.ep_s, "overlapped_s": m * b.ep_overlapped_s},
        "pp": {"exposed_s": breakdown["pp"], "overlapped_s": 0.0},
        "dp": {"exposed_s": breakdown["dp"],
               "overlapped_s": m * b.dp.mb_overlapped_s + t.dp.tail_overlapped_s}}
    return Timing(pipe + t.tail_s, pipe, breakdown, comm)
