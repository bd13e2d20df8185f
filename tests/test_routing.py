"""MoE routing: forced balance, a max/mean load, a histogram of tokens per expert, and a
capacity factor that drops tokens (sim.layout.routing), in both tiers."""

import dataclasses
import json

import pytest
from helpers.cli import assert_bad_input, cli

from sim import Plan, load_cluster, load_model, simulate
from sim.cost import compute as cm
from sim.cost.profiled import cost_model_for
from sim.errors import SpecError
from sim.layout.memory import layer_activation_bytes
from sim.layout.routing import dispatches, ep_bytes, expected_nodes, gini, routing

MIXTRAL = load_model("mixtral-8x7b")
CLUSTER = load_cluster("dgx-h100:8")
BASE = Plan(global_batch_size=128, seq_len=4096, dp=16, pp=4, ep=8, zero_stage=1)


def test_gini_by_hand():
    assert gini((1.0, 1.0, 1.0, 1.0)) == 0.0
    assert gini((1.0, 0.0, 0.0, 0.0)) == pytest.approx(0.75)
    assert gini((1.0, 3.0)) == pytest.approx(0.25)  # |1-3| / (2 * 2 * mean 2)


def test_max_load_puts_the_hot_rank_at_f_and_spreads_the_rest():
    r = routing(MIXTRAL, dataclasses.replace(BASE, moe_max_load=1.25))
    assert (r.load_factor, r.max_load, r.dropped_fraction) == (1.25, 1.25, 0.0)
    # one expert at 1.25, seven at (8 - 1.25) / 7
    rest = 6.75 / 7
    assert r.gini == pytest.approx(gini((1.25,) + (rest,) * 7))


def test_histogram_and_capacity_by_hand():
    """16 experts on ep 4 (4 a rank). Loads 4,0,0,0 | 1,1,1,1 | ... : the first rank holds
    4/16 of the mean per expert... its mean is 1 like the others; capacity 2 keeps 2 of 4."""
    m = dataclasses.replace(MIXTRAL, num_experts=16)
    hist = (4.0, 0.0, 0.0, 0.0) + (1.0,) * 12
    plan = Plan(global_batch_size=32, seq_len=4096, dp=8, ep=4, moe_expert_load=hist)
    r = routing(m, plan)
    assert r.load_factor == pytest.approx(1.0) and r.dropped_fraction == 0.0
    hot = (6.0, 2.0, 0.0, 0.0) + (2 / 3,) * 12  # mean 1 after normalising
    r = routing(m, dataclasses.replace(plan, moe_expert_load=hot, moe_capacity_factor=1.5))
    assert r.max_load == pytest.approx(2.0)
    assert r.load_factor == pytest.approx((1.5 + 1.5 + 0 + 0) / 4)
    assert r.dropped_fraction == pytest.approx((4.5 + 0.5) / 16)


@pytest.mark.parametrize("tier", ["analytic", "des"])
def test_forced_balance_is_what_was_simulated_before(tier):
    """An equal histogram goes through the general path: the same step to 1e-9."""
    even = dataclasses.replace(BASE, moe_expert_load=(3.0,) * 8)
    a = simulate(MIXTRAL, CLUSTER, BASE, tier).iteration_time_s
    b = simulate(MIXTRAL, CLUSTER, even, tier).iteration_time_s
    assert b == pytest.approx(a, rel=1e-9)


def test_a_hot_rank_slows_the_expert_phase_by_its_load():
    """max/mean 1.25 on EP 8: the hot rank's expert GEMMs and its all-to-all bytes are 1.25x
    (roofline GEMMs in this size range are linear in tokens), and both tiers agree."""
    hot = dataclasses.replace(BASE, moe_max_load=1.25)
    assert ep_bytes(MIXTRAL, hot) == 1.25 * ep_bytes(MIXTRAL, BASE)
    cost = cost_model_for(CLUSTER)
    base_s, hot_s = (sum(cm.expert_time(cost, MIXTRAL, p, p.local_tokens)) for p in (BASE, hot))
    assert hot_s / base_s == pytest.approx(1.25, rel=0.01)
    steps = {}
    for tier in ("analytic", "des"):
        base, slow = (simulate(MIXTRAL, CLUSTER, p, tier) for p in (BASE, hot))
        assert slow.breakdown["ep"] / base.breakdown["ep"] == pytest.approx(1.25, rel=0.02)
        steps[tier] = slow.iteration_time_s / base.iteration_time_s
        assert slow.routing["load_factor"] == 1.25
    assert steps["des"] == pytest.approx(steps["analytic"], rel=0.02)
    assert 1.05 < steps["analytic"] < 1.25


def test_routed_activations_grow_with_the_load():
    hot = dataclasses.replace(BASE, moe_max_load=2.0)
    routed = 2 * (3 * MIXTRAL.expert_ffn + MIXTRAL.hidden_size) * 4096 * 2  # top-2, bf16
    grow = layer_activation_bytes(MIXTRAL, hot, moe=True) - layer_activation_bytes(
        MIXTRAL, BASE, moe=True)
    assert grow == pytest.approx(routed)


def test_capacity_drops_tokens_and_says_so():
    plan = dataclasses.replace(BASE, moe_max_load=2.0, moe_capacity_factor=1.25)
    res = simulate(MIXTRAL, CLUSTER, plan)
    assert res.routing["load_factor"] == 1.25 and res.routing["dropped_fraction"] > 0
    assert any("drops" in w for w in res.warnings)
    dropless = simulate(MIXTRAL, CLUSTER, dataclasses.replace(plan, moe_capacity_factor=None))
    assert dropless.iteration_time_s > res.iteration_time_s


def test_dense_model_has_no_routing():
    res = simulate(load_model("llama3-8b"), load_cluster("dgx-h100:1"),
                   Plan(global_batch_size=8, seq_len=2048, dp=8))
    assert res.routing == {}


@pytest.mark.parametrize("edit,field", [
    ("moe_capacity_factor=0", "plan.moe_capacity_factor"),
    ("moe_capacity_factor=-1.5", "plan.moe_capacity_factor"),
    ("moe_max_load=0.5", "plan.moe_max_load"),
    ("moe_max_load=9", "plan.moe_max_load"),
    ("moe_max_load=nan", "plan.moe_max_load"),
    ("moe_expert_load=[1, 2]", "plan.moe_expert_load"),
    ("moe_expert_load=[1, 1, 1, 1, 1, 1, 1, -1]", "plan.moe_expert_load"),
    ('moe_dispatcher="fast"', "plan.moe_dispatcher"),
])
def test_bad_routing_is_one_line(capsys, tmp_path, edit, field):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(BASE.to_dict()))
    rc, out, err = cli(capsys, "simulate", "--model", "mixtral-8x7b", "--cluster",
                       "dgx-h100:8", "--plan", str(path), "--set", edit)
    assert_bad_input(rc, out, err, field)


def test_routing_fields_need_an_moe_model_and_one_source():
    with pytest.raises(SpecError) as err:
        simulate(load_model("llama3-8b"), load_cluster("dgx-h100:1"),
                 Plan(global_batch_size=8, seq_len=2048, dp=8, moe_capacity_factor=1.0))
    assert err.value.field == "plan.moe_capacity_factor"
    with pytest.raises(SpecError) as err:
        Plan(global_batch_size=128, seq_len=4096, dp=16, ep=8, moe_max_load=1.5,
             moe_expert_load=(1.0,) * 8)
    assert err.value.field == "plan.moe_max_load"


def test_plan_json_round_trips_and_megatron_reads_the_capacity():
    plan = dataclasses.replace(BASE, moe_expert_load=(2.0,) + (1.0,) * 7,
                               moe_capacity_factor=1.5)
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    pytest.importorskip("megatron.core", reason="megatron-core not installed")
    from helpers.frameworks import _flags, _megatron_configs, script_env_and_args

    from optimizer.export import export

    text = export("megatron", plan, MIXTRAL, CLUSTER)["megatron_args.sh"]
    cfg, _ = _megatron_configs(_flags(script_env_and_args(text, "pretrain_gpt.py")[1]))
    assert cfg.moe_expert_capacity_factor == 1.5 and cfg.moe_token_drop_policy == "probs"


def test_executor_refuses_imbalanced_routing():
    from executor.capabilities import unsupported

    hot = dataclasses.replace(BASE, moe_max_load=1.25)
    assert unsupported(MIXTRAL, hot)[0] == "plan.moe_max_load"


def test_expected_nodes_by_hand_and_by_drawing():
    """Unlimited: n (1 - C(E - E/n, k) / C(E, k)). DeepSeek-V3 (4 of 8 groups, 8 of their
    128 experts) on 8 nodes, a group a node: checked by drawing 40,000 tokens."""
    from math import comb

    import numpy as np

    m = load_model("deepseek-v3")
    assert expected_nodes(m, 1) == 1.0
    free = dataclasses.replace(m, expert_groups=0, expert_groups_per_token=0)
    assert expected_nodes(free, 8) == pytest.approx(8 * (1 - comb(224, 8) / comb(256, 8)))
    rng = np.random.default_rng(0)
    groups = np.argsort(rng.random((40_000, 8)), axis=1)[:, :4]  # 4 of 8 groups a token
    picks = np.argsort(rng.random((40_000, 128)), axis=1)[:, :8]  # 8 of their 128 experts
    nodes = np.take_along_axis(groups, picks // 32, axis=1)
    drawn = np.mean([len(set(row)) for row in nodes.tolist()])
    assert expected_nodes(m, 8) == pytest.approx(drawn, rel=0.01)
    assert expected_nodes(m, 8) < expected_nodes(free, 8)


DSV3_64 = Plan(global_batch_size=64, seq_len=4096, dp=32, pp=2, ep=32, zero_stage=1,
               layers_per_stage=(31, 30))


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather", "deepep"])
def test_dispatchers_agree_across_tiers_and_reductions(dispatcher):
    m, c = load_model("deepseek-v3"), load_cluster("dgx-h100:8")
    plan = dataclasses.replace(DSV3_64, moe_dispatcher=dispatcher)
    a = simulate(m, c, plan)
    d = simulate(m, c, plan, "des")
    full = simulate(m, c, plan, "des", reduce=False)
    assert d.iteration_time_s == full.iteration_time_s and d.simulation["reduced"]
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.01)


def test_deepep_sends_a_token_once_per_node():
    """On 4 nodes DeepSeek-V3's 8 experts sit on 2.93 nodes on average: DeepEP's
    inter-node part is 2.93/8 of the all-to-all's bytes, and its step is faster."""
    m, c = load_model("deepseek-v3"), load_cluster("dgx-h100:8")
    deepep = dataclasses.replace(DSV3_64, moe_dispatcher="deepep")
    (rdma, nvl), _ = dispatches(m, deepep, 4)
    assert rdma[1] == pytest.approx(ep_bytes(m, deepep) * expected_nodes(m, 4) / 8)
    assert nvl == ("dispatch_nvl", ep_bytes(m, deepep))
    assert simulate(m, c, deepep).breakdown["ep"] < simulate(m, c, DSV3_64).breakdown["ep"]


def test_allgather_wins_when_top_k_is_large_against_ep():
    """All-gather moves every token to every rank once each way; the all-to-all moves
    top_k copies. With top-8 of 16 experts on ep 2 the all-gather is cheaper; with top-2 of
    8 on ep 8 (Mixtral) the all-to-all is."""
    wide = dataclasses.replace(MIXTRAL, num_experts=16, top_k=8)
    c = load_cluster("dgx-h100:1")
    small = Plan(global_batch_size=16, seq_len=4096, dp=8, ep=2)
    for model, plan, winner in ((wide, small, "allgather"), (MIXTRAL, BASE, "alltoall")):
        cl = c if plan is small else CLUSTER
        ep = {d: simulate(model, cl, dataclasses.replace(plan, moe_dispatcher=d)
                          ).breakdown["ep"] for d in ("alltoall", "allgather")}
        assert min(ep, key=ep.get) == winner, ep


def test_megatron_reads_the_dispatcher_back():
    pytest.importorskip("megatron.core", reason="megatron-core not installed")
    from helpers.frameworks import _flags, _megatron_configs, script_env_and_args

    from optimizer.export import export

    for dispatcher, kind in (("allgather", "allgather"), ("deepep", "flex")):
        plan = dataclasses.replace(BASE, moe_dispatcher=dispatcher)
        text = export("megatron", plan, MIXTRAL, CLUSTER)["megatron_args.sh"]
        cfg, _ = _megatron_configs(_flags(script_env_and_args(text, "pretrain_gpt.py")[1]))
        assert cfg.moe_token_dispatcher_type == kind
        if dispatcher == "deepep":
            assert cfg.moe_flex_dispatcher_backend == "deepep"
