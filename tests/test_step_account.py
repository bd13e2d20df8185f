"""One account of a step's collectives: what the discrete-event tier issues (kind, group,
count, bytes, per rank of every pipeline stage) equals :mod:`sim.layout.inventory`'s
account under its ``SIMULATED`` conventions, for every test plan. The inventory's
``TORCH`` account is checked against real runs in ``test_executor.py``; the conventions
name every place where the two differ."""

from __future__ import annotations

import pytest

from executor.suite import suite_plans
from sim import Plan, load_cluster, load_model
from sim.cost.profiled import cost_model_for
from sim.des.run import issued_collectives
from sim.layout.inventory import SIMULATED, TORCH, expected_collectives

P = Plan
GPU_PLANS = {  # name -> (model, cluster, plan): every parallelism and ZeRO stage the DES runs
    "tp2-pp2": ("llama3-8b", "dgx-h100:2", P(16, 2048, dp=4, tp=2, pp=2)),
    "tp4-sp-pp2": ("llama3-8b", "dgx-h100:2",
                   P(16, 2048, dp=2, tp=4, pp=2, sequence_parallel=True)),
    "interleaved": ("llama3-8b", "dgx-h100:4",
                    P(32, 2048, dp=2, tp=4, pp=4, vpp=2, schedule="interleaved-1f1b")),
    "cp2": ("llama3-8b", "dgx-h100:2", P(8, 8192, dp=2, tp=2, cp=2, pp=2)),
    "cp2-allgather-recompute": ("llama3-8b", "dgx-h100:2", P(
        8, 8192, dp=2, tp=2, cp=2, pp=2, cp_comm="allgather", recompute="full")),
    "cp4-a2a": ("llama3-8b", "dgx-h100:2", P(8, 8192, dp=2, tp=2, cp=4, cp_comm="a2a")),
    "cp4-a2a-recompute": ("llama3-8b", "dgx-h100:2", P(
        8, 8192, dp=2, tp=2, cp=4, cp_comm="a2a", recompute="full")),
    "zero1": ("llama3-8b", "dgx-h100:2", P(16, 2048, dp=16, zero_stage=1)),
    "zero2": ("llama3-8b", "dgx-h100:2", P(32, 2048, dp=16, zero_stage=2)),
    "zero3": ("llama3-8b", "dgx-h100:2", P(16, 2048, dp=16, zero_stage=3)),
    "gpipe-recompute": ("llama3-8b", "dgx-h100:2",
                        P(16, 2048, dp=4, pp=4, recompute="full", schedule="gpipe")),
    "no-overlap": ("llama3-8b", "dgx-h100:2", P(16, 2048, dp=8, pp=2, overlap_grad_reduce=False)),
    "tiny-cp-cpu": ("tiny", "cpu:4", P(8, 256, cp=2, dp=2)),
    # the memoised path: TP groups alone on their links, chunks replayed as one delay
    "tiny-tp2-recompute": ("tiny", "cpu:2", P(8, 256, tp=2, recompute="full")),
    "tiny-tp2-early-stop": ("tiny", "cpu:2", P(8, 256, tp=2, recompute="full",
                                               recompute_replay="early-stop")),
    "moe-sp-early-stop": ("mixtral-8x7b", "dgx-h100:2", P(
        16, 2048, dp=2, tp=8, ep=2, sequence_parallel=True, recompute="full",
        recompute_replay="early-stop")),
    "moe-tp8-ep2": ("mixtral-8x7b", "dgx-h100:2",
                    P(16, 2048, dp=2, tp=8, ep=2, sequence_parallel=True, recompute="full")),
    # replicas running different numbers of micro-batches (the DES then runs unreduced)
    "uneven-replicas": ("tiny", "cpu:4", P(8, 256, dp=2, tp=2, micro_batches_per_replica=(3, 5))),
    "uneven-zero1-pp": ("tiny", "cpu:4", P(10, 256, dp=2, pp=2, zero_stage=1,
                                           micro_batches_per_replica=(4, 6))),
    "dualpipev-tp2": ("llama3-8b", "dgx-h100:2", P(32, 2048, dp=2, tp=2, pp=4, vpp=2,
                                                   schedule="dualpipev")),
    "dualpipev-tied-zero3": ("tiny", "cpu:4", P(8, 256, dp=2, pp=2, vpp=2, zero_stage=3,
                                                schedule="dualpipev")),
    "dualpipev-moe-a2a": ("qwen3-30b-a3b", "dgx-h100:2", P(
        32, 2048, dp=4, pp=4, vpp=2, ep=4, schedule="dualpipev", moe_overlap="a2a")),
}
for z in (1, 3):
    for r in ("none", "full"):
        GPU_PLANS[f"moe-ep4-zero{z}-{r}"] = ("mixtral-8x7b", "dgx-h100:4", P(
            32, 2048, dp=8, tp=2, pp=2, ep=4, sequence_parallel=True, zero_stage=z, recompute=r))
CASES = GPU_PLANS | {f"executor-{k}": ("tiny", "cpu:2", p) for k, p in suite_plans().items()}


def _keyed(rows: list[dict]) -> dict[tuple[str, str], tuple[int, int]]:
    return {(r["group"], r["kind"]): (r["count"], r["bytes"]) for r in rows}


@pytest.mark.parametrize("name", CASES)
def test_des_issues_the_inventorys_collectives(name: str) -> None:
    model_ref, cluster_ref, plan = CASES[name]
    model, cluster = load_model(model_ref), load_cluster(cluster_ref)
    replicas = range(plan.dp) if plan.micro_batches_per_replica else range(1)
    for replica in replicas:
        issued = issued_collectives(model, cluster, plan, cost_model_for(cluster), replica)
        for stage in range(plan.pp):
            des = _keyed(issued[stage])
            expected = _keyed(expected_collectives(model, plan, stage, SIMULATED, replica))
            where = (replica, stage)
            assert set(des) == set(expected), (where, sorted(des), sorted(expected))
            for key, (count, size) in expected.items():
                assert des[key][0] == count, (where, key, des[key], count)
                assert des[key][1] == pytest.approx(size, rel=1e-9, abs=1), (where, key)


def test_uneven_replicas_issue_their_own_counts() -> None:
    """With 3 and 5 micro-batches the two replicas issue different numbers of TP
    collectives, and each matches its own account."""
    model, cluster = load_model("tiny"), load_cluster("cpu:4")
    plan = CASES["uneven-replicas"][2]
    counts = [_keyed(issued_collectives(model, cluster, plan, cost_model_for(cluster), r)[0])
              [("tp", "all_reduce")][0] for r in (0, 1)]
    assert counts[0] < counts[1]


def test_the_conventions_differ_where_named() -> None:
    """On a TP + PP plan without sequence parallelism the DES sends 1/tp of each boundary
    tensor and all-gathers it; torch sends it whole. Elsewhere (a data-parallel plan of a
    small model, one bucket per chunk either way) the two accounts agree."""
    model = load_model("llama3-8b")
    plan = P(16, 2048, dp=4, tp=2, pp=2)
    torch, des = (_keyed(expected_collectives(model, plan, 0, c)) for c in (TORCH, SIMULATED))
    assert des[("pp", "send")][1] * 2 == torch[("pp", "send")][1]
    assert ("tp", "all_gather") in des and ("tp", "all_gather") not in torch
    tiny = P(8, 256, dp=2)
    assert expected_collectives(load_model("tiny"), tiny, 0, TORCH) == \
        expected_collectives(load_model("tiny"), tiny, 0, SIMULATED)
