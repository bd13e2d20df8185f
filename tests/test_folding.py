"""Folded expert parallelism (Megatron-LM's MoE parallel folding, sim/spec/experts.py): the
expert grid's groups against Megatron-LM's own rank generator, the rules, both tiers and
the reduced DES on folded plans, and what folding changes (expert shards, TP collectives)."""

from __future__ import annotations

import dataclasses

import pytest

from optimizer.export import export
from optimizer.space import SearchSpace
from sim import Plan, load_cluster, load_model, simulate
from sim.errors import SpecError
from sim.layout.memory import layer_rank_params
from sim.layout.placement import group_span, groups_of
from sim.spec.experts import ep_inner, expert_tp, is_folded

QWEN = "qwen3-30b-a3b"  # 128 experts, top 8


def _plan(**kw) -> Plan:
    base = dict(global_batch_size=64, seq_len=4096, micro_batch_size=1, tp=2, pp=2, dp=8,
                sequence_parallel=True, recompute="full")
    return Plan(**{**base, **kw})


# (tp, cp, dp, pp, ep, etp): plain, folded over TP, folded over CP, EP within a TP group
GRIDS = [(2, 1, 8, 2, 8, None), (2, 1, 8, 2, 16, 1), (2, 1, 8, 2, 4, 1), (4, 1, 4, 1, 2, 1),
         (2, 2, 4, 2, 4, None), (2, 2, 4, 1, 16, 1), (1, 4, 4, 1, 8, None)]


@pytest.mark.parametrize("tp,cp,dp,pp,ep,etp", GRIDS)
def test_expert_groups_are_megatrons(tp, cp, dp, pp, ep, etp):
    """Our ep and edp groups, in the default placement's logical ranks (Megatron-LM's global
    ranks), are the groups megatron-core's initialize_model_parallel builds."""
    pytest.importorskip("megatron.core", reason="megatron-core not installed (pip install -e "
                        "'.[export-check]')")
    from megatron.core.parallel_state import RankGenerator

    plan = Plan(64, 4096, dp=dp, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp,
                sequence_parallel=tp > 1)
    e = expert_tp(plan)
    gen = RankGenerator(tp=e, ep=ep, dp=plan.world_size // (e * ep * pp), pp=pp, cp=1,
                        order="tp-cp-ep-dp-pp")
    assert sorted(groups_of(plan, "ep", {})) == sorted(gen.get_ranks("ep"))
    assert sorted(groups_of(plan, "edp", {})) == sorted(gen.get_ranks("dp"))
    assert plan.expert_replicas == len(gen.get_ranks("dp")[0])


def test_plain_grid_is_unfolded_and_etp_tp_is_the_default():
    plain = _plan(ep=8)
    assert not is_folded(plain) and ep_inner(plain) == 8
    explicit = dataclasses.replace(plain, etp=2)
    m, c = load_model(QWEN), load_cluster("dgx-h100:4")
    for fid in ("analytic", "des"):
        a, b = simulate(m, c, plain, fidelity=fid), simulate(m, c, explicit, fidelity=fid)
        assert a.iteration_time_s == b.iteration_time_s and a.breakdown == b.breakdown


@pytest.mark.parametrize("kw,field", [
    (dict(ep=32, etp=1), "plan.ep"),  # 1 x 32 does not divide 2 x 8
    (dict(tp=4, dp=4, ep=4, etp=2), "plan.etp"),  # between 1 and tp
    (dict(ep=8, etp=1, sequence_parallel=False), "plan.sequence_parallel"),
    (dict(ep=8, etp=0), "plan.etp"),
    (dict(ep=8, etp=True), "plan.etp"),
    (dict(tp=2, cp=3, dp=2, ep=3, etp=1, seq_len=4104), "plan.ep"),  # 3 vs tp x cp = 6: no
])
def test_bad_expert_grids_name_the_field(kw, field):
    with pytest.raises(SpecError) as err:
        _plan(**kw)
    assert err.value.field == field and "\n" not in str(err.value)


def test_folded_ep_beyond_dp_in_both_tiers_and_reduced_des():
    """EP 16 on DP 8 x TP 2: the plan Megatron-LM's folding allows and the plain grid
    cannot hold. The reduced DES equals the unreduced one; the tiers agree."""
    m, c = load_model(QWEN), load_cluster("dgx-h100:4")
    plan = _plan(ep=16, etp=1)
    a = simulate(m, c, plan)
    d = simulate(m, c, plan, fidelity="des")
    u = simulate(m, c, plan, fidelity="des", reduce=False)
    assert d.iteration_time_s == pytest.approx(u.iteration_time_s, rel=1e-9)
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.05)
    assert group_span(plan, c, "ep").size == 16 and group_span(plan, c, "ep").nodes == 2


def test_folding_keeps_expert_traffic_in_the_node():
    """TP 2 x EP 8: with etp = tp the expert group strides over two nodes; with etp = 1 it
    is the eight GPUs of one node, so the all-to-all leaves InfiniBand."""
    m, c = load_model(QWEN), load_cluster("dgx-h100:4")
    plain, folded = _plan(ep=8), _plan(ep=8, etp=1)
    assert group_span(plain, c, "ep").nodes == 2 and group_span(folded, c, "ep").nodes == 1
    for fid in ("analytic", "des"):
        a, b = simulate(m, c, plain, fidelity=fid), simulate(m, c, folded, fidelity=fid)
        assert b.breakdown["ep"] < 0.5 * a.breakdown["ep"]
        assert b.breakdown["tp"] < a.breakdown["tp"]  # MoE layers drop the MLP's TP pair


def test_etp1_shards_experts_over_ep_only_and_keeps_rank_flops():
    m = load_model(QWEN)
    plain, folded = _plan(ep=8), _plan(ep=8, etp=1)
    assert layer_rank_params(m, folded, True)[1] == pytest.approx(
        2 * layer_rank_params(m, plain, True)[1])
    assert folded.expert_replicas == 2 and plain.expert_replicas == 1
    res = [simulate(m, load_cluster("dgx-h100:4"), p) for p in (plain, folded)]
    # the same model FLOPs: MFU moves with the step time alone
    assert res[0].mfu * res[0].iteration_time_s == pytest.approx(
        res[1].mfu * res[1].iteration_time_s, rel=1e-9)


def test_megatron_export_writes_the_expert_grid():
    m, c = load_model(QWEN), load_cluster("dgx-h100:2")
    files = export("megatron", _plan(ep=16, etp=1, pp=1, dp=8), m, c)
    args = files["megatron_args.sh"]
    assert "--expert-model-parallel-size 16" in args
    assert "--expert-tensor-parallel-size 1" in args


def test_megatron_reads_a_folded_plan_back():
    pytest.importorskip("megatron.core", reason="megatron-core not installed (pip install -e "
                        "'.[export-check]')")
    from helpers.frameworks import megatron_parsed

    m, c = load_model(QWEN), load_cluster("dgx-h100:2")
    plan = _plan(ep=16, etp=1, pp=1)
    parsed = megatron_parsed(export("megatron", plan, m, c)["megatron_args.sh"], 16)
    assert (parsed["tp"], parsed["dp"], parsed["ep"], parsed["etp"]) == (2, 8, 16, 1)
    assert sorted(parsed["ep_groups"]) == sorted(groups_of(plan, "ep", {}))


def test_executor_takes_a_folded_grid_but_not_context_parallelism():
    """EP 4 over TP 2 x DP 2 (folded) runs for real (tests/test_executor_moe.py); the same
    grid over CP is refused for its CP, which the executor does not run."""
    from executor.capabilities import unsupported

    mixtral = load_model("mixtral-8x7b")
    assert unsupported(mixtral, _plan(ep=4, tp=2, dp=2, pp=1, etp=1, zero_stage=3)) is None
    why = unsupported(mixtral, _plan(ep=4, cp=2, tp=1, dp=4, pp=1, sequence_parallel=False))
    assert why is not None and why[0] == "plan.cp"


def test_search_space_offers_folded_grids():
    m, c = load_model(QWEN), load_cluster("dgx-h100:2")
    space = SearchSpace(m, c, 64, 4096)
    grids = {(tp, dp, ep, etp) for tp, _cp, _pp, dp, ep, etp in space.degrees()}
    assert (2, 8, 16, 1) in grids and (2, 8, 8, None) in grids
    assert all(etp in (None, 1) for *_, etp in grids)
