"""The statistical-efficiency model: a power law and a divergence threshold fitted to
measured runs (sim/cost/convergence.py)."""

from __future__ import annotations

import math

import pytest

from sim.cost.convergence import (
    BUNDLED,
    Observation,
    fit_convergence,
    load_observations,
)
from sim.errors import SpecError
from sim.spec.plan import Plan


def _synthetic() -> list[Observation]:
    """Runs from log U = 5 - 0.5 log lr + 0.3 log(1 + k), diverging above lr (1 + k) = 2."""
    out = []
    for lr in (0.05, 0.1, 0.2, 0.4, 0.8):
        for k in (0.0, 1.0, 3.0):
            bad = lr * (1 + k) > 2
            u = math.exp(5 - 0.5 * math.log(lr) + 0.3 * math.log1p(k))
            out.append(Observation("asp", lr, k, 1, None if bad else u, bad))
    return out


def test_fit_recovers_the_power_law_and_the_threshold() -> None:
    m = fit_convergence(_synthetic(), "async")
    assert m.coef == pytest.approx((5.0, -0.5, 0.3), abs=1e-9)
    assert m.sigma == pytest.approx(0.0, abs=1e-9)
    # the widest-margin boundary between the runs that trained and those that diverged
    assert all(m.predict(o.lr, o.k).diverges == o.diverged for o in _synthetic())
    p = m.predict(0.3, 1.0)
    assert p.updates == pytest.approx(math.exp(5 - 0.5 * math.log(0.3) + 0.3 * math.log(2)))
    assert not p.diverges and not p.extrapolated
    assert m.predict(0.8, 3.0).diverges
    assert m.predict(5.0, 0.0).extrapolated  # outside the fitted learning rates


def test_the_boundary_follows_k_only_when_the_runs_do() -> None:
    """Divergence set by lr alone (any k) gives a flat boundary; set by lr (1 + k), a
    sloped one that still separates the runs."""
    flat = [Observation("asp", lr, k, 1, None if lr > 0.5 else 100.0, lr > 0.5)
            for lr in (0.1, 0.2, 0.4, 0.8, 1.6) for k in (0.0, 1.0, 3.0, 7.0)]
    m = fit_convergence(flat, "async")
    assert m.gamma == 0 and m.predict(0.7, 0.0).diverges and not m.predict(0.3, 7.0).diverges
    sloped = fit_convergence(_synthetic(), "async")
    assert sloped.gamma > 0.5


def test_gossip_and_backup_k() -> None:
    from sim.cost.convergence import k_of, mixing_k
    from sim.spec.sync import Sync

    assert mixing_k([(0, 1), (1, 2), (2, 3), (0, 3)], 4) == pytest.approx(0.5)  # ring
    assert mixing_k([(a, b) for a in range(4) for b in range(a + 1, 4)], 4) == 0  # exact
    assert mixing_k([(0, 1), (1, 2), (2, 3)], 4) > 4  # a path mixes slowest
    def plan(sync: object, compression: object = "none") -> Plan:
        return Plan(global_batch_size=128, seq_len=1, dp=4, sync=sync,  # type: ignore[arg-type]
                    compression=compression)  # type: ignore[arg-type]

    assert k_of(plan(Sync("backup-workers", backups=1))) == pytest.approx(1 / 3)
    assert k_of(plan(Sync("diloco", period=10))) == 9
    assert k_of(plan("bsp", "int8"), wire_ratio=4.0) == 3
    with pytest.raises(SpecError, match="wire_ratio"):
        k_of(plan("bsp", "fp16"))
    # the families measured since: SGP, AD-PSGD (its graph's k), two-stage (share delayed)
    assert k_of(plan(Sync("gossip", gossip_mode="sgp", graph="exponential"))) == 1
    assert k_of(plan(Sync("gossip", gossip_mode="ad-psgd", graph="ring"))) == \
        pytest.approx(0.5)
    assert k_of(plan(Sync("two-stage", important_fraction=0.3))) == pytest.approx(0.7)
    with pytest.raises(SpecError, match="important_layers"):
        k_of(plan(Sync("two-stage", important_layers=("fc1",))))


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 12, 16])
def test_sgp_k_is_the_steps_its_mixing_takes_to_shrink_disagreement_e_fold(n: int) -> None:
    """Against dense products of SGP's column-stochastic mixing matrices (circulant, so the
    disagreement's slowest mode is the second largest eigenvalue magnitude)."""
    import numpy as np

    from sim.cost.convergence import sgp_mixing_k

    h = max(1, math.ceil(math.log2(n)))
    eye = np.eye(n)
    prod, t = eye, 0
    while True:
        prod = (eye + np.roll(eye, 2 ** (t % h), axis=0)) / 2 @ prod
        if np.sort(np.abs(np.linalg.eigvals(prod)))[-2] <= math.exp(-1) + 1e-12:
            break
        t += 1
    assert sgp_mixing_k(n) == t
    if n & (n - 1) == 0 and n >= 4:
        assert sgp_mixing_k(n) == math.log2(n) - 1  # across the graph in log2 n steps


def test_bundled_digits_runs_load_and_fit() -> None:
    obs = load_observations(BUNDLED / "digits_cpu.csv")
    families = {o.family for o in obs}
    assert {"async", "local", "sgp", "ad-psgd", "two-stage"} <= families
    for family in families:
        m = fit_convergence(obs, family)
        spread = m.lr_range[0] < m.lr_range[1]  # else the lr slope is not identified: 0
        assert m.coef[1] < 0 if spread else m.coef[1] == 0  # larger lr, fewer updates
        diverged = any(o.diverged for o in obs if o.family == family)
        assert (0 < m.threshold < math.inf) if diverged else m.threshold == math.inf


def test_bad_observation_files_are_one_line_errors(tmp_path) -> None:
    bad = tmp_path / "runs.csv"
    bad.write_text("kind,lr,period\nssp,0.1,1\n")
    with pytest.raises(SpecError, match="missing column"):
        load_observations(bad)
    bad.write_text("kind,lr,staleness_mean,period,updates_to_95,diverged\nssp,-1,1,1,10,False\n")
    with pytest.raises(SpecError, match="lr: must be > 0"):
        load_observations(bad)
    bad.write_text("kind,gossip_mode,lr,staleness_mean,period,k,updates_to_95,diverged\n"
                   "gossip,push-pull,0.1,0,1,0.5,10,False\n")
    with pytest.raises(SpecError, match="gossip_mode: must be one of d-psgd"):
        load_observations(bad)
    with pytest.raises(SpecError, match="at least 3"):
        fit_convergence(_synthetic()[:2], "async")


def test_the_second_bundled_task_fits_and_times() -> None:
    from sim.spec.cluster import load_cluster
    from sim.spec.plan import Plan
    from sim.spec.zoo import load_any
    from sim.strategies import simulate_sync

    obs = load_observations(BUNDLED / "cancer_cpu.csv")
    assert {"async", "local", "diloco", "backup", "gossip", "compressed", "sgp", "ad-psgd",
            "two-stage"} <= {o.family for o in obs}
    p = Plan(global_batch_size=256, seq_len=4096, dp=4, tp=8, sync="asp",
             communication={"architecture": "ps"})
    r = simulate_sync(load_any("llama3-8b"), load_cluster("dgx-h100:4"), p, "analytic",
                      convergence="cancer-cpu", lr=0.2)
    t = r.time_to_target
    assert "breast cancer" in t["task"] and 0 < t["updates"] < 200 and not t["diverges"]
