"""Operator-level overlap (``moe_overlap = "operator"``): a layer's exchanges hidden inside
one micro-batch, as MegaScale-MoE runs them (Jin et al., arXiv 2505.11432, section 4).

* **Intra-operator**: each exchange is fused tile by tile with the GEMM beside it, the
  GEMM that consumes what it brings or produces what it sends: an expert dispatch with the
  routed experts' first (gate and up) GEMM, a combine with their last (down); Ulysses'
  all-to-all of Q, K and V with the attention's input projections, the one of its output
  with the output projection. In the backward the exchanges come in the reverse order,
  each with its GEMM's data gradient (half that GEMM's backward: ``dX = dY W^T`` has the
  forward's FLOPs, as ``dW = X^T dY`` does). A fused pair takes ``max(c, g)`` seconds:
  the ideal pipeline, its fill and drain (the first tile's exchange, the last tile's
  GEMM) not charged.
* **Inter-operator**: compute that needs none of the exchanges still to come runs during
  their waits, from the step that makes it ready: the shared expert (forward and backward,
  from the first exchange); in the backward the experts' weight gradients once the
  combine's gradient has arrived (the down GEMM's needs it), so beside the dispatch's
  gradient; for Ulysses the output projection's weight gradient beside the first
  exchange (the input projections' needs the second exchange's result: not beside it).

So exchange ``i`` (``c_i`` seconds, fused with a GEMM of ``g_i``) waits ``max(0, c_i - g_i)``
less whatever ready independent compute has not run yet; what is left of that compute runs
after the last. The pass takes ``sum g + F + exposed`` where its exchanges and compute would
otherwise add up. An ideal bound, like ``a2a``'s two streams: the tiles' fill and drain
and the fused kernels' contention (beyond ``moe_comm_sms`` for the expert exchanges) are
not modelled; on a device whose collectives cannot overlap compute (``comm_overlap``) the
GEMMs hide that share only. The ring and all-gather forms of context parallelism are
unchanged.

The tensor-parallel all-gathers and reduce-scatters of sequence parallelism are fused the
same way, on their own switch (``plan.tp_overlap``: torch's async TP, Megatron-LM's
``--tp-comm-overlap``), with no independent compute beside them (:func:`tp_steps`).
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.cost.compute import LayerTime

__all__ = ["Step", "exposed", "held", "exchange_passes", "ep_steps", "cp_steps", "tp_steps"]

Parts = Sequence[tuple[str, float]]  # collectives that run at once
# an exchange, the seconds of the GEMM fused with it, and the seconds of independent
# compute ready from this step on (it may run in this exchange's wait or a later one's)
Step = tuple[Parts, float, float]


def exposed(times: Sequence[float], steps: Sequence[Step], scale: float = 1.0) -> float:
    """Seconds of a pass's exchanges, lasting ``times``, on its critical path; its compute
    timed ``scale`` x (stragglers; times the share of it that can overlap exchanges)."""
    ready = out = 0.0
    for c, (_, gemm, fill) in zip(times, steps, strict=True):
        ready += scale * fill
        wait = max(0.0, c - scale * gemm)
        out += max(0.0, wait - ready)
        ready = max(0.0, ready - wait)
    return out


def exchange_passes(recompute: str, backward: bool) -> list[tuple[bool, bool]]:
    """A layer's exchange passes in its forward or backward as (forward-shaped, replay): the
    forward, or the backward after full recomputation's replay."""
    if not backward:
        return [(True, False)]
    return [(True, True)] * (recompute == "full") + [(False, False)]


def held(steps: Sequence[Step]) -> float:
    """Compute seconds a pass's exchanges run beside: their GEMMs and the fill."""
    return sum(g + f for _, g, f in steps)


def ep_steps(lt: LayerTime, ways: Sequence[Parts], backward: bool) -> list[Step]:
    """An MoE layer's dispatch and combine in one pass (a forward, full recomputation's
    replay, or ``backward``): ``ways`` as :func:`sim.layout.routing.dispatches` gives
    them, in the order they run."""
    (up_f, up_b), (down_f, down_b) = lt.expert_gemms
    if backward:  # the combine's gradient first, beside the down GEMM's data gradient
        gemms = [(down_b / 2, lt.shared_backward), (up_b / 2, (up_b + down_b) / 2)]
    else:  # a replay that stops early has the dispatch only
        gemms = [(up_f, lt.shared_forward), (down_f, 0.0)]
    return [(parts, g, f) for parts, (g, f) in zip(ways, gemms[:len(ways)], strict=True)]


def cp_steps(lt: LayerTime, parts: Parts, backward: bool, full: bool) -> list[list[Step]]:
    """Ulysses' all-to-alls of one layer in one pass (:func:`sim.layout.stages.cp_exchanges`
    with ``cp_comm = "a2a"``: Q, K and V, then the output; a backward that re-runs the core
    repeats the forward's first), as steps per pass in the order they run. The replay's
    exchanges have GEMMs beside them under ``full`` recomputation only (selective
    recomputation re-runs the core alone)."""
    (in_f, in_b), (out_f, out_b) = lt.attention_gemms

    def pair(first: float, second: float) -> list[Step]:
        return [([parts[0]], first, 0.0), ([parts[1]], second, 0.0)]
    if not backward:
        return [pair(in_f, out_f)]
    # the output's gradient first, beside the output projection's data gradient, its
    # weight gradient ready; the input projections' weight gradient needs the second
    last: list[Step] = [([parts[-1]], out_b / 2, out_b / 2), ([parts[-2]], in_b / 2, 0.0)]
    return ([pair(full * in_f, full * out_f)] if len(parts) == 4 else []) + [last]


def tp_steps(lt: LayerTime, ops: Parts, backward: bool) -> list[Step]:
    """A dense layer's tensor-parallel all-gathers and reduce-scatters in one pass
    (:func:`sim.layout.stages.tp_pass` with sequence parallelism, bytes), each fused with
    its GEMM as torch's async TP and Megatron-LM's ``--tp-comm-overlap`` run them: the
    attention's input all-gather with the input projections, its reduce-scatter with the
    output projection, the MLP's with its up and down GEMMs; in the backward, block by
    block from the MLP, the all-gather of the output gradient beside the last GEMM's data
    gradient and the reduce-scatter beside the first's. A replay that stops early has no
    MLP reduce-scatter. No independent compute is counted beside them."""
    (in_f, in_b), (out_f, out_b) = lt.attention_gemms
    (up_f, up_b), (down_f, down_b) = lt.mlp_gemms
    # backward: each block's all-gather of the output gradient before the data gradient of
    # its last GEMM, the reduce-scatter of the input gradient after its first GEMM's
    gemms = [out_b / 2, in_b / 2, down_b / 2, up_b / 2] if backward else \
        [in_f, out_f, up_f, down_f]
    if len(ops) == 3:  # the replay's last reduce-scatter left out
        gemms = gemms[:3]
    steps: list[Step] = [([op], g, 0.0) for op, g in zip(ops, gemms, strict=True)]
    return steps[2:] + steps[:2] if backward else steps
