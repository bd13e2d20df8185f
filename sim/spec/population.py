"""A federated client population: how many clients, how fast each computes, its uplink and
downlink, how much data it holds, when it is online and how often it drops out.

Per-client quantities are distributions (drawn once per client from the job's seed) or come
from a trace CSV with one row per client. A distribution is a number (every client the
same) or a table ``{dist = "lognormal", median = M, sigma = S}``, ``{dist = "uniform", low =
A, high = B}``, ``{dist = "normal", mean = M, std = S}`` (draws clipped to the smallest
positive tenth of the mean) or ``{dist = "constant", value = V}``.

Compute speed follows FedScale's trace convention: ``ms_per_sample`` is the device's
inference latency for one sample of the model; training a sample costs ``train_factor``
inferences (3: forward plus a backward of twice its cost). Bandwidths are per client, in
Mb/s, each direction on its own. ``availability`` is the chance a client is online when the
server samples: one number, or 24 numbers by hour of the virtual day (the clock starts at
``start_hour``). ``dropout`` is the chance a participant leaves mid-round, before its upload.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import SpecError, field_name

__all__ = ["Dist", "Population", "ClientArrays", "population_from_dict", "TRACE_COLUMNS"]

DISTS = {"lognormal": ("median", "sigma"), "uniform": ("low", "high"),
         "normal": ("mean", "std"), "constant": ("value",)}
TRACE_COLUMNS = ("client", "ms_per_sample", "up_Mbps", "down_Mbps")  # required
TRACE_OPTIONAL = ("samples", "availability")
MAX_CLIENTS = 10_000_000


@dataclass(frozen=True)
class Dist:
    """A per-client quantity: ``kind`` and its parameters (validated on creation)."""

    kind: str
    params: tuple[float, ...]
    name: str = "value"  # the field, for errors

    def __post_init__(self) -> None:
        if self.kind not in DISTS:
            raise SpecError(f"{self.name}.dist", f"must be one of {', '.join(DISTS)}, "
                            f"got {self.kind!r}")
        for key, v in zip(DISTS[self.kind], self.params, strict=True):
            ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            need_pos = key in ("median", "value", "mean", "high")
            if not ok or v < 0 or (need_pos and v <= 0):
                rule = "a positive number" if need_pos else "a number >= 0"
                raise SpecError(f"{self.name}.{key}", f"must be {rule}, got {v!r}")
        if self.kind == "uniform" and not 0 < self.params[0] <= self.params[1]:
            raise SpecError(f"{self.name}.low", f"must be > 0 and <= high, got "
                            f"low={self.params[0]!r}, high={self.params[1]!r}")

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        with np.errstate(over="ignore", under="ignore"):  # callers check the range
            return self._draw(rng, n)

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = self.params
        if self.kind == "constant":
            return np.full(n, float(p[0]))
        if self.kind == "lognormal":
            return p[0] * np.exp(p[1] * rng.standard_normal(n))
        if self.kind == "uniform":
            return rng.uniform(p[0], p[1], n)
        return np.maximum(rng.normal(p[0], p[1], n), p[0] / 10.0)

    def to_dict(self) -> Any:
        return {"dist": self.kind, **dict(zip(DISTS[self.kind], self.params, strict=True))}

    @classmethod
    def parse(cls, name: str, raw: Any) -> Dist:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return cls("constant", (raw,), name)
        if not isinstance(raw, dict):
            raise SpecError(name, f"must be a positive number or a table {{dist = ...}}, "
                            f"got {raw!r}")
        kind = raw.get("dist")
        if not isinstance(kind, str) or kind not in DISTS:
            raise SpecError(f"{name}.dist", f"must be one of {', '.join(DISTS)}, got {kind!r}")
        keys = DISTS[kind]
        unknown = sorted(set(raw) - set(keys) - {"dist"})
        if unknown:
            raise SpecError(f"{name}.{field_name(unknown[0])}", f"unknown field for {kind} "
                            f"(known: {', '.join(keys)})")
        missing = [k for k in keys if k not in raw]
        if missing:
            raise SpecError(f"{name}.{missing[0]}", f"is required for dist = {kind!r}")
        return cls(kind, tuple(raw[k] for k in keys), name)


@dataclass(frozen=True)
class ClientArrays:
    """Every client's drawn (or traced) values, aligned by client index."""

    ids: np.ndarray
    ms_per_sample: np.ndarray
    up_Bps: np.ndarray
    down_Bps: np.ndarray
    samples: np.ndarray
    availability: np.ndarray | None  # per client (from a trace), else None


@dataclass(frozen=True)
class Population:
    clients: int = 1000  # clients in the population
    ms_per_sample: Dist = Dist("lognormal", (20.0, 0.6), "population.ms_per_sample")
    up_Mbps: Dist = Dist("lognormal", (10.0, 0.8), "population.up_Mbps")
    down_Mbps: Dist = Dist("lognormal", (40.0, 0.8), "population.down_Mbps")
    samples: Dist = Dist("lognormal", (200.0, 0.5), "population.samples")  # local samples
    availability: tuple[float, ...] = (1.0,)  # one number, or 24 by hour of the day
    dropout: float = 0.0  # chance a participant leaves before its upload
    latency_ms: float = 50.0  # one-way latency of a transfer between client and server
    trace: str | None = None  # CSV: one row per client (overrides the drawn columns)
    start_hour: float = 0.0  # hour of the virtual day at time 0
    _trace_rows: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        n = self.clients
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CLIENTS:
            raise SpecError("population.clients", f"must be an integer in 1..{MAX_CLIENTS:,},"
                            f" got {n!r}")
        a = self.availability
        if len(a) not in (1, 24) or any(not _prob(x) for x in a):
            raise SpecError("population.availability", "must be a probability in [0, 1] or "
                            f"24 of them (by hour of the day), got {list(a)!r}")
        if max(a) <= 0:
            raise SpecError("population.availability", "is 0 at every hour: no client is "
                            "ever online")
        if not _prob(self.dropout) or self.dropout >= 1:
            raise SpecError("population.dropout", f"must be a probability in [0, 1), got "
                            f"{self.dropout!r}")
        for name in ("latency_ms", "start_hour"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
                raise SpecError(f"population.{name}", f"must be a number >= 0, got {v!r}")

    def online_chance(self, t_s: np.ndarray | float) -> np.ndarray | float:
        """The chance a client is online at virtual time ``t_s`` (the hourly table's)."""
        if len(self.availability) == 1:
            return self.availability[0]
        hour = (np.floor(np.asarray(t_s) / 3600.0 + self.start_hour) % 24).astype(int)
        return np.asarray(self.availability)[hour]

    def arrays(self, seed: int) -> ClientArrays:
        """Every client's values: the trace's rows, or draws from ``seed``."""
        if self._trace_rows is not None:
            return self._trace_rows
        rng = np.random.default_rng([seed, 17])
        n = self.clients
        drawn = {k: getattr(self, k).draw(rng, n)
                 for k in ("ms_per_sample", "up_Mbps", "down_Mbps", "samples")}
        for key, v in drawn.items():  # a wide distribution can under- or overflow a double
            if not np.all(np.isfinite(v) & (v > 0)) or (key != "samples" and (
                    v.min() < 1e-9 or v.max() > 1e12)):
                raise SpecError(f"population.{key}", "draws fall outside 1e-9..1e12 (a "
                                "sigma or range too wide for any device): narrow it")
        return ClientArrays(np.arange(n), drawn["ms_per_sample"],
                            drawn["up_Mbps"] * 1e6 / 8, drawn["down_Mbps"] * 1e6 / 8,
                            np.maximum(np.rint(drawn["samples"]), 1.0), None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"clients": self.clients, "dropout": self.dropout,
                               "availability": list(self.availability),
                               "latency_ms": self.latency_ms, "start_hour": self.start_hour}
        if self.trace:
            return out | {"trace": self.trace}
        return out | {k: getattr(self, k).to_dict()
                      for k in ("ms_per_sample", "up_Mbps", "down_Mbps", "samples")}


def _prob(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x <= 1


_KEYS = {"clients", "ms_per_sample", "up_Mbps", "down_Mbps", "samples", "availability",
         "dropout", "latency_ms", "trace", "start_hour"}


def population_from_dict(raw: Any, base: Path | None = None) -> Population:
    if not isinstance(raw, dict):
        raise SpecError("population", "must be a TOML table")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise SpecError(f"population.{field_name(unknown[0])}",
                        f"unknown field (known: {', '.join(sorted(_KEYS))})")
    kw: dict[str, Any] = {k: raw[k] for k in ("dropout", "latency_ms", "start_hour")
                          if k in raw}
    for key in ("ms_per_sample", "up_Mbps", "down_Mbps", "samples"):
        if key in raw:
            kw[key] = Dist.parse(f"population.{key}", raw[key])
    if "availability" in raw:
        a = raw["availability"]
        kw["availability"] = tuple(a) if isinstance(a, list) else (a,)
    if "trace" in raw:
        if "clients" in raw:
            raise SpecError("population.clients", "a trace gives the clients (one row "
                            "each): leave clients unset")
        path = Path(str(raw["trace"]))
        if base is not None and not path.is_absolute():
            path = base / path
        rows = load_trace(path)
        return Population(len(rows.ids), trace=str(path), _trace_rows=rows, **kw)
    if "clients" in raw:
        kw["clients"] = raw["clients"]
    return Population(**kw)


def load_trace(path: Path) -> ClientArrays:
    """A client trace: columns ``client, ms_per_sample, up_Mbps, down_Mbps`` and optionally
    ``samples`` (default 1) and ``availability`` (a probability per client)."""
    import pandas as pd

    if not path.is_file():
        raise SpecError("population.trace", f"no such file: {path}")
    try:
        df = pd.read_csv(path)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SpecError("population.trace", f"{path.name} is not a readable CSV: "
                        f"{str(exc).splitlines()[0]}") from None
    missing = [c for c in TRACE_COLUMNS if c not in df.columns]
    if missing:
        raise SpecError("population.trace", f"{path.name} lacks column(s) "
                        f"{', '.join(missing)} (needs {', '.join(TRACE_COLUMNS)}; optional "
                        f"{', '.join(TRACE_OPTIONAL)})")
    if df.empty or len(df) > MAX_CLIENTS:
        raise SpecError("population.trace", f"{path.name} must have 1..{MAX_CLIENTS:,} rows, "
                        f"got {len(df):,}")
    cols = {}
    for c in TRACE_COLUMNS[1:] + tuple(c for c in TRACE_OPTIONAL if c in df.columns):
        v = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(v) | (v <= 0) if c != "availability" else ~((v >= 0) & (v <= 1))
        if bad.any():
            rule = "a probability in [0, 1]" if c == "availability" else "a positive number"
            i = int(np.argmax(bad))
            raise SpecError(f"population.trace.{c}", f"row {i + 2} of {path.name} must be "
                            f"{rule}, got {str(df[c].iloc[i])!r}")
        cols[c] = v
    if df["client"].duplicated().any():
        i = int(np.argmax(df["client"].duplicated().to_numpy()))
        raise SpecError("population.trace.client", f"row {i + 2} of {path.name} repeats "
                        f"client {str(df['client'].iloc[i])!r}: one row a client")
    return ClientArrays(df["client"].to_numpy(), cols["ms_per_sample"],
                        cols["up_Mbps"] * 1e6 / 8, cols["down_Mbps"] * 1e6 / 8,
                        np.rint(cols.get("samples", np.ones(len(df)))).clip(min=1),
                        cols.get("availability"))
