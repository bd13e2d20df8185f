"""Synchronisation strategies over many steps: the exact equalities the issue names, the
closed forms against the DES on an idle network, and the straggler ordering."""

from __future__ import annotations

import json
import math

import pytest

from sim.analytic.sync import sync_closed_form
from sim.api import simulate
from sim.des.workers import run_workers
from sim.errors import SpecError
from sim.spec.cluster import load_cluster
from sim.spec.faults import Faults, faults_from_options
from sim.spec.plan import Plan
from sim.spec.zoo import load_any
from sim.strategies import build_setup, simulate_sync

MODEL = load_any("llama3-8b")
CLUSTER = load_cluster("dgx-h100:4")
BASE = dict(global_batch_size=256, seq_len=4096, dp=4, tp=8)
PS2 = {"architecture": "ps", "servers": 2}


def plan(sync: object = "bsp", comm: object = "auto", **kw: object) -> Plan:
    return Plan(**{**BASE, **kw}, sync=sync, communication=comm)  # type: ignore[arg-type]


def des(p: Plan, steps: int = 60, faults: Faults | None = None):
    s, _ = build_setup(MODEL, CLUSTER, p, "analytic", faults)
    return s, run_workers(s, steps)


def test_ssp_zero_is_bsp_and_ssp_inf_is_asp() -> None:
    _, bsp = des(plan("bsp", PS2))
    _, ssp0 = des(plan({"kind": "ssp", "staleness": 0}, PS2))
    assert ssp0.end_s == bsp.end_s  # the same waits, the same flows
    assert sum(x for _, x in ssp0.samples) == sum(x for _, x in bsp.samples)
    faults = faults_from_options(["gpu:0=1.3"])
    _, asp = des(plan("asp", PS2), faults=faults)
    _, inf = des(plan({"kind": "ssp", "staleness": "inf"}, PS2), faults=faults)
    assert (inf.end_s, inf.updates, inf.staleness) == (asp.end_s, asp.updates, asp.staleness)


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_bsp_with_identical_workers_is_the_one_step_tier(fidelity: str) -> None:
    """Over many steps, BSP must give the one-step tier's iteration time exactly."""
    one = simulate(MODEL, CLUSTER, plan(), fidelity)
    r = simulate_sync(MODEL, CLUSTER, plan(), fidelity, steps=40)
    assert r.bsp_iteration_s == one.iteration_time_s
    assert r.step_time_s == pytest.approx(one.iteration_time_s, rel=1e-9)
    assert r.samples_per_s == pytest.approx(one.samples_per_s, rel=1e-9)


def test_local_sgd_with_period_one_is_bsp() -> None:
    _, loc = des(plan({"kind": "local-sgd", "period": 1}))
    _, bsp = des(plan())
    one = simulate(MODEL, CLUSTER, plan(), "analytic")
    assert loc.end_s == bsp.end_s == pytest.approx(60 * one.iteration_time_s, rel=1e-12)


CLOSED = [
    ("bsp", {"architecture": "ps", "servers": 2}),
    ("asp", {"architecture": "ps", "servers": 1}),
    ({"kind": "local-sgd", "period": 8}, "auto"),
    ({"kind": "diloco", "period": 10, "pseudo_gradient_dtype": "bf16"}, "auto"),
    ({"kind": "two-stage", "important_fraction": 0.3}, "auto"),
    ({"kind": "gossip", "graph": "ring"}, "auto"),
    ({"kind": "gossip", "gossip_mode": "sgp", "graph": "exponential"}, "auto"),
]


@pytest.mark.parametrize("sync,comm", CLOSED, ids=lambda x: str(x)[:30])
def test_closed_forms_equal_the_des_on_an_idle_network(sync: object, comm: object) -> None:
    p = plan(sync, comm)
    s, _ = build_setup(MODEL, CLUSTER, p, "analytic")
    r = simulate_sync(MODEL, CLUSTER, p, "des", steps=200)
    cf = sync_closed_form(s)
    assert r.updates_per_s == pytest.approx(cf.updates_per_s, rel=1e-3)
    assert r.samples_per_s == pytest.approx(cf.samples_per_s, rel=1e-3)
    if p.sync.kind == "asp":
        assert r.staleness["mean"] == pytest.approx(cf.staleness_mean, rel=2e-2)


def _rates(factor: float) -> dict[str, float]:
    faults = faults_from_options([f"gpu:0={factor}"])
    out = {}
    for name, sync in (("bsp", "bsp"), ("ssp", {"kind": "ssp", "staleness": 2}),
                       ("asp", "asp")):
        r = simulate_sync(MODEL, CLUSTER, plan(sync, {"architecture": "ps"}), "des",
                          steps=120, faults=faults)
        out[name] = r.samples_per_s
    return out


def test_asp_ssp_bsp_order_under_a_straggler_and_the_gap_grows() -> None:
    mild, strong = _rates(1.5), _rates(2.0)
    for r in (mild, strong):
        assert r["asp"] >= r["ssp"] >= r["bsp"]
    assert strong["asp"] / strong["bsp"] > mild["asp"] / mild["bsp"]


def test_staleness_and_server_figures_are_recorded() -> None:
    r = simulate_sync(MODEL, CLUSTER, plan("asp", PS2), "des", steps=80)
    assert r.update_scope == "server"
    assert r.staleness["mean"] == pytest.approx(3.0, abs=0.1)  # n - 1 for identical workers
    assert sum(r.staleness["histogram"].values()) > 0
    assert len(r.servers) == 2 and all(0 < s["cpu"] < 1 for s in r.servers)
    assert r.links and r.links[0]["link"].startswith(("ps", "pod", "nic", "gpu"))


def test_trace_spans_workers_and_servers(tmp_path) -> None:
    path = tmp_path / "t.json"
    simulate_sync(MODEL, CLUSTER, plan("asp", PS2), "des", steps=10, trace=str(path),
                  trace_steps=3)
    doc = json.loads(path.read_text())
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert {"worker0", "server0", "server1"} <= names
    assert any(e.get("name") == "push1" for e in doc["traceEvents"])


def test_simulate_refuses_a_multi_step_plan() -> None:
    with pytest.raises(SpecError, match="simulate_sync"):
        simulate(MODEL, CLUSTER, plan("asp"), "analytic")


@pytest.mark.parametrize("fields,match", [
    ({"sync": {"kind": "ssp", "staleness": -1}}, "plan.sync.staleness"),
    ({"sync": {"kind": "local-sgd", "period": 0}}, "plan.sync.period"),
    ({"sync": {"kind": "gossip", "graph": "edges", "edges": [[0, 1], [2, 3]]}},
     "not connected"),
    ({"sync": {"kind": "gossip", "graph": "edges", "edges": [[0, 9]]}}, "names worker 9"),
    ({"compression": {"kind": "topk", "ratio": 0}}, "plan.compression.ratio"),
    ({"compression": {"kind": "topk", "ratio": 1.5}}, "plan.compression.ratio"),
    ({"sync": "asp", "communication": "allreduce"}, "asp runs over ps"),
    ({"sync": {"kind": "asp", "period": 4}}, "parameter of local-sgd"),
    ({"sync": "asp", "zero_stage": 1}, "plan.zero_stage"),
    ({"sync": "asp", "dp": 1, "global_batch_size": 64}, "dp >= 2"),
    ({"sync": {"kind": "gossip", "graph": "edges", "edges": 5}}, "list of worker pairs"),
    ({"sync": {"kind": "gossip", "gossip_mode": "sgp"}}, "exponential"),
    ({"compression": {"kind": "none", "warmup_steps": 5}}, "not of kind 'none'"),
    ({"sync": "gossip", "dp": 2**15, "global_batch_size": 2**15, "tp": 1}, "at most 16,384"),
])
def test_bad_sync_fields_are_one_line_errors(fields: dict, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        Plan(**{**BASE, **fields})


def test_more_servers_than_tensors_is_an_error() -> None:
    tiny = load_any("tiny")
    p = Plan(global_batch_size=8, seq_len=128, dp=4, sync="asp",
             communication={"architecture": "ps", "servers": 10_000})
    with pytest.raises(SpecError, match="plan.communication.servers.*parameter tensors"):
        simulate_sync(tiny, load_cluster("cpu:4"), p, "analytic")


def test_plan_json_round_trip_and_defaults_unchanged() -> None:
    p = plan({"kind": "ssp", "staleness": "inf"}, PS2)
    d = p.to_dict()
    assert d["sync"] == {"kind": "ssp", "staleness": "inf"}
    assert Plan.from_dict(d) == p
    assert plan().to_dict()["sync"] == {"kind": "bsp"}
    assert math.isinf(p.sync.staleness)


def test_fill_few_equals_the_numpy_water_filling() -> None:
    """The plain-Python rating of a few flows is the same weighted max-min as ``_fill``."""
    import numpy as np

    from sim.network.flows import Flow, _fill, _Pairs, fill_few

    rng = np.random.default_rng(3)
    for _ in range(200):
        cap = rng.uniform(1.0, 10.0, 12)
        flows = []
        for _ in range(int(rng.integers(1, 9))):
            links = tuple(int(x) for x in rng.choice(12, size=int(rng.integers(1, 5)),
                                                     replace=False))
            weights = tuple(float(rng.choice([0.5, 1.0, 2.0])) for _ in links)
            flows.append(Flow(links, weights, 1.0, None))
        few = fill_few(flows, cap)
        ref = _fill(_Pairs.of(flows), cap)
        assert np.allclose(few, ref, rtol=1e-12, atol=0)


def test_staleness_does_not_depend_on_the_number_of_shards() -> None:
    """Each shard answers on its own (as the real servers do): alike workers see n - 1."""
    for servers in (1, 4):
        r = simulate_sync(MODEL, load_cluster("dgx-h100:2"), Plan(
            global_batch_size=64, seq_len=4096, dp=4, tp=4, sync="asp",
            communication={"architecture": "ps", "servers": servers}), "des", steps=80)
        assert r.staleness["mean"] == pytest.approx(3.0, abs=0.05), servers
        assert r.warmup_updates_dropped < 4 * 80


def test_backup_workers_let_a_straggler_finish() -> None:
    r = simulate_sync(load_any("resnet50"), load_cluster("dgx-h100:1"), Plan(
        global_batch_size=256, seq_len=1, dp=8, sync={"kind": "backup-workers", "backups": 1}),
        "des", steps=50, faults=faults_from_options(["gpu:0=5"]))
    assert r.steps == 50 and not r.warnings
    assert 0 < r.dropped_fraction < 0.5
