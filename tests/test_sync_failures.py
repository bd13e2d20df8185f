"""Links failing during a multi-step synchronisation run (sim/strategies/failures.py):
flows re-routed or stalled, all-reduce strategies repriced from the failure on."""

from __future__ import annotations

import pytest

from sim.errors import SpecError
from sim.spec.cluster import load_cluster
from sim.spec.faults import faults_from_options
from sim.spec.plan import Plan
from sim.spec.zoo import load_any
from sim.strategies import simulate_sync

MODEL, CLUSTER = load_any("llama3-8b"), load_cluster("dgx-h100:4")
ONE = faults_from_options(failures=["nic3.0@5"])
ALL = faults_from_options(failures=[f"nic3.{i}@5" for i in range(8)])  # node 3 cut off


def plan(sync: object = "bsp", comm: object = "auto") -> Plan:
    return Plan(global_batch_size=256, seq_len=4096, dp=4, tp=8, sync=sync,  # type: ignore[arg-type]
                communication=comm)  # type: ignore[arg-type]


@pytest.mark.parametrize("sync,comm", [("bsp", "auto"), ("asp", {"architecture": "ps"}),
                                       ("gossip", "auto")])
def test_one_failed_nic_is_routed_around(sync: object, comm: object) -> None:
    p = plan(sync, comm)
    base = simulate_sync(MODEL, CLUSTER, p, "des", steps=30)
    r = simulate_sync(MODEL, CLUSTER, p, "des", steps=30, faults=ONE)
    assert 0 < r.samples_per_s <= base.samples_per_s * 1.02
    assert any("after the link failure at 5 s" in w for w in r.warnings)


@pytest.mark.parametrize("sync,comm,why", [
    ("bsp", "auto", "reduction has no path left"),
    ({"kind": "local-sgd", "period": 4}, "auto", "reduction has no path left"),
    ("asp", {"architecture": "ps"}, "no path from"),
    ("gossip", "auto", "no path from")])
def test_a_node_cut_off_stalls_the_run(sync: object, comm: object, why: str) -> None:
    r = simulate_sync(MODEL, CLUSTER, plan(sync, comm), "des", steps=30, faults=ALL)
    assert r.samples_per_s == 0 and r.updates_per_s == 0
    assert any(why in w and "cannot complete" in w for w in r.warnings)
    assert r.simulation["stalled_at_s"] >= 5


def test_the_closed_forms_refuse_failing_links() -> None:
    with pytest.raises(SpecError, match="--fail-link: .*des tier"):
        simulate_sync(MODEL, CLUSTER, plan(), "analytic", faults=ONE)


def test_repricing_keeps_compression_and_ignores_stragglers() -> None:
    from sim.strategies import build_setup

    p = Plan(global_batch_size=256, seq_len=4096, dp=4, tp=8, compression="int8")
    s, _ = build_setup(MODEL, CLUSTER, p, "des", ONE)
    assert s.after["exposed_s"] <= s.after["allreduce_s"]  # compressed after the failure too
    slow = faults_from_options(["gpu:0=2.0"], failures=["nic3.0@5"])
    s2, _ = build_setup(MODEL, CLUSTER, p, "des", slow)
    assert s2.after == s.after  # the straggler is the DES's, not the repricing's
