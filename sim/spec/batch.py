"""The batch arithmetic and schedule rules of a plan: the global batch against the
data-parallel degree and micro-batch (or an uneven per-replica split), sequence lengths
against context and sequence parallelism, what the interleaved and DualPipe schedules
need, and the stages' layer counts."""

from __future__ import annotations

from typing import Any

from sim.errors import SpecError
from sim.spec.limits import MAX_DUALPIPEV_RANK_MICROBATCHES

# ``plan`` below is a sim.spec.plan.Plan, which imports this module for its rules (typed
# as Any: naming Plan here would be an import circle).
Plan = Any

__all__ = ["check_batch", "check_schedule", "check_layers", "CP_COMMS"]

# Context parallelism's exchanges, as Megatron-LM names them (--cp-comm-type; its
# "all_gather" is written allgather here, as the MoE dispatcher)
CP_COMMS = ("p2p", "allgather", "a2a")


def _check_uneven(plan: Plan) -> None:
    """An uneven micro-batch split: one count per replica, summing to the batch; replicas
    meet only in the gradient reduction after their last backward (no ZeRO-2/3, no EP)."""
    mbr, name = plan.micro_batches_per_replica, "plan.micro_batches_per_replica"
    assert mbr is not None
    if len(mbr) != plan.dp:
        raise SpecError(name, f"must list dp = {plan.dp} counts, got {list(mbr)}")
    if sum(mbr) * plan.micro_batch_size != plan.global_batch_size:
        raise SpecError(name, f"sum {'+'.join(map(str, mbr))} = {sum(mbr)} micro-batches x "
                        f"micro_batch_size {plan.micro_batch_size} != global_batch_size "
                        f"{plan.global_batch_size}")
    if plan.zero_stage > 1 or plan.ep > 1:
        raise SpecError(name, f"needs zero_stage <= 1 and ep = 1 (replicas must not meet per "
                        f"micro-batch), got zero_stage={plan.zero_stage}, ep={plan.ep}")
    if plan.schedule == "interleaved-1f1b" and any(m % plan.pp for m in mbr):
        raise SpecError(name, f"interleaved-1f1b needs every count a multiple of pp = "
                        f"{plan.pp}, got {list(mbr)}")


def check_batch(plan: Plan) -> None:
    per_step = plan.dp * plan.micro_batch_size
    if plan.micro_batches_per_replica is not None:
        _check_uneven(plan)
    elif plan.global_batch_size % per_step:
        raise SpecError("plan.global_batch_size", f"must be a multiple of dp*micro_batch_size = "
                        f"{plan.dp}*{plan.micro_batch_size} = {per_step}, "
                        f"got {plan.global_batch_size}")
    if plan.cp_comm not in CP_COMMS:
        hint = {"all_gather": " (written allgather here)",
                "a2a+p2p": " (Megatron-LM's hierarchical a2a+p2p is not modelled)"}
        raise SpecError("plan.cp_comm", f"must be one of {', '.join(CP_COMMS)}, got "
                        f"{plan.cp_comm!r}{hint.get(str(plan.cp_comm), '')}")
    if plan.cp == 1 and plan.cp_comm != "p2p":
        raise SpecError("plan.cp_comm", f"{plan.cp_comm} needs cp > 1 (it is how context-"
                        "parallel ranks exchange)")
    if plan.cp > 1 and plan.seq_len % (2 * plan.cp):
        raise SpecError("plan.seq_len", f"must be a multiple of 2*cp = {2 * plan.cp} for "
                        f"load-balanced context parallelism, got {plan.seq_len}")
    if plan.sequence_parallel and plan.seq_len // plan.cp % plan.tp:
        raise SpecError("plan.seq_len", f"seq_len/cp = {plan.seq_len // plan.cp} must be a "
                        f"multiple of tp = {plan.tp} with sequence parallelism")


def check_schedule(plan: Plan) -> None:
    if plan.schedule == "interleaved-1f1b":
        if plan.pp == 1 or plan.vpp < 2:
            raise SpecError("plan.vpp", f"interleaved-1f1b needs pp > 1 and vpp >= 2, got "
                            f"pp={plan.pp}, vpp={plan.vpp}")
        m = plan.num_microbatches
        if m % plan.pp and plan.micro_batches_per_replica is None:
            raise SpecError("plan.global_batch_size", f"interleaved-1f1b needs micro-batches a "
                            f"multiple of pp: global_batch_size/(dp*micro_batch_size) = "
                            f"{plan.global_batch_size}/({plan.dp}*{plan.micro_batch_size}) = "
                            f"{m}, {m} % {plan.pp} != 0")
    elif plan.schedule in ("dualpipev", "dualpipe"):
        _check_dualpipe(plan)
    elif plan.vpp != 1:
        raise SpecError("plan.vpp", f"must be 1 unless schedule is interleaved-1f1b, "
                        f"dualpipev or dualpipe, got {plan.vpp} with {plan.schedule}")


def _check_dualpipe(plan: Plan) -> None:
    """DualPipeV: two virtual stages a rank, in a V, and at least one micro-batch per
    virtual stage, ``2 pp`` (DeepSeek's and torch's rule). DualPipe: an even pp, an even
    number of micro-batches (half enter at each end), at least ``2 pp`` (DeepSeek's), and
    ZeRO-0/1: the two copies of a stage sum their gradients after the data-parallel
    reduction, which trainsim models on whole gradients or ZeRO-1's shards only."""
    name, mirrored = plan.schedule, plan.schedule == "dualpipe"
    if plan.pp < 2 or (mirrored and plan.pp % 2):
        raise SpecError("plan.pp", f"{name} needs {'an even ' if mirrored else ''}pp >= 2, "
                        f"got {plan.pp}")
    if plan.vpp != 2:
        how = "one of each direction" if mirrored else "in a V"
        raise SpecError("plan.vpp", f"{name} needs vpp = 2 (two stages a rank, {how}), got "
                        f"{plan.vpp}")
    if mirrored and plan.zero_stage > 1:
        raise SpecError("plan.zero_stage", f"dualpipe is modelled with zero_stage 0 or 1 (the "
                        f"mirrored stages sum whole gradients or ZeRO-1 shards), got "
                        f"{plan.zero_stage}")
    field = "plan.micro_batches_per_replica" if plan.micro_batches_per_replica else \
        "plan.global_batch_size"
    counts = plan.micro_batches_per_replica or (plan.num_microbatches,)
    if min(counts) < 2 * plan.pp:
        raise SpecError(field, f"{name} needs at least 2*pp = {2 * plan.pp} micro-batches "
                        f"per replica, got {min(counts)}")
    if mirrored and any(c % 2 for c in counts):
        raise SpecError(field, f"dualpipe feeds half the micro-batches from each end: their "
                        f"number per replica must be even, got {list(counts)}")
    most = MAX_DUALPIPEV_RANK_MICROBATCHES
    if plan.pp * max(counts) > most:
        raise SpecError(field, f"{name} runs its programs pass by pass: pp * micro-batches "
                        f"per replica = {plan.pp}*{max(counts)} must be at most {most:,}")


def check_layers(plan: Plan, m: Any) -> None:
    """The stages' layer counts against the model (``m``, a ModelSpec): an even split, or
    ``layers_per_stage`` (pp counts under DualPipe, whose two directions hold each)."""
    mirrored = plan.schedule == "dualpipe"  # pp stages, each held twice
    stages, name = (plan.pp, "pp") if mirrored else (plan.pp * plan.vpp, "pp*vpp")
    shown = f"{stages}" if mirrored else f"{plan.pp}*{plan.vpp} = {stages}"
    lps = plan.layers_per_stage
    if lps is None:
        if m.num_layers % stages:
            raise SpecError("plan.pp", f"{name} = {shown} must divide model.num_layers = "
                            f"{m.num_layers} (or give layers_per_stage)")
        return
    if len(lps) != stages:
        raise SpecError("plan.layers_per_stage", f"must list {name} = {stages} counts, got "
                        f"{list(lps)}")
    if plan.zero_stage == 3 and 0 in lps:
        raise SpecError("plan.layers_per_stage", "a stage of no layers with zero_stage 3 is "
                        "not modelled (which rank gathers the embedding's and output's "
                        f"weights differs between the tiers), got {list(lps)}")
    if sum(lps) != m.num_layers:
        raise SpecError("plan.layers_per_stage", f"sum {'+'.join(map(str, lps))} = {sum(lps)} "
                        f"!= model.num_layers = {m.num_layers}")
