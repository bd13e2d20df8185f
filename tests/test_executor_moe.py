"""MoE layers run for real on the expert grids the simulator models: expert tensor
parallelism on the attention's TP group (Megatron-LM's all-to-all dispatcher with a TP
all-gather of the routed tokens), expert groups beyond the data-parallel ranks (EP > DP,
folded), and experts sharded by FSDP2 over their own group. Each run issues exactly the
collectives the simulator's torch account lists, and computes the same function as one
rank (forced-balance routing makes the parallel runs' losses comparable)."""

from __future__ import annotations

import pytest

from executor.launch import execute
from executor.parallel import mesh_ranks
from sim.layout.inventory import compare_inventory, expected_collectives
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

SHARED = ModelSpec("tiny-moe-shared", 2, 64, 4, 128, 512, max_seq_len=128, gated_mlp=True,
                   norm="rmsnorm", position_embedding="rope", num_experts=4, top_k=2,
                   shared_expert_ffn_hidden_size=64)
BASE = {"global_batch_size": 4, "seq_len": 64, "dtype": "fp32"}
ONE_REPLICA = {  # two micro-batches of two sequences, as one rank runs them
    "tp2 (etp = tp)": Plan(**BASE, micro_batch_size=2, tp=2, sequence_parallel=True),
    "tp2 ep2 etp1 (EP > DP)": Plan(**BASE, micro_batch_size=2, tp=2, ep=2, etp=1,
                                   sequence_parallel=True),
    "pp2 tp2 (tied embeddings)": Plan(**BASE, micro_batch_size=2, tp=2, pp=2,
                                      sequence_parallel=True),
    "tp2 full recompute": Plan(**BASE, micro_batch_size=2, tp=2, sequence_parallel=True,
                               recompute="full"),
}
TWO_REPLICAS = {  # one sequence per micro-batch on each of two replicas
    "dp2 (experts data parallel)": Plan(**BASE, micro_batch_size=1, dp=2),
    "dp2 ep2 (DDP)": Plan(**BASE, micro_batch_size=1, dp=2, ep=2),
    "tp2 dp2 ep2 ZeRO-3": Plan(**BASE, micro_batch_size=1, dp=2, tp=2, ep=2, zero_stage=3,
                               sequence_parallel=True),
    "tp2 dp2 ep4 etp1 ZeRO-3 (folded)": Plan(**BASE, micro_batch_size=1, dp=2, tp=2, ep=4,
                                             etp=1, zero_stage=3, sequence_parallel=True),
    "dp2 ep2 full recompute": Plan(**BASE, micro_batch_size=1, dp=2, ep=2,
                                   recompute="full"),
}


def _run(plan: Plan, **run) -> list[float]:
    res = execute(SHARED, plan, steps=1, warmup=1, timeout_s=180, **run)
    stage_of = {int(r): p for p, ranks in enumerate(mesh_ranks(plan)) for r in ranks.flatten()}
    for rank, measured in res["collectives"].items():
        expected = expected_collectives(SHARED, plan, stage_of[int(rank)])
        rows = compare_inventory(expected, measured)
        assert all(r["match"] for r in rows), (rank, rows)
        assert rows or plan.world_size == 1
    return res["loss"]


@pytest.mark.slow
def test_one_replica_grids_compute_what_one_rank_does():
    alone = _run(Plan(**BASE, micro_batch_size=2))
    for name, plan in ONE_REPLICA.items():
        assert _run(plan) == pytest.approx(alone, rel=1e-5), name


def test_expert_tensor_parallel_run_issues_the_simulated_collectives():
    """The TP all-gather and reduce-scatter of the routed tokens (top-k copies) that the
    simulator charges an MoE layer whose experts share the attention's TP group."""
    plan = ONE_REPLICA["tp2 (etp = tp)"]
    rows = expected_collectives(SHARED, plan, 0)
    gathered = next(r for r in rows if (r["group"], r["kind"]) == ("tp", "reduce_scatter"))
    act = plan.local_tokens * SHARED.hidden_size * 4  # fp32
    layer = (1 + 1 + SHARED.top_k) * act  # every layer MoE: attention, shared, routed
    edges = 2 * act  # the embedding's (forward) and the output layer's (backward)
    n = plan.num_microbatches
    assert gathered["bytes"] == SHARED.num_layers * layer * 2 * n + edges * n
    _run(plan)


@pytest.mark.slow
def test_expert_gradients_scale_as_data_parallel_ones():
    """Experts reduced by hand over their replicas (DDP) and sharded by FSDP2 over the
    expert-data-parallel group train as data-parallel experts do: with SGD (a step
    proportional to the gradient; a gradient twice too large moves the second loss by 5e-4)
    the second step's loss agrees."""
    losses = [_run(plan, optimizer="sgd", lr=1.0) for plan in TWO_REPLICAS.values()]
    assert all(other == pytest.approx(losses[0], rel=1e-5) for other in losses[1:])


def test_expert_groups_beyond_the_data_parallel_ranks_run():
    """EP 2 on one replica of TP 2 (etp 1): the expert group is the TP ranks, each expert
    whole; the dispatch crosses the TP ranks, the TP group keeps the attention's and the
    shared expert's collectives only."""
    plan = ONE_REPLICA["tp2 ep2 etp1 (EP > DP)"]
    groups = {(r["group"], r["kind"]) for r in expected_collectives(SHARED, plan, 0)}
    assert {("ep", "all_to_all"), ("ep", "all_gather")} <= groups
    _run(plan)
