"""Stragglers and failures as the user describes them: slow GPUs, nodes and links, and
links that fail mid-step. A :class:`Faults` is cluster-independent, parsed from the command
line or a scenario file; :mod:`sim.network.failures` resolves it for one cluster.

Draws are seeded (``numpy.random.default_rng(seed)``), one distribution after the other in
the order given: ``lognormal:SIGMA`` is ``exp(SIGMA z)`` with ``z`` standard normal (median
1, so some devices come out faster than nominal), ``uniform:LO:HI`` uniform in [LO, HI].

Links are named by their end vertices: ``gpu5``, ``sw3`` (node 3's NVSwitch), ``nic3.0``
(node 3's first NIC), ``pod0``, ``core``, ``rail0.1``, ``spine2``, ``rt4``; a link is
``A-B`` (both directions) and a vertex alone means every link touching it (a NIC).

>>> parse_straggler("node:3=1.2")
('node', '3', 1.2)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.errors import SpecError

__all__ = ["Faults", "Dist", "parse_straggler", "parse_dist", "parse_failure",
           "faults_from_options", "with_edits", "SCOPES", "DISTRIBUTIONS"]

SCOPES = ("gpu", "node", "link")
DISTRIBUTIONS = {"lognormal": 1, "uniform": 2}  # name -> number of parameters


@dataclass(frozen=True)
class Dist:
    """Slow-down factors drawn per ``scope`` member from ``kind`` with ``params``."""

    scope: str
    kind: str
    params: tuple[float, ...]

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "lognormal":
            return np.exp(self.params[0] * rng.standard_normal(n))
        return rng.uniform(self.params[0], self.params[1], n)

    def label(self) -> str:
        return f"{self.scope}:{self.kind}:" + ":".join(f"{p:g}" for p in self.params)


@dataclass(frozen=True)
class Faults:
    """Fixed factors (``(scope, name, factor)``), distributions, a seed, and link failures
    (``(link name, time_s)``)."""

    factors: tuple[tuple[str, str, float], ...] = ()
    dists: tuple[Dist, ...] = ()
    seed: int = 0
    failures: tuple[tuple[str, float], ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.factors or self.dists or self.failures)

    @property
    def touches_links(self) -> bool:
        return bool(self.failures) or any(s == "link" for s, _, _ in self.factors) \
            or any(d.scope == "link" for d in self.dists)

    def to_dict(self) -> dict[str, Any]:
        return {"stragglers": [f"{s}:{n}={f:g}" for s, n, f in self.factors],
                "distributions": [d.label() for d in self.dists], "seed": self.seed,
                "link_failures": [f"{n}@{t:g}" for n, t in self.failures]}


# Parsing ------------------------------------------------------------------------------------
def _number(option: str, text: str, rule: str = "a positive number") -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise SpecError(option, f"must be {rule}, got {text!r}")
    return value


def parse_straggler(text: str, option: str = "--straggler") -> tuple[str, str, float]:
    """``gpu:5=1.3``, ``node:3=1.2`` or ``link:nic3.0-pod0=2`` -> (scope, name, factor)."""
    target, sep, value = text.partition("=")
    scope, colon, name = target.strip().partition(":")
    if not sep or not colon or scope not in SCOPES or not name.strip():
        raise SpecError(option, f"must be SCOPE:NAME=FACTOR with SCOPE one of "
                        f"{', '.join(SCOPES)} (e.g. gpu:5=1.3), got {text!r}")
    name = name.strip()
    if scope != "link" and not (name.isascii() and name.isdigit()):
        raise SpecError(option, f"a {scope} is a non-negative integer index, got {name!r}")
    return scope, name, _number(option, value.strip(), "a slow-down factor > 0")


def parse_dist(text: str, option: str = "--straggler-dist") -> Dist:
    """``lognormal:0.1`` (per GPU), ``node:uniform:1:1.3``, ``link:lognormal:0.2``."""
    parts = [p.strip() for p in text.split(":")]
    scope = parts.pop(0) if parts and parts[0] in SCOPES else "gpu"
    kind = parts.pop(0) if parts else ""
    if kind not in DISTRIBUTIONS or len(parts) != DISTRIBUTIONS[kind]:
        raise SpecError(option, "must be [gpu:|node:|link:]lognormal:SIGMA or "
                        f"[gpu:|node:|link:]uniform:LO:HI, got {text!r}")
    params = tuple(_number(option, p) for p in parts)
    if kind == "uniform" and params[0] > params[1]:
        raise SpecError(option, f"uniform needs LO <= HI, got {text!r}")
    return Dist(scope, kind, params)


def parse_failure(text: str, option: str = "--fail-link") -> tuple[str, float]:
    """``nic3.0-pod0@0.5``: the link (or every link of a vertex) fails at 0.5 s."""
    name, sep, when = text.rpartition("@")
    if not sep or not name.strip():
        raise SpecError(option, f"must be LINK@SECONDS (e.g. nic3.0-pod0@0.5), got {text!r}")
    try:
        t = float(when)
    except ValueError:
        t = math.nan
    if not (math.isfinite(t) and t >= 0):
        raise SpecError(option, f"the time after '@' must be seconds >= 0, got {when!r}")
    return name.strip(), t


def faults_from_options(stragglers: Sequence[str] = (), dists: Sequence[str] = (),
                        seed: int = 0, failures: Sequence[str] = (),
                        option: str = "--straggler") -> Faults:
    """A :class:`Faults` from command-line (or sweep) strings."""
    _check_seed("--seed", seed)
    return Faults(tuple(parse_straggler(s, option) for s in stragglers),
                  tuple(parse_dist(d) for d in dists), seed,
                  tuple(parse_failure(f) for f in failures))


def _check_seed(option: str, seed: object) -> None:
    """numpy seeds are non-negative integers."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SpecError(option, f"must be an integer >= 0, got {seed!r}")


def with_edits(faults: Faults | None, edits: Sequence[tuple[str, Any]]) -> Faults | None:
    """``faults`` plus scenario edits ``faults.straggler``, ``faults.straggler_dist``,
    ``faults.fail_link`` (a string or a list: appended) and ``faults.seed`` (replaces)."""
    if not edits:
        return faults
    f = faults or Faults()
    for key, value in edits:
        name = key.removeprefix("faults.")
        if name == "seed":
            _check_seed(key, value)
            f = dataclasses.replace(f, seed=value)
            continue
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in items):
            raise SpecError(key, f"must be a string or a list of strings, got {value!r}")
        parse = {"straggler": parse_straggler, "straggler_dist": parse_dist,
                 "fail_link": parse_failure}[name]
        parsed = tuple(parse(v, key) for v in items)
        field = {"straggler": "factors", "straggler_dist": "dists", "fail_link": "failures"}
        f = dataclasses.replace(f, **{field[name]: getattr(f, field[name]) + parsed})
    return f
