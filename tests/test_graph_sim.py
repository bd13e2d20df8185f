"""Workload graphs in both tiers (sim/analytic/graph.py, sim/des/graph.py): DDP buckets
behind backward, ZeRO, pipelines over the layer sequence, memory; checked by hand on a toy
workload with measured layer times and against each other on the presets."""

from __future__ import annotations

import dataclasses

import pytest
from helpers.cli import assert_bad_input, cli

from sim import Plan, load_cluster, simulate
from sim.cost.graph import layer_times
from sim.cost.profiled import cost_model_for
from sim.errors import SpecError
from sim.layout.graph import (
    BUCKET_BYTES,
    FIRST_BUCKET_BYTES,
    check_graph_plan,
    ddp_buckets,
    graph_memory,
    graph_stages,
)
from sim.layout.placement import group_span
from sim.network.algorithms import collective_time
from sim.network.alphabeta import fabric_for
from sim.spec.workload import Layer, Measured, Workload
from sim.spec.zoo import load_any

H1 = load_cluster("dgx-h100:1")
DEVICE = H1.gpu.name
MB = 2**20


def _toy(bwd=(1e-3, 1e-3, 1e-3)) -> Workload:
    """Three layers with measured bf16 times on the H100 at batch 4; 8 MiB of fp32 parameters
    each (2 Mi elements), 1 MiB of activations across each cut per sample."""
    layers = tuple(Layer(f"l{i}", "Linear", (2 * MB,), forward_flops=1.0, backward_flops=2.0,
                         boundary_bytes=MB, saved_bytes=2 * MB, output_bytes=MB,
                         measured=(Measured(DEVICE, 4, 5e-4, b, "bf16"),))
                   for i, b in enumerate(bwd))
    return Workload("toy", layers)


def _coll(plan: Plan, kind: str, size: float) -> float:
    f = fabric_for(H1, group_span(plan, H1, "dp"))
    return collective_time(kind, f, size, "auto")


def test_ddp_buckets_follow_reverse_registration_order():
    w = _toy()
    # bf16 gradients: 4 MiB per tensor, last layer first; the first bucket closes at 1 MiB,
    # so it holds the last layer's alone, the next (25 MiB) the other two
    assert ddp_buckets(w, range(3), 2.0) == [(4 * MB, 2), (8 * MB, 0)]
    small = Workload("s", tuple(Layer(f"l{i}", "Linear", (MB // 8,)) for i in range(40)))
    sizes = [b for b, _ in ddp_buckets(small, range(40), 4.0)]  # 0.5 MiB tensors
    assert sizes[0] == FIRST_BUCKET_BYTES and max(sizes[1:]) <= BUCKET_BYTES
    assert sum(sizes) == 40 * MB // 2


def test_gradient_all_reduce_hides_behind_backward_by_hand():
    """dp 8, one micro-batch: the last layer's bucket starts after its backward (1 ms), the
    other when the backward pass is done (3 ms): it is all exposed, the first hidden. bf16
    under autocast keeps fp32 gradients: 8 MiB per tensor."""
    w, plan = _toy(), Plan(32, 1, 4, dp=8)
    r = simulate(w, H1, plan)
    first, second = _coll(plan, "all_reduce", 8 * MB), _coll(plan, "all_reduce", 16 * MB)
    end = max(1e-3 + first, 3e-3) + second
    assert r.breakdown["compute"] == pytest.approx(3 * 5e-4 + 3e-3)
    assert r.breakdown["dp"] == pytest.approx(end - 3e-3) == pytest.approx(second)
    assert r.communication["dp"]["overlapped_s"] == pytest.approx(first)
    assert simulate(w, H1, plan, "des").iteration_time_s == pytest.approx(r.iteration_time_s)


def test_without_overlap_every_bucket_is_exposed():
    w, plan = _toy(), Plan(32, 1, 4, dp=8, overlap_grad_reduce=False)
    r = simulate(w, H1, plan)
    assert r.breakdown["dp"] == pytest.approx(_coll(plan, "all_reduce", 8 * MB)
                                              + _coll(plan, "all_reduce", 16 * MB))
    assert simulate(w, H1, plan, "des").iteration_time_s == pytest.approx(r.iteration_time_s)


def test_pipeline_of_two_stages_by_hand():
    """pp 2 over three equal layers: stages of 2 and 1 layers (the balanced split); the
    slowest stage paces m micro-batches, the other adds its own time once, and the first
    activation and last gradient cross the boundary once each."""
    w, plan = _toy(), Plan(8, 1, 4, dp=1, pp=2)  # 2 micro-batches, one device each
    times = layer_times(w, load_cluster("dgx-h100:1"), plan)
    assert graph_stages(w, plan, times) == [range(0, 2), range(2, 3)]
    cluster = load_cluster("dgx-h100:1")
    cluster = dataclasses.replace(cluster, gpus_per_node=2)
    r = simulate(w, cluster, plan)
    f = fabric_for(cluster, group_span(plan, cluster, "pp"))
    send = collective_time("send_recv", f, 4 * MB * 2 / 4, "auto")  # 1 MiB x 4 samples bf16
    slow, fast = 2 * 1.5e-3, 1.5e-3
    assert r.iteration_time_s - r.breakdown["optimizer"] == pytest.approx(
        2 * slow + fast + 2 * send)
    # the DES follows 1F1B op by op: the fast stage's backward overlaps the slow stage's
    # next forward, which the closed form (exact for balanced stages) does not credit
    des = simulate(w, cluster, plan, "des")
    assert des.iteration_time_s <= r.iteration_time_s
    assert des.iteration_time_s - des.breakdown["optimizer"] == pytest.approx(
        2 * slow + 5e-4 + 2 * send, rel=0.01)


def test_memory_by_hand():
    """ZeRO-0 bf16: 2 + 2 + 12 bytes per parameter; 1F1B keeps pp - stage micro-batches of
    saved activations (bf16: half the traced fp32 bytes); the largest layer output as
    working space; the device's reserve."""
    w, plan = _toy(), Plan(16, 1, 4, dp=1, pp=2)
    cluster = dataclasses.replace(load_cluster("dgx-h100:1"), gpus_per_node=2)
    gib = graph_memory(w, cluster, plan, layer_times(w, cluster, plan))
    act = 4 * 0.5  # 4 samples, bf16
    first = (2 * 2 * MB * 16 + 2 * (2 * MB * 2) * act + MB * act) / 2**30
    assert gib[0] == pytest.approx(first + cluster.gpu.reserved_gib)


@pytest.mark.parametrize("changes, field", [
    ({"tp": 2, "dp": 4}, "plan.tp"), ({"vpp": 2, "pp": 2, "dp": 4,
                                        "schedule": "interleaved-1f1b"}, "plan.vpp"),
    ({"recompute": "selective"}, "plan.recompute"), ({"recompute": "full"}, "plan.recompute"),
    ({"dtype": "fp8"}, "plan.dtype"), ({"seq_len": 512}, "plan.seq_len"),
    ({"attention": "standard"}, "plan.attention"),
    ({"collectives": (("tp", "ring"),)}, "plan.collectives"),
    ({"pp": 2, "dp": 4, "layers_per_stage": (1, 1)}, "plan.layers_per_stage"),
])
def test_graph_plans_refuse_what_a_graph_cannot_run(changes, field):
    plan = dataclasses.replace(Plan(32, 1, 4, dp=8), **changes)
    with pytest.raises(SpecError) as err:
        check_graph_plan(_toy(), plan, H1)
    assert err.value.field == field


@pytest.mark.parametrize("name, plan", [
    ("resnet50", Plan(256, 1, 32, dp=8)),
    ("bert-base", Plan(256, 1, 8, dp=16, zero_stage=2)),
    ("vgg16", Plan(256, 1, 8, dp=8, pp=2)),
    ("bert-base", Plan(256, 1, 8, dp=16, zero_stage=3)),
])
def test_the_tiers_agree_on_presets(name, plan):
    cluster = load_cluster("dgx-a100:2" if plan.world_size == 16 else "dgx-a100:1")
    a, d = (simulate(load_any(name), cluster, plan, f) for f in ("analytic", "des"))
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.1)
    assert a.fits_in_memory and a.samples_per_s == pytest.approx(256 / a.iteration_time_s)


def test_roofline_without_measurements():
    """No measured times: max(FLOPs / GEMM rate, bytes / memory rate) per layer."""
    w = load_any("resnet50")
    plan = Plan(256, 1, 32, dp=8)
    cluster = load_cluster("dgx-a100:1")
    times = layer_times(w, cluster, plan)
    conv = next(i for i, x in enumerate(w.layers) if x.name == "layer1.0.conv2")
    rate = cost_model_for(cluster).gemm_flops["bf16"]  # type: ignore[attr-defined]
    assert times[conv][0] >= w.layers[conv].forward_flops * 32 / rate


def test_simulate_cli_on_a_workload(capsys):
    import json
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "p.json"
        plan.write_text(json.dumps({"global_batch_size": 256, "seq_len": 1,
                                    "micro_batch_size": 32, "dp": 8}))
        code, out, err = cli(capsys, "simulate", "--model", "resnet50", "--cluster",
                             "dgx-a100:1", "--plan", str(plan))
        assert code == 0 and "samples/s" in out, err
        plan.write_text(json.dumps({"global_batch_size": 256, "seq_len": 1, "dp": 4,
                                    "tp": 2}))
        code, out, err = cli(capsys, "simulate", "--model", "resnet50", "--cluster",
                             "dgx-a100:1", "--plan", str(plan))
        assert_bad_input(code, out, err, "plan.tp")


def test_graph_space_holds_every_dp_pp_plan_within_the_constraints():
    from optimizer.constraints import Constraints
    from optimizer.graph import graph_plans

    w, cluster = load_any("vgg16"), load_cluster("dgx-a100:1")
    plans = graph_plans(w, cluster, 64, "bf16", Constraints())
    assert {(p.dp, p.pp) for p in plans} == {(8, 1), (4, 2), (2, 4), (1, 8)}
    assert all(p.zero_stage < 3 for p in plans if p.pp > 1)
    assert all(p.zero_stage == 0 for p in plans if p.dp == 1)
    assert {p.schedule for p in plans if p.pp > 1} == {"1f1b", "gpipe"}
    for p in plans:
        check_graph_plan(w, p, cluster)
    capped = graph_plans(w, cluster, 64, "bf16", Constraints(max_zero_stage=1,
                                                              fixed=(("pp", 2),)))
    assert capped and all(p.pp == 2 and p.zero_stage <= 1 for p in capped)
    with pytest.raises(SpecError, match="--framework"):
        graph_plans(w, cluster, 64, "bf16", Constraints(framework="megatron"))


def test_optimize_a_workload_graph(capsys, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = cli(capsys, "optimize", "--model", "resnet50", "--cluster",
                            "dgx-a100:1", "--global-batch-size", "256", "--seq-len", "1",
                            "--top", "3", "--json", "--out", str(out))
    assert code == 0, err
    import json

    s = json.loads(stdout)
    assert s["best_plan"]["tp"] == 1 and s["ranked"][0]["tier"] == "des"
    assert len(s["ranked"]) == 3 and (out / "best_plan.json").is_file()
    best = Plan.from_dict(s["best_plan"])
    assert simulate(load_any("resnet50"), load_cluster("dgx-a100:1"), best, "des") \
        .iteration_time_s == pytest.approx(s["best_iteration_s"])
    code, _, err = cli(capsys, "optimize", "--model", "resnet50", "--cluster", "dgx-a100:1",
                       "--global-batch-size", "256", "--seq-len", "1", "--max-memory-gib",
                       "0.5")
    assert code == 3 and "no feasible plan" in err


def test_measured_times_serve_only_their_dtype():
    """Times measured in bf16 do not stand for an fp32 plan (nor the other way round)."""
    w = _toy()
    bf16 = simulate(w, H1, Plan(32, 1, 4, dp=8))
    fp32 = simulate(w, H1, Plan(32, 1, 4, dp=8, dtype="fp32"))
    assert bf16.breakdown["compute"] == pytest.approx(3 * 5e-4 + 3e-3)
    assert fp32.breakdown["compute"] < 1e-3  # the roofline: a few FLOPs and bytes per layer


@pytest.mark.parametrize("plan", [Plan(64, 1, 8, dp=2, pp=4), Plan(16, 1, 8, dp=1, pp=8),
                                  Plan(256, 1, 8, dp=8, overlap_grad_reduce=False)])
def test_tiers_agree_with_heavy_late_stages_and_without_overlap(plan):
    """VGG-16's parameters sit in its last layers: the last micro-batch's backward reaches
    those stages first, so their reduction and step start early (both tiers)."""
    w, cluster = load_any("vgg16"), load_cluster("dgx-a100:1")
    a, d = (simulate(w, cluster, plan, f).iteration_time_s for f in ("analytic", "des"))
    assert a == pytest.approx(d, rel=0.05)


def test_a_plan_in_another_dtype_than_measured_says_so():
    w = _toy()  # measured in bf16
    r = simulate(w, H1, Plan(32, 1, 4, dp=8, dtype="fp32"))
    assert any("measured on this device in bf16 only" in x for x in r.warnings)
    assert not simulate(w, H1, Plan(32, 1, 4, dp=8)).warnings


def test_a_workload_with_nothing_to_time_is_an_error():
    with pytest.raises(SpecError, match="nothing to time"):
        simulate(Workload("empty", (Layer("a", "Identity"),)), H1, Plan(32, 1, 4, dp=8))
