"""Context parallelism's three exchanges (``plan.cp_comm``): the K/V ring (``p2p``, the
default, today's numbers), the K/V all-gather and Ulysses' all-to-all: their validation,
their bytes, the tiers' agreement, their memory, the search and the exports."""

from __future__ import annotations

import dataclasses

import pytest

from optimizer.constraints import Constraints
from optimizer.export import export
from optimizer.space import SearchSpace
from sim import Plan, load_cluster, load_model, simulate
from sim.analytic.iteration import stage_costs
from sim.cost.profiled import cost_model_for
from sim.errors import SpecError
from sim.layout.inventory import SIMULATED, expected_collectives
from sim.spec.plan import validate

MODEL, CLUSTER = "llama3-8b", "dgx-h100:1"  # 32 query heads, 8 key/value heads
COMMS = ("p2p", "allgather", "a2a")


def _plan(comm: str, **kw: object) -> Plan:
    base = {"global_batch_size": 4, "seq_len": 65536, "cp": 8, "cp_comm": comm}
    return Plan(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("changes, words", [
    ({"cp_comm": "ring"}, "must be one of p2p, allgather, a2a"),
    ({"cp_comm": "all_gather"}, "written allgather here"),
    ({"cp_comm": "a2a+p2p"}, "hierarchical a2a+p2p is not modelled"),
    ({"cp": 1, "cp_comm": "a2a"}, "needs cp > 1"),
])
def test_bad_values_are_one_line_errors(changes, words):
    with pytest.raises(SpecError) as err:
        _plan("p2p", **changes)
    assert err.value.field == "plan.cp_comm" and words in str(err.value)
    assert "\n" not in str(err.value)


def test_ulysses_needs_the_heads_to_split_over_cp():
    """TP 2 leaves 4 key/value heads a rank: cp 4 splits them, cp 8 does not."""
    model = load_model(MODEL)
    validate(_plan("a2a", cp=4, tp=2), model)
    with pytest.raises(SpecError) as err:
        validate(_plan("a2a", tp=2), model)
    assert err.value.field == "plan.cp_comm" and "num_kv_heads/tp = 4" in str(err.value)


def test_the_default_is_the_ring_and_todays_numbers():
    """A plan without cp_comm is the ring, and times as before the field existed (trainsim
    at aff61d9: these values); its peak memory gains the ring's four K/V chunk buffers."""
    model, cluster = load_model(MODEL), load_cluster("dgx-h100:2")
    plain = Plan(8, 8192, dp=2, tp=2, cp=2, pp=2)
    assert plain.cp_comm == "p2p"
    assert Plan.from_dict({k: v for k, v in plain.to_dict().items() if k != "cp_comm"}) == plain
    a, d = (simulate(model, cluster, plain, fidelity=f) for f in ("analytic", "des"))
    assert a.iteration_time_s == 0.5937640462534428
    assert d.iteration_time_s == pytest.approx(0.596103452194932, rel=1e-12)
    chunk = 8192 // 2 * (model.kv_dim + model.v_dim) / 2 * 2 / 2 ** 30
    assert a.peak_memory_gib == pytest.approx(41.423828125 + 4 * chunk, rel=1e-12)


def _counts(plan: Plan) -> dict[str, tuple[int, int]]:
    rows = expected_collectives(load_model(MODEL), plan, 0, SIMULATED)
    return {r["kind"]: (r["count"], r["bytes"]) for r in rows if r["group"] == "cp"}


def test_each_exchange_moves_what_its_implementation_moves():
    """Per layer and micro-batch (32 layers, 4 micro-batches): the all-gather gathers K and
    V forward and again backward, reduce-scattering their gradients; Ulysses exchanges Q,
    K, V and the output forward and their gradients backward; full recomputation repeats
    the forward's exchanges (the ring's account is the DES's, unchanged)."""
    m, n = load_model(MODEL), 32 * 4
    local = 65536 // 8 * 2  # tokens of a rank's chunk, bytes of a bf16 element
    kv = 8 * local * (m.kv_dim + m.v_dim)  # every rank's K and V
    assert _counts(_plan("allgather")) == {"all_gather": (2 * n, 2 * n * kv),
                                           "reduce_scatter": (n, n * kv)}
    qkv, out = local * (m.q_dim + m.kv_dim + m.v_dim), local * m.o_dim
    assert _counts(_plan("a2a")) == {"all_to_all": (4 * n, 2 * n * (qkv + out))}
    assert _counts(_plan("a2a", recompute="full")) == {
        "all_to_all": (6 * n, 3 * n * (qkv + out))}


@pytest.mark.parametrize("comm", ["p2p", "allgather", "a2a"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_tiers_agree(comm, recompute):
    model, cluster = load_model(MODEL), load_cluster(CLUSTER)
    plan = _plan(comm, recompute=recompute)
    a, d = (simulate(model, cluster, plan, fidelity=f) for f in ("analytic", "des"))
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.01)
    exposed = [r.communication["cp"]["exposed_s"] for r in (a, d)]
    if comm == "p2p":  # hidden behind the attention core at 64k tokens
        assert exposed == [0.0, 0.0]
    else:  # the core waits: nothing hidden, both tiers within 10% of each other
        assert a.communication["cp"]["overlapped_s"] == 0.0
        assert exposed[1] == pytest.approx(exposed[0], rel=0.1) and exposed[0] > 0


def test_the_attention_core_costs_the_same_either_way():
    """Ulysses runs 1/cp of the heads over the whole sequence, the ring the whole heads
    over 1/cp of the queries: the same causal FLOPs, so the same compute in the roofline."""
    model, cluster = load_model(MODEL), load_cluster(CLUSTER)
    cost = cost_model_for(cluster)
    ring, ulysses = (stage_costs(model, cluster, _plan(c), cost)[0] for c in ("p2p", "a2a"))
    assert ulysses.compute_s == pytest.approx(ring.compute_s, rel=1e-12)
    assert ulysses.cp_exposed_s > 0 and ulysses.cp_overlapped_s == 0


def test_the_exchanges_buffers_in_memory():
    """One layer's K/V buffers: the ring two chunks of K/V and two of their gradients, the
    all-gather the whole gathered K/V and their full-size gradients, Ulysses nothing beyond
    its activations."""
    model, cluster = load_model(MODEL), load_cluster(CLUSTER)
    peaks = {c: simulate(model, cluster, _plan(c)).peak_memory_gib for c in COMMS}
    chunk = (65536 // 8) * (model.kv_dim + model.v_dim) * 2 / 2 ** 30
    assert peaks["p2p"] - peaks["a2a"] == pytest.approx(4 * chunk, rel=1e-6)
    assert peaks["allgather"] - peaks["a2a"] == pytest.approx(2 * 8 * chunk, rel=1e-6)


def test_the_search_moves_to_another_exchange_where_the_ring_is_exposed():
    """The space holds the ring (the all-gather for torchtitan, which runs no other); the
    local moves try the all-gather and, where the heads split, Ulysses, once the DES shows
    the ring exposed (CP 16 over two nodes at 32k tokens; CP 8 in a node is hidden)."""
    from optimizer.moves import _cp_moves

    model = load_model(MODEL)
    for framework, comm in (("any", "p2p"), ("torchtitan", "allgather")):
        space = SearchSpace(model, load_cluster("dgx-h100:2"), 16, 65536, constraints=Constraints(
            framework=framework, fixed=(("cp", 8),)))
        assert {p.cp_comm for p in space} == {comm}
    exposed = Plan(8, 32768, dp=2, cp=16, recompute="full", zero_stage=1)
    des = simulate(model, load_cluster("dgx-h100:4"), exposed, fidelity="des")
    moves = dict(_cp_moves(exposed, des))
    assert set(moves) == {"cp exchange allgather", "cp exchange a2a"}
    hidden = Plan(16, 32768, dp=2, cp=8, recompute="full", zero_stage=1)
    assert _cp_moves(hidden, simulate(model, load_cluster("dgx-h100:2"), hidden,
                                      fidelity="des")) == []


def test_exports_say_which_exchange_or_refuse_it():
    model, cluster = load_model(MODEL), load_cluster("dgx-h100:2")
    base = Plan(16, 16384, dp=4, cp=4, zero_stage=3)
    names = {"p2p": "p2p", "allgather": "all_gather", "a2a": "a2a"}
    for comm, te in names.items():
        args = export("megatron", dataclasses.replace(base, cp_comm=comm), model, cluster)
        assert f"--cp-comm-type {te}" in args["megatron_args.sh"]
    export("torchtitan", dataclasses.replace(base, cp_comm="allgather"), model, cluster)
    for comm in ("p2p", "a2a"):
        with pytest.raises(SpecError) as err:
            export("torchtitan", dataclasses.replace(base, cp_comm=comm), model, cluster)
        assert err.value.field == "plan.cp_comm" and "all-gathers K and V" in str(err.value)


def test_megatron_core_reads_the_exchange_back():
    pytest.importorskip("megatron.core", reason="megatron-core not installed (pip install -e "
                        "'.[export-check]')")
    from helpers.frameworks import megatron_parsed

    model, cluster = load_model(MODEL), load_cluster("dgx-h100:2")
    for comm, te in (("allgather", "all_gather"), ("a2a", "a2a")):
        plan = Plan(16, 16384, dp=2, tp=2, cp=4, sequence_parallel=True, cp_comm=comm)
        text = export("megatron", plan, model, cluster)["megatron_args.sh"]
        assert megatron_parsed(text, cluster.world_size)["cp_comm"] == te


def test_the_ring_across_nodes_waits_for_one_nic_in_both_tiers():
    """CP 16 over two nodes at 32k tokens: each of the ring's 15 hops waits for the chunk
    that leaves its node through one NIC, which the attention core no longer hides; the
    DES (flows, the ring beside the core only) and the closed form agree."""
    model, cluster = load_model(MODEL), load_cluster("dgx-h100:4")
    plan = Plan(8, 32768, dp=2, cp=16, recompute="full", zero_stage=1)
    a, d = (simulate(model, cluster, plan, fidelity=f) for f in ("analytic", "des"))
    assert a.communication["cp"]["exposed_s"] > 0.1
    assert d.communication["cp"]["exposed_s"] == pytest.approx(
        a.communication["cp"]["exposed_s"], rel=0.05)
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.02)
