"""ZeRO-3 keeping each layer's gathered weights from its forward to its backward
(``reshard_after_forward = false``, FSDP2's flag): one gather a micro-batch, the weights held
in between, in both tiers, the memory, the step's collectives and the exports."""

import dataclasses
import json

import pytest

from optimizer.export import export
from sim import Plan, load_cluster, load_model, simulate
from sim.errors import SpecError
from sim.layout.inventory import SIMULATED, expected_collectives
from sim.spec.zoo import load_any

LLAMA = load_model("llama3-8b")
H100_4 = load_cluster("dgx-h100:4")


def zero3(keep: bool, vpp: int = 4) -> Plan:
    return Plan(global_batch_size=256, seq_len=4096, micro_batch_size=1, dp=16, pp=2, vpp=vpp,
                zero_stage=3, schedule="interleaved-1f1b" if vpp > 1 else "1f1b",
                reshard_after_forward=not keep)


def _gathers(plan: Plan) -> float:
    rows = expected_collectives(LLAMA, plan, 0, SIMULATED)
    return sum(r["count"] for r in rows if r["kind"] == "all_gather")


def test_one_gather_a_micro_batch_and_the_tiers_agree():
    regather, keep = zero3(False), zero3(True)
    assert _gathers(keep) == pytest.approx(_gathers(regather) / 2)
    for fidelity in ("analytic", "des"):
        fast = simulate(LLAMA, H100_4, keep, fidelity=fidelity)
        slow = simulate(LLAMA, H100_4, regather, fidelity=fidelity)
        assert fast.breakdown["dp"] < slow.breakdown["dp"]
    a, d = (simulate(LLAMA, H100_4, keep, fidelity=f) for f in ("analytic", "des"))
    assert a.iteration_time_s == pytest.approx(d.iteration_time_s, rel=0.03)


def test_the_kept_weights_cost_memory():
    """Held from forward to backward, every layer of the rank is gathered at once: the
    rank's weights in 16 bits, less the two layers ZeRO-3 holds anyway."""
    keep, regather = (simulate(LLAMA, H100_4, zero3(k, vpp=1)) for k in (True, False))
    stage_weights_gib = LLAMA.num_layers / 2 * 218e6 * 2 / 2 ** 30
    assert keep.peak_memory_gib - regather.peak_memory_gib > 0.8 * stage_weights_gib


def test_only_zero3_keeps_weights():
    with pytest.raises(SpecError, match="plan.reshard_after_forward: false needs zero_stage"):
        Plan(16, 128, dp=8, zero_stage=2, reshard_after_forward=False)
    with pytest.raises(SpecError, match="plan.reshard_after_forward: must be true or false"):
        Plan(16, 128, dp=8, zero_stage=3, reshard_after_forward="no")


def test_exports():
    plan = Plan(64, 4096, 1, dp=16, zero_stage=3, reshard_after_forward=False)
    cluster = load_cluster("dgx-h100:2")
    for keep, want in ((True, "'never'"), (False, "'always'")):
        titan = export("torchtitan", dataclasses.replace(plan, reshard_after_forward=not keep),
                       LLAMA, cluster)["trainsim_torchtitan.py"]
        assert f"'fsdp_reshard_after_forward': {want}" in titan
    for fmt in ("deepspeed", "megatron"):
        with pytest.raises(SpecError, match="plan.reshard_after_forward: false is not "
                                            "expressible"):
            export(fmt, plan, LLAMA, cluster)
    kept = json.dumps(Plan.from_dict(plan.to_dict()).to_dict())
    assert '"reshard_after_forward": false' in kept


def test_workload_graphs_refuse_it():
    with pytest.raises(SpecError, match="plan.reshard_after_forward"):
        simulate(load_any("resnet18"), load_cluster("dgx-h100:1"),
                 dataclasses.replace(Plan(16, 1, dp=8, zero_stage=3),
                                     reshard_after_forward=False))
