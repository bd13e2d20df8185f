"""Workload graphs run for real (executor/graph_run.py) under torchrun with gloo: DDP's
buckets as the simulator counts them, a pipeline split where torch.distributed.pipelining
can cut, and the comparison with the prediction."""

from __future__ import annotations

import pytest

from executor.graph_run import graph_split, graph_unsupported
from executor.launch import check_runnable, execute
from sim import Plan, load_cluster
from sim.cost.graph import layer_times
from sim.errors import SpecError
from sim.layout.graph import ddp_buckets
from sim.spec.zoo import load_any

RUN = {"nproc": 2, "steps": 2, "warmup": 1, "timeout_s": 300.0, "device": "cpu",
       "threads": 1}


def test_ddp_issues_the_buckets_the_simulator_counts():
    """Two replicas of the LSTM language model: one all-reduce per DDP bucket of the last
    micro-batch, of the bytes the simulator's buckets hold."""
    w = load_any("lstm-lm")
    plan = Plan(8, 1, 2, dp=2, dtype="fp32")
    result = execute(w, plan, **RUN)
    rows = {(r["group"], r["kind"]): r for r in result["collectives"]["0"]}
    buckets = ddp_buckets(w, range(len(w.layers)), 4.0)
    reduce = rows[("dp", "all_reduce")]
    assert reduce["count"] == len(buckets)  # in the step recorded with the profiler
    assert reduce["bytes"] == sum(b for b, _ in buckets)
    assert all(v is not None for v in result["loss"])


def test_pipeline_splits_where_a_module_begins_and_runs():
    w = load_any("resnet18")
    plan = Plan(8, 1, 2, dp=1, pp=2, dtype="fp32")
    split = graph_split(w, plan, layer_times(w, load_cluster("cpu:2"), plan))
    assert split is not None and sum(split) == len(w.layers) and len(split) == 2
    first = w.layers[split[0]]
    assert first.kind in ("Conv2d", "BatchNorm2d", "Linear", "MaxPool2d")  # a leaf begins it
    import dataclasses

    result = execute(w, dataclasses.replace(plan, layers_per_stage=split), **RUN)
    kinds = {(r["group"], r["kind"]) for r in result["collectives"]["0"]}
    assert ("pp", "send") in kinds and ("pp", "recv") in kinds
    assert result["loss"][-1] is not None


@pytest.mark.parametrize("changes, field", [
    ({"pp": 2, "dp": 1, "zero_stage": 2}, "plan.zero_stage"),
    ({"dtype": "fp16"}, "plan.dtype"), ({"recompute": "full"}, "plan.recompute"),
    ({"tp": 2, "dp": 1}, "plan.tp"),
])
def test_refused_before_launch(changes, field):
    import dataclasses

    plan = dataclasses.replace(Plan(8, 1, 2, dp=2, dtype="fp32"), **changes)
    w = load_any("resnet18")
    assert graph_unsupported(w, plan)[0] == field
    with pytest.raises(SpecError) as err:
        check_runnable(w, plan, 2)
    assert err.value.field == field


def test_compare_cli_on_a_workload(capsys, tmp_path):
    import json

    from helpers.cli import cli

    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"global_batch_size": 8, "seq_len": 1, "micro_batch_size": 2,
                                "dp": 2, "dtype": "fp32"}))
    code, out, err = cli(capsys, "compare", "--model", "lstm-lm", "--plan", str(plan),
                         "--cluster", "cpu:2", "--steps", "2", "--warmup", "1", "--json")
    assert code == 0, err
    c = json.loads(out)
    assert c["model"] == "lstm-lm" and c["predicted_s"] > 0 and c["measured_s"] > 0
