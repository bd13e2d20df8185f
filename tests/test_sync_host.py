"""A measured profile of the workers in the multi-step DES (``simulate_sync(measured=...)``):
the measured local steps drawn per worker and step (sim/strategies/host.py), against rates
computed by hand from the same distribution."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sim.errors import SpecError
from sim.spec.cluster import load_cluster
from sim.spec.faults import Dist
from sim.spec.plan import Plan
from sim.spec.zoo import load_any
from sim.strategies import simulate_sync
from sim.strategies.host import Resampled, cpu_per_step, resampled

TINY = load_any("tiny")
CPU = load_cluster("cpu:4")
AR_S = 4e-3  # a measured all-reduce


def plan(sync: object = "bsp") -> Plan:
    return Plan(global_batch_size=8, seq_len=128, dp=4, sync=sync)  # type: ignore[arg-type]


def test_resampled_factors_have_mean_one_and_draw_only_measured_values() -> None:
    r = resampled([1e-3, 3e-3])
    assert r.factors == (0.5, 1.5)
    x = r.draw(np.random.default_rng(0), 1000)
    assert set(x.tolist()) == {0.5, 1.5}
    assert abs(x.mean() - 1.0) < 0.05
    assert np.array_equal(x, Resampled((0.5, 1.5)).draw(np.random.default_rng(0), 1000))


@pytest.mark.parametrize("bad", [[], [-1e-3, 1e-3], [0.0, 0.0], [float("nan")]])
def test_bad_measured_steps_are_one_line_errors(bad: list[float]) -> None:
    with pytest.raises(SpecError, match="measured.step_samples_s"):
        resampled(bad)


def test_equal_measured_steps_give_step_plus_allreduce_exactly() -> None:
    r = simulate_sync(TINY, CPU, plan(), "des", steps=50,
                      measured={"step_samples_s": [1e-3] * 7, "allreduce_s": AR_S})
    assert r.updates_per_s == pytest.approx(1 / (1e-3 + AR_S), rel=1e-9)


def test_bsp_waits_for_the_slowest_draw_of_its_workers() -> None:
    """Steps of 0.5 or 1.5 ms, equally likely, 4 workers: a BSP step's compute is 1.5 ms
    unless all four drew 0.5 ms (1/16): E = 1.5 - 1/16 = 1.4375 ms."""
    r = simulate_sync(TINY, CPU, plan(), "des", steps=3000,
                      measured={"step_samples_s": [0.5e-3, 1.5e-3], "allreduce_s": AR_S})
    assert r.updates_per_s == pytest.approx(1 / (1.4375e-3 + AR_S), rel=0.01)


def test_local_sgd_waits_for_the_slowest_sum_of_h_draws() -> None:
    """H = 4: a worker's period is 2 ms + k ms, k ~ Binomial(4, 1/2); the average waits for
    the largest k of four workers: E[max] = sum over m of (1 - F(m)^4)."""
    cdf = np.cumsum([1, 4, 6, 4, 1]) / 16
    e_max = float(sum(1 - cdf[m] ** 4 for m in range(4))) * 1e-3
    r = simulate_sync(TINY, CPU, plan({"kind": "local-sgd", "period": 4}), "des",
                      steps=4000,
                      measured={"step_samples_s": [0.5e-3, 1.5e-3], "allreduce_s": AR_S})
    assert r.updates_per_s == pytest.approx(4 / (2e-3 + e_max + AR_S), rel=0.01)


def test_step_s_overrides_the_samples_mean_and_jitter_conflicts() -> None:
    r = simulate_sync(TINY, CPU, plan(), "des", steps=50,
                      measured={"step_samples_s": [1e-3, 1e-3], "step_s": 2e-3,
                                "allreduce_s": AR_S})
    assert r.updates_per_s == pytest.approx(1 / (2e-3 + AR_S), rel=1e-9)
    with pytest.raises(SpecError, match="measured steps or a jitter"):
        simulate_sync(TINY, CPU, plan(), "des", steps=5, jitter=Dist("gpu", "lognormal",
                                                                        (0.2,)),
                      measured={"step_samples_s": [1e-3]})
    with pytest.raises(SpecError, match="measured.step_samples_s"):
        simulate_sync(TINY, CPU, plan(), "des", steps=5, measured={"step_samples_s": 1e-3})


# The host cap: the ranks' measured CPU seconds against the host's cores -------------------

CPU_S = {"step_cpu_s": 1e-3, "allreduce_cpu_s": 2e-3, "exchange_cpu_s": 3e-3,
         "push_cpu_s": 0.5e-3, "serve_cpu_s": 0.25e-3}
PS1 = {"architecture": "ps", "servers": 1, "placement": "colocated"}


@pytest.mark.parametrize("sync, comm, per_step", [
    ("bsp", None, 3e-3),
    ({"kind": "local-sgd", "period": 4}, None, 1.5e-3),
    ({"kind": "gossip", "graph": "ring"}, None, 4e-3),
    ("asp", PS1, 1.75e-3),
    ("bsp", PS1, 1.75e-3),
    ({"kind": "backup-workers", "backups": 1}, PS1, 1.75e-3),
    ("bsp", {**PS1, "partition_MB": 4}, None),  # BytePS-style partitions: not probed
    ({"kind": "diloco", "period": 4}, None, None),  # its outer step: not probed
    ("two-stage", None, None),  # no measured CPU cost for its stages
])
def test_cpu_per_step_adds_what_the_strategy_runs_each_step(sync, comm, per_step) -> None:
    p = Plan(global_batch_size=8, seq_len=128, dp=4, sync=sync,
             **({"communication": comm} if comm else {}))  # type: ignore[arg-type]
    got = cpu_per_step(p, CPU_S)
    assert got == (None if per_step is None else pytest.approx(per_step, rel=1e-12))
    assert cpu_per_step(p, {k: v for k, v in CPU_S.items() if k != "step_cpu_s"}) is None


def test_host_cap_scales_the_rates_to_the_cores_where_it_binds() -> None:
    """BSP on equal 1 ms steps and a 4 ms all-reduce: 200 updates, 800 worker steps a
    second. At 3 ms of CPU a worker step they need 2.4 cores: 4 cores leave the rate alone,
    2 cap it at 2 / 3e-3 = 666.7 worker steps a second."""
    measured = {"step_samples_s": [1e-3] * 3, "allreduce_s": AR_S,
                "step_cpu_s": 1e-3, "allreduce_cpu_s": 2e-3}
    free = simulate_sync(TINY, CPU, plan(), "des", steps=50, measured=measured)
    assert free.updates_per_s == pytest.approx(200, rel=1e-9)
    roomy = simulate_sync(TINY, CPU, plan(), "des", steps=50,
                          measured={**measured, "host_cores": 4})
    assert dataclasses.replace(roomy, simulation=free.simulation) == free
    capped = simulate_sync(TINY, CPU, plan(), "des", steps=50,
                           measured={**measured, "host_cores": 2})
    assert capped.samples_per_s == pytest.approx(2 * 2 / 3e-3, rel=1e-9)  # 2 samples a step
    assert capped.updates_per_s == pytest.approx(2 / 3e-3 / 4, rel=1e-9)
    assert capped.step_time_s == pytest.approx(1 / capped.updates_per_s, rel=1e-9)
    assert [w for w in capped.warnings if w.startswith("host-bound")]
    assert capped.staleness == free.staleness
    closed = simulate_sync(TINY, CPU, plan(), "analytic", steps=50,
                           measured={**measured, "host_cores": 2})
    assert closed.updates_per_s == pytest.approx(capped.updates_per_s, rel=1e-9)


@pytest.mark.parametrize("cores", [0, 0.5, float("inf"), "2", True])
def test_bad_host_cores_are_one_line_errors(cores) -> None:
    with pytest.raises(SpecError, match="measured.host_cores"):
        simulate_sync(TINY, CPU, plan(), "des", steps=5,
                      measured={"step_s": 1e-3, "host_cores": cores})


def test_a_strategy_the_profile_cannot_price_says_the_cap_was_not_applied() -> None:
    measured = {"step_samples_s": [1e-3] * 3, "allreduce_s": AR_S, "step_cpu_s": 9e-3,
                "allreduce_cpu_s": 2e-3, "host_cores": 1}
    r = simulate_sync(TINY, CPU, plan({"kind": "two-stage", "important_fraction": 0.5}),
                      "des", steps=50, measured=measured)
    assert any(w.startswith("host cap not applied") for w in r.warnings)
    assert not any(w.startswith("host-bound") for w in r.warnings)
