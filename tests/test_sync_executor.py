"""Real runs of the synchronisation strategies: torchrun + gloo on cpu, scikit-learn's
bundled digits, workers and parameter-server ranks."""

from __future__ import annotations

import pytest

from executor.sync.launch import execute_sync, execute_sync_batch, runnable, updates_to
from executor.sync.replica import gossip_weights, shard_indices
from executor.sync.task import build_model, load_task, mlp
from sim.errors import SpecError
from sim.spec.plan import Plan


def plan(sync: object = "bsp", comm: object = "auto", dp: int = 2, **kw: object) -> Plan:
    return Plan(global_batch_size=32 * dp, seq_len=1, dp=dp, sync=sync,  # type: ignore[arg-type]
                communication=comm, **kw)  # type: ignore[arg-type]


def test_asp_run_learns_and_its_server_measures_staleness() -> None:
    r = execute_sync(plan("asp"), "digits", steps=60, lr=0.2, eval_every=20)
    assert r["servers"] == 1 and r["update_scope"] == "server"
    hist = {int(k): v for k, v in r["staleness"]["histogram"].items()}
    assert sum(hist.values()) == 2 * 60  # every push applied once
    assert 0.2 < r["staleness"]["mean"] < 2.0  # n - 1 = 1 for alike workers
    first, last = r["evals"][0], r["evals"][-1]
    assert first["updates"] == 0 and 60 <= last["updates"] <= 120  # its last read
    assert last["accuracy"] > first["accuracy"] + 0.4
    assert r["updates_per_s"] > 0 and r["samples_per_s"] == pytest.approx(
        32 * r["updates_per_s"])


def test_one_start_runs_bsp_local_sgd_diloco_and_gossip() -> None:
    runs = [(plan("bsp", dp=4), 0.2, 0), (plan({"kind": "local-sgd", "period": 4}, dp=4),
                                          0.2, 0),
            (plan({"kind": "diloco", "period": 5}, dp=4), 0.2, 0),
            (plan("gossip", dp=4), 0.2, 0),
            (plan({"kind": "gossip", "gossip_mode": "sgp", "graph": "exponential"}, dp=4),
             0.2, 0)]
    out = execute_sync_batch([(p, 0.5, s) for p, _, s in runs], "digits", steps=60,
                             eval_every=60)
    for (p, _, _), r in zip(runs, out, strict=True):
        assert r["strategy"]["kind"] == p.sync.kind
        assert r["evals"][-1]["accuracy"] > 0.8, (p.sync, r["evals"])
        assert r["updates_per_s"] > 0
    assert out[0]["update_scope"] == "global" and out[1]["update_scope"] == "local"


def test_bsp_over_two_servers_equals_the_mean_gradient_step() -> None:
    """BSP over servers applies the mean of the workers' gradients, as all-reduce BSP does:
    same seed, same batches, the same accuracy curve."""
    shards = [(plan("bsp", {"architecture": "ps", "servers": 2, "sharding": s}), 0.2, 0)
              for s in ("size-balanced", "flat")]
    whole, flat = execute_sync_batch(shards, "digits", steps=20, eval_every=10)
    b = execute_sync(plan("bsp"), "digits", steps=20, lr=0.2, eval_every=10)
    for a in (whole, flat):
        assert [e["accuracy"] for e in a["evals"]] == pytest.approx(
            [e["accuracy"] for e in b["evals"]], abs=1e-6)
        assert a["staleness"]["mean"] == 0 and a["servers"] == 2


def test_updates_to_target() -> None:
    r = {"evals": [{"updates": 0, "accuracy": 0.1}, {"updates": 50, "accuracy": 0.96}]}
    assert updates_to(r, 0.95) == 50 and updates_to(r, 0.99) is None


def test_task_model_and_shards() -> None:
    t = load_task("digits")
    assert t.x_train.shape[1] == 64 and t.classes == 10 and len(t.x_test) == 360
    m = mlp(t, (64,), 0)
    assert sum(p.numel() for p in m.parameters()) == 64 * 64 + 64 + 64 * 10 + 10
    flat = shard_indices([4, 2, 4], 3, "flat")
    assert [x.tolist() for x in flat] == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    whole = shard_indices([4, 2, 4], 2, "size-balanced")  # as the simulator deals them
    assert [x.tolist() for x in whole] == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9]]
    assert [x.tolist() for x in shard_indices([4, 2, 4], 2, "round-robin")] == \
        [[0, 1, 2, 3, 6, 7, 8, 9], [4, 5]]
    x0, _ = t.shard(0, 4)
    assert len(x0) == (len(t.x_train) + 3) // 4


def test_digits_on_resnet18_runs_for_real() -> None:
    """The graph workload the issue names (ResNet-18 on small inputs): the digits as
    3 x 32 x 32 images; two workers push to a server; every rank reports its CPU seconds."""
    t = load_task("digits-resnet18")
    assert tuple(t.x_train.shape[1:]) == (3, 32, 32) and t.classes == 10
    assert float(t.x_train[0, 0, :4, :4].std()) == 0  # a pixel is a 4 x 4 block
    m = build_model(t, (), 0)
    assert sum(p.numel() for p in m.parameters()) == 11_181_642
    m.train()
    t.evaluate(m)
    assert m.training  # evaluated in eval mode (batch norm), then back
    r = execute_sync(plan("asp"), "digits-resnet18", steps=4, eval_every=4, timeout_s=300)
    assert r["task"] == "digits-resnet18" and r["updates_per_s"] > 0
    assert len(r["cpu_s"]["workers"]) == 2 and len(r["cpu_s"]["servers"]) == 1
    assert all(x > 0 for x in r["cpu_s"]["workers"] + r["cpu_s"]["servers"])


@pytest.mark.parametrize("kw, field", [({"hidden": (64,)}, "hidden"),
                                       ({"dp": 4, "batch": 4}, "plan.global_batch_size"),
                                       ({"task": "mnist"}, "task")])
def test_what_the_resnet_task_refuses_before_launch(kw: dict, field: str) -> None:
    p = Plan(global_batch_size=kw.get("batch", 64), seq_len=1, dp=kw.get("dp", 2))
    with pytest.raises(SpecError) as err:
        execute_sync(p, kw.get("task", "digits-resnet18"), steps=2, hidden=kw.get("hidden"))
    assert err.value.field == field


def test_gossip_weights_are_doubly_stochastic() -> None:
    p = plan({"kind": "gossip", "graph": "edges", "edges": [[0, 1], [1, 2], [2, 3], [1, 3]]},
             dp=4)
    w = [gossip_weights(p, r) for r in range(4)]
    for r in range(4):
        assert sum(w[r].values()) < 1
        for j, x in w[r].items():
            assert w[j][r] == x  # symmetric


@pytest.mark.parametrize("sync,comp,match", [
    ("asp", "fp16", "compress BSP over all-reduce only"),
])
def test_what_the_real_runs_refuse(sync: object, comp: str, match: str) -> None:
    p = Plan(global_batch_size=64, seq_len=1, dp=2, sync=sync,  # type: ignore[arg-type]
             compression=comp)  # type: ignore[arg-type]
    assert match in runnable(p)[1]  # type: ignore[index]
    with pytest.raises(SpecError, match=match):
        execute_sync(p, "digits", steps=5)


def test_cli_needs_a_task_for_a_sync_plan(tmp_path, capsys) -> None:
    from sim.spec.plan import save_plan
    from trainsim.cli import main

    path = tmp_path / "p.json"
    save_plan(plan("asp"), path)
    assert main(["execute", "--plan", str(path)]) == 2
    assert "--task" in capsys.readouterr().err


def test_two_stage_runs_for_real_and_with_everything_important_is_bsp() -> None:
    runs = [(plan("bsp", dp=2), 0.4, 0),
            (plan({"kind": "two-stage", "important_fraction": 1.0}, dp=2), 0.4, 0),
            (plan({"kind": "two-stage", "important_fraction": 0.3}, dp=2), 0.4, 0),
            (plan({"kind": "two-stage", "important_layers": ["2"]}, dp=2), 0.4, 0)]
    bsp, whole, part, layer = execute_sync_batch(runs, "digits", steps=40, eval_every=40)
    assert [e["loss"] for e in whole["evals"]] == [e["loss"] for e in bsp["evals"]]
    for r in (part, layer):
        assert r["update_scope"] == "global"
        assert r["evals"][-1]["accuracy"] > r["evals"][0]["accuracy"] + 0.3
        assert r["evals"][-1]["loss"] != bsp["evals"][-1]["loss"]  # one stage late


def test_ad_psgd_averages_with_neighbours_without_waiting() -> None:
    p = plan({"kind": "gossip", "gossip_mode": "ad-psgd"}, dp=4)
    r = execute_sync(p, "digits", steps=60, lr=0.4, eval_every=60)
    assert r["update_scope"] == "local" and r["updates_per_s"] > 0
    assert r["swaps_served"] == 4 * 60  # every step's request answered by a neighbour
    assert r["evals"][-1]["accuracy"] > r["evals"][0]["accuracy"] + 0.3


def test_compare_puts_measured_beside_predicted(tmp_path, capsys) -> None:
    from sim.spec.plan import save_plan
    from trainsim.cli import main

    path = tmp_path / "p.json"
    save_plan(plan("asp", dp=2), path)
    assert main(["compare", "--plan", str(path), "--cluster", "cpu:3", "--task", "digits",
                 "--steps", "60", "--eval-every", "5", "--lr", "0.4", "--convergence",
                 "digits-cpu", "--json"]) == 0
    import json

    c = json.loads(capsys.readouterr().out)
    m, p = c["measured"], c["predicted"]
    assert m["servers"] == 1 and p["update_scope"] == "server"
    assert p["updates_per_s"] > 0 and c["errors"]["updates_per_s"] == pytest.approx(
        p["updates_per_s"] / m["updates_per_s"] - 1)
    assert 0.5 < p["staleness_mean"] < 2  # n - 1 = 1 for two alike workers
    assert c["profile"]["p2p_s"] > 0 and c["profile"]["service_s"] > 0
    prof = c["profile"]
    assert prof["host_cores"] >= 1 and all(  # what the host cap needs
        prof[k] > 0 for k in ("step_cpu_s", "allreduce_cpu_s", "push_cpu_s", "serve_cpu_s"))
    assert p["diverges"] or p["updates_to_target"] > 0
    assert main(["compare", "--plan", str(path), "--cluster", "dgx-h100:1", "--task",
                 "digits"]) == 2
    assert "give cpu:2" in capsys.readouterr().err


@pytest.mark.slow
def test_compare_on_resnet18_caps_asp_at_the_host(tmp_path, capsys) -> None:
    """ASP on ResNet-18 keeps the 2 cores busy: the prediction says it is host-bound (about
    a minute: 40 steps and 10 probe repetitions by default for this task)."""
    import json

    from sim.spec.plan import save_plan
    from trainsim.cli import main

    path = tmp_path / "p.json"
    save_plan(plan("asp", {"architecture": "ps", "servers": 1, "placement": "colocated"},
                   dp=4), path)
    assert main(["compare", "--plan", str(path), "--cluster", "cpu:5", "--task",
                 "digits-resnet18", "--timeout", "600", "--json"]) == 0
    c = json.loads(capsys.readouterr().out)
    assert c["measured"]["steps"] == 40 and c["profile"]["serve_cpu_s"] > 0
    if c["profile"]["host_cores"] <= 2:
        assert any(w.startswith("host-bound") for w in c["predicted"]["warnings"])


def test_the_cli_offers_the_tasks_the_executor_has() -> None:
    from executor.sync.task import CLI_TASKS
    from trainsim.commands.execute_sync import TASKS

    assert TASKS == CLI_TASKS
