"""Executor: the model, the collective accounting, and real two-rank runs under torchrun +
gloo (every plan of the validation suite, faults, MoE expert parallelism)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from executor.collectives import attribute, summarize, trace_collectives
from executor.launch import ExecutionError, execute
from executor.model import Transformer, scale_model
from executor.parallel import _interleave_rows, mesh_ranks
from executor.suite import suite_plans
from executor.worker import synthetic_batch
from sim.errors import SpecError
from sim.layout.flops import param_count
from sim.layout.inventory import compare_inventory, expected_collectives
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.zoo import load_model

TINY = load_model("tiny")
MOE = ModelSpec("tiny-moe", 2, 64, 4, 128, 512, max_seq_len=128, gated_mlp=True,
                norm="rmsnorm", position_embedding="rope", num_experts=4, top_k=2)


# Model and data ----------------------------------------------------------------------------
def test_synthetic_batch_follows_its_rule_and_is_reproducible():
    ids, target = synthetic_batch(3, 4, 16, 8192, seed=1)
    assert torch.equal(target[:, :-1], ids[:, 1:])
    assert torch.equal(target, (5 * ids + 7) % 512)
    assert torch.equal(ids, synthetic_batch(3, 4, 16, 8192, seed=1)[0])


def test_transformer_shapes_and_tied_embedding():
    model = Transformer(TINY, 32)
    logits = model(torch.randint(0, TINY.vocab_size, (2, 32)))
    assert logits.shape == (2, 32, TINY.vocab_size)
    assert model.output.weight is model.tok_embeddings.weight
    assert sum(p.numel() for p in model.parameters()) == param_count(TINY)


def test_scale_model_keeps_structure():
    small = scale_model(load_model("llama3-8b"), layers=2, hidden=512)
    assert (small.num_layers, small.hidden_size, small.head_size) == (2, 512, 128)
    assert small.num_heads // small.kv_heads == 4
    with pytest.raises(SpecError, match="scale.hidden"):
        scale_model(TINY, hidden=100)


def test_interleaved_rows_give_each_rank_its_share_of_every_part():
    lin = torch.nn.Linear(2, 8, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.arange(8.0).repeat(2, 1).T)  # row i holds i
    _interleave_rows(lin, (2, 1, 1), tp=2)  # parts q=rows 0-3, k=4-5, v=6-7
    assert lin.weight[:, 0].tolist() == [0, 1, 4, 6, 2, 3, 5, 7]


def test_moe_routes_each_token_to_its_forced_balance_experts():
    from executor.moe import balanced_choice

    torch.manual_seed(0)
    model = Transformer(MOE, 8)
    moe = model.layers["0"].feed_forward
    x = torch.randn(6, MOE.hidden_size)
    chosen = balanced_choice(6, 2, 4, x.device)
    assert torch.bincount(chosen.reshape(-1), minlength=4).tolist() == [3, 3, 3, 3]
    assert all(len(set(row.tolist())) == 2 for row in chosen)  # distinct experts per token
    weights = moe.router(x).gather(-1, chosen).softmax(-1)
    expected = torch.stack([sum(w * moe.experts[int(e)](x[i:i + 1])[0]
                                for w, e in zip(weights[i], chosen[i], strict=True))
                            for i in range(6)])
    assert torch.allclose(moe(x), expected, atol=1e-5)


def test_mesh_follows_the_plan_placement():
    plan = Plan(global_batch_size=8, seq_len=64, dp=2, tp=2, pp=2)
    ranks = mesh_ranks(plan)  # (pp, dp, cp, tp), tp innermost by default
    assert ranks[1, 1, 0, 1] == 7 and ranks[0, 1, 0, 0] == 2
    swapped = Plan(global_batch_size=8, seq_len=64, dp=2, tp=2, pp=2,
                   placement="dp-tp-cp-ep-pp")
    assert mesh_ranks(swapped)[0, 1, 0, 0] == 1


# Collective accounting -----------------------------------------------------------------------
def _event(name, ts, dur, dims, types, tid=1):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid,
            "args": {"Input Dims": dims, "Input type": types}}


def test_trace_counts_a_functional_collective_once_with_its_dtype():
    trace = {"traceEvents": [
        _event("_c10d_functional::all_reduce", 0, 10, [[4, 8], [], []], ["float", "", ""]),
        _event("_c10d_functional::all_reduce", 1, 8, [[4, 8], [], []], ["float", "", ""]),
        _event("c10d::allreduce_", 2, 5, [[[4, 8]], [], []], ["TensorList", "", ""]),
        _event("c10d::send", 20, 5, [[[16]], [], [], []], ["TensorList", "", "", ""]),
        _event("aten::mm", 30, 5, [[4, 8], [8, 8]], ["float", "float"])]}
    assert trace_collectives(trace) == [("all_reduce", 32, 128), ("send", 16, None)]


def test_attribute_adds_what_the_dispatcher_did_not_see():
    log = [("all_reduce", "tp", 128, 32)]
    traced = [("all_reduce", 32, 128), ("all_reduce", 4, 16)]
    rows = summarize(attribute(log, traced, "tp"))
    assert rows == [{"group": "tp", "kind": "all_reduce", "count": 2, "bytes": 144}]


def test_expected_collectives_by_hand():
    plans = suite_plans()
    tokens, h = 4 * 512, 256  # TP plans: micro-batches of 4 sequences
    tp = {(r["group"], r["kind"]): r for r in expected_collectives(TINY, plans["tp2"])}
    # 4 layers x (2 fwd + 2 bwd) x 2 micro-batches + embedding and output layer (2 x 2)
    # of activations, and 3 loss all-reduces per micro-batch of one fp32 per token
    assert tp[("tp", "all_reduce")]["count"] == 32 + 4 + 6
    assert tp[("tp", "all_reduce")]["bytes"] == 36 * tokens * h * 4 + 6 * tokens * 4
    pp = {(r["group"], r["kind"]): r for r in expected_collectives(TINY, plans["pp2-1f1b-8mb"])}
    assert pp[("pp", "send")]["count"] == 8 and pp[("pp", "recv")]["count"] == 8
    assert pp[("pp", "send")]["bytes"] == 8 * 512 * h * 4
    assert pp[("embedding", "all_reduce")]["bytes"] == TINY.vocab_size * h * 4
    z3 = {(r["group"], r["kind"]): r for r in expected_collectives(TINY, plans["zero3-fsdp"])}
    assert z3[("dp", "all_gather")]["count"] == 2 * 2 * 5  # 4 layers + embedding, fwd + bwd
    assert z3[("dp", "reduce_scatter")]["count"] == 2 * 5


def test_fsdp_under_a_pipeline_gathers_after_forwards_and_reduces_once():
    """torch's pipeline schedules keep an FSDP2 unit gathered after each backward and
    reduce-scatter once after the last: stage 0 of 1F1B over 4 micro-batches runs
    F F B F B F B B, gathering (ZeRO-3) for its first pass and after each forward: 5 times;
    ZeRO-2 gathers once. Units: 2 layers and the embedding."""
    z3 = Plan(global_batch_size=8, seq_len=512, micro_batch_size=1, pp=2, dp=2,
              zero_stage=3, dtype="fp32")
    for plan, gathers in ((z3, 5), (dataclasses.replace(z3, zero_stage=2), 1)):
        rows = {(r["group"], r["kind"]): r["count"] for r in expected_collectives(TINY, plan)}
        assert rows[("dp", "all_gather")] == 3 * gathers
        assert rows[("dp", "reduce_scatter")] == 3
    flat = {(r["group"], r["kind"]): r["count"] for r in expected_collectives(
        TINY, dataclasses.replace(z3, pp=1, zero_stage=2))}  # every micro-batch: 4 of 5 units
    assert flat[("dp", "all_gather")] == flat[("dp", "reduce_scatter")] == 4 * 5


@pytest.mark.slow
@pytest.mark.parametrize("zero,keep,pp", [(2, False, 2), (3, False, 2), (3, True, 2),
                                           (3, True, 1)])
def test_fsdp_pipeline_runs_issue_the_expected_collectives(zero, keep, pp):
    """Every rank's collectives match the step's account; ``keep``: ZeRO-3 with
    reshard_after_forward=False (without a pipeline one gather a micro-batch, under torch's
    pipeline one a step)."""
    plan = Plan(global_batch_size=8, seq_len=128, micro_batch_size=1, pp=pp, dp=2,
                zero_stage=zero, dtype="fp32", reshard_after_forward=not keep)
    res = execute(TINY, plan, steps=1, warmup=1, timeout_s=180)
    stage_of = {int(r): p for p, ranks in enumerate(mesh_ranks(plan)) for r in ranks.flatten()}
    for rank, measured in res["collectives"].items():
        rows = compare_inventory(expected_collectives(TINY, plan, stage_of[int(rank)]),
                                 measured)
        assert rows and all(r["match"] for r in rows), (rank, rows)


def test_compare_inventory_flags_count_and_byte_mismatches():
    exp = [{"group": "dp", "kind": "all_reduce", "count": 1, "bytes": 100}]
    assert compare_inventory(exp, [{"group": "dp", "kind": "all_reduce", "count": 1,
                                    "bytes": 104}])[0]["match"]
    assert not compare_inventory(exp, [{"group": "dp", "kind": "all_reduce", "count": 1,
                                        "bytes": 110}])[0]["match"]
    extra = compare_inventory(exp, exp + [{"group": "tp", "kind": "send", "count": 1,
                                           "bytes": 8}])
    assert [r["match"] for r in extra] == [True, False]


# Real runs: torchrun, two ranks, gloo ------------------------------------------------------
@pytest.mark.parametrize("name", list(suite_plans()))
def test_suite_plan_runs_and_issues_the_expected_collectives(name):
    plan = suite_plans()[name]
    res = execute(TINY, plan, steps=1, warmup=1, timeout_s=90)
    assert len(res["step_s"]) == 2 and all(t > 0 for t in res["step_s"])
    assert all(v is not None and 0 < v < 12 for v in res["loss"])
    rows = compare_inventory(expected_collectives(TINY, plan, 0), res["collectives"]["0"])
    assert rows and all(r["match"] for r in rows), rows


def test_selective_recompute_reruns_the_attention_core_and_no_collective():
    """Megatron-LM's selective recomputation: the attention core only, so the TP
    collectives run once (the account's count) and the losses are the plain run's."""
    plan = Plan(global_batch_size=4, seq_len=128, micro_batch_size=2, tp=2,
                sequence_parallel=True, dtype="fp32")
    plain = execute(TINY, plan, steps=1, warmup=1, timeout_s=90)
    again = dataclasses.replace(plan, recompute="selective")
    res = execute(TINY, again, steps=1, warmup=1, timeout_s=90)
    for rank, measured in res["collectives"].items():
        rows = compare_inventory(expected_collectives(TINY, again, 0), measured)
        assert rows and all(r["match"] for r in rows), (rank, rows)
    assert res["loss"] == pytest.approx(plain["loss"], rel=1e-6)


def test_full_recompute_replays_as_the_plan_says():
    """torch's checkpoint with ``early_stop`` as ``plan.recompute_replay``: the whole replay
    runs every TP collective again, the early one all but each layer's last reduce-scatter
    (the MLP's); each run issues its account's collectives, and both train alike."""
    plan = Plan(global_batch_size=4, seq_len=128, micro_batch_size=2, tp=2,
                sequence_parallel=True, dtype="fp32", recompute="full")
    losses = []
    for replay in ("whole", "early-stop"):
        run = dataclasses.replace(plan, recompute_replay=replay)
        res = execute(TINY, run, steps=1, warmup=1, timeout_s=90)
        for rank, measured in res["collectives"].items():
            rows = compare_inventory(expected_collectives(TINY, run, 0), measured)
            assert rows and all(r["match"] for r in rows), (replay, rank, rows)
        losses.append(res["loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)


def test_dualpipev_runs_for_real_and_trains_as_one_rank():
    """torch's ScheduleDualPipeV on two ranks (four stages in a V, the tied embedding's two
    copies summed on rank 0): the single rank's losses under SGD, the simulated transfers
    (two a micro-batch each way: both ends on rank 0, the turn on rank 1)."""
    base = Plan(global_batch_size=8, seq_len=128, micro_batch_size=1, dtype="fp32")
    plan = dataclasses.replace(base, pp=2, vpp=2, schedule="dualpipev")
    alone = execute(TINY, base, steps=1, warmup=1, timeout_s=90, optimizer="sgd", lr=0.5)
    res = execute(TINY, plan, steps=1, warmup=1, timeout_s=90, optimizer="sgd", lr=0.5)
    assert res["loss"] == pytest.approx(alone["loss"], rel=1e-6)
    for rank, measured in res["collectives"].items():
        rows = compare_inventory(expected_collectives(TINY, plan, int(rank)), measured)
        assert rows and all(r["match"] for r in rows), (rank, rows)
        assert {(r["group"], r["kind"]) for r in rows} == {("pp", "send"), ("pp", "recv")}


def test_loss_falls_over_a_short_run():
    plan = Plan(global_batch_size=8, seq_len=128, dp=2, micro_batch_size=4, dtype="fp32")
    res = execute(TINY, plan, steps=5, warmup=1)
    assert res["loss"][-1] < res["loss"][0] - 0.5


def test_interleaved_pipeline_and_expert_parallel_run():
    inter = Plan(global_batch_size=4, seq_len=128, pp=2, vpp=2, micro_batch_size=1,
                 schedule="interleaved-1f1b", dtype="fp32")
    res = execute(TINY, inter, steps=1, warmup=1)
    sends = {r["kind"]: r["count"] for r in res["collectives"]["0"] if r["group"] == "pp"}
    assert sends == {"send": 12, "recv": 12}  # (2 chunks x 2 - 1) x 4 micro-batches
    ep = Plan(global_batch_size=4, seq_len=64, dp=2, ep=2, micro_batch_size=1, dtype="fp32")
    res = execute(MOE, ep, steps=1, warmup=1)
    kinds = {(r["group"], r["kind"]) for r in res["collectives"]["0"]}
    assert ("ep", "all_to_all") in kinds and ("dp", "all_reduce") in kinds


def _workers_left(folder: Path) -> bool:
    out = subprocess.run(["pgrep", "-f", "-a", str(folder)], capture_output=True, text=True)
    return any("pgrep" not in line for line in out.stdout.splitlines())


@pytest.mark.skipif(shutil.which("pgrep") is None, reason="needs pgrep to look for orphans")
@pytest.mark.parametrize("kind", ["crash", "hang"])
def test_a_failing_rank_stops_the_run_with_one_line(kind, tmp_path: Path):
    plan = suite_plans()["dp2"]
    with pytest.raises(ExecutionError) as err:
        execute(TINY, plan, steps=2, warmup=1, timeout_s=8,
                fault={"kind": kind, "rank": 1, "step": 1}, workdir=tmp_path)
    assert "rank 1" in str(err.value) and "\n" not in str(err.value)
    assert not _workers_left(tmp_path)


def test_cli_execute_bad_input_exits_2(tmp_path: Path):
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(suite_plans()["dp2"].to_dict()))
    for extra, field in ((["--inject-fault", "boom"], "--inject-fault"),
                         (["--nproc", "3"], "execute.nproc")):
        out = subprocess.run([str(Path(__import__("sys").executable).with_name("trainsim")),
                              "execute", "--model", "tiny", "--plan", str(plan), *extra],
                             capture_output=True, text=True)
        assert out.returncode == 2 and field in out.stderr and "Traceback" not in out.stderr


def test_a_failure_without_a_rank_error_quotes_torchrun_s_log(tmp_path) -> None:
    from executor.launch import _failure

    assert _failure(tmp_path, 2, 1) == "torchrun exited with status 1"  # no log at all
    (tmp_path / "torchrun.log").write_text(
        "W starting\nRuntimeError: [gloo] Connection closed by peer\nI exiting\n")
    msg = _failure(tmp_path, 2, 1)
    assert msg == ("torchrun exited with status 1; its log ends: RuntimeError: [gloo] "
                   "Connection closed by peer") and "\n" not in msg
    (tmp_path / "error1.txt").write_text("ValueError: bad")
    assert _failure(tmp_path, 2, 1) == "rank 1 failed: ValueError: bad"
