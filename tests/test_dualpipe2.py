"""DualPipe itself (DeepSeek's two-direction schedule, ``schedule = "dualpipe"``): the
programs against the published bubble and activations and against DualPipeV on half the
ranks, and the schedule through the plan, both tiers, memory and the collective account."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from sim import Plan, load_cluster, load_model, simulate, validate
from sim.errors import SpecError
from sim.layout.dualpipe import peak_activations, rank_calls, rank_program, stages_of_rank
from sim.layout.dualpipe_time import makespan, published_bubble, uniform
from sim.layout.inventory import expected_collectives
from sim.layout.memory import inflight_microbatches
from sim.layout.stages import pipeline_rank_layers, rank_virtual_stages, virtual_stage_rank

SIZES = [(pp, m) for pp in (2, 4, 8, 16) for m in (2 * pp, 2 * pp + 2, 6 * pp + 2)]


@pytest.mark.parametrize("pp,m", SIZES)
def test_every_rank_runs_each_pass_of_its_chains_once(pp, m):
    for r in range(pp):
        passes = Counter()
        for p in rank_program(pp, m, r, True):
            if p.kind in ("F", "FB"):
                passes["F", p.mb, p.stage] += 1
            if p.kind in ("B", "FB"):
                passes["B", p.mb2 if p.kind == "FB" else p.mb,
                       p.stage2 if p.kind == "FB" else p.stage] += 1
        assert sorted(passes.values()) == [1] * (4 * (m // 2))
        assert {s for _, _, s in passes} == set(stages_of_rank(pp, r, True))


def test_ranks_hold_a_chain_each_way_and_mirrors_hold_the_same_layers():
    pp = 8
    for r in range(pp):
        down, back = sorted(stages_of_rank(pp, r, True))
        assert down == r and back == pp + (pp - 1 - r)  # chain 0 stage r, chain 1 pp-1-r
        mirror = sorted(stages_of_rank(pp, pp - 1 - r, True))
        assert {s % pp for s in (down, back)} == {s % pp for s in mirror}


@pytest.mark.parametrize("pp,m", SIZES)
def test_the_programs_give_the_published_bubble_and_activations(pp, m):
    """DeepSeek's table for DualPipe on PP ranks: (PP/2 - 1)(F&B + B - 3W) and PP + 1 chunk
    activations a device; without transfers it is DualPipeV on PP/2 ranks with half the
    micro-batches, and slower with them (the turn crosses ranks)."""
    u = uniform(1.0, 2.0, 1.0)
    t, busy = makespan(pp, m, u, mirrored=True)
    assert busy == [m * 3.0] * pp
    assert t - m * 3.0 == pytest.approx(published_bubble(pp, 1.0, 2.0, 1.0, 3.0, True))
    assert [peak_activations(pp, m, r, True) for r in range(pp)] == [pp + 1] * pp
    if pp > 2:
        assert t == makespan(pp // 2, m // 2, u)[0]
        assert makespan(pp, m, u, 0.1, True)[0] > makespan(pp // 2, m // 2, u, 0.1)[0]


def test_the_middle_ranks_send_each_other_the_turn():
    pp, m = 4, 8
    sent = {msg for r in (1, 2) for item in rank_calls(pp, m, r, True)
            if isinstance(item, tuple) for msg in item[0]}
    assert ("F", 0, 2) in sent and ("F", 0, pp + 2) in sent  # chain 0 and chain 1 turns
    assert ("B", 0, 1) in sent and ("B", 0, pp + 1) in sent


@pytest.mark.parametrize("pp,m", [(3, 6), (4, 6), (4, 9)])
def test_uneven_shapes_are_refused(pp, m):
    with pytest.raises(ValueError, match="DualPipe needs an even pp"):
        rank_program(pp, m, 0, True)


# The plan ---------------------------------------------------------------------------------
LLAMA, H100 = load_model("llama3-8b"), load_cluster("dgx-h100:2")
D = Plan(128, 4096, 1, dp=4, pp=4, vpp=2, schedule="dualpipe", zero_stage=1)


@pytest.mark.parametrize("kw,match", [
    ({"pp": 3, "dp": 4}, "plan.pp: dualpipe needs an even pp >= 2, got 3"),
    ({"vpp": 1}, "plan.vpp: dualpipe needs vpp = 2 .two stages a rank, one of each direction"),
    ({"zero_stage": 2}, "plan.zero_stage: dualpipe is modelled with zero_stage 0 or 1"),
    ({"global_batch_size": 28}, "plan.global_batch_size: dualpipe needs at least 2[*]pp = 8 "
     "micro-batches per replica, got 7"),
    ({"global_batch_size": 36}, "plan.global_batch_size: dualpipe feeds half the "
     "micro-batches from each end: their number per replica must be even, got .9."),
    ({"layers_per_stage": (8,) * 8}, "plan.layers_per_stage: must list pp = 4 counts"),
])
def test_bad_dualpipe_plans_name_the_rule(kw, match):
    with pytest.raises(SpecError, match=match):
        validate(dataclasses.replace(D, **kw), LLAMA, H100)


def test_each_rank_holds_two_stages_and_both_ends_sit_on_the_outer_ranks():
    assert [rank_virtual_stages(D, r) for r in range(4)] == [[0, 7], [1, 6], [5, 2], [4, 3]]
    assert [virtual_stage_rank(D, vs) for vs in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    ranks = pipeline_rank_layers(D, LLAMA)
    assert [(r.first, r.last, r.total) for r in ranks] == \
        [(True, True, 16), (False, False, 16), (False, False, 16), (True, True, 16)]
    uneven = dataclasses.replace(D, layers_per_stage=(6, 10, 10, 6))
    assert [r.total for r in pipeline_rank_layers(uneven, LLAMA)] == [12, 20, 20, 12]


def test_twice_the_parameters_of_1f1b_and_dualpipev_on_half_the_ranks():
    """DeepSeek's table: 2x the parameters a device of 1F1B over the same stages; the same
    layers a rank as DualPipeV on pp / 2 ranks (whose data-parallel group is twice as wide,
    so ZeRO-1 shards its optimizer state twice as thin)."""
    from sim.layout.memory import peak_memory

    one = dataclasses.replace(D, schedule="1f1b", vpp=1)
    v = dataclasses.replace(D, pp=2, dp=8, schedule="dualpipev")
    mem = {k: peak_memory(LLAMA, p, 0.0)[1] for k, p in (("d", D), ("1", one), ("v", v))}
    assert mem["d"].weights == pytest.approx(2 * mem["1"].weights, rel=0.05)
    assert mem["d"].weights == mem["v"].weights and mem["d"].gradients == mem["v"].gradients
    assert mem["d"].optimizer == pytest.approx(2 * mem["v"].optimizer)
    assert [inflight_microbatches(D, r) for r in range(4)] == [2.5] * 4  # (pp + 1) / 2


def test_both_tiers_agree_and_match_dualpipev_on_half_the_ranks_in_compute():
    v = dataclasses.replace(D, pp=2, dp=8, schedule="dualpipev")
    tiers = [simulate(LLAMA, H100, D, fidelity=f) for f in ("analytic", "des")]
    assert tiers[1].iteration_time_s == pytest.approx(tiers[0].iteration_time_s, rel=0.02)
    half = simulate(LLAMA, H100, v, fidelity="analytic")
    assert tiers[0].breakdown["compute"] == pytest.approx(half.breakdown["compute"], rel=1e-9)
    one = simulate(LLAMA, H100, dataclasses.replace(D, schedule="1f1b", vpp=1))
    assert tiers[0].breakdown["bubble"] < one.breakdown["bubble"] / 4
    whole = simulate(LLAMA, H100, D, fidelity="des", reduce=False).iteration_time_s
    assert whole == pytest.approx(tiers[1].iteration_time_s, rel=1e-9)


def test_the_des_issues_the_accounts_collectives_and_mirror_sums():
    """Every rank sends two tensors a chain micro-batch at the ends, four inside; each sums
    its gradients (ZeRO-1: its shard) with its mirror's once a step; no embedding
    all-reduce (both ends on the outer ranks)."""
    from sim.cost.profiled import cost_model_for
    from sim.des.run import issued_collectives
    from sim.layout.inventory import SIMULATED

    tied = dataclasses.replace(LLAMA, tied_embeddings=True)
    issued = issued_collectives(tied, H100, D, cost_model_for(H100), 0)
    for stage in range(4):
        want = {(r["group"], r["kind"]): (r["count"], r["bytes"])
                for r in expected_collectives(tied, D, stage, SIMULATED)}
        got = {(r["group"], r["kind"]): (r["count"], r["bytes"]) for r in issued[stage]}
        assert got == want, stage
        per_mb = 2 if stage in (0, 3) else 4
        assert got[("pp", "send")][0] == per_mb * D.num_microbatches // 2
        assert got[("mirror", "all_reduce")][0] == 1 and ("embedding", "all_reduce") not in got


def test_the_exporters_and_the_executor_refuse_it():
    from executor.capabilities import unsupported
    from optimizer.export import export

    for framework in ("megatron", "torchtitan", "deepspeed"):
        with pytest.raises(SpecError, match="^plan.(schedule|pp)"):
            export(framework, D, LLAMA, H100)
    assert unsupported(LLAMA, D)[0] == "plan.schedule"


def test_balancing_keeps_dualpipes_rules():
    """Sites split the batch two micro-batches at a time, at least 2 pp a replica; a layer
    split weighs each stage by the slower of the two ranks holding it; a layer move maps
    a rank's chunks onto the pp stages."""
    from optimizer.balance import _micro_unit, _moves
    from optimizer.sites import balance_sites

    assert _micro_unit(D) == (2, 8)
    mixed = load_cluster("examples/two-regions-mixed.toml")
    plan = Plan(32 * 20, 4096, 1, dp=32, pp=4, vpp=2, schedule="dualpipe", zero_stage=1)
    split = balance_sites(LLAMA, mixed, plan).micro_batches_per_replica
    assert split is not None and len(set(split)) > 1
    assert all(n % 2 == 0 and n >= 8 for n in split) and sum(split) == 640
    moves = _moves(dataclasses.replace(D, layers_per_stage=(10, 6, 6, 10)), [])
    assert moves and all(len(p.layers_per_stage) == 4 for p in moves)
