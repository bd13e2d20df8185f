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
    model, cluster = load_model(MOE), load_cluster("dgx-h100:1")
    a, b = (simulate(model, cluster, _plan(m)) for m in (None, ("core_attn",)))
    assert a.iteration_time_s == b.iteration_time_s
    assert a.peak_memory_gib == b.peak_memory_gib


def test_each_module_saves_what_it_no_longer_keeps():
    """Per layer and micro-batch (4,096 tokens, bf16): the norms' outputs (2 x s x h), the
    routed experts' activation outputs (top-k x expert ffn of the most-loaded rank's
    tokens), a dense MLP's inner tensors (gate, up and product: 3 x ffn)."""
    moe, dense = load_model(MOE), load_model("llama3-8b")
    sbe = 4096 * 2
    base = layer_activation_bytes(moe, _plan(None), moe=True)
    norms = layer_activation_bytes(moe, _plan(("core_attn", "layernorm")), moe=True)
    assert base - norms == pytest.approx(2 * sbe * moe.hidden_size)
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
    norm = 2 * cm.elementwise(model.norm, 4096, model.hidden_size, "bf16")[0]
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
    assert parsed["recompute_modules"] == ["core_attn", "moe_act", "layernorm"]
