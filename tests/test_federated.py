"""Federated rounds on a virtual clock: the spec's rules, the round arithmetic, FedBuff's
buffer and staleness, and ``trainsim fl``."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from sim.errors import SpecError
from sim.federated import simulate_fl
from sim.spec.federated import FLJob, FLTraining, ServerSpec, fl_from_dict, load_fl
from sim.spec.population import Dist, Population, population_from_dict
from trainsim.cli import main


def _job(**training: object) -> FLJob:
    pop = Population(clients=200, latency_ms=0.0)
    return FLJob("t", pop, ServerSpec(), FLTraining(**{"rounds": 5, "clients_per_round": 10,
                                                       **training}))


def test_same_seed_same_result_and_a_new_seed_differs() -> None:
    a, b = simulate_fl(_job(seed=1)), simulate_fl(_job(seed=1))
    c = simulate_fl(_job(seed=2))
    assert a.round_times().tolist() == b.round_times().tolist()
    assert a.round_times().tolist() != c.round_times().tolist()


def test_uncontended_shared_link_equals_the_scalar_model() -> None:
    # 13 clients on a 10 Gb/s server: their own links (Mb/s) bind, never the server's
    shared = simulate_fl(_job(network="shared"))
    scalar = simulate_fl(_job(network="scalar"))
    assert shared.round_times() == pytest.approx(scalar.round_times(), rel=1e-9)


def test_a_slow_server_link_stretches_rounds() -> None:
    slow = dataclasses.replace(_job(), server=ServerSpec(ingress_Gbps=0.01, egress_Gbps=0.01))
    fast = simulate_fl(_job())
    assert np.all(simulate_fl(slow).round_times() > fast.round_times() * 2)


def test_round_waits_for_the_kth_update_of_the_overcommitted_sample() -> None:
    res = simulate_fl(_job(network="scalar", overcommit=2.0))
    for row, times in zip(res.rows, res.client_s, strict=True):
        assert row["sampled"] == 20 and row["updates"] == 10
        assert row["collect_s"] == times[-1] == max(times)


def test_a_deadline_cuts_the_round_and_a_round_below_min_clients_fails() -> None:
    res = simulate_fl(_job(network="scalar", deadline_s=1e-3, min_clients=2))
    assert all(r["failed"] and r["updates"] == 0 for r in res.rows)
    assert all(r["collect_s"] == pytest.approx(1e-3) for r in res.rows)


def test_dropouts_leave_fewer_updates() -> None:
    pop = Population(clients=200, dropout=0.5, latency_ms=0.0)
    job = FLJob("t", pop, ServerSpec(), FLTraining(rounds=20, clients_per_round=10,
                                                   overcommit=1.0))
    res = simulate_fl(job)
    assert 0 < np.mean([r["updates"] for r in res.rows]) < 10
    assert all(r["updates"] + r["dropped"] == 10 for r in res.rows)


def test_secure_aggregation_costs_time() -> None:
    plain = simulate_fl(_job())
    sec = dataclasses.replace(_job(), server=ServerSpec(secure_aggregation=True))
    assert np.all(simulate_fl(sec).round_times() > plain.round_times())


def test_no_client_online_waits_for_the_next_hour() -> None:
    hours = [0.0] * 12 + [1.0] * 12
    pop = Population(clients=50, availability=tuple(hours), latency_ms=0.0)
    res = simulate_fl(FLJob("t", pop, ServerSpec(), FLTraining(rounds=2,
                                                               clients_per_round=5)))
    first = res.rows[0]
    assert first["start_s"] == first["waited_s"] == 12 * 3600.0 and not first["failed"]
    assert res.rows[1]["waited_s"] == 0.0
    never = Population(clients=5, availability=tuple([0.0] * 23 + [1e-300]))
    with pytest.raises(SpecError, match="week"):
        simulate_fl(FLJob("t", never, ServerSpec(), FLTraining(rounds=1,
                                                               clients_per_round=1)))


def test_fedbuff_steps_every_buffer_and_counts_staleness() -> None:
    res = simulate_fl(_job(strategy="fedbuff", buffer=5, concurrency=20, rounds=30))
    assert len(res.rows) == 30 and all(r["updates"] == 5 for r in res.rows)
    assert res.rows[0]["staleness_mean"] == 0.0  # everyone started from version 0
    assert max(r["staleness_max"] for r in res.rows) >= 1
    ends = [r["end_s"] for r in res.rows]
    assert ends == sorted(ends)


@pytest.mark.parametrize(("raw", "field"), [
    ({"population": {"up_Mbps": -1}}, "population.up_Mbps.value"),
    ({"population": {"down_Mbps": {"dist": "lognormal", "median": -5, "sigma": 1}}},
     "population.down_Mbps.median"),
    ({"population": {"availability": 1.5}}, "population.availability"),
    ({"population": {"availability": [0.5] * 23}}, "population.availability"),
    ({"population": {"clients": 0}}, "population.clients"),
    ({"population": {"dropout": 1.0}}, "population.dropout"),
    ({"server": {"ingress_Gbps": 0}}, "server.ingress_Gbps"),
    ({"training": {"strategy": "fedsgd"}}, "training.strategy"),
    ({"training": {"overcommit": 0.5}}, "training.overcommit"),
    ({"training": {"local_steps": 5, "local_epochs": 1.0}}, "training.local_steps"),
    ({"training": {"clients_per_round": 2000}}, "training.clients_per_round"),
    ({"training": {"rounds": 10**9}}, "training.rounds"),
    ({"bogus": {}}, "bogus"),
])
def test_bad_jobs_name_the_field(raw: dict, field: str) -> None:
    with pytest.raises(SpecError) as err:
        fl_from_dict(raw, "x")
    assert err.value.field == field


def test_a_trace_with_missing_columns_or_bad_rows_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "t.csv"
    bad.write_text("client,ms_per_sample,up_Mbps\n0,10,5\n")
    with pytest.raises(SpecError, match="lacks column"):
        population_from_dict({"trace": str(bad)})
    bad.write_text("client,ms_per_sample,up_Mbps,down_Mbps\n0,10,5,-3\n")
    with pytest.raises(SpecError, match="row 2"):
        population_from_dict({"trace": str(bad)})


def test_a_trace_sets_every_client(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("client,ms_per_sample,up_Mbps,down_Mbps,samples\n"
                    "7,10,8,16,50\n9,20,4,8,100\n")
    pop = population_from_dict({"trace": "t.csv"}, tmp_path)
    a = pop.arrays(0)
    assert pop.clients == 2 and a.ids.tolist() == [7, 9]
    assert a.up_Bps.tolist() == [1e6, 5e5] and a.samples.tolist() == [50, 100]


def test_distributions_draw_their_shape() -> None:
    rng = np.random.default_rng(0)
    d = Dist("lognormal", (10.0, 0.5)).draw(rng, 20000)
    assert np.median(d) == pytest.approx(10.0, rel=0.03)
    assert Dist.parse("x", 3).draw(rng, 3).tolist() == [3.0] * 3
    u = Dist("uniform", (1.0, 2.0)).draw(rng, 1000)
    assert u.min() >= 1.0 and u.max() <= 2.0


def test_presets() -> None:
    assert load_fl("fl:mobile").population.clients == 10_000
    assert load_fl("fl:mobile:500").population.clients == 500
    for bad in ("fl:phone", "fl:mobile:0", "fl:mobile:x"):
        with pytest.raises(SpecError):
            load_fl(bad)


def test_cli_runs_writes_and_refuses_bad_input(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    assert main(["fl", "fl:mobile:300", "--rounds", "3", "--clients-per-round", "10",
                 "--compare-networks", "--out", str(out), "--no-progress"]) == 0
    assert "shared network" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} >= {
        "inputs.json", "rounds-fedavg-shared.csv", "rounds-fedavg-scalar.csv",
        "round_times.png", "participation.png"}
    job = tmp_path / "job.toml"
    job.write_text("[population]\nclients = 100\nup_Mbps = -2\n")
    assert main(["fl", str(job)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "population.up_Mbps" in err
    job.write_text("[[sites]]\n")
    assert main(["fl", str(job)]) == 2
    assert main(["fl", str(tmp_path / "missing.toml")]) == 2


def test_inf_alpha_means_iid() -> None:
    job = fl_from_dict({"training": {"non_iid_alpha": "inf"}}, "x")
    assert math.isinf(job.training.non_iid_alpha)
    assert fl_from_dict({"training": {"local_epochs": 1.0}}, "x").training.local_steps == 0


def test_the_bundled_model_fits_and_predicts_what_the_runs_say() -> None:
    from sim.federated.accuracy import fit_fl, load_fl_observations

    obs = load_fl_observations()
    model = fit_fl(obs)
    assert {0.8, 0.85, 0.9} <= set(model.targets)
    # IID, 8 local epochs, 10 clients a round: the runs took 7.5 rounds to 90% on average
    p = model.predict("fedavg", 0.9, 10, 8, math.inf)
    assert 5 <= p.rounds <= 11 and p.band[0] < p.rounds < p.band[1] and not p.notes
    # non-IID data needs more rounds than IID
    assert model.predict("fedavg", 0.9, 10, 3, 0.5).rounds > model.predict(
        "fedavg", 0.9, 10, 3, math.inf).rounds
    assert model.predict("fedavg", 0.9, 500, 3, 0.5).notes  # outside the runs: flagged
    # FedBuff: more clients training at once, staler deltas: more server steps
    assert model.predict("fedbuff", 0.9, 2, 3, 0.5, concurrency=4).rounds > model.predict(
        "fedbuff", 0.9, 2, 3, 0.5, concurrency=2).rounds
    with pytest.raises(SpecError, match="fedsgd"):
        model.predict("fedsgd", 0.9, 10, 3, 0.5)


def test_time_to_target_reads_the_simulated_clock() -> None:
    from sim.federated.accuracy import fit_fl, load_fl_observations, time_to_target

    model = fit_fl(load_fl_observations())
    job = dataclasses.replace(_job(rounds=5), training=dataclasses.replace(
        _job().training, rounds=5, local_steps=0, local_epochs=3.0, non_iid_alpha=0.5))
    res = simulate_fl(job)
    t = time_to_target(res, model, 0.9)
    assert t["rounds"] > 5 and any("beyond" in n for n in t["notes"])
    mean = float(np.mean(res.round_times()))
    assert t["time_s"] == pytest.approx(res.total_s + (t["rounds"] - 5) * mean)
    # rounds that got half their updates count for half a round each
    half = dataclasses.replace(job, population=Population(clients=200, dropout=0.5,
                                                          latency_ms=0.0))
    slow = time_to_target(simulate_fl(half), model, 0.9)
    assert any("counted in proportion" in n for n in slow["notes"])
    assert slow["time_s"] > t["time_s"]


def test_observations_need_their_columns(tmp_path: Path) -> None:
    from sim.federated.accuracy import load_fl_observations

    bad = tmp_path / "o.csv"
    bad.write_text("strategy,clients_per_round\nfedavg,5\n")
    with pytest.raises(SpecError, match="lacks"):
        load_fl_observations(bad)


def test_cli_target(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    args = ["fl", "fl:mobile:300", "--rounds", "3", "--clients-per-round", "10",
            "--no-progress", "--target"]
    assert main([*args, "0.9"]) == 0
    assert "to 0.9 test accuracy" in capsys.readouterr().out
    assert main([*args, "1.5"]) == 2
    assert main([*args, "0.42"]) == 2
    assert "targets" in capsys.readouterr().err


@pytest.mark.parametrize(("raw", "field"), [
    ({"population": {"up_Mbps": {"dist": ["x"]}}}, "population.up_Mbps.dist"),
    ({"population": {"up_Mbps": {"dist": {}}}}, "population.up_Mbps.dist"),
    ({"population": {"up_Mbps": {"dist": "lognormal", "median": 5, "sigma": 400}}},
     "population.up_Mbps"),
    ({"population": {"ms_per_sample": 1e306}}, "population.ms_per_sample"),
    ({"training": {"strategy": "fedbuff", "concurrency": 20, "buffer": 5,
                   "deadline_s": 30.0}}, "training.deadline_s"),
    ({"training": {"strategy": "fedbuff", "concurrency": 20, "buffer": 5},
      "server": {"secure_aggregation": True}}, "server.secure_aggregation"),
])
def test_more_bad_jobs_name_the_field(raw: dict, field: str) -> None:
    with pytest.raises(SpecError) as err:
        simulate_fl(fl_from_dict(raw, "x"))
    assert err.value.field == field


def test_traces_refuse_a_client_count_and_repeated_ids(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("client,ms_per_sample,up_Mbps,down_Mbps\n1,10,8,16\n1,20,4,8\n")
    with pytest.raises(SpecError, match="repeats client"):
        population_from_dict({"trace": str(path)})
    path.write_text("client,ms_per_sample,up_Mbps,down_Mbps\n1,10,8,16\n")
    with pytest.raises(SpecError, match="population.clients"):
        population_from_dict({"trace": str(path), "clients": 5})


def test_fedbuff_with_nobody_online_stops_with_an_error() -> None:
    pop = Population(clients=30, availability=tuple([0.0] * 23 + [1e-300]), latency_ms=0.0)
    job = FLJob("t", pop, ServerSpec(), FLTraining(strategy="fedbuff", rounds=3,
                                                   clients_per_round=5, concurrency=10))
    with pytest.raises(SpecError, match="week"):
        simulate_fl(job)


def test_the_day_may_start_mid_hour() -> None:
    hours = [1.0] * 24
    hours[20] = 0.0
    pop = Population(clients=50, availability=tuple(hours), latency_ms=0.0, start_hour=20.5)
    res = simulate_fl(FLJob("t", pop, ServerSpec(), FLTraining(rounds=1,
                                                               clients_per_round=5)))
    assert res.rows[0]["waited_s"] == pytest.approx(1800.0)


def test_an_override_can_make_a_job_valid(tmp_path: Path) -> None:
    assert load_fl("fl:mobile:100", {"clients_per_round": 10}).training.sampled == 13
    with pytest.raises(SpecError):
        load_fl("fl:mobile:100")


def test_bad_observation_files_are_one_line_errors(tmp_path: Path) -> None:
    from sim.federated.accuracy import load_fl_observations

    head = "strategy,clients_per_round,local_epochs,alpha,mu,rounds_to_90\n"
    for body, match in (("fedavg,2.5,1,0.5,0,10\n", "clients_per_round"),
                        ("fedavg,2,1,0,0,10\n", "alpha"),
                        ("fedavg,0,1,0.5,0,10\n", "clients_per_round"),
                        ("fedavg,2,1,0.5,0,ten\n", "rounds_to_90")):
        bad = tmp_path / "o.csv"
        bad.write_text(head + body)
        with pytest.raises(SpecError, match=match):
            load_fl_observations(bad)
    bad.write_text("strategy,clients_per_round,local_epochs,alpha,mu,rounds_to_abc\n")
    with pytest.raises(SpecError, match="rounds_to_<accuracy"):
        load_fl_observations(bad)
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SpecError):
        load_fl_observations(bad)


def test_fedbuff_rows_count_each_steps_own_clients() -> None:
    res = simulate_fl(_job(strategy="fedbuff", buffer=5, concurrency=20, rounds=30))
    assert sum(r["sampled"] for r in res.rows) >= 20 + 30 * 5 - 20
    assert all(r["sampled"] >= 0 for r in res.rows)
