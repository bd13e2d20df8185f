"""A federated training job: the client population, the server, and how training runs.

A TOML file with tables ``[population]`` (:mod:`sim.spec.population`), ``[server]`` and
``[training]``, or a preset name (``fl:mobile``, ``fl:mobile:CLIENTS``). Strategies:

- ``fedavg`` (McMahan et al. 2017): each round the server samples ``clients_per_round x
  overcommit`` online clients, sends them the model, each trains locally and uploads; the
  round ends when ``clients_per_round`` updates arrived (the rest are cut off) or at the
  deadline, then the server averages them;
- ``fedprox`` (Li et al. 2020): FedAvg's rounds with a proximal term ``mu`` in the local
  objective (its time is FedAvg's; its statistical efficiency differs);
- ``fedbuff`` (Nguyen et al. 2022): asynchronous; ``concurrency`` clients train at any time,
  the server applies an aggregate every ``buffer`` updates, and a new client starts as each
  one reports.

``network = "shared"`` lets uploads share the server's ingress (and downloads its egress)
max-min fairly, each capped by its client's own link; ``"scalar"`` is FedScale's
contention-free model, a client's transfer time its bytes over its own bandwidth.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.errors import SpecError, field_name
from sim.io import read_toml, table_fields
from sim.spec.population import Population, population_from_dict

__all__ = ["ServerSpec", "FLTraining", "FLJob", "load_fl", "fl_from_dict", "STRATEGIES",
           "fl_preset_names"]

STRATEGIES = ("fedavg", "fedprox", "fedbuff")
NETWORKS = ("shared", "scalar")
MAX_ROUNDS = 1_000_000


@dataclass(frozen=True)
class ServerSpec:
    ingress_Gbps: float = 10.0  # the server's link, clients to server, Gb/s
    egress_Gbps: float = 10.0  # server to clients, Gb/s
    aggregate_GBps: float = 5.0  # bytes of updates the server sums per second
    # secure aggregation (Bonawitz et al. CCS 2017): extra key rounds, bytes and unmasking
    secure_aggregation: bool = False
    key_bytes: int = 256  # SecAgg: one public key or secret share, bytes
    prg_GBps: float = 1.0  # SecAgg: bytes of mask the server expands per second

    def __post_init__(self) -> None:
        for name in ("ingress_Gbps", "egress_Gbps", "aggregate_GBps", "prg_GBps"):
            _positive(f"server.{name}", getattr(self, name))
        if not isinstance(self.secure_aggregation, bool):
            raise SpecError("server.secure_aggregation", "must be true or false, got "
                            f"{self.secure_aggregation!r}")
        _int("server.key_bytes", self.key_bytes, 1)


@dataclass(frozen=True)
class FLTraining:
    strategy: str = "fedavg"  # fedavg, fedprox or fedbuff
    rounds: int = 100  # rounds (fedbuff: server updates)
    clients_per_round: int = 100  # updates a round waits for (fedbuff: buffer default)
    overcommit: float = 1.3  # sample this many times clients_per_round
    deadline_s: float = 0.0  # a round ends by then at the latest (0: no deadline)
    min_clients: int = 1  # a round with fewer updates fails (the model is not updated)
    local_steps: int = 20  # local mini-batch steps (FedScale's); 0: use local_epochs
    local_epochs: float = 0.0  # passes over the client's samples instead of local_steps
    batch_size: int = 20  # local mini-batch, samples
    model_MB: float = 20.0  # bytes of the model sent down and of an update sent up, MB
    train_factor: float = 3.0  # training a sample costs this many inferences
    mu: float = 0.01  # fedprox's proximal weight
    buffer: int = 0  # fedbuff: updates per server step (0: clients_per_round)
    concurrency: int = 0  # fedbuff: clients training at once (0: clients_per_round x overcommit)
    network: str = "shared"  # shared (max-min at the server) or scalar (FedScale's)
    seed: int = 0  # draws of the population, sampling and dropouts
    # what-if for the statistical model: non-IID Dirichlet alpha of the clients' label split
    non_iid_alpha: float = math.inf

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise SpecError("training.strategy", f"must be one of {', '.join(STRATEGIES)}, "
                            f"got {self.strategy!r}")
        if self.network not in NETWORKS:
            raise SpecError("training.network", f"must be one of {', '.join(NETWORKS)}, got "
                            f"{self.network!r}")
        _int("training.rounds", self.rounds, 1, MAX_ROUNDS)
        _int("training.clients_per_round", self.clients_per_round, 1)
        _int("training.min_clients", self.min_clients, 1, self.clients_per_round)
        _int("training.local_steps", self.local_steps, 0)
        _int("training.batch_size", self.batch_size, 1)
        _int("training.buffer", self.buffer, 0)
        _int("training.concurrency", self.concurrency, 0)
        _int("training.seed", self.seed, 0)
        for name in ("model_MB", "train_factor"):
            _positive(f"training.{name}", getattr(self, name))
        for name in ("deadline_s", "local_epochs", "mu"):
            _nonneg(f"training.{name}", getattr(self, name))
        if not isinstance(self.overcommit, int | float) or isinstance(self.overcommit, bool) \
                or not 1 <= self.overcommit <= 100:
            raise SpecError("training.overcommit", f"must be a number in [1, 100], got "
                            f"{self.overcommit!r}")
        if (self.local_steps > 0) == (self.local_epochs > 0):
            raise SpecError("training.local_steps", "set exactly one of local_steps and "
                            "local_epochs above 0")
        a = self.non_iid_alpha
        if isinstance(a, bool) or not isinstance(a, int | float) or not a > 0:
            raise SpecError("training.non_iid_alpha", f"must be a positive number (inf: IID), "
                            f"got {a!r}")

    @property
    def sampled(self) -> int:
        """Clients sampled a round (``clients_per_round x overcommit``, rounded up)."""
        return math.ceil(self.clients_per_round * self.overcommit - 1e-9)

    @property
    def buffer_size(self) -> int:
        return self.buffer or self.clients_per_round

    @property
    def in_flight(self) -> int:
        return self.concurrency or self.sampled

    @property
    def model_bytes(self) -> float:
        return self.model_MB * 1e6


@dataclass(frozen=True)
class FLJob:
    name: str = "fl"
    population: Population = field(default_factory=Population)
    server: ServerSpec = field(default_factory=ServerSpec)
    training: FLTraining = field(default_factory=FLTraining)

    def __post_init__(self) -> None:
        t = self.training
        busy = t.in_flight if t.strategy == "fedbuff" else t.sampled
        if busy > self.population.clients:
            what = "concurrency" if t.strategy == "fedbuff" else "clients_per_round x overcommit"
            raise SpecError(f"training.{what.split()[0]}", f"{what} = {busy:,} exceeds the "
                            f"population's {self.population.clients:,} clients")
        if t.strategy == "fedbuff" and t.buffer_size > t.in_flight:
            what = "buffer" if t.buffer else f"buffer (unset: clients_per_round = {t.buffer_size})"
            raise SpecError("training.buffer", f"{what} must be <= concurrency "
                            f"({t.in_flight}): the server would wait for more updates than "
                            "clients train")
        if t.strategy == "fedbuff" and (t.deadline_s or self.server.secure_aggregation):
            field = "training.deadline_s" if t.deadline_s else "server.secure_aggregation"
            raise SpecError(field, "is modelled for fedavg and fedprox rounds only: FedBuff "
                            "has no rounds to cut or to mask")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "population": self.population.to_dict(),
                "server": dataclasses.asdict(self.server),
                "training": dataclasses.asdict(self.training)}


def _positive(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
        raise SpecError(name, f"must be a positive number, got {v!r}")


def _nonneg(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
        raise SpecError(name, f"must be a number >= 0, got {v!r}")


def _int(name: str, v: Any, low: int, high: int | None = None) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < low or (high and v > high):
        span = f"in {low}..{high:,}" if high else f">= {low}"
        raise SpecError(name, f"must be an integer {span}, got {v!r}")


def _table(raw: dict[str, Any], key: str, cls: type) -> Any:
    sub = table_fields(raw, key, cls)
    if key == "training" and sub.get("non_iid_alpha") == "inf":
        sub = sub | {"non_iid_alpha": math.inf}
    if key == "training" and "local_epochs" in sub and "local_steps" not in sub:
        sub = sub | {"local_steps": 0}  # local epochs instead of the default steps
    return cls(**sub)


def fl_from_dict(raw: dict[str, Any], name: str, base: Path | None = None,
                 training: dict[str, Any] | None = None) -> FLJob:
    """A job from its TOML tables; ``training``: fields that override the file's (checked
    together with it, so an override can make a file valid)."""
    unknown = sorted(set(raw) - {"name", "population", "server", "training"})
    if unknown:
        raise SpecError(field_name(unknown[0]), "unknown table (known: name, population, "
                        "server, training)")
    if training:
        if not isinstance(raw.get("training", {}), dict):
            raise SpecError("training", "must be a TOML table")
        raw = raw | {"training": {**raw.get("training", {}), **training}}
    return FLJob(str(raw.get("name", name)), population_from_dict(raw.get("population", {}),
                                                                  base),
                 _table(raw, "server", ServerSpec), _table(raw, "training", FLTraining))


def fl_preset_names() -> list[str]:
    return ["fl:mobile", "fl:mobile:CLIENTS"]


def load_fl(ref: str, training: dict[str, Any] | None = None) -> FLJob:
    """A job file (TOML) or the preset ``fl:mobile[:CLIENTS]`` (10,000 clients by default:
    phones with lognormal compute and bandwidths; their medians are illustrative
    assumptions, not measurements: bring a trace for real figures). ``training``: fields
    that override the job's ``[training]``."""
    if ref.startswith("fl:"):
        parts = ref.split(":")
        if parts[1] != "mobile" or len(parts) > 3:
            raise SpecError("job", f"unknown preset {ref!r} (presets: "
                            f"{', '.join(fl_preset_names())})")
        count = parts[2] if len(parts) == 3 else "10000"
        if not count.isdigit() or int(count) < 1:
            raise SpecError("job", f"preset {ref!r} needs a positive client count, e.g. "
                            "fl:mobile:10000")
        return fl_from_dict({"population": {"clients": int(count)}}, ref, None, training)
    path = Path(ref)
    if path.suffix != ".toml" and not path.is_file():
        raise SpecError("job", f"no such file or preset {ref!r} (presets: "
                        f"{', '.join(fl_preset_names())})")
    return fl_from_dict(read_toml(path, "job", f"job[{path.name}]"), path.stem, path.parent,
                        training)
