"""ZeRO-3 under an interleaved pipeline: every chunk (virtual stage) waits for the gather of
the first layer it runs, in the forward and in the backward, in both tiers."""

import dataclasses

import pytest

from sim import Plan, load_cluster, load_model, simulate
from sim.analytic.context import Ctx
from sim.analytic.iteration import stage_costs
from sim.cost.profiled import cost_model_for
from sim.layout.memory import layer_rank_params

LLAMA = load_model("llama3-8b")
H100_4 = load_cluster("dgx-h100:4")


def zero3(vpp: int, pp: int = 2) -> Plan:
    dp = 32 // pp
    return Plan(global_batch_size=dp * 16, seq_len=4096, micro_batch_size=1, dp=dp, pp=pp,
                vpp=vpp, zero_stage=3,
                schedule="interleaved-1f1b" if vpp > 1 else "1f1b")


def _layer_waits(plan: Plan) -> float:
    """Seconds of one (dense) layer's weight gather, twice (forward, backward), and its
    gradient's reduce-scatter, over the data-parallel group."""
    x = Ctx(LLAMA, H100_4, plan, cost_model_for(H100_4))
    dense, _ = layer_rank_params(LLAMA, plan, False)
    return (2 * x.coll("dp", "all_gather", dense * x.e)
            + x.coll("dp", "reduce_scatter", dense * plan.grad_bytes))


def test_each_chunk_waits_for_its_first_gather():
    """With the gathers otherwise hidden, going from one chunk a rank to four adds three
    chunks' waits a micro-batch: the first layer's gather in the forward, the last's in the
    backward, and the backward's last reduce-scatter."""
    one, four = zero3(1), zero3(4)
    exposed = [stage_costs(LLAMA, H100_4, p, cost_model_for(H100_4))[0].dp.mb_exposed_s
               for p in (one, four)]
    assert exposed[1] - exposed[0] == pytest.approx(3 * _layer_waits(four), rel=1e-9)


@pytest.mark.parametrize("vpp,pp", [(1, 2), (4, 2), (4, 4)])
def test_tiers_agree_on_zero3_waits(vpp, pp):
    """The DES runs each chunk's gathers layer by layer; the closed form counts the same
    waits (before: one a micro-batch and rank, whatever the chunks, 2.4x fewer than the
    DES at vpp 4)."""
    plan = zero3(vpp, pp)
    a, d = (simulate(LLAMA, H100_4, plan, fidelity=f) for f in ("analytic", "des"))
    assert a.breakdown["dp"] == pytest.approx(d.breakdown["dp"], rel=0.2)
    assert a.iteration_time_s == pytest.approx(d.iteration_time_s, rel=0.02)


def test_stages_of_no_layers_wait_for_nothing():
    """A chunk without layers (Megatron-LM layouts with an empty first stage) gathers no
    layer's weights, so it adds no wait."""
    split = (0, 16, 8, 8)
    plan = dataclasses.replace(zero3(2), layers_per_stage=split)
    even = dataclasses.replace(zero3(2), layers_per_stage=(8, 8, 8, 8))
    cost = cost_model_for(H100_4)
    waits = [stage_costs(LLAMA, H100_4, p, cost)[0].dp.mb_exposed_s for p in (plan, even)]
    assert waits[0] < waits[1]


def _sharded(tp: int, zero: int, microbatches: int) -> Plan:
    dp = 32 // tp
    return Plan(global_batch_size=dp * microbatches, seq_len=4096, micro_batch_size=1, dp=dp,
                tp=tp, zero_stage=zero, sequence_parallel=tp > 1)


def test_zero2_reduce_scatters_end_with_their_backward():
    """DeepSpeed synchronises after each backward's reduction and FSDP2's post-backward
    callback makes compute wait for the last reduce-scatter: under ZeRO-2 a micro-batch's
    reduce-scatters do not run on into the next one, so what waits for them grows with
    the micro-batches (the DES once let them spill over, and four times the micro-batches
    cost no more than the tail)."""
    waits = [simulate(LLAMA, H100_4, _sharded(8, 2, mb), fidelity="des").breakdown["dp"]
             for mb in (8, 32)]
    assert waits[1] > 2 * waits[0]
    a, d = (simulate(LLAMA, H100_4, _sharded(8, 2, 16), fidelity=f) for f in ("analytic", "des"))
    assert a.iteration_time_s == pytest.approx(d.iteration_time_s, rel=0.03)


def test_zero3_gathers_go_on_beside_node_local_collectives():
    """With TP inside each node and the data-parallel groups across nodes, ZeRO-3's
    gathers use the NICs while the TP collectives use NVLink: the closed form hides them
    behind both, as the DES runs them, not behind compute alone."""
    plan = _sharded(8, 3, 16)
    st = stage_costs(LLAMA, H100_4, plan, cost_model_for(H100_4))[0]
    assert st.tp_s > 0
    assert st.dp.mb_overlapped_s > st.compute_s


def test_zero2_under_a_pipeline_waits_for_each_chunks_last_bucket():
    """Each chunk's backward flushes its last bucket at its end and waits for it: the
    closed form counts that wait too, so the tiers agree under an interleaved pipeline."""
    plan = Plan(global_batch_size=32, seq_len=4096, micro_batch_size=1, dp=2, tp=8, pp=2,
                vpp=2, schedule="interleaved-1f1b", zero_stage=2, sequence_parallel=True)
    a, d = (simulate(LLAMA, H100_4, plan, fidelity=f) for f in ("analytic", "des"))
    assert a.iteration_time_s == pytest.approx(d.iteration_time_s, rel=0.03)
    assert a.breakdown["dp"] > 0.5 * d.breakdown["dp"]


def test_zero3_waits_never_exceed_the_communication():
    """One layer a chunk and short sequences: the waits are most of the traffic and the
    compute less than them; nothing is hidden below zero nor exposed beyond the traffic."""
    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100:8")
    plan = Plan(global_batch_size=64, seq_len=512, micro_batch_size=1, dp=4, tp=8, pp=2,
                vpp=40, schedule="interleaved-1f1b", zero_stage=3, sequence_parallel=True)
    for st in stage_costs(model, cluster, plan, cost_model_for(cluster)):
        assert st.dp.mb_overlapped_s >= 0.0
    timing = simulate(model, cluster, plan)
    assert timing.communication["dp"]["overlapped_s"] >= 0.0


def test_zero2_without_overlap_reduces_after_each_backward():
    """``overlap_grad_reduce = false``: ZeRO-2 reduce-scatters a chunk's gradients at the
    end of its backward, in both tiers (the DES used to overlap them anyway)."""
    plan = dataclasses.replace(_sharded(8, 2, 16), overlap_grad_reduce=False)
    a, d = (simulate(LLAMA, H100_4, plan, fidelity=f) for f in ("analytic", "des"))
    overlapped = simulate(LLAMA, H100_4, _sharded(8, 2, 16), fidelity="des")
    assert d.iteration_time_s > overlapped.iteration_time_s
    assert a.iteration_time_s == pytest.approx(d.iteration_time_s, rel=0.03)


def test_the_des_counts_zero3_gathers_in_its_data_parallel_seconds():
    """The DES's data-parallel seconds (exposed + overlapped) hold ZeRO-3's gathers as well
    as its reduce-scatters: keeping the gathered weights (one gather a micro-batch, not two)
    takes about a gather pass off them in both tiers (it took nothing off the DES's until
    2026-12-06, which counted the reduce-scatters only)."""
    m, c = load_model("llama3-8b"), load_cluster("dgx-h100:1")
    plan = Plan(32, 4096, 1, dp=8, zero_stage=3)
    keep = dataclasses.replace(plan, reshard_after_forward=False)

    def total(p, fidelity):
        d = simulate(m, c, p, fidelity).communication["dp"]
        return d["exposed_s"] + d["overlapped_s"]
    saved = {f: total(plan, f) - total(keep, f) for f in ("analytic", "des")}
    assert saved["analytic"] > 0.1
    assert saved["des"] == pytest.approx(saved["analytic"], rel=0.2)
