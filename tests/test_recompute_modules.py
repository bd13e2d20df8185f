"""Selective recomputation by module (``plan.recompute_modules``, Megatron-LM's
``--recompute-modules``): validation, what each module saves in memory and costs in time
(both tiers), FLOPs, context parallelism's exchange, and the exports."""

from __future__ import annotations

import dataclasses

import pytest

from executor.capabilities import unsupported
from optimizer.export import export
from sim import Plan, load_cluster, load_model, simulate
from sim.cost.compute import ops_layer_time
from sim.cost.profiled import cost_model_for
from sim.errors import SpecError
from sim.layout.flops import hardware_flops_per_token
from sim.layout.memory import layer_activation_bytes
from sim.layout.routing import routing
from sim.layout.stages import cp_exchanges
from sim.spec.plan import validate

MOE = "mixtral-8x7b"  # MoE in every layer, no shared expert; 8 experts, top-2


def _plan(mods: tuple[str, ...] | None, **kw: object) -> Plan:
    base = {"global_batch_size": 16, "seq_len": 4096, "dp": 8, "ep": 8,
            "recompute": "selective", "recompute_modules": mods}
    return Plan(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("changes, words", [
    ({"recompute_modules": ("attn",)}, "unknown module 'attn'"),
    ({"recompute_modules": ("moe",)}, "moe is not modelled"),
    ({"recompute_modules": ("mla_up_proj",)}, "mla_up_proj is not modelled"),
    ({"recompute_modules": ("layernorm", "layernorm")}, "names a module twice"),
    ({"recompute_modules": ()}, "non-empty list"),
    ({"recompute": "full"}, "needs recompute = selective"),
    ({"recompute_modules": ("mlp",), "tp": 2, "dp": 4, "ep": 1}, "with tp > 1 are not modelled"),
    ({"recompute_modules": ("shared_experts",), "moe_overlap": "shared-expert"},
     "cannot be re-run with moe_overlap = shared-expert"),
])
def test_bad_lists_are_one_line_errors(changes, words):
    with pytest.raises(SpecError) as err:
        _plan(("layernorm",), **changes)
    assert err.value.field == "plan.recompute_modules" and words in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("model, mods, words", [
    ("llama3-8b", ("moe_act",), "needs an MoE model"),
    (MOE, ("shared_experts",), "needs MoE layers with a shared expert"),
    (MOE, ("mlp",), "needs dense (non-MoE) layers"),
])
def test_modules_the_model_lacks_are_refused(model, mods, words):
    with pytest.raises(SpecError) as err:
        validate(_plan(mods, ep=1), load_model(model))
    assert err.value.field == "plan.recompute_modules" and words in str(err.value)


def test_null_is_the_attention_core_as_before():
    """Selective recomputation without modules is the attention core, with the numbers it
    had before the field existed (trainsim at aff61d9: these values)."""
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100:2")
    plan = Plan(16, 2048, dp=8, pp=2, recompute="selective")
    core = dataclasses.replace(plan, recompute_modules=("core_attn",))
    for p in (plan, core):
        a, d = (simulate(model, cluster, p, fidelity=f) for f in ("analytic", "des"))
        assert (a.iteration_time_s, a.peak_memory_gib) == (0.3153933146636109, 69.337890625)
        assert d.iteration_time_s == pytest.approx(0.3208931338607774, rel=1e-12)


def test_each_module_saves_what_it_no_longer_keeps():
    """Per layer and micro-batch (4,096 tokens, bf16): the outputs of the norms that stand
    alone (Transformer Engine's spec under flash attention: an MoE layer's pre-MLP norm,
    not a dense layer's, whose norms are fused into the next linear layer; both with the
    local spec of standard attention), the routed experts' activation outputs (top-k x
    expert ffn of the most-loaded rank's tokens), a dense MLP's inner tensors (gate, up and
    product: 3 x ffn)."""
    moe, dense = load_model(MOE), load_model("llama3-8b")
    sbe, h = 4096 * 2, moe.hidden_size
    base = layer_activation_bytes(moe, _plan(None), moe=True)
    norms = layer_activation_bytes(moe, _plan(("core_attn", "layernorm")), moe=True)
    assert base - norms == pytest.approx(sbe * h)
    fused = _plan(("layernorm",), ep=1)
    assert layer_activation_bytes(dense, fused) == layer_activation_bytes(dense, _plan(
        None, ep=1))
    local = dataclasses.replace(fused, attention="standard")
    assert layer_activation_bytes(dense, dataclasses.replace(local, recompute_modules=(
        "core_attn",))) - layer_activation_bytes(dense, dataclasses.replace(
            local, recompute_modules=("core_attn", "layernorm"))) == pytest.approx(2 * sbe * h)
    act = layer_activation_bytes(moe, _plan(("core_attn", "moe_act")), moe=True)
    load = routing(moe, _plan(None)).load_factor
    assert base - act == pytest.approx(moe.top_k * moe.expert_ffn * load * sbe)
    d = _plan(None, ep=1)
    mlp = layer_activation_bytes(dense, dataclasses.replace(d, recompute_modules=("mlp",)))
    assert layer_activation_bytes(dense, d) - mlp == pytest.approx(3 * dense.ffn_hidden_size
                                                                   * sbe)


def test_each_module_costs_its_forward_again_in_both_tiers():
    model, cluster = load_model(MOE), load_cluster("dgx-h100:1")
    cm = cost_model_for(cluster)
    core, more = _plan(("core_attn",)), _plan(("core_attn", "layernorm", "moe_act"))
    lt_core, lt_more = (ops_layer_time(cm, model, p, moe=True) for p in (core, more))
    norm = cm.elementwise(model.norm, 4096, model.hidden_size, "bf16")[0]  # pre-MLP only
    per_expert = 4096 * model.top_k / model.num_experts * 8  # the rank's expert's tokens
    act = cm.elementwise("swiglu", per_expert, model.expert_ffn, "bf16")[0]
    assert lt_more.recompute_forward - lt_core.recompute_forward == pytest.approx(norm + act)
    assert lt_core.recompute_forward == lt_core.attention_forward
    times = {}
    for name, p in (("core", core), ("more", more)):
        a, d = (simulate(model, cluster, p, fidelity=f) for f in ("analytic", "des"))
        assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.01)
        times[name] = a.iteration_time_s
    layers, micro = model.num_layers, 2  # 16 sequences over dp 8
    assert times["more"] - times["core"] == pytest.approx(layers * micro * (norm + act),
                                                          rel=1e-6)


def test_recomputed_matmuls_count_in_the_hardware_flops():
    m = load_model("llama3-8b")
    core = hardware_flops_per_token(m, 4096, "selective")
    mlp = hardware_flops_per_token(m, 4096, "selective", frozenset({"core_attn", "mlp"}))
    assert mlp - core == pytest.approx(m.num_layers * 2 * 3 * m.hidden_size * m.ffn_hidden_size)
    assert hardware_flops_per_token(m, 4096, "selective", frozenset({"layernorm"})) == \
        hardware_flops_per_token(m, 4096)


def test_the_cp_exchange_is_repeated_only_with_the_core():
    model = load_model("llama3-8b")
    ring = Plan(8, 32768, dp=2, cp=4, recompute="selective", recompute_modules=("layernorm",))
    with_core = dataclasses.replace(ring, recompute_modules=("layernorm", "core_attn"))
    assert cp_exchanges(model, with_core, True)[0][1] == \
        pytest.approx(1.5 * cp_exchanges(model, ring, True)[0][1])


def test_exports_name_the_modules_or_refuse_them():
    model, cluster = load_model(MOE), load_cluster("dgx-h100:1")
    plan = _plan(("core_attn", "moe_act"))
    text = export("megatron", plan, model, cluster)["megatron_args.sh"]
    assert "--recompute-granularity selective" in text
    assert "--recompute-modules core_attn moe_act" in text
    dense = Plan(16, 4096, dp=8, zero_stage=3, recompute="selective",
                 recompute_modules=("layernorm",))
    with pytest.raises(SpecError) as err:
        export("torchtitan", dense, load_model("llama3-8b"), cluster)
    assert err.value.field == "plan.recompute_modules"
    with pytest.raises(SpecError) as err:  # Megatron-LM's delayed fp8 scaling refuses them
        export("megatron", dataclasses.replace(plan, dtype="fp8"), model, cluster)
    assert err.value.field == "plan.recompute_modules" and "fp8" in str(err.value)
    assert unsupported(load_model("tiny"), Plan(8, 256, dp=2, recompute="selective",
                                                recompute_modules=("layernorm",)))[0] \
        == "plan.recompute_modules"


def test_megatron_core_reads_the_modules_back():
    pytest.importorskip("megatron.core", reason="megatron-core not installed (pip install -e "
                        "'.[export-check]')")
    from helpers.frameworks import megatron_parsed

    model, cluster = load_model(MOE), load_cluster("dgx-h100:1")
    text = export("megatron", _plan(("core_attn", "moe_act", "layernorm")), model,
                  cluster)["megatron_args.sh"]
    parsed = megatron_parsed(text, cluster.world_size)
    assert parsed["recompute_modules"] == ["core_attn", "layernorm", "moe_act"]  # ordered


def test_the_search_re_runs_norms_and_activations_only_where_that_makes_a_plan_fit():
    """Qwen3-30B-A3B, EP 8 x DP 16, micro-batch 2 (study_recompute_modules.py): without
    recomputation ZeRO-1 needs 86.8 GiB, ZeRO-2 80.8, ZeRO-3 75.0; layernorm saves 1.5 GiB,
    moe_act 4.5, both 6. The search offers the cheapest that makes the plan fit the device
    (ZeRO-2), or the user's budget (ZeRO-3 under 70 GiB); never where nothing or the plain
    plan fits, and never for a dense model."""
    from optimizer.constraints import Constraints
    from optimizer.space import SearchSpace

    model, cluster = load_model("qwen3-30b-a3b"), load_cluster("dgx-h100:2")
    fixed = (("tp", 1), ("cp", 1), ("pp", 1), ("ep", 8), ("micro_batch_size", 2))

    def lightened(budget: float | None) -> dict[int, tuple[str, ...]]:
        space = SearchSpace(model, cluster, 256, 4096, constraints=Constraints(
            fixed=fixed, max_memory_gib=budget))
        return {p.zero_stage: p.recompute_modules for p in space if p.recompute_modules}

    assert lightened(None) == {2: ("layernorm",)}  # 79.3 GiB: the norms are enough
    assert lightened(70.0) == {3: ("layernorm", "moe_act")}  # 69.0 GiB
    dense = SearchSpace(load_model("llama3-8b"), cluster, 64, 4096)
    assert all(p.recompute_modules is None for p in dense)
