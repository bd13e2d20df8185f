"""DualPipeV (DeepSeek's DualPipe cut in half): the programs, their timing against the
published bubble and activation count, and the schedule through the plan, the analytic
tier, memory, the collective account and the exporters."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from sim import Plan, load_cluster, load_model, simulate
from sim.errors import SpecError
from sim.layout.dualpipe import peak_activations, rank_program, stages_of_rank
from sim.layout.dualpipe_time import makespan, published_bubble, uniform
from sim.layout.inventory import expected_collectives
from sim.layout.memory import inflight_microbatches
from sim.layout.stages import pipeline_rank_layers, rank_virtual_stages, virtual_stage_rank

SIZES = [(pp, m) for pp in (2, 4, 8) for m in (2 * pp, 2 * pp + 3, 5 * pp)]


@pytest.mark.parametrize("pp,m", SIZES)
def test_every_rank_runs_each_pass_once(pp, m):
    for r in range(pp):
        passes = Counter()
        for p in rank_program(pp, m, r):
            if p.kind in ("F", "FB"):
                passes["F", p.mb, p.stage] += 1
            if p.kind in ("B", "FB"):
                passes["B", p.mb2 if p.kind == "FB" else p.mb,
                       p.stage2 if p.kind == "FB" else p.stage] += 1
            if p.kind == "W":
                passes["W", p.mb, p.stage] += 1
        deferred = sum(p.deferred for p in rank_program(pp, m, r))
        stages = stages_of_rank(pp, r)
        assert all(passes["F", mb, s] == passes["B", mb, s] == 1
                   for mb in range(m) for s in stages)
        assert sum(v for (k, *_), v in passes.items() if k == "W") == deferred > 0


@pytest.mark.parametrize("pp,m", SIZES)
def test_the_programs_give_the_published_bubble(pp, m):
    """With DeepSeek's usual proportions (B = 2F, W = F) the bubble over the work of
    ``2m`` chunks is exactly the published ``(PP/2 - 1)(F&B + B - 3W)``, whatever m. With
    an input-gradient pass at least a forward long (B - W >= F) the formula is an upper
    bound within a forward; shorter, the programs wait longer than it says."""
    t, busy = makespan(pp, m, uniform(1.0, 2.0, 1.0))
    assert busy == [2 * m * 3.0] * pp
    assert t - 2 * m * 3.0 == pytest.approx(published_bubble(pp, 1.0, 2.0, 1.0, 3.0))

    def gap(f: float, b: float, w: float) -> float:
        bubble = makespan(pp, m, uniform(f, b, w))[0] - 2 * m * (f + b)
        return published_bubble(pp, f, b, w, f + b) - bubble
    assert all(0.0 <= gap(*fbw) <= fbw[0] + 1e-9
               for fbw in ((1.0, 2.0, 0.5), (1.0, 3.0, 1.0), (1.0, 2.5, 0.8), (1.0, 4.0, 2.0)))
    assert gap(1.0, 1.5, 0.7) < 0.0


@pytest.mark.parametrize("pp,m", SIZES)
def test_a_rank_holds_the_published_activations(pp, m):
    """DeepSeek's table: PP + 1 chunk activations a device (PP = 2 pp stages)."""
    assert [peak_activations(pp, m, r) for r in range(pp)] == [2 * pp + 1] * pp


def test_too_few_micro_batches_are_refused():
    with pytest.raises(ValueError, match="m >= 2 pp"):
        rank_program(4, 7, 0)


# The plan ---------------------------------------------------------------------------------
LLAMA, H100 = load_model("llama3-8b"), load_cluster("dgx-h100:2")
V = Plan(64, 4096, 1, dp=4, pp=4, vpp=2, schedule="dualpipev")


@pytest.mark.parametrize("kw,match", [
    ({"vpp": 1}, "plan.vpp: dualpipev needs vpp = 2"),
    ({"vpp": 4}, "plan.vpp: dualpipev needs vpp = 2"),
    ({"pp": 1, "dp": 16}, "plan.pp: dualpipev needs pp >= 2, got 1"),
    ({"global_batch_size": 28}, "plan.global_batch_size: dualpipev needs at least 2[*]pp = 8 "
     "micro-batches per replica, got 7"),
    ({"micro_batches_per_replica": (25, 7, 16, 16)}, "plan.micro_batches_per_replica: "
     "dualpipev needs at least 2[*]pp = 8 micro-batches per replica, got 7"),
])
def test_bad_dualpipev_plans_name_the_rule(kw, match):
    with pytest.raises(SpecError, match=match):
        dataclasses.replace(V, **kw)


def test_stages_sit_in_a_v():
    assert [rank_virtual_stages(V, r) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert [virtual_stage_rank(V, vs) for vs in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    ranks = pipeline_rank_layers(V, LLAMA)
    assert ranks[0].first and ranks[0].last and all(r.total == 8 for r in ranks)


def test_both_tiers_time_the_programs():
    """Rank 0 holds the embedding and the loss; the other ranks' bubbles hide in its
    slack, so DualPipeV's bubble is a fraction of interleaved 1F1B's over the same stages,
    in both tiers; the tiers agree, and the DES's symmetry reduction is exact."""
    inter = dataclasses.replace(V, schedule="interleaved-1f1b")
    for fid in ("analytic", "des"):
        a, b = simulate(LLAMA, H100, inter, fidelity=fid), simulate(LLAMA, H100, V, fidelity=fid)
        assert b.breakdown["bubble"] < a.breakdown["bubble"] / 2, fid
        assert b.iteration_time_s < a.iteration_time_s, fid
    tiers = [simulate(LLAMA, H100, V, fidelity=f).iteration_time_s for f in ("analytic", "des")]
    assert tiers[1] == pytest.approx(tiers[0], rel=0.05)
    whole = simulate(LLAMA, H100, V, fidelity="des", reduce=False).iteration_time_s
    assert whole == pytest.approx(tiers[1], rel=1e-9)


def test_the_overlap_hides_only_paired_all_to_alls():
    """MoE with the a2a overlap: DualPipeV's pairs hide their all-to-alls, its unpaired
    warm-up and cool-down passes wait for theirs; both tiers see it gain."""
    qwen = load_model("qwen3-30b-a3b")
    plan = Plan(64, 4096, 1, dp=4, pp=4, vpp=2, ep=4, schedule="dualpipev")
    for fid in ("analytic", "des"):
        plain = simulate(qwen, H100, plan, fidelity=fid).iteration_time_s
        over = simulate(qwen, H100, dataclasses.replace(plan, moe_overlap="a2a"),
                        fidelity=fid).iteration_time_s
        assert over < plain, fid


def test_memory_holds_the_programs_peak_stage_by_stage():
    """(2 pp + 1) chunks at the peak; weighted by stage, an uneven split counts the stage
    a rank holds most of; with recomputation a deferred weight gradient keeps its layer's
    activations until its W."""
    from sim.layout.memory import peak_memory

    assert [inflight_microbatches(V, r) for r in range(4)] == [4.5] * 4  # (2 pp + 1) / 2
    even = peak_memory(LLAMA, V, 0.0)[0].activations
    heavy_first = dataclasses.replace(V, layers_per_stage=(7, 4, 4, 4, 4, 4, 4, 1))
    heavy_last = dataclasses.replace(V, layers_per_stage=(1, 4, 4, 4, 4, 4, 4, 7))
    assert peak_memory(LLAMA, heavy_first, 0.0)[0].activations > even > \
        peak_memory(LLAMA, heavy_last, 0.0)[0].activations
    full = dataclasses.replace(V, recompute="full")
    inputs = [peak_memory(LLAMA, full, 0.0)[r].activations for r in range(4)]
    assert inputs[3] > inputs[0]  # the last rank defers the most weight gradients


def test_the_turn_and_both_ends_need_no_transfer():
    """Rank 0 holds the first and the last stage, rank pp - 1 both stages of the turn:
    each sends and receives two tensors a micro-batch, the others four; no embedding
    all-reduce (both ends on rank 0)."""
    for rank, per_mb in ((0, 2), (1, 4), (3, 2)):
        rows = {(r["group"], r["kind"]): r for r in expected_collectives(LLAMA, V, rank)}
        assert rows[("pp", "send")]["count"] == per_mb * V.num_microbatches
    tied = dataclasses.replace(LLAMA, tied_embeddings=True)
    assert not any(r["group"] == "embedding" for r in expected_collectives(tied, V, 0))


def test_torchtitan_takes_it_megatron_refuses_it():
    """torchtitan's schedule name (torch's own lookup: ScheduleDualPipeV, which places the
    stages in a V); Megatron-LM has no DualPipe schedule."""
    from torch.distributed.pipelining.schedules import ScheduleDualPipeV, get_schedule_class

    from optimizer.export import export

    files = export("torchtitan", V, LLAMA, H100)
    assert any("'pipeline_parallel_schedule': 'DualPipeV'" in text for text in files.values())
    assert get_schedule_class("DualPipeV") is ScheduleDualPipeV
    with pytest.raises(SpecError, match="^plan.schedule: dualpipev is not expressible"):
        export("megatron", V, LLAMA, H100)


def test_analytic_passes_add_up_to_each_ranks_time():
    """Without the a2a overlap a rank's passes over a step add up to its per-micro-batch
    time m times, a rank without layers included (its time over its forward and backward
    passes, none in a weight pass)."""
    from sim.analytic.dualpipev import RankTime, StagePasses, _rank_durations

    pp, m = 4, 11
    stages = [StagePasses(1.0, 2.0, 0.8, 0.3, 0.5)] * 2 * pp
    stages[1] = stages[6] = StagePasses(0.0, 0.0, 0.0)  # rank 1 holds no layers
    ranks = [RankTime(4.0, 3.0, 0.6, 0.2)] * pp
    for r in range(pp):
        seconds = _rank_durations(pp, r, stages, ranks[r], False, 0.15)
        total = sum(seconds(p) for p in rank_program(pp, m, r))
        assert total == pytest.approx(m * ranks[r].total), r


def test_the_des_runs_odd_pipelines_and_uneven_replicas():
    """pp 3 (the turn on rank 2, here holding no layers), and two replicas of 7 and 9
    micro-batches (the DES then runs unreduced): it completes and issues the account's
    transfers."""
    from sim.cost.profiled import cost_model_for
    from sim.des.run import issued_collectives

    plan = Plan(16, 256, 1, dp=2, pp=3, vpp=2, schedule="dualpipev", layers_per_stage=(
        1, 1, 0, 0, 1, 1), micro_batches_per_replica=(7, 9))
    # the catalog roofline, not the profile shipped for some hosts' CPU model: the tiers'
    # agreement is then the same on every machine (with AMD EPYC's profile 2.2% apart)
    cluster = dataclasses.replace(load_cluster("cpu:6"), profile=None)
    tiny = load_model("tiny")
    times = [simulate(tiny, cluster, plan, fidelity=f).iteration_time_s
             for f in ("analytic", "des")]
    assert times[1] == pytest.approx(times[0], rel=0.02)
    for replica in (0, 1):
        issued = issued_collectives(tiny, cluster, plan, cost_model_for(cluster), replica)
        for stage in range(3):
            sends = {r["kind"]: r["count"] for r in issued[stage] if r["group"] == "pp"}
            per_mb = 4 if stage == 1 else 2
            assert sends["send"] == per_mb * plan.micro_batches_per_replica[replica]


def test_absurd_dualpipev_batches_are_refused_not_run():
    """Both tiers run DualPipeV's programs pass by pass: pp x micro-batches is capped."""
    from sim import Plan
    from sim.errors import SpecError

    with pytest.raises(SpecError, match=r"plan\.global_batch_size.*must be at most 262,144"):
        Plan(2**31, 256, pp=2, vpp=2, schedule="dualpipev")
    Plan(2**17, 256, pp=2, vpp=2, schedule="dualpipev")  # at the limit

