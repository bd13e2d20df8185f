"""What hides an MoE layer's all-to-alls (plan.moe_overlap): the shared expert's compute, or
another micro-batch's in merged forward/backward steps; both tiers, the rules (Megatron-LM's),
the export and the front door that reads it back."""

from __future__ import annotations

import dataclasses

import pytest

from optimizer.export import export
from sim import Plan, load_cluster, load_model, simulate
from sim.cost import compute as cm
from sim.cost.profiled import cost_model_for
from sim.errors import SpecError
from sim.layout.memory import memory_report

QWEN = "qwen3-30b-a3b"  # no shared expert
A2A = Plan(64, 4096, 1, dp=8, tp=2, pp=2, vpp=2, schedule="interleaved-1f1b", ep=8,
           sequence_parallel=True, moe_overlap="a2a")


def _ep(r) -> tuple[float, float]:
    return r.communication["ep"]["exposed_s"], r.communication["ep"]["overlapped_s"]


@pytest.mark.parametrize("plan", [A2A, Plan(64, 4096, 1, dp=16, tp=2, ep=8,
                                            sequence_parallel=True, moe_overlap="a2a")],
                         ids=["interleaved", "no-pipeline"])
def test_a2a_hides_the_all_to_alls_in_both_tiers(plan):
    m, c = load_model(QWEN), load_cluster("dgx-h100:4")
    base = dataclasses.replace(plan, moe_overlap="none")
    for fid in ("analytic", "des"):
        on, off = simulate(m, c, plan, fidelity=fid), simulate(m, c, base, fidelity=fid)
        exposed, hidden = _ep(on)
        assert hidden > 0 and exposed < 0.5 * _ep(off)[0]
        assert on.iteration_time_s < off.iteration_time_s
        # the same all-to-alls, now partly behind compute (the DES measures their union)
        assert exposed + hidden == pytest.approx(_ep(off)[0], rel=1e-9 if fid == "analytic"
                                                 else 0.1)
    a, d = simulate(m, c, plan), simulate(m, c, plan, fidelity="des")
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.05)
    u = simulate(m, c, plan, fidelity="des", reduce=False)
    assert u.iteration_time_s == pytest.approx(d.iteration_time_s, rel=1e-9)


def test_a2a_leaves_the_warm_up_exposed():
    """Only merged steps hide their all-to-alls: the warm-up forwards (and their backwards)
    wait, so the exposed share is at least the unmerged passes' share."""
    m, c = load_model(QWEN), load_cluster("dgx-h100:4")
    few = dataclasses.replace(A2A, global_batch_size=16)  # 2 micro-batches: all warm-up
    on = simulate(m, c, few)
    off = simulate(m, c, dataclasses.replace(few, moe_overlap="none"))
    assert _ep(on) == pytest.approx(_ep(off), rel=1e-9)


def test_shared_expert_hides_each_pass_behind_its_shared_expert():
    m, c = load_model("deepseek-v3"), load_cluster("dgx-h100:64")
    plan = Plan(256, 4096, 1, dp=32, pp=16, ep=32, recompute="full",
                layers_per_stage=(3,) + (4,) * 14 + (2,), moe_overlap="shared-expert")
    base = dataclasses.replace(plan, moe_overlap="none")
    lt = cm.layer_time(cost_model_for(c), m, plan, moe=True)
    assert lt.shared_forward > 0 and lt.shared_backward > lt.shared_forward
    on, off = simulate(m, c, plan), simulate(m, c, base)
    assert _ep(on)[0] < _ep(off)[0] and sum(_ep(on)) == pytest.approx(_ep(off)[0], rel=1e-9)
    d = simulate(m, c, plan, fidelity="des")
    assert d.iteration_time_s == pytest.approx(on.iteration_time_s, rel=0.02)
    assert d.iteration_time_s < simulate(m, c, base, fidelity="des").iteration_time_s


@pytest.mark.parametrize("kw,why", [
    (dict(ep=1), "ep > 1"),
    (dict(recompute="full"), "full recomputation"),
    (dict(vpp=1, schedule="1f1b"), "interleaved"),
    (dict(moe_dispatcher="allgather"), "not allgather"),
    (dict(moe_overlap="both"), "must be one of"),
    (dict(moe_overlap="shared-expert", moe_dispatcher="deepep"), "alltoall dispatcher"),
])
def test_megatron_rules(kw, why):
    with pytest.raises(SpecError, match=why) as err:
        dataclasses.replace(A2A, **kw)
    assert err.value.field == "plan.moe_overlap" and "\n" not in str(err.value)


def test_shared_expert_needs_one():
    plan = dataclasses.replace(A2A, moe_overlap="shared-expert")
    with pytest.raises(SpecError, match="has none") as err:
        simulate(load_model(QWEN), load_cluster("dgx-h100:4"), plan)
    assert err.value.field == "plan.moe_overlap"


def test_export_and_the_front_door():
    m, c = load_model(QWEN), load_cluster("dgx-h100:4")
    args = export("megatron", A2A, m, c)["megatron_args.sh"]
    assert "--overlap-moe-expert-parallel-comm" in args
    pytest.importorskip("megatron.core", reason="megatron-core not installed (pip install -e "
                        "'.[export-check]')")
    from helpers.frameworks import megatron_parsed

    parsed = megatron_parsed(args, c.world_size)
    assert parsed["moe_overlap"] == "a2a" and parsed["vpp"] == 2


def test_executor_refuses_overlap():
    from executor.capabilities import unsupported

    why = unsupported(load_model("mixtral-8x7b"), Plan(8, 256, dp=2, ep=2, moe_overlap="a2a"))
    assert why is not None and why[0] == "plan.moe_overlap"


def test_search_space_splits_awkward_layer_counts_and_takes_a2a():
    """94 layers (no pipeline depth >= 4 divides them): every depth, split evenly, with the
    published power-of-two vpp; 80 layers keep the depths that divide them. MoE plans take
    the all-to-all overlap wherever Megatron-LM's rules allow it."""
    import itertools

    from optimizer.space import SearchSpace

    space = SearchSpace(load_model("qwen3-235b-a22b"), load_cluster("dgx-h100:32"), 2048, 4096)
    assert {4, 8, 16} <= {pp for _tp, _cp, pp, *_ in space.degrees()}
    assert (("interleaved-1f1b", 4) in space._schedules(8, 128)
            and ("interleaved-1f1b", 11) in space._schedules(8, 128))
    dense = SearchSpace(load_model("llama3-70b"), load_cluster("dgx-h100:16"), 512, 4096)
    assert all(80 % pp == 0 for _tp, _cp, pp, *_ in dense.degrees())
    merged = 0
    space = SearchSpace(load_model(QWEN), load_cluster("dgx-h100:2"), 64, 4096)
    for plan in itertools.islice(iter(space), 3000):
        allowed = plan.ep > 1 and plan.recompute != "full" and (
            plan.pp == 1 or plan.schedule in ("interleaved-1f1b", "dualpipev"))
        merged += plan.moe_overlap == "a2a"
        assert plan.moe_overlap == "none" or allowed
        if allowed and plan.moe_overlap == "none":  # only where a merged step would not fit
            with_a2a = dataclasses.replace(plan, moe_overlap="a2a")
            assert not memory_report(space.model, space.cluster, with_a2a).fits
    assert merged > 0


@pytest.mark.parametrize("pp,vpp,m", [(2, 2, 2), (2, 2, 4), (4, 2, 8), (2, 4, 8), (1, 1, 4)])
def test_merged_steps_never_pair_one_micro_batch(pp, vpp, m):
    """Megatron-LM warms up one more forward with the overlap, so a merged step's forward
    and backward are always of different micro-batches (the DES runs them side by side)."""
    from sim.des.run import _program

    plan = Plan(8 * m, 4096, 1, dp=8, tp=2, pp=pp, vpp=vpp, ep=8, sequence_parallel=True,
                schedule="interleaved-1f1b" if vpp > 1 else "1f1b", moe_overlap="a2a")
    for stage in range(pp):
        items = [i for i in _program(plan, stage) if isinstance(i, tuple)]
        pairs = [(f, b) for f, b in zip(items, items[1:], strict=False)
                 if f[0] == "F" and b[0] == "B"]
        assert pairs and all(f[1] != b[1] for f, b in pairs)


def test_review_rules():
    m = load_model("llama3-8b")
    with pytest.raises(SpecError) as err:  # etp on a dense model
        from sim import validate
        validate(Plan(8, 4096, dp=4, tp=2, etp=1, sequence_parallel=True), m)
    assert err.value.field == "plan.etp"
    with pytest.raises(SpecError, match="gpipe"):
        Plan(16, 4096, dp=8, ep=8, moe_overlap="a2a", schedule="gpipe")
    with pytest.raises(SpecError) as err:  # etp between 1 and tp names etp, not ep
        Plan(16, 4096, dp=4, tp=4, ep=2, etp=3, sequence_parallel=True)
    assert err.value.field == "plan.etp"


def test_shared_expert_keeps_its_tp_collectives_when_etp_is_1():
    from sim.layout.stages import tp_blocks

    plan = Plan(64, 4096, dp=8, tp=2, ep=16, etp=1, sequence_parallel=True)
    assert tp_blocks(load_model("deepseek-v3"), plan, True) == (1.0, 1.0)
    assert tp_blocks(load_model(QWEN), plan, True) == (1.0,)
    assert tp_blocks(load_model(QWEN), plan, False) == (1.0, 1.0)


def test_experts_on_the_tp_group_gather_the_routed_tokens():
    """etp = tp: Megatron-LM's dispatcher all-gathers the received tokens over TP (top-k
    copies, times the hottest rank's load) and reduce-scatters the outputs back; the
    all-gather dispatcher gathers the whole block's tokens (ep activations); with etp = 1
    no routed tokens cross TP; both tiers charge what the blocks say."""
    from sim.layout.stages import tp_blocks

    qwen, ds = load_model(QWEN), load_model("deepseek-v3")
    plan = Plan(64, 4096, dp=8, tp=2, ep=8, sequence_parallel=True)
    assert tp_blocks(qwen, plan, True) == (1.0, 8.0)  # attention, routed (top-8)
    assert tp_blocks(ds, plan, True) == (1.0, 1.0, 8.0)  # and the shared expert
    hot = dataclasses.replace(plan, moe_max_load=1.25)
    assert tp_blocks(qwen, hot, True) == (1.0, 8.0 * 1.25)
    gather = dataclasses.replace(plan, moe_dispatcher="allgather")
    assert tp_blocks(qwen, gather, True) == (1.0, 8.0)
    assert tp_blocks(qwen, dataclasses.replace(gather, ep=2), True) == (1.0, 2.0)
    assert tp_blocks(qwen, dataclasses.replace(plan, etp=1), True) == (1.0,)
    c = load_cluster("dgx-h100:2")
    base = Plan(16, 4096, dp=8, tp=2, ep=8, sequence_parallel=True)
    for fid in ("analytic", "des"):  # the routed block: top_k activations more
        small = simulate(qwen, c, dataclasses.replace(base, etp=1),
                         fidelity=fid).communication["tp"]["exposed_s"]
        big = simulate(qwen, c, base, fidelity=fid).communication["tp"]["exposed_s"]
        assert big > 3 * small


def test_space_expert_grids_follow_the_tp_rule():
    """An expert block that straddles TP groups (ep 3 on tp 2 x cp 3) is never generated."""
    from optimizer.space import SearchSpace

    m = dataclasses.replace(load_model(QWEN), num_experts=96)
    space = SearchSpace(m, load_cluster("dgx-h100:3"), 24, 6144)
    grids = space._experts(2, 3, 4)
    assert (3, 1) not in grids and grids
    for ep, etp in grids:
        Plan(24, 6144, dp=4, tp=2, cp=3, ep=ep, etp=etp, sequence_parallel=True)
