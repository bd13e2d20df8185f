"""MegaScale-MoE's operator-level overlap (plan.moe_overlap = "operator",
sim.cost.overlap): a layer's expert exchanges (and Ulysses' all-to-alls) fused with the GEMMs
beside them and hidden behind the pass's independent compute, in both tiers; its rules and
refusals."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from optimizer.export import export
from sim import Plan, load_cluster, load_model, simulate
from sim.cost import compute as cm
from sim.cost.overlap import cp_steps, ep_steps, exposed, held
from sim.cost.profiled import cost_model_for
from sim.errors import SpecError

QWEN = "qwen3-30b-a3b"  # 128 small experts, top-8: exchanges longer than the GEMMs
PLANS = {
    "ep-across-nodes": dict(dp=32, ep=32),
    "tp-sp": dict(dp=16, tp=2, ep=8, sequence_parallel=True),
    "ulysses-full-recompute": dict(dp=8, cp=4, cp_comm="a2a", ep=32, recompute="full"),
    "deepep-pp": dict(dp=16, pp=2, ep=16, moe_dispatcher="deepep"),
    "allgather-selective": dict(dp=32, ep=32, moe_dispatcher="allgather",
                                recompute="selective"),
}


def _ep(r) -> tuple[float, float]:
    return r.communication["ep"]["exposed_s"], r.communication["ep"]["overlapped_s"]


def test_the_pass_formula():
    """A GEMM hides only its own exchange; independent compute hides what any exchange
    from the one that readies it on leaves, and runs after the last otherwise."""
    def steps(*gf):
        return [([("all_to_all", 1.0)], g, f) for g, f in gf]
    assert exposed([3.0, 1.0], steps((1.0, 0.0), (2.0, 0.0))) == 2.0
    assert exposed([3.0, 1.0], steps((1.0, 1.5), (2.0, 0.0))) == 0.5
    assert exposed([3.0, 1.0], steps((1.0, 9.0), (2.0, 0.0))) == 0.0
    # compute readied by the second step cannot hide the first exchange
    assert exposed([3.0, 1.0], steps((1.0, 0.0), (2.0, 9.0))) == 2.0
    assert exposed([3.0, 4.0], steps((1.0, 1.0), (2.0, 0.5))) == 1.0 + 1.5
    assert exposed([3.0], steps((1.0, 0.0)), scale=2.0) == 1.0  # slower GEMMs hide more
    assert held(steps((1.0, 0.5), (2.0, 0.25))) == 3.75
    lt = cm.LayerTime(10.0, 20.0, 1.0, 2.0, 0.5, 1.0, 0.0,
                      expert_gemms=((2.0, 4.0), (1.0, 2.0)),
                      attention_gemms=((3.0, 6.0), (1.5, 3.0)))
    a, b = [("all_to_all", 1.0)], [("all_to_all", 2.0)]
    # forward: dispatch with the up GEMM, combine with the down GEMM, the shared expert
    # ready from the dispatch on
    assert ep_steps(lt, [a, b], backward=False) == [(a, 2.0, 0.5), (b, 1.0, 0.0)]
    # backward: the combine's gradient first with the down GEMM's data gradient and the
    # shared expert's backward; the experts' weight gradients ready once it has arrived
    assert ep_steps(lt, [a, b], backward=True) == [(a, 1.0, 1.0), (b, 2.0, 3.0)]
    assert ep_steps(lt, [a], backward=False) == [(a, 2.0, 0.5)]  # DeepEP's early stop
    qkv, out = ("all_to_all", 4.0), ("all_to_all", 2.0)
    assert cp_steps(lt, [qkv, out], False, False) == [[([qkv], 3.0, 0.0), ([out], 1.5, 0.0)]]
    # backward: the output projection's weight gradient beside the first exchange; the
    # input projections' needs the second's result
    assert cp_steps(lt, [qkv, out], True, False) == [[([out], 1.5, 1.5), ([qkv], 3.0, 0.0)]]
    # a backward that re-runs the core: the replay's pair first, with its GEMMs only when
    # the whole layer is re-run
    full = cp_steps(lt, [qkv, out] * 2, True, True)
    assert full[0] == [([qkv], 3.0, 0.0), ([out], 1.5, 0.0)] and len(full) == 2
    assert cp_steps(lt, [qkv, out] * 2, True, False)[0] == [([qkv], 0.0, 0.0),
                                                            ([out], 0.0, 0.0)]


@pytest.mark.parametrize("kw", PLANS.values(), ids=PLANS.keys())
def test_both_tiers_hide_part_and_agree(kw):
    m, c = load_model(QWEN), load_cluster("dgx-h100:4")
    plan = Plan(64, 4096, 1, moe_overlap="operator", **kw)
    base = dataclasses.replace(plan, moe_overlap="none")
    a, off = simulate(m, c, plan), simulate(m, c, base)
    assert 0 < _ep(a)[0] < _ep(off)[0] and a.iteration_time_s < off.iteration_time_s
    if plan.moe_dispatcher != "deepep":  # no SMs taken (DeepEP's 20 are charged)
        assert sum(_ep(a)) == pytest.approx(_ep(off)[0], rel=1e-9)
    if plan.cp > 1:  # Ulysses' all-to-alls hidden behind the projections
        cp, cp_off = a.communication["cp"], off.communication["cp"]
        assert cp["exposed_s"] < cp_off["exposed_s"]
        assert cp["exposed_s"] + cp["overlapped_s"] == pytest.approx(cp_off["exposed_s"])
    d = simulate(m, c, plan, fidelity="des")
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.01)
    assert _ep(d)[0] == pytest.approx(_ep(a)[0], rel=0.05)
    assert d.iteration_time_s < simulate(m, c, base, fidelity="des").iteration_time_s


def test_the_analytic_exposure_by_hand():
    """EP 32 over four nodes, forced balance, no shared expert: every exchange of the
    layer is the same all-to-all ``C`` (read off the plan without overlap), so a micro-
    batch's exposure per MoE layer is ``max(0, C - up) + max(0, C - down)`` forward and
    backward ``max(0, C - down')`` (no shared expert to run beside the combine's gradient)
    plus ``max(0, C - up' - W)``, the experts' weight gradients ``W`` ready once the
    combine's gradient has arrived."""
    m, c = load_model(QWEN), load_cluster("dgx-h100:4")
    plan = Plan(64, 4096, 1, dp=32, ep=32, moe_overlap="operator")
    off = simulate(m, c, dataclasses.replace(plan, moe_overlap="none"))
    passes = plan.num_microbatches * m.num_layers
    each = off.communication["ep"]["exposed_s"] / passes / 4
    (up_f, up_b), (down_f, down_b) = cm.layer_time(cost_model_for(c), m, plan,
                                                   moe=True).expert_gemms
    assert 0 < up_f < each and up_b == pytest.approx(2 * up_f, rel=0.05)
    forward = max(0.0, each - up_f) + max(0.0, each - down_f)
    backward = max(0.0, each - down_b / 2) + max(0.0, each - up_b / 2 - (up_b + down_b) / 2)
    got = simulate(m, c, plan).communication["ep"]["exposed_s"]
    assert got == pytest.approx(passes * (forward + backward), rel=1e-9)


def test_nothing_exposed_when_the_gemms_are_longer():
    """Mixtral's wide experts on one node: every exchange fits under its GEMM."""
    m, c = load_model("mixtral-8x7b"), load_cluster("dgx-h100:1")
    plan = Plan(64, 4096, 1, dp=8, ep=8, moe_overlap="operator")
    for fid in ("analytic", "des"):
        r = simulate(m, c, plan, fidelity=fid)
        assert _ep(r)[0] == 0.0 and _ep(r)[1] > 0


def test_a_device_that_cannot_overlap_hides_nothing():
    """CPU ranks (gloo, ``comm_overlap`` 0): the exchanges wait in both tiers."""
    m = load_model("mixtral-8x7b")
    c = dataclasses.replace(load_cluster("cpu:8"), profile=None)
    plan = Plan(8, 256, 1, dp=8, ep=8, moe_overlap="operator")
    off = simulate(m, c, dataclasses.replace(plan, moe_overlap="none"))
    for fid in ("analytic", "des"):
        r = simulate(m, c, plan, fidelity=fid)
        assert _ep(r) == pytest.approx((_ep(off)[0], 0.0), rel=1e-9, abs=1e-12)
        assert r.iteration_time_s == pytest.approx(off.iteration_time_s, rel=0.02)


@pytest.mark.parametrize("kw,why", [
    (dict(ep=1, dp=8), "needs expert parallelism"),
    (dict(pp=2, dp=4, vpp=2, schedule="dualpipev"), "not modelled"),
])
def test_rules(kw, why):
    with pytest.raises(SpecError, match=why) as err:
        Plan(64, 4096, 1, **{"dp": 8, "ep": 8, "moe_overlap": "operator", **kw})
    assert err.value.field == "plan.moe_overlap" and "\n" not in str(err.value)


def test_no_framework_runs_it():
    from executor.capabilities import unsupported
    from optimizer.moves import _dispatcher_moves

    m, c = load_model(QWEN), load_cluster("dgx-h100:4")
    plan = Plan(64, 4096, 1, dp=32, ep=32, moe_overlap="operator")
    for fmt in ("megatron", "deepspeed"):
        with pytest.raises(SpecError, match="MegaScale-MoE") as err:
            export(fmt, plan, m, c)
        assert err.value.field == "plan.moe_overlap"
    why = unsupported(load_model("mixtral-8x7b"), Plan(8, 256, dp=2, ep=2,
                                                       moe_overlap="operator"))
    assert why is not None and why[0] == "plan.moe_overlap"
    base = dataclasses.replace(plan, moe_overlap="none")
    moves = _dispatcher_moves(base, simulate(m, c, base))
    assert moves and all(p.moe_overlap != "operator" for _, p in moves)


def test_the_front_door(tmp_path):
    out = tmp_path / "plan.json"
    run = subprocess.run([sys.executable, "-m", "trainsim", "plan", "new", "--model", QWEN,
                          "--cluster", "dgx-h100:4", "--global-batch-size", "64", "--seq-len",
                          "4096",
                          "--dp", "32", "--ep", "32", "--moe-overlap", "operator",
                          "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert '"moe_overlap": "operator"' in out.read_text()


def test_slow_nodes_hide_more_in_both_tiers():
    """Stragglers' slower GEMMs hide more of their exchanges, Ulysses' too (its groups
    across the nodes here)."""
    from sim.spec.faults import faults_from_options

    m, c = load_model(QWEN), load_cluster("dgx-h100:4")
    plan = Plan(64, 4096, 1, dp=8, cp=4, cp_comm="a2a", ep=8, moe_overlap="operator",
                placement="tp-ep-dp-cp-pp")
    slow = faults_from_options([f"node:{n}=1.5" for n in range(4)])
    a, d = simulate(m, c, plan, faults=slow), simulate(m, c, plan, "des", faults=slow)
    even = simulate(m, c, plan)
    for kind in ("ep", "cp"):
        assert a.communication[kind]["exposed_s"] < even.communication[kind]["exposed_s"]
        assert d.communication[kind]["exposed_s"] == pytest.approx(
            a.communication[kind]["exposed_s"], rel=0.05, abs=1e-6)
