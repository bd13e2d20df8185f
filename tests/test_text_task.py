"""The language-modelling task of the real synchronisation runs (executor/sync/text.py) and
DiLoCo on it for real (two workers under torchrun, gloo)."""

from __future__ import annotations

import math

import pytest
import torch

from executor.sync.launch import execute_sync_batch
from executor.sync.task import TASKS, build_model, load_task
from executor.sync.text import CONTEXT, TextTask
from sim.errors import SpecError
from sim.spec.plan import Plan


def test_text_task_shards_windows_and_model() -> None:
    t = load_task("text")
    assert isinstance(t, TextTask) and t.classes == 97 and len(t.train) > 400_000
    a, b = t.shard(0, 2)[0], t.shard(1, 2)[0]
    assert len(a) + len(b) == len(t.train) and torch.equal(torch.cat([a, b]), t.train)
    x, y = t.sample(t.shard(1, 2), 8, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (8, CONTEXT) and torch.equal(x[:, 1:], y[:, :-1])
    m = build_model(t, TASKS["text"], 0)
    assert sum(p.numel() for p in m.parameters()) == 110_400
    loss, acc = t.evaluate(m)  # untrained: about uniform over the alphabet
    assert loss == pytest.approx(math.log(97), abs=0.15) and acc < 0.1


def test_the_model_is_causal() -> None:
    t = load_task("text")
    m = build_model(t, (32, 1), 1).eval()
    x = t.test_x[:2].clone()
    before = m(x)
    x[:, 40] = (x[:, 40] + 1) % t.classes
    after = m(x)
    assert torch.allclose(before[:, :40], after[:, :40], atol=1e-5)
    assert not torch.allclose(before[:, 40:], after[:, 40:], atol=1e-3)


def test_bsp_and_diloco_train_the_text_model_for_real() -> None:
    """Two workers, AdamW inside; DiLoCo evaluated at its outer parameters: between two
    synchronisations the evaluated model does not change."""
    plans = [Plan(global_batch_size=32, seq_len=CONTEXT, dp=2, sync=s)  # type: ignore[arg-type]
             for s in ("bsp", {"kind": "diloco", "period": 10})]
    bsp, dil = execute_sync_batch([(p, 3e-3, 0) for p in plans], "text", steps=40,
                                  eval_every=5, timeout_s=300, inner="adamw",
                                  eval_global=True)
    assert bsp["evals"][-1]["loss"] < bsp["evals"][0]["loss"] - 1.0
    losses = {e["updates"]: e["loss"] for e in dil["evals"]}
    assert losses[5] == losses[0] and losses[15] == losses[10] and losses[25] == losses[20]
    assert losses[40] < losses[0] - 0.5
    with pytest.raises(SpecError, match="inner"):
        execute_sync_batch([(plans[0], 1e-3, 0)], "text", inner="adam")


def test_diloco_keeps_its_outer_parameters_apart_from_the_replica(tmp_path) -> None:  # noqa: ANN001
    """After an outer step the replica's parameters are a copy of the outer ones: an inner
    step must not move them (it used to: the parameters were views of the outer vector, so
    every later pseudo-gradient read 0 and the replicas never met again). Evaluating the
    outer parameters leaves the replica's in their own storage too."""
    import torch.distributed as dist

    import executor.sync.worker as W
    from executor.sync.replica import Worker

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    try:
        plan = Plan(global_batch_size=16, seq_len=1, dp=2,
                    sync={"kind": "diloco", "period": 2})  # type: ignore[arg-type]
        w = Worker({"plan": plan.to_dict(), "hidden": [8], "seed": 0, "lr": 0.1}, 0,
                   load_task("digits"))
        state = W._strategy_state(w)
        for k in range(6):
            w.gradient()
            W._synchronise(w, k, state)
        outer = state["global"]
        w.evaluate(6, 0.0, outer)
        ptr = outer.untyped_storage().data_ptr()
        assert all(p.untyped_storage().data_ptr() != ptr for p in w.params)
        before = outer.detach().clone()
        w.gradient()
        w.opt.step()
        assert torch.equal(before, outer.detach())
    finally:
        dist.destroy_process_group()
