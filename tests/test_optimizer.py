"""The optimizer: a valid space, the search, honesty, outputs, exports."""

import json

import pytest

from optimizer.export import export
from optimizer.search import lower_bound_s, megatron_heuristic, optimize
from optimizer.space import SearchSpace, divisors
from sim import Plan, load_cluster, load_model, validate
from sim.errors import NoFeasiblePlan, SpecError
from sim.layout.flops import model_flops_per_token
from sim.layout.placement import framework_rank_table
from trainsim.cli import main
from trainsim.plots.search import pareto_front

L8, H1, H2 = load_model("llama3-8b"), load_cluster("dgx-h100:1"), load_cluster("dgx-h100:2")
MIX = load_model("mixtral-8x7b")


def test_divisors():
    assert divisors(12) == [1, 2, 3, 4, 6, 12] and divisors(12, 5) == [1, 2, 3, 4]


@pytest.mark.parametrize("model,cluster", [(L8, H2), (MIX, H2)], ids=["dense", "moe"])
def test_every_generated_plan_is_valid(model, cluster):
    plans = list(SearchSpace(model, cluster, 64, 4096))
    assert len(plans) > 100
    for p in plans:
        validate(p, model, cluster)  # raises if the generator built an invalid plan
    assert {p.tp for p in plans} == {1, 2, 4, 8}
    assert any(p.schedule == "interleaved-1f1b" for p in plans)
    assert any(p.schedule == "dualpipev" for p in plans)
    assert any(p.ep > 1 for p in plans) == model.is_moe


@pytest.mark.parametrize("model,cluster", [(L8, H1), (MIX, H2)], ids=["dense", "moe"])
def test_screening_dualpipev_keeps_the_exact_top_k(model, cluster):
    """DualPipeV plans are bounded below (their busiest rank's work) and timed only where
    the bound could rank: the top 8 are those of timing every plan, and every bound is at
    most the time."""
    from optimizer.scoring import init_worker, score, screen
    from optimizer.search import _analytic_tier

    space = SearchSpace(model, cluster, 32, 4096, max_micro_batch=2)
    plans = list(space)
    init_worker(model, cluster)
    exact, bounds = score(plans), screen(plans)
    dual = [i for i, p in enumerate(plans) if p.schedule == "dualpipev"]
    assert dual and all(bounds[i][0] <= exact[i][0] * (1 + 1e-12) for i in dual)
    fit = [i for i in dual if exact[i][0] < float("inf")]
    assert sum(bounds[i][0] < exact[i][0] for i in fit) > len(fit) // 2  # a real bound
    feasible, screened_out = _analytic_tier(space, plans, 1, False, 8)
    everything = sorted((s, repr(sorted(p.to_dict().items()))) for p, (s, _) in
                        zip(plans, exact, strict=True) if s < float("inf"))
    assert [c.analytic_s for c in feasible[:8]] == [s for s, _ in everything[:8]]
    assert screened_out > 0 and len(feasible) + screened_out == len(everything)


def test_a_mixed_fabric_ranks_dualpipev_by_its_time(tmp_path):
    """Node groups of one GPU with different NICs: a heterogeneous cluster with one compute
    speed, where DualPipeV plans are screened too, and each ranked plan carries its time,
    not its bound."""
    from optimizer.scoring import init_worker, score
    from optimizer.search import _analytic_tier
    from sim.spec.cluster import load_cluster as load

    path = tmp_path / "nics.toml"
    path.write_text('name = "h100-two-nics"\ngpus_per_node = 8\n[inter_node]\n'
                    'nic_Gbps = 400\n[[node_groups]]\nnodes = 1\ngpu = "h100-sxm5-80gb"\n'
                    '[[node_groups]]\nnodes = 1\ngpu = "h100-sxm5-80gb"\n'
                    'inter_node = { nic_Gbps = 200, nics_per_node = 4 }\n')
    cluster = load(str(path))
    space = SearchSpace(L8, cluster, 32, 4096, max_micro_batch=2)
    feasible, screened_out = _analytic_tier(space, list(space), 1, False, 8)
    init_worker(L8, cluster)
    dual = [c for c in feasible[:40] if c.plan.schedule == "dualpipev"]
    assert cluster.heterogeneous and dual and screened_out > 0
    assert [c.analytic_s for c in dual] == [s for s, _ in score([c.plan for c in dual])]


def test_heuristic_is_tp_in_node_then_pp():
    p = megatron_heuristic(SearchSpace(load_model("llama3-70b"), load_cluster("dgx-h100:4"),
                                       64, 4096))
    assert p is not None and (p.tp, p.sequence_parallel) == (8, True)
    assert p.tp * p.pp * p.dp == 32 and p.pp > 1  # 70B needs more than one stage


def test_lower_bound_by_hand():
    space = SearchSpace(L8, H2, 64, 4096)
    flops = model_flops_per_token(L8, 4096) * 64 * 4096
    assert lower_bound_s(space) == pytest.approx(flops / (16 * 989.4e12 * 0.70))


def test_search_small_case():
    rep = optimize(L8, H1, 32, 4096, top_k=4, workers=1, progress=False)
    assert rep.ranked[0].des is not None and rep.des_evaluated >= 4
    assert rep.baseline is not None and rep.baseline.des is not None
    assert rep.best.best_s <= rep.baseline.best_s
    assert rep.best.best_s >= rep.lower_bound_s
    assert all(c.analytic_s >= rep.candidates[0].analytic_s for c in rep.candidates)


def test_no_feasible_plan_says_why():
    with pytest.raises(NoFeasiblePlan, match=r"no plan fits in memory.*tp=8"):
        optimize(load_model("llama3-405b"), H1, 8, 8192, workers=1, progress=False)


def test_bad_sequence_length():
    with pytest.raises(SpecError, match="exceeds the model's learned position table"):
        optimize(load_model("gpt3-175b"), H1, 8, 4096, workers=1, progress=False)


def test_pareto_front():
    pts = [(10, 1), (20, 5), (15, 2), (30, 4), (12, 3)]
    assert pareto_front(pts) == [(10, 1), (12, 3), (20, 5)]


# exports ------------------------------------------------------------------------------
PLAN = Plan(global_batch_size=64, seq_len=4096, dp=2, tp=4, pp=2, vpp=2,
            schedule="interleaved-1f1b", sequence_parallel=True, recompute="full",
            zero_stage=1)


def test_rank_table_when_the_placement_differs(tmp_path):
    p = Plan(global_batch_size=64, seq_len=4096, dp=2, tp=4, pp=2, placement="tp-cp-ep-pp-dp")
    files = export("megatron", p, L8, H2)
    table = json.loads(files["rank_table.json"])["ranks"]
    assert len(table) == 16 and table == framework_rank_table(p, H2.gpus_per_node)
    # framework rank 4 (tp 0, dp 1) is logical rank 8 under pp-inner placement: node 1
    assert table[4] == {"rank": 4, "node": 1, "local_rank": 0}
    assert "rank_table.json" not in export("megatron", PLAN, L8, H2)


def test_cli_optimize_and_export(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["optimize", "--model", "llama3-8b", "--cluster", "dgx-h100:1",
                 "--global-batch-size", "32", "--seq-len", "4096", "--top", "3",
                 "--workers", "1", "--json", "--out", str(out)])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["best_iteration_s"] > 0 and "speedup_over_baseline" in report
    for name in ("best_plan.json", "plans.csv", "report.json", "pareto.png",
                 "top_breakdown.png", "best_trace.json", "megatron_args.sh"):
        assert (out / name).is_file(), name
    code = main(["export", "--plan", str(out / "best_plan.json"), "--model", "llama3-8b",
                 "--cluster", "dgx-h100:1", "--format", "torchrun", "--out", str(tmp_path)])
    assert code == 0 and "executor.worker" in (tmp_path / "torchrun.sh").read_text()


def test_cli_exit_3_when_nothing_fits(capsys):
    code = main(["optimize", "--model", "llama3-405b", "--cluster", "dgx-h100:1",
                 "--global-batch-size", "8", "--seq-len", "8192", "--workers", "1", "--json"])
    assert code == 3 and "no plan fits in memory" in capsys.readouterr().err
