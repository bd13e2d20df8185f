"""Full recomputation's replay (``plan.recompute_replay``): whole, as Megatron-LM and
torchtitan 0.3.0 run it, or stopped early at the last tensor the backward needs (torch's
non-reentrant checkpoint with its default ``early_stop``, as NeMo Automodel runs it): the
rules, what each tier charges, and the exports."""

from __future__ import annotations

import dataclasses

import pytest

from optimizer.export import refusal
from sim import Plan, load_cluster, load_model, simulate
from sim.errors import SpecError
from sim.layout.routing import dispatches, replay_dispatches
from sim.layout.stages import tp_pass

EARLY = {"recompute": "full", "recompute_replay": "early-stop"}


def test_the_field_has_its_rules() -> None:
    with pytest.raises(SpecError, match=r"plan\.recompute_replay.*one of whole, early-stop"):
        Plan(8, 1024, recompute="full", recompute_replay="early")
    with pytest.raises(SpecError, match=r"plan\.recompute_replay.*needs recompute = full"):
        Plan(8, 1024, recompute="selective", recompute_replay="early-stop")
    assert Plan.from_dict(Plan(8, 1024, **EARLY).to_dict()).recompute_replay == "early-stop"


def test_an_early_replay_leaves_out_the_last_reduction_of_a_layer() -> None:
    """Dense: the MLP's reduce-scatter (its output only joins the residual stream); an MoE
    layer with a shared expert: the shared expert's; without one, nothing."""
    dense, moe = load_model("llama3-8b"), load_model("mixtral-8x7b")
    p = Plan(16, 4096, tp=8, ep=2, dp=2, sequence_parallel=True, **EARLY)
    ops = tp_pass(dense, p, False)
    assert [k for k, _ in ops] == ["all_gather", "reduce_scatter"] * 2
    assert tp_pass(dense, p, False, replay=True) == ops[:3]
    assert tp_pass(moe, p, True, replay=True) == tp_pass(moe, p, True)
    shared = dataclasses.replace(moe, shared_expert_ffn_hidden_size=4096)
    assert tp_pass(shared, p, True, replay=True) == \
        [op for i, op in enumerate(tp_pass(shared, p, True)) if i != 3]
    deepep = dataclasses.replace(p, moe_dispatcher="deepep")  # Automodel's order: the shared
    assert tp_pass(shared, deepep, True, replay=True) == tp_pass(shared, deepep, True)  # first
    whole = dataclasses.replace(p, recompute_replay="whole")
    assert tp_pass(dense, whole, False, replay=True) == tp_pass(dense, whole, False)


def test_only_deepeps_combine_is_left_out() -> None:
    """DeepEP's tokens are weighted and un-permuted before its combine, which the replay
    then skips; the all-to-all dispatcher's un-permute after the combine keeps it."""
    m = load_model("qwen3-30b-a3b")
    deepep = Plan(64, 4096, dp=8, ep=8, moe_dispatcher="deepep", **EARLY)
    assert replay_dispatches(m, deepep, 1) == dispatches(m, deepep, 1)[:1]
    a2a = dataclasses.replace(deepep, moe_dispatcher="alltoall")
    assert replay_dispatches(m, a2a, 1) == dispatches(m, a2a, 1)


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_tp_time_of_an_early_replay(fidelity: str) -> None:
    """Llama-3 8B, TP 8 with SP on one node: a pass is four equal TP collectives a layer;
    the replay adds four (whole) or three (early stop) to the plain plan's."""
    m, c = load_model("llama3-8b"), load_cluster("dgx-h100:1")
    plain = Plan(8, 4096, tp=8, sequence_parallel=True)
    tp = {name: simulate(m, c, p, fidelity=fidelity).communication["tp"]["exposed_s"]
          for name, p in (("none", plain),
                          ("whole", dataclasses.replace(plain, recompute="full")),
                          ("early", dataclasses.replace(plain, **EARLY)))}
    ratio = (tp["early"] - tp["none"]) / (tp["whole"] - tp["none"])
    assert ratio == pytest.approx(0.75, rel=1e-6)


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_ep_time_of_an_early_replay_with_deepep(fidelity: str) -> None:
    """Qwen3-30B-A3B, EP 8 on one node, forced balance: dispatch and combine take as long,
    so the replay's exchanges are half the forward's under early stop (whole: all of it)."""
    m, c = load_model("qwen3-30b-a3b"), load_cluster("dgx-h100:1")
    plain = Plan(32, 4096, micro_batch_size=4, dp=8, ep=8, zero_stage=3,
                 moe_dispatcher="deepep")
    ep = {name: simulate(m, c, p, fidelity=fidelity).communication["ep"]["exposed_s"]
          for name, p in (("none", plain),
                          ("whole", dataclasses.replace(plain, recompute="full")),
                          ("early", dataclasses.replace(plain, **EARLY)))}
    ratio = (ep["early"] - ep["none"]) / (ep["whole"] - ep["none"])
    assert ratio == pytest.approx(0.5, rel=0.02)


def test_exports_refuse_what_their_framework_does_not_run() -> None:
    m = load_model("llama3-8b")
    p = Plan(16, 4096, tp=8, dp=2, sequence_parallel=True, **EARLY)
    for fmt in ("megatron", "torchtitan"):
        assert "plan.recompute_replay" in str(refusal(fmt, p, m)), fmt
    whole = dataclasses.replace(p, recompute_replay="whole")
    assert refusal("megatron", whole, m) is None


def test_an_early_replay_skips_a_dense_layers_down_projection() -> None:
    """torch saves a standard linear's inputs before running it, so the early stop fires
    before a dense layer's last GEMM (the MLP's down projection); an MoE layer's grouped
    expert GEMMs save after running, so its replay runs the whole forward."""
    from sim.cost.compute import layer_time
    from sim.cost.profiled import cost_model_for
    from sim.layout.flops import hardware_flops_per_token

    m, c = load_model("llama3-8b"), load_cluster("dgx-h100:1")
    cm = cost_model_for(c)
    p = Plan(8, 4096, tp=8, sequence_parallel=True, **EARLY)
    lt = layer_time(cm, m, p)
    down = cm.gemm(p.local_tokens, m.hidden_size, m.ffn_hidden_size / 8, "bf16")[0]
    assert lt.replay("full", True) == pytest.approx(lt.forward - down, rel=1e-12)
    assert lt.replay("full", False) == lt.forward and lt.replay("none", True) == 0.0
    moe_model = load_model("mixtral-8x7b")
    q = Plan(16, 4096, dp=2, ep=2, tp=8, sequence_parallel=True, **EARLY)
    moe = layer_time(cm, moe_model, q, moe=True)
    assert moe.replay("full", True) == pytest.approx(moe.forward, rel=1e-12)
    whole = hardware_flops_per_token(m, 4096, "full")
    early = hardware_flops_per_token(m, 4096, "full", early_stop=True)
    assert whole - early == pytest.approx(32 * 2.0 * m.hidden_size * m.ffn_hidden_size)
