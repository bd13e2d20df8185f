"""BytePS-style parameter servers: node aggregation and partitions pipelined with the
backward (sim/strategies/byteps.py, sim/des/partitions.py)."""

from __future__ import annotations

import dataclasses

import pytest

from executor.sync.launch import runnable
from sim.analytic.sync import sync_closed_form
from sim.des.workers import run_workers
from sim.errors import SpecError
from sim.spec.cluster import load_cluster
from sim.spec.faults import faults_from_options
from sim.spec.plan import Plan
from sim.spec.zoo import load_any
from sim.strategies import build_setup, simulate_sync

VGG = load_any("vgg16")
CLUSTER = dataclasses.replace(load_cluster("examples/byteps-v100-tcp20.toml"), nodes=2)


def plan(**comm: object) -> Plan:
    return Plan(global_batch_size=16 * 64, seq_len=1, dp=16, dtype="fp32", sync="bsp",
                communication={"architecture": "ps", "servers": 2, **comm})


def test_one_partition_on_one_server_is_the_whole_push() -> None:
    """A partition as big as the gradient, one server: the same flows at the same times."""
    whole = simulate_sync(VGG, CLUSTER, plan(servers=1), "des", steps=8)
    one = simulate_sync(VGG, CLUSTER, plan(servers=1, partition_MB=10_000), "des", steps=8)
    s, _ = build_setup(VGG, CLUSTER, plan(servers=1, partition_MB=10_000), "analytic")
    assert s.partitions == 1
    assert one.step_time_s == pytest.approx(whole.step_time_s, rel=1e-12)


@pytest.mark.parametrize("comm", [{"partition_MB": 4}, {"partition_MB": 16, "servers": 3},
                                  {"partition_MB": 4, "aggregate": "node"}])
def test_the_partition_recursion_equals_the_des(comm: dict) -> None:
    p = plan(**comm)
    s, _ = build_setup(VGG, CLUSTER, p, "analytic")
    r = simulate_sync(VGG, CLUSTER, p, "des", steps=10)
    assert r.step_time_s == pytest.approx(1 / sync_closed_form(s).updates_per_s, rel=1e-9)


def test_partitions_hide_the_servers_behind_the_backward() -> None:
    whole = simulate_sync(VGG, CLUSTER, plan(aggregate="node"), "des", steps=8)
    piped = simulate_sync(VGG, CLUSTER, plan(aggregate="node", partition_MB=4), "des", steps=8)
    assert piped.samples_per_s > 1.3 * whole.samples_per_s


def test_node_aggregation_makes_a_node_one_worker() -> None:
    per_gpu, _ = build_setup(VGG, CLUSTER, plan(), "analytic")
    node, _ = build_setup(VGG, CLUSTER, plan(aggregate="node"), "analytic")
    assert (per_gpu.workers, node.workers) == (16, 2)
    assert node.samples_per_step == 8 * per_gpu.samples_per_step
    assert sorted(node.devices[1]) == list(range(8, 16))
    assert node.push_bytes == per_gpu.push_bytes  # one gradient's worth a node, not eight
    assert node.local_reduce_s > 0
    assert node.compute_s[0] == pytest.approx(per_gpu.compute_s[0] + node.local_reduce_s)
    rec = run_workers(node, 6)
    assert rec.link_bytes.sum() < run_workers(per_gpu, 6).link_bytes.sum() / 4


def test_a_slow_gpu_slows_its_whole_node() -> None:
    faults = faults_from_options(["gpu:3=2.0"])
    s, _ = build_setup(VGG, CLUSTER, plan(aggregate="node"), "analytic", faults)
    assert s.compute_s[0] > 1.9 * (s.compute_s[1] - s.local_reduce_s)


@pytest.mark.parametrize("comm,match", [
    ({"partition_MB": -1}, "plan.communication.partition_MB"),
    ({"partition_MB": float("nan")}, "plan.communication.partition_MB"),
    ({"aggregate": "rack"}, "plan.communication.aggregate"),
    ({"partition_MB": 5e-324}, "a byte at least"),
])
def test_bad_byteps_fields_are_one_line_errors(comm: dict, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        plan(**comm)


def test_partitions_need_bsp_and_servers() -> None:
    with pytest.raises(SpecError, match="needs sync bsp"):
        Plan(global_batch_size=64, seq_len=1, dp=4, sync="asp",
             communication={"architecture": "ps", "partition_MB": 4})
    with pytest.raises(SpecError, match="partition_MB"):
        Plan(global_batch_size=64, seq_len=1, dp=4,
             communication={"architecture": "allreduce", "partition_MB": 4})


def test_uneven_nodes_cannot_aggregate() -> None:
    six = dataclasses.replace(load_cluster("dgx-h100:2"), gpus_per_node=6)  # 4-GPU replicas
    p = Plan(global_batch_size=6, seq_len=128, dp=3, tp=4,
             communication={"architecture": "ps", "aggregate": "node"})
    with pytest.raises(SpecError, match="as many workers on every node, got 1 to 2"):
        simulate_sync(load_any("tiny"), six, p, "analytic")


def test_the_real_runs_refuse_what_they_do_not_do() -> None:
    assert "simulated only" in runnable(plan(partition_MB=4))[1]  # type: ignore[index]
    assert runnable(plan(aggregate="node"))[0] == "plan.communication.aggregate"  # type: ignore[index]


def test_the_closed_form_says_when_colocated_servers_share_the_nics() -> None:
    p = plan(partition_MB=4, placement="colocated")
    r = simulate_sync(VGG, CLUSTER, p, "analytic")
    assert any("colocated servers" in w and "des tier" in w for w in r.warnings)
    assert not simulate_sync(VGG, CLUSTER, plan(partition_MB=4), "analytic").warnings
