"""Launch a real federated run (:mod:`executor.federated.run`) under torchrun and gather
what its server and client processes measured."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from executor.launch import launch
from executor.sync.task import TABLE_TASKS
from sim.errors import SpecError

__all__ = ["FLRun", "execute_fl", "execute_fl_batch"]


@dataclass
class FLRun:
    """A real run's settings. Rates in Mb/s (``inf``: not emulated); a client's rates by
    its id (every client ``client_up_Mbps[c % len]``)."""

    population: int = 8  # logical clients
    processes: int = 4  # client processes (plus one server)
    clients_per_round: int = 4
    overcommit: float = 1.0
    rounds: int = 20
    alpha: float = math.inf  # Dirichlet non-IID split (inf: IID)
    local_epochs: int = 1
    batch_size: int = 16
    lr: float = 0.1
    mu: float = 0.0  # FedProx's proximal weight (0: FedAvg)
    strategy: str = "fedavg"  # fedavg (fedprox with mu > 0) or fedbuff
    buffer: int = 4  # fedbuff: deltas a server step
    server_lr: float = 1.0  # fedbuff: the server's step on the mean delta
    deadline_s: float = 0.0
    server_ingress_Mbps: float = math.inf
    server_egress_Mbps: float = math.inf
    client_up_Mbps: list[float] = field(default_factory=lambda: [math.inf])
    client_down_Mbps: list[float] = field(default_factory=lambda: [math.inf])
    chunk_bytes: float = 16_384.0
    task: str = "digits"
    hidden: tuple[int, ...] = (64,)
    seed: int = 0
    eval_every: int = 1
    probe: bool = False
    schedule: list[list[int]] | None = None  # clients each round (else drawn by the server)

    @property
    def sampled(self) -> int:
        return min(self.population, math.ceil(self.clients_per_round * self.overcommit - 1e-9))

    def check(self) -> None:
        if self.strategy not in ("fedavg", "fedbuff"):
            raise SpecError("strategy", f"must be fedavg or fedbuff, got {self.strategy!r}")
        if self.strategy == "fedbuff" and self.buffer < 1:
            raise SpecError("buffer", f"must be >= 1, got {self.buffer}")
        if self.strategy == "fedbuff" and self.population <= self.processes:
            raise SpecError("population", "fedbuff samples a client no process is training: "
                            "needs more clients than processes")
        if self.task not in TABLE_TASKS:  # clients split labelled rows and train an MLP
            raise SpecError("task", f"must be one of {', '.join(TABLE_TASKS)}, got "
                            f"{self.task!r}")
        if not 1 <= self.processes <= 16 or self.population < self.processes:
            raise SpecError("processes", f"must be 1..16 and <= population "
                            f"({self.population}), got {self.processes}")
        if not 1 <= self.clients_per_round <= self.population:
            raise SpecError("clients_per_round", f"must be 1..population, got "
                            f"{self.clients_per_round}")
        if self.schedule is not None and len(self.schedule) < self.rounds:
            raise SpecError("schedule", f"one list of clients a round: {self.rounds} rounds, "
                            f"{len(self.schedule)} lists")
        for r, ids in enumerate(self.schedule or []):
            if len(set(ids)) != len(ids) or any(not 0 <= c < self.population for c in ids):
                raise SpecError("schedule", f"round {r}: distinct client ids in "
                                f"0..{self.population - 1}, got {ids!r}")
        from executor.federated.protocol import MAX_ASSIGN

        if math.ceil(self.population / self.processes) > MAX_ASSIGN:
            raise SpecError("population", f"at most {MAX_ASSIGN} clients a process "
                            f"({self.processes} processes), got {self.population}")


def _mbps(v: float) -> float:
    return v * 1e6 / 8 if math.isfinite(v) else math.inf


def _config(run: FLRun, timeout_s: float) -> dict[str, Any]:
    from executor.federated.protocol import paced

    run.check()
    up, down = run.client_up_Mbps, run.client_down_Mbps
    clients = [{"id": c, "up_Bps": _mbps(up[c % len(up)]),
                "down_Bps": _mbps(down[c % len(down)])} for c in range(run.population)]
    cfg: dict[str, Any] = {
        **asdict(run), "hidden": list(run.hidden), "sampled": run.sampled,
        "server": {"ingress_Bps": _mbps(run.server_ingress_Mbps),
                   "egress_Bps": _mbps(run.server_egress_Mbps)},
        "clients": clients, "device": "cpu", "threads": 1, "timeout_s": timeout_s}
    cfg["paced"] = paced(cfg)
    return cfg


def _gather(run: FLRun, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    server = next(r for r in ranks if r["role"] == "server")
    procs = [r for r in ranks if r["role"] == "client"]
    merged = {key: {int(c): v for r in procs for c, v in r[key].items()}
              for key in ("ms_per_sample", "samples", "labels")}
    return {"run": asdict(run), "rounds": server["rounds"], **merged}


def execute_fl(run: FLRun, timeout_s: float = 120.0, workdir: Path | None = None
               ) -> dict[str, Any]:
    """Run it; the server's rounds and each client's probe, samples and labels."""
    cfg = _config(run, timeout_s)
    ranks = launch("executor.federated.run", cfg, run.processes + 1, timeout_s, 1, workdir)
    return _gather(run, ranks)


def execute_fl_batch(runs: list[FLRun], timeout_s: float = 120.0,
                     workdir: Path | None = None) -> list[dict[str, Any]]:
    """Several runs on one torchrun start (the same number of client processes)."""
    if not runs:
        return []
    if len({r.processes for r in runs}) > 1:
        raise SpecError("runs", "a batch's runs need the same number of processes")
    cfgs = [_config(r, timeout_s) for r in runs]
    base = {**cfgs[0], "runs": cfgs}
    ranks = launch("executor.federated.run", base, runs[0].processes + 1, timeout_s, 1,
                   workdir)
    return [_gather(r, [rank["runs"][i] for rank in ranks]) for i, r in enumerate(runs)]
