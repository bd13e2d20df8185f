"""trainsim calibrate from PyTorch profiler (Kineto) traces: the iteration time from the
ProfilerStep spans of a real trace, checked against the run's model."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from executor.model import Transformer
from optimizer.calibrate import load_runs
from optimizer.traces import iteration_s_from_trace
from sim.errors import SpecError
from sim.spec.plan import Plan
from sim.spec.zoo import load_model
from trainsim.cli import main

TINY = load_model("tiny")
SEQ = 64
PLAN = Plan(global_batch_size=2, seq_len=SEQ, micro_batch_size=2, dtype="fp32")


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> tuple[Path, list[float]]:
    """A real trace of five training steps of ``tiny`` (one rank, cpu), and the steps'
    wall-clock times measured beside it: between successive ``prof.step()`` calls, the
    spans the profiler records as steps (so a loaded machine moves both alike)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    model = Transformer(TINY, SEQ)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, TINY.vocab_size, (2, SEQ))
    marks = []
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=5, repeat=1)) as prof:
        for _ in range(6):
            loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
            marks.append(time.perf_counter())
    path = tmp_path_factory.mktemp("trace") / "rank0.json"
    prof.export_chrome_trace(str(path))
    return path, [b - a for a, b in zip(marks[:-1], marks[1:], strict=True)]  # 5 active steps


def test_a_real_trace_gives_its_steps_median(trace) -> None:
    """The median of the trace's ProfilerStep spans (read here on their own; the first left
    out as warm-up), each inside
    the interval between two ``prof.step()`` calls: at most the intervals' median (a loaded
    machine stretches the intervals, not the spans' order), within the call's own tail."""
    path, walls = trace
    t = iteration_s_from_trace(path, TINY, PLAN)
    spans = [e["dur"] / 1e6 for e in json.loads(path.read_text())["traceEvents"]
             if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert len(spans) == 5 and t == pytest.approx(statistics.median(spans[1:]), rel=1e-9)
    assert 0 < t <= 1.25 * statistics.median(walls) + 0.005


def test_a_trace_of_another_model_is_refused(trace) -> None:
    with pytest.raises(SpecError, match="^trace: rank0.json is a trace of another model"):
        iteration_s_from_trace(trace[0], load_model("llama3-8b"), PLAN)


def _synthetic(path: Path, steps: list[float], shapes: bool = True) -> Path:
    events = [{"ph": "X", "name": f"ProfilerStep#{i + 3}", "cat": "user_annotation",
               "ts": 1e6 * i, "dur": 1e6 * s} for i, s in enumerate(steps)]
    events += [{"ph": "X", "name": "ProfilerStep#3", "cat": "gpu_user_annotation", "ts": 0,
                "dur": 9e9}]  # the GPU's copy of a step span: not the CPU's
    gemm = {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 1, "dur": 5}
    if shapes:
        gemm["args"] = {"Input Dims": [[128, 256], [256, 704]]}  # x @ w1 of tiny
    path.write_text(json.dumps({"traceEvents": events + [gemm]}))
    return path


def test_the_first_step_is_left_out_and_gpu_spans_ignored(tmp_path: Path) -> None:
    p = _synthetic(tmp_path / "t.json", [9.0, 1.0, 1.2, 1.1])
    assert iteration_s_from_trace(p, TINY, PLAN) == pytest.approx(1.1)
    two = _synthetic(tmp_path / "two.json", [2.0, 1.0])
    assert iteration_s_from_trace(two, TINY, PLAN) == pytest.approx(1.5)
    bare = _synthetic(tmp_path / "bare.json", [1.0, 1.0], shapes=False)
    assert iteration_s_from_trace(bare, load_model("llama3-8b"), PLAN) == 1.0  # no shapes: no check


@pytest.mark.parametrize("text, match", [
    ('{"traceEvents": []}', "no ProfilerStep#N spans"),
    ("{not json", "not valid JSON"),
    ('{"events": 1}', "no traceEvents list"),
])
def test_bad_traces_are_one_line_errors(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "t.json"
    p.write_text(text)
    with pytest.raises(SpecError, match=match):
        iteration_s_from_trace(p, TINY, PLAN)


def test_a_runs_csv_may_name_traces(tmp_path: Path, trace, capsys) -> None:  # noqa: ANN001
    (tmp_path / "p.json").write_text(json.dumps(PLAN.to_dict()))
    runs = tmp_path / "runs.csv"
    runs.write_text(f"model,cluster,plan,trace\ntiny,cpu:1,p.json,{trace[0]}\n")
    assert load_runs(runs)[0].measured_s == iteration_s_from_trace(trace[0], TINY, PLAN)
    runs.write_text(f"model,cluster,plan,trace\nllama3-8b,cpu:1,p.json,{trace[0]}\n")
    out = tmp_path / "cal.json"
    assert main(["calibrate", str(runs), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runs[0].trace" in err[0] and "another model" in err[0]
    assert not out.exists()


def test_a_token_count_equal_to_the_hidden_size_does_not_pass_for_the_model(tmp_path):
    """An 8B trace at 8,192 tokens holds (8192, 4096) and (8192, 14336) activations; against
    llama3-70b (hidden 8,192) at tp 8 none of them is a 70B weight."""
    events = [{"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0,
               "dur": 1e6},
              {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 1, "dur": 5,
               "args": {"Input Dims": [[8192, 4096], [4096, 14336]]}},
              {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 9, "dur": 5,
               "args": {"Input Dims": [[14336, 8192], [8192, 4096]]}}]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events}))
    plan = Plan(global_batch_size=32, seq_len=8192, tp=8, dp=4, micro_batch_size=1)
    with pytest.raises(SpecError, match="another model"):
        iteration_s_from_trace(p, load_model("llama3-70b"), plan)
    assert iteration_s_from_trace(p, load_model("llama3-8b"), PLAN) == 1.0
