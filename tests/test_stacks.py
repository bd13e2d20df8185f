"""Software-stack profiles (sim/data/stacks.toml): each value sourced, applied once, acting in
both tiers, and the fitted ones reproducing what they were fitted to."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from sim import Plan, load_cluster, simulate
from sim.cost.compute import expert_time
from sim.cost.costmodel import roofline_for
from sim.errors import SpecError
from sim.spec.calibration import apply_calibration
from sim.spec.cluster import cluster_from_dict
from sim.spec.hf_config import hf_config_to_spec
from sim.spec.stack import STACK_FIELDS, apply_stack, get_stack, stacks
from sim.spec.zoo import load_model
from trainsim.cli import main

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
GPT = load_model("gpt3-175b")
A100 = load_cluster("dgx-a100:16")
PLAN = Plan(global_batch_size=64, seq_len=2048, tp=8, pp=4, dp=4, micro_batch_size=1)


def _with(cluster, stack):
    return dataclasses.replace(cluster, stack=stack)


def test_every_stack_sets_every_field_and_names_its_sources():
    assert {"megatron-2021", "megatron-core", "torchtitan-eager", "torchtitan-compile",
            "deepspeed"} <= set(stacks())
    for st in stacks().values():
        assert set(st.values) == set(STACK_FIELDS) and set(st.sources) >= set(STACK_FIELDS)
        assert st.description and all(st.sources[f] for f in STACK_FIELDS)


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_megatron_2021_is_the_catalog(fidelity):
    a = simulate(GPT, A100, PLAN, fidelity=fidelity)
    b = simulate(GPT, _with(A100, "megatron-2021"), PLAN, fidelity=fidelity)
    assert a.iteration_time_s == b.iteration_time_s


def test_a_stack_is_applied_once_and_a_calibration_goes_on_top():
    c = _with(A100, "torchtitan-compile")
    again = dataclasses.replace(c, name="x")
    assert again.gpu == c.gpu and c.gpu.stack == "torchtitan-compile"
    cal = apply_calibration(c, {"device": c.gpu.name, "factors": {"layer_overhead_us": 50.0}})
    assert cal.gpu.layer_overhead_us == 50.0
    assert cal.gpu.elementwise_scale == get_stack("torchtitan-compile").values[
        "elementwise_scale"]
    back = cluster_from_dict(c.to_dict(), "c")
    assert back.stack == "torchtitan-compile" and back.gpu == c.gpu


def test_a_stack_cannot_give_a_cpu_overlap():
    cpu = load_cluster("cpu:2")
    assert apply_stack(cpu.gpu, "torchtitan-eager").comm_overlap == 0.0
    assert apply_stack(A100.gpu, "deepspeed").nic_eff <= A100.gpu.nic_eff


def test_the_mechanisms_in_the_roofline():
    hw = A100.gpu
    base = roofline_for(dataclasses.replace(hw, elementwise_scale=1.0))
    half = roofline_for(dataclasses.replace(hw, elementwise_scale=0.5))
    assert half.elementwise("swiglu", 4096, 8192, "bf16")[0] == pytest.approx(
        0.5 * base.elementwise("swiglu", 4096, 8192, "bf16")[0], rel=1e-12)
    assert half.embedding(4096, 8192, 50000, "bf16") == base.embedding(4096, 8192, 50000,
                                                                          "bf16")
    h100 = load_cluster("dgx-h100:1").gpu
    plain = roofline_for(h100)
    cast = roofline_for(dataclasses.replace(h100, fp8_cast_bytes=5.0))
    m, n, k = 8192.0, 4096.0, 4096.0
    f0, b0 = plain.gemm(m, n, k, "fp8")
    f1, b1 = cast.gemm(m, n, k, "fp8")
    assert f1 - f0 == pytest.approx((m * k + n * k) * 5.0 / plain.mem_Bps, rel=1e-9)
    assert b1 - b0 == pytest.approx(m * n * 5.0 / plain.mem_Bps, rel=1e-9)
    assert cast.gemm(m, n, k, "bf16") == plain.gemm(m, n, k, "bf16")  # fp8 GEMMs only


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_a_step_overhead_adds_to_the_step_in_both_tiers(fidelity):
    gpu = dataclasses.replace(A100.gpu, step_overhead_ms=250.0)
    slow = dataclasses.replace(A100, gpu=gpu, node_groups=tuple(
        dataclasses.replace(g, gpu=gpu) for g in A100.node_groups))
    a = simulate(GPT, A100, PLAN, fidelity=fidelity).iteration_time_s
    b = simulate(GPT, slow, PLAN, fidelity=fidelity).iteration_time_s
    assert b - a == pytest.approx(0.25, rel=1e-6)


def test_the_fitted_values_reproduce_what_they_were_fitted_to():
    sys.path.insert(0, str(EXPERIMENTS))
    from fit_stacks import tt_step, tt_tps, zero3_runs

    comp = tt_step(8, "bf16", "torchtitan-compile")
    assert comp == tt_step(8, "bf16", "torchtitan-eager")  # compile's bf16 gain: not modelled
    fp8 = tt_step(8, "fp8", "torchtitan-compile")
    assert comp / fp8 == pytest.approx(tt_tps(8, "Float8 + compile")
                                       / tt_tps(8, "BF16 + torch.compile"), rel=0.005)
    run = zero3_runs()[0]
    t = simulate(run.model, _with(run.cluster, "deepspeed"), run.plan).iteration_time_s
    assert t == pytest.approx(run.measured_s, rel=0.03)
    from calibrate_torchtitan import runs as tt_runs

    by = {r.label: r for r in tt_runs()[0]}
    vanilla, fused = (by[f"70B FSDP32 x TP8 {tp} TP 256 GPUs BF16 + compile"]
                      for tp in ("vanilla", "async"))
    assert fused.plan.tp_overlap and fused.cluster.gpu.tp_overlap_eff == 0.184
    ratio = simulate(vanilla.model, vanilla.cluster, vanilla.plan).iteration_time_s \
        / simulate(fused.model, fused.cluster, fused.plan).iteration_time_s
    assert ratio == pytest.approx(vanilla.measured_s / fused.measured_s, rel=0.005)


def test_stack_in_a_toml_and_on_the_command_line(tmp_path, capsys):
    bad = tmp_path / "c.toml"
    bad.write_text('nodes = 1\ngpus_per_node = 8\ngpu = "h100-sxm5-80gb"\nstack = "jax"\n')
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(Plan(global_batch_size=8, seq_len=2048, dp=8,
                                    dtype="fp8").to_dict()))
    args = ["simulate", "--model", "llama3-8b", "--plan", str(plan), "--json"]
    assert main([*args, "--cluster", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stack: unknown stack 'jax'" in err[0]
    bad.write_text(bad.read_text().replace('"jax"', '"torchtitan-eager"'))
    assert main([*args, "--cluster", str(bad)]) == 0
    eager = json.loads(capsys.readouterr().out)["iteration_time_s"]
    assert main([*args, "--cluster", str(bad), "--stack", "megatron-2021"]) == 0
    plain = json.loads(capsys.readouterr().out)["iteration_time_s"]
    assert plain < eager  # no fp8 casts
    assert main([*args, "--cluster", str(bad), "--stack", ""]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_s"] == plain
    assert main(["hardware", "--stacks"]) == 0
    assert "torchtitan-compile" in capsys.readouterr().out


def test_a_stack_reaches_the_sites_of_a_multi_site_cluster():
    from sim.strategies.sites import site_steps

    c = dataclasses.replace(load_cluster("regions2-dgx-h100:2"), stack="torchtitan-eager")
    assert all(s.gpu is None or s.gpu.stack == "torchtitan-eager" for s in c.sites)
    plan = Plan(global_batch_size=32, seq_len=2048, dp=32, micro_batch_size=1)
    assert site_steps(load_model("llama3-8b"), c, plan).ref.iteration_time_s > 0


def test_a_calibration_keeps_to_the_stack_it_was_fitted_under():
    from optimizer.calibrate import Run, fit

    c = _with(load_cluster("dgx-h100:1"), "torchtitan-eager")
    plan = Plan(global_batch_size=8, seq_len=2048, dp=8, micro_batch_size=1)
    model = load_model("llama3-8b")
    t = simulate(model, c, plan).iteration_time_s
    cal = fit([Run(model, c, plan, 1.2 * t, "run")], factors=("gemm_eff_max",))
    assert cal["stack"] == "torchtitan-eager"
    assert apply_calibration(c, cal).gpu.gemm_eff_max == cal["factors"]["gemm_eff_max"]
    with pytest.raises(SpecError, match="^--calibration: was fitted under stack"):
        apply_calibration(_with(load_cluster("dgx-h100:1"), "megatron-core"), cal)
    with pytest.raises(SpecError, match="^runs: every run must be on one software stack"):
        fit([Run(model, c, plan, t, "a"), Run(model, load_cluster("dgx-h100:1"), plan, t, "b")])


def test_an_empty_stack_takes_the_stack_off():
    on = _with(A100, "deepspeed")
    off = _with(on, "")
    assert off.gpu == A100.gpu and off.node_groups == A100.node_groups
    assert simulate(GPT, off, PLAN).iteration_time_s == simulate(GPT, A100, PLAN).iteration_time_s


def _gpt_oss():
    entries = json.loads((EXPERIMENTS / "data" / "moe_hf_configs.json").read_text())
    cfg = next(e["config"] for e in entries if e["name"] == "gpt-oss-120b")
    return hf_config_to_spec(cfg, "gpt-oss-120b")


def test_biased_experts_add_their_biases_as_the_stack_says():
    """The stack's element streams of each expert GEMM output, up and down, forward and
    backward; nothing in a GEMM's epilogue, nothing for experts without biases."""
    oss, h100 = _gpt_oss(), load_cluster("dgx-h100:1").gpu
    plan = Plan(global_batch_size=8, seq_len=4096, micro_batch_size=1, ep=8, dp=8)
    tokens = plan.local_tokens
    none = dict.fromkeys(("expert_bias_up_fwd", "expert_bias_up_bwd", "expert_bias_down_fwd",
                          "expert_bias_down_bwd"), 0.0)
    fused = roofline_for(dataclasses.replace(h100, **none))
    core = roofline_for(apply_stack(h100, "megatron-core"))
    (f0, b0), (f1, b1) = (expert_time(c, oss, plan, tokens) for c in (fused, core))
    routed = tokens * oss.top_k  # forced balance: every rank's experts get this many
    up, down = (routed * w * 2 / core.mem_Bps for w in (2 * oss.expert_ffn, oss.hidden_size))
    assert f1 - f0 == pytest.approx(0 * up + 6 * down, rel=1e-9)
    assert b1 - b0 == pytest.approx(1 * up + 6 * down, rel=1e-9)
    plain = dataclasses.replace(oss, linear_bias=False)
    assert expert_time(fused, plain, plan, tokens) == expert_time(core, plain, plan, tokens)


def test_expert_biases_in_both_tiers():
    """The same seconds in both tiers (every expert pass is compute on the critical path
    here: one node, no pipeline); none for experts without biases."""
    oss, h100 = _gpt_oss(), load_cluster("dgx-h100:1")
    plan = Plan(global_batch_size=8, seq_len=4096, micro_batch_size=1, ep=8, dp=8,
                zero_stage=3)

    def extra(model, fidelity):
        te, titan = (simulate(model, _with(h100, s), plan, fidelity=fidelity).iteration_time_s
                     for s in ("megatron-core", "torchtitan-eager"))
        return titan - te
    a, d = extra(oss, "analytic"), extra(oss, "des")
    assert a != 0 and d == pytest.approx(a, rel=1e-6)
    plain = dataclasses.replace(oss, linear_bias=False)
    assert extra(plain, "analytic") == extra(plain, "des") == 0
