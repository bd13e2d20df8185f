"""--explain: each assumption and input moved alone, the iteration time's response."""

from __future__ import annotations

import json

import pytest

from optimizer.explain import explain
from sim import load_cluster
from sim.errors import SpecError
from sim.spec.plan import Plan
from sim.spec.zoo import load_any
from trainsim.cli import main

PLAN = Plan(global_batch_size=64, seq_len=2048, dp=8, tp=4, micro_batch_size=1)


def test_gemm_efficiency_moves_a_compute_bound_step_most() -> None:
    base, rows = explain(load_any("llama3-8b"), load_cluster("dgx-h100:4"), PLAN)
    by = {r.knob: r for r in rows}
    assert rows[0].knob == "gpu.gemm_eff_max"
    assert by["gpu.gemm_eff_max"].minus_s > base > by["gpu.gemm_eff_max"].plus_s
    assert -1.0 < by["gpu.gemm_eff_max"].elasticity < 0
    assert by["gpu.nvls_eff"].note == ""  # a bus-bandwidth ratio: not capped at 1
    assert all(abs(r.plus_s - r.minus_s) >= abs(s.plus_s - s.minus_s)
               for r, s in zip(rows, rows[1:], strict=False))


def test_a_slow_wan_is_what_to_measure_across_sites() -> None:
    """Flat BSP across two regions pays the WAN's 43.5 ms on every ring step of every
    gradient bucket: its latency moves the step most, then its bandwidth."""
    _, rows = explain(load_any("llama3-8b"), load_cluster("regions2-dgx-h100:2"), PLAN)
    assert [r.knob for r in rows[:2]] == ["wan[us-east-us-west].latency_ms",
                                          "wan[us-east-us-west].Gbps"]
    assert rows[0].elasticity > 0 > rows[1].elasticity


def test_cli_explain(capsys, tmp_path) -> None:  # noqa: ANN001
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(PLAN.to_dict()))
    args = ["simulate", "--model", "llama3-8b", "--cluster", "dgx-h100:4", "--plan",
            str(plan), "--explain"]
    assert main(args) == 0
    assert "what moves the iteration time" in capsys.readouterr().out
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["explain"][0]["knob"] == "gpu.gemm_eff_max"
    assert main([*args, "--explain-delta", "1.5"]) == 2
    with pytest.raises(SpecError):
        explain(load_any("llama3-8b"), load_cluster("dgx-h100:4"), PLAN, delta=0.0)
