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
    assert 1.6 < m.threshold < 3.2  # between the last stable and the first diverged index
    p = m.predict(0.3, 1.0)
    assert p.updates == pytest.approx(math.exp(5 - 0.5 * math.log(0.3) + 0.3 * math.log(2)))
    assert not p.diverges and not p.extrapolated
    assert m.predict(0.8, 3.0).diverges
    assert m.predict(5.0, 0.0).extrapolated  # outside the fitted learning rates


def test_bundled_digits_runs_load_and_fit() -> None:
    obs = load_observations(BUNDLED / "digits_cpu.csv")
    assert {o.family for o in obs} == {"async", "local"}
    for family in ("async", "local"):
        m = fit_convergence(obs, family)
        assert m.coef[1] < 0  # a larger learning rate needs fewer updates
        assert 0 < m.threshold < math.inf


def test_bad_observation_files_are_one_line_errors(tmp_path) -> None:
    bad = tmp_path / "runs.csv"
    bad.write_text("kind,lr,period\nssp,0.1,1\n")
    with pytest.raises(SpecError, match="missing column"):
        load_observations(bad)
    bad.write_text("kind,lr,staleness_mean,period,updates_to_95,diverged\nssp,-1,1,1,10,False\n")
    with pytest.raises(SpecError, match="lr: must be > 0"):
        load_observations(bad)
    with pytest.raises(SpecError, match="at least 3"):
        fit_convergence(_synthetic()[:2], "async")
