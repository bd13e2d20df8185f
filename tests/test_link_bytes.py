"""Invariant: bytes are conserved on every link (hypothesis over random scenarios,
derandomized like tests/test_properties.py).

* the flow network credits each flow's bytes (times its weight) to every link of its path
  exactly once, however flows overlap and are re-rated;
* a collective on a random group of a random topology puts on each link the sum of the
  bytes of the flows routed over it; the bytes its ranks send add up to the algorithm's
  closed form (a ring, tree, halving-doubling or hierarchical all-reduce sends
  ``2(n-1)·S``, an all-gather, reduce-scatter, all-to-all or chain broadcast ``(n-1)·S``),
  and all links together carry that times each flow's hop count (networkx shortest paths);
* a reduced collective (one aggregate flow standing for its copies on other groups) puts
  the same bytes on every link as running every copy;
* a training step puts the same bytes on every link reduced or in full, and a
  data-parallel-only step's ranks send ``2(dp-1)`` times the gradient bytes.
"""

from __future__ import annotations

import functools
import math

import networkx as nx
import numpy as np
import simpy
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from optimizer.space import SearchSpace
from sim.cost.profiled import cost_model_for
from sim.des.run import simulate_des
from sim.layout.memory import rank_params
from sim.layout.stages import pipeline_rank_layers
from sim.network.algorithms import TABLE, expand
from sim.network.engine import CommEngine
from sim.network.flows import Network
from sim.network.topology import Topology, build_topology
from sim.spec.cluster import TOPOLOGIES, ClusterSpec, load_cluster
from sim.spec.plan import Plan
from sim.spec.scenario import apply_cluster_edits
from sim.spec.zoo import load_model

FLOWS = settings(max_examples=60, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])
STEPS = settings(max_examples=10, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


# the flow network ---------------------------------------------------------------------------
@FLOWS
@given(st.data())
def test_network_credits_every_flow_once_on_each_link(data):
    n = data.draw(st.integers(1, 6))
    caps = data.draw(st.lists(st.floats(1e8, 1e11), min_size=n, max_size=n))
    flows = data.draw(st.lists(st.tuples(
        st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True),
        st.floats(1.0, 1e9), st.floats(0.0, 1e-2), st.sampled_from((0.25, 1.0, 3.0))),
        min_size=1, max_size=10))
    env = simpy.Environment()
    net = Network(env, caps, [0.0] * n)
    expected = np.zeros(n)
    for links, size, start_s, weight in flows:
        net.transfer(links, size, [weight] * len(links), latency_s=start_s)
        expected[links] += weight * size
    env.run()
    assert np.allclose(net.stats.bytes, expected, rtol=1e-9, atol=1e-3)


# collectives on random topologies -----------------------------------------------------------
@st.composite
def clusters(draw: st.DrawFn) -> ClusterSpec:
    per_node = draw(st.sampled_from((2, 4, 8)))
    edits = [("gpus_per_node", per_node),
             ("intra_node.kind", draw(st.sampled_from(("nvswitch", "nvlink-mesh", "pcie")))),
             ("inter_node.topology", draw(st.sampled_from(TOPOLOGIES))),
             ("inter_node.nics_per_node", draw(st.sampled_from((1, 2, per_node)))),
             ("inter_node.oversubscription", draw(st.sampled_from((1.0, 3.0)))),
             ("inter_node.pod_gpus", draw(st.sampled_from((0, per_node))))]
    preset = f"{draw(st.sampled_from(('dgx-a100', 'dgx-h100')))}:{draw(st.integers(1, 6))}"
    return apply_cluster_edits(load_cluster(preset), edits)


@functools.lru_cache(maxsize=16)
def _topology(cluster: ClusterSpec) -> Topology:
    return build_topology(cluster)


def _run(topo: Topology, groups: list[tuple[str, str, list[int], float]],
         copies: list[list[int]] | None = None) -> np.ndarray:
    """Per-link bytes after running the collectives at once on a fresh network."""
    env = simpy.Environment()
    net = Network(env, topo.cap, topo.lat)
    comm = CommEngine(env, topo, net)
    for kind, algorithm, devices, size in groups:
        env.process(comm.run(kind, algorithm, devices, size, copies))
    env.run()
    return net.stats.bytes


def _flows(topo: Topology, kind: str, algorithm: str, devices: list[int], size: float
           ) -> list[tuple[tuple[int, ...], float, int, int]]:
    """(route, weighted bytes, source device, destination device) of every flow, routed
    here from the algorithm's phases (a flow to or from the switch is one link)."""
    nodes: dict[int, list[int]] = {}
    for i, d in enumerate(devices):
        nodes.setdefault(topo.node_of(d), []).append(i)
    out = []
    for phase in expand(kind, algorithm, len(devices), size, list(nodes.values())):
        for f in phase.flows:
            src, dst = devices[f.src], devices[f.dst]
            if f.to_switch or f.from_switch:
                sw = ("sw", topo.node_of(src))
                link = topo.lid(src, sw) if f.to_switch else topo.lid(sw, src)
                g = topo.cluster.gpu_of(src)
                weight = g.comm_eff / g.nvls_eff if g.nvls_eff else 1.0
                out.append(((link,), f.size_bytes * weight, src, -1))
            else:
                out.append((topo.route(src, dst), f.size_bytes, src, dst))
    return out


def _draw_collective(data: st.DataObject, cluster: ClusterSpec) -> tuple[str, str]:
    """A collective and an algorithm (NVLS only where plans may ask for it: NVSwitch)."""
    algorithms = [a for a in TABLE
                  if a != "nvls" or cluster.intra_node.kind == "nvswitch"]
    return data.draw(st.sampled_from(KINDS)), data.draw(st.sampled_from(algorithms))


def _sent_by_ranks(kind: str, n: int, size: float) -> float:
    """Closed form: bytes all ranks of the group send."""
    return (2 if kind == "all_reduce" else 1) * (n - 1) * size


@FLOWS
@given(clusters(), st.data())
def test_collective_bytes_on_every_link(cluster, data):
    topo = _topology(cluster)
    n = data.draw(st.integers(2, min(8, cluster.world_size)))
    devices = data.draw(st.permutations(range(cluster.world_size)))[:n]
    kind, algorithm = _draw_collective(data, cluster)
    size = data.draw(st.floats(1e3, 1e9))
    got = _run(topo, [(kind, algorithm, devices, size)])
    flows = _flows(topo, kind, algorithm, devices, size)
    expected = np.zeros(len(topo.links))
    for route, b, _, _ in flows:
        expected[list(route)] += b
    assert np.allclose(got, expected, rtol=1e-9, atol=1e-3)
    if all(dst >= 0 for _, _, _, dst in flows):  # no in-switch reduction
        sent = sum(b for _, b, _, _ in flows)
        assert math.isclose(sent, _sent_by_ranks(kind, n, size), rel_tol=1e-9)
        hops = sum(b * nx.shortest_path_length(topo.graph, s, d) for _, b, s, d in flows)
        assert math.isclose(float(got.sum()), hops, rel_tol=1e-9)


@FLOWS
@given(clusters(), st.data())
def test_reduced_collective_credits_every_copy(cluster, data):
    """One aggregate flow for the same collective on groups shifted by whole nodes puts
    the bytes of all of them on every link."""
    topo = _topology(cluster)
    g = cluster.gpus_per_node
    span = data.draw(st.integers(1, max(1, cluster.nodes // 2)))
    n = data.draw(st.integers(2, min(8, span * g)))
    devices = sorted(data.draw(st.permutations(range(span * g)))[:n])
    copies = [[d + shift * span * g for d in devices] for shift in range(cluster.nodes // span)]
    kind, algorithm = _draw_collective(data, cluster)
    size = data.draw(st.floats(1e3, 1e9))
    reduced = _run(topo, [(kind, algorithm, devices, size)], copies)
    full = _run(topo, [(kind, algorithm, c, size) for c in copies])
    assert np.allclose(reduced, full, rtol=1e-9, atol=1e-3)


# training steps -----------------------------------------------------------------------------
@functools.cache
def _plans(model: str, preset: str, per_node: int, batch: int) -> list[Plan]:
    cluster = apply_cluster_edits(load_cluster(preset), [("gpus_per_node", per_node)])
    return list(SearchSpace(load_model(model), cluster, batch, 1024))


@st.composite
def steps(draw: st.DrawFn, dp_only: bool = False) -> tuple[str, ClusterSpec, Plan]:
    # llama3-8b has no data-parallel-only plan that fits (weights and Adam state unsharded)
    model = "tiny" if dp_only else draw(st.sampled_from(("tiny", "llama3-8b")))
    gpu = "dgx-a100" if dp_only else draw(st.sampled_from(("dgx-a100", "dgx-h100")))
    preset, per_node = f"{gpu}:{draw(st.sampled_from((1, 2)))}", draw(st.sampled_from((4, 8)))
    plans = [p for p in _plans(model, preset, per_node, draw(st.sampled_from((8, 16))))
             if not dp_only or (p.world_size == p.dp and p.zero_stage == 0)]
    edits = [("gpus_per_node", per_node),
             ("inter_node.topology", draw(st.sampled_from(TOPOLOGIES))),
             ("inter_node.oversubscription", draw(st.sampled_from((1.0, 4.0)))),
             ("inter_node.pod_gpus", draw(st.sampled_from((0, per_node))))]
    assume(plans)  # e.g. 16 GPUs, batch 8: no data-parallel-only plan
    return model, apply_cluster_edits(load_cluster(preset), edits), \
        plans[draw(st.integers(0, len(plans) - 1))]


def _link_bytes(model: str, cluster: ClusterSpec, plan: Plan, reduce: bool) -> dict[str, float]:
    t = simulate_des(load_model(model), cluster, plan, cost_model_for(cluster), reduce=reduce,
                     top_links=None)
    return {x["link"]: x["bytes"] for x in t.links}


@STEPS
@given(steps())
@example(("llama3-8b", load_cluster("dgx-h100:2"), Plan(16, 1024, dp=2, tp=8)))
@example(("llama3-8b", load_cluster("dgx-a100:2"), Plan(16, 1024, tp=8, pp=2)))
def test_step_puts_the_same_bytes_on_every_link_reduced_or_full(scenario):
    """(The two examples: TP memoised inside each node, replayed by every unit.)"""
    reduced, full = _link_bytes(*scenario, reduce=True), _link_bytes(*scenario, reduce=False)
    assert set(reduced) == set(full)
    for link, b in full.items():
        assert math.isclose(reduced[link], b, rel_tol=1e-9), link


@STEPS
@given(steps(dp_only=True))
def test_data_parallel_step_sends_twice_dp_minus_one_gradients(scenario):
    model, cluster, plan = scenario
    m = load_model(model)
    grads = sum(rank_params(m, plan, pipeline_rank_layers(plan, m)[0])) * plan.activation_bytes
    links = _link_bytes(model, cluster, plan, reduce=True)
    sent = sum(b for name, b in links.items() if name.split("->")[0].startswith("gpu"))
    assert math.isclose(sent, 2 * (plan.dp - 1) * grads, rel_tol=1e-9)
