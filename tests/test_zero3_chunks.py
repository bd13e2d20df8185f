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


def _layer_gather(plan: Plan) -> float:
    """Seconds of one (dense) layer's weight gather over the data-parallel group."""
    cost = cost_model_for(H100_4)
    x = Ctx(LLAMA, H100_4, plan, cost)
    dense, _ = layer_rank_params(LLAMA, plan, False)
    return x.coll("dp", "all_gather", dense * x.e)


def test_each_chunk_waits_for_its_first_gather():
    """With the gathers otherwise hidden, going from one chunk a rank to four adds six
    waits a micro-batch: three more chunks, each in the forward and the backward."""
    one, four = zero3(1), zero3(4)
    exposed = [stage_costs(LLAMA, H100_4, p, cost_model_for(H100_4))[0].dp.mb_exposed_s
               for p in (one, four)]
    assert exposed[1] - exposed[0] == pytest.approx(6 * _layer_gather(four), rel=1e-9)


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
