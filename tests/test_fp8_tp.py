"""fp8 training under tensor parallelism as torchao's float8 TP (torchtitan's) and Transformer
Engine (Megatron-Core's) run it: with sequence parallelism each linear layer's input is cast
on its sequence shard and all-gathered in fp8, as is a row-parallel layer's output gradient
in the backward; the reduce-scatters, the routed tokens' gathers and the output projection
stay 16-bit (sim.layout.stages.tp_gathers, sim.cost.costmodel.Roofline.gemm)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sim import Plan, load_cluster, load_model, simulate
from sim.cost.compute import logits_time, ops_layer_time
from sim.cost.costmodel import roofline_for
from sim.layout.inventory import expected_collectives
from sim.layout.stages import tp_gathers, tp_pass


def _plan(dtype: str = "fp8", **kw) -> Plan:
    base = dict(global_batch_size=16, seq_len=4096, micro_batch_size=1, dp=2, tp=8,
                sequence_parallel=True, dtype=dtype)
    return Plan(**(base | kw))


def _bytes(model, plan) -> dict[str, int]:
    return {r["kind"]: r["bytes"] for r in expected_collectives(model, plan)
            if r["group"] == "tp"}


def test_which_gathers_carry_fp8():
    llama, mla = load_model("llama3-8b"), load_model("deepseek-v3")
    assert tp_gathers(llama, _plan(), False) == (0.5, 0.5)
    assert tp_gathers(llama, _plan("bf16"), False) == (1.0, 1.0)
    # no sequence parallelism: all-reduces of outputs, nothing gathered
    assert tp_gathers(llama, _plan(sequence_parallel=False), False) == (1.0, 1.0)
    assert [k for k, _ in tp_pass(llama, _plan(sequence_parallel=False), False)] == \
        ["all_reduce", "all_reduce"]
    # MLA's attention gathers 16 bits (Megatron-LM's duplicated down-projections); the
    # shared expert fp8; the routed tokens the dispatcher's own 16-bit gather
    moe = _plan(ep=2)  # the experts on the TP group (etp = tp): the routed tokens' pair
    scales = tp_gathers(mla, moe, True)
    assert scales[:2] == (1.0, 0.5) and all(s == 1.0 for s in scales[2:])
    assert tp_gathers(mla, moe, False) == (1.0, 0.5)
    # the pass: the gathers at their bytes, the reduce-scatters at 16 bits
    assert tp_pass(llama, _plan(), False) == [("all_gather", 0.5), ("reduce_scatter", 1.0),
                                              ("all_gather", 0.5), ("reduce_scatter", 1.0)]


def test_the_inventory_halves_the_layers_gathers_only():
    m = load_model("llama3-8b")
    fp8, bf16 = _bytes(m, _plan()), _bytes(m, _plan("bf16"))
    p = _plan()
    act = p.local_tokens * m.hidden_size * 2
    # every layer's two gathers, forward and backward, each micro-batch, at half; the
    # embedding's backward and the output layer's forward gather stay 16-bit (not fp8
    # linear layers)
    assert bf16["all_gather"] - fp8["all_gather"] == \
        m.num_layers * 2 * 2 * p.num_microbatches * act / 2
    assert fp8["reduce_scatter"] == bf16["reduce_scatter"]


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_both_tiers_charge_the_smaller_gathers(fidelity):
    m, c = load_model("llama3-8b"), load_cluster("dgx-h100:2")
    fp8 = simulate(m, c, _plan(), fidelity=fidelity).communication["tp"]["exposed_s"]
    bf16 = simulate(m, c, _plan("bf16"), fidelity=fidelity).communication["tp"]["exposed_s"]
    # the same reduce-scatters, the layers' gathers at half their bytes (the bandwidth term
    # dominates at these sizes): about three quarters of the 16-bit plan's TP time
    assert 0.7 * bf16 < fp8 < 0.8 * bf16


def test_the_tiers_agree_under_fp8_tp():
    """The TP seconds alike (the iteration times differ by the tiers' known data-parallel
    tail, docs/validation/network.md, which shorter fp8 compute exposes more of)."""
    m, c = load_model("llama3-8b"), load_cluster("dgx-h100:2")
    for kw in ({}, {"recompute": "full"}, {"pp": 2, "dp": 1}):
        a = simulate(m, c, _plan(**kw)).communication["tp"]["exposed_s"]
        d = simulate(m, c, _plan(**kw), fidelity="des").communication["tp"]["exposed_s"]
        assert d == pytest.approx(a, rel=0.01), kw


class _CastAfterGather:
    """A cost model whose fp8 casts all run on the gathered operands (what trainsim charged
    before 2026-12-06), else ``inner``'s."""

    def __init__(self, inner):
        self.inner = inner

    def gemm(self, m, n, k, dtype, gathered=(1.0, 1.0)):
        return self.inner.gemm(m, n, k, dtype)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _roofline():
    return roofline_for(dataclasses.replace(load_cluster("grand-teton:1").gpu,
                                            fp8_cast_bytes=5.0))


def test_casts_run_on_the_shard_before_the_gather():
    rf = _roofline()
    m, n, k = 32768.0, 768.0, 4096.0
    cast = 5.0 / rf.mem_Bps
    whole, shard = rf.gemm(m, n, k, "fp8"), rf.gemm(m, n, k, "fp8", (8, 1))
    assert whole[0] - shard[0] == pytest.approx(m * k * (1 - 1 / 8) * cast)
    assert whole[1] == shard[1]
    grads = rf.gemm(m, n, k, "fp8", (1, 8))
    assert whole[1] - grads[1] == pytest.approx(m * n * (1 - 1 / 8) * cast)
    # bf16 has no casts: the argument changes nothing
    assert rf.gemm(m, n, k, "bf16", (8, 8)) == rf.gemm(m, n, k, "bf16")


@pytest.mark.parametrize("name,moe", [("llama3-8b", False), ("qwen3-30b-a3b", True)])
def test_a_layer_casts_exactly_its_gathered_operands_on_the_shard(name, moe):
    """Forward: the input projections' (QKV; the MLP's up, or a shared expert's) inputs;
    backward: the output projections' (attention, MLP or shared-expert down) output
    gradients. Routed experts' and the router's operands are not gathered."""
    rf, model = _roofline(), load_model(name)
    if moe:  # a shared expert beside the routed ones, on the TP group
        model = dataclasses.replace(model, shared_expert_ffn_hidden_size=2048)
    p = _plan(ep=2) if moe else _plan()
    lt = ops_layer_time(rf, model, p, moe)
    before = ops_layer_time(_CastAfterGather(rf), model, p, moe)
    saved = 2 * p.local_tokens * model.hidden_size * (1 - 1 / p.tp) * 5.0 / rf.mem_Bps
    assert before.forward - lt.forward == pytest.approx(saved, rel=1e-9)
    assert before.backward - lt.backward == pytest.approx(saved, rel=1e-9)
    # without sequence parallelism nothing is gathered: the casts as before
    flat = dataclasses.replace(p, sequence_parallel=False)
    assert ops_layer_time(rf, model, flat, moe) == \
        ops_layer_time(_CastAfterGather(rf), model, flat, moe)


def test_the_output_projection_runs_in_16_bits():
    rf, m = _roofline(), load_model("llama3-8b")
    assert logits_time(rf, m, _plan(tp=1, dp=16, sequence_parallel=False)) == \
        logits_time(rf, m, _plan("bf16", tp=1, dp=16, sequence_parallel=False))



def test_fp16_training_keeps_fp16_activations():
    """V100s have no bf16: an fp16 plan's activations, attention and output layer run in
    fp16 (a KeyError traceback until 2026-12-06)."""
    c = load_cluster(str(Path(__file__).parents[1] / "examples" / "byteps-v100-tcp20.toml"))
    m = load_model("llama3-8b")
    plan = Plan(global_batch_size=64, seq_len=1024, dp=64, dtype="fp16", zero_stage=3)
    assert plan.activation_dtype == "fp16"
    for fidelity in ("analytic", "des"):
        assert simulate(m, c, plan, fidelity=fidelity).iteration_time_s > 0


def test_the_torchtitan_export_says_what_its_float8_runs_differently(tmp_path):
    """torchtitan 0.3.0 has rowwise float8 recipes only (no float8 TP): the script says so;
    the output layer is filtered, as trainsim times it."""
    from optimizer.export import export

    plan = Plan(64, 4096, 1, dp=2, tp=8, sequence_parallel=True, dtype="fp8")
    files = export("torchtitan", plan, load_model("llama3-8b"), load_cluster("dgx-h100:2"))
    note = files["torchtitan.sh"]
    assert "rowwise recipes only" in note and "gathers activations in bf16" in note
    assert 'filter_fqns=["lm_head"]' in files["trainsim_torchtitan.py"]
    plain = export("torchtitan", dataclasses.replace(plan, dtype="bf16"),
                   load_model("llama3-8b"), load_cluster("dgx-h100:2"))
    assert "rowwise" not in plain["torchtitan.sh"]
