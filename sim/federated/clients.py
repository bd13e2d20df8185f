"""The drawn population of a federated job, and what every strategy asks of it: which clients
are online now, a sample of them, how long one trains, and the secure-aggregation extras."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.errors import SpecError
from sim.spec.federated import FLJob
from sim.spec.population import ClientArrays

__all__ = ["Fleet", "SecAggCost"]


@dataclass(frozen=True)
class SecAggCost:
    """Secure aggregation's extras for one round of ``n`` sampled clients (Bonawitz et al.
    CCS 2017, the four-round protocol): keys advertised and shared through the server (bytes
    on each client's link, three more server round trips) and the masks a client expands
    (its pairwise masks with ``n - 1`` peers and its self mask)."""

    up_bytes: float
    down_bytes: float
    round_trips: int
    client_mask_s: float

    @staticmethod
    def of(job: FLJob, n: int) -> SecAggCost:
        s = job.server
        if not s.secure_aggregation:
            return SecAggCost(0.0, 0.0, 0, 0.0)
        k = float(s.key_bytes)
        # AdvertiseKeys: 2 keys up, everyone's 2 keys down; ShareKeys: 2 shares per peer
        # up and down; Unmasking: one share per peer up
        up = 2 * k + 2 * (n - 1) * k + (n - 1) * k
        down = 2 * n * k + 2 * (n - 1) * k
        return SecAggCost(up, down, 3, n * job.training.model_bytes / (s.prg_GBps * 1e9))

    def server_unmask_s(self, job: FLJob, survivors: int, dropped: int) -> float:
        """The server regenerates each survivor's self mask and every dropped client's
        pairwise masks with the survivors."""
        if not job.server.secure_aggregation:
            return 0.0
        m = job.training.model_bytes
        return (survivors + dropped * survivors) * m / (job.server.prg_GBps * 1e9)


class Fleet:
    """The population's arrays and the job's random stream (one per simulation)."""

    def __init__(self, job: FLJob) -> None:
        self.job = job
        self.c: ClientArrays = job.population.arrays(job.training.seed)
        self.rng = np.random.default_rng([job.training.seed, 29])
        t = job.training
        if t.local_steps:  # FedScale's order of operations, for an exact match
            self.compute_s = t.train_factor * t.batch_size * t.local_steps \
                * self.c.ms_per_sample / 1000.0
        else:
            self.compute_s = t.train_factor * t.local_epochs * self.c.samples \
                * self.c.ms_per_sample / 1000.0
        self.latency_s = job.population.latency_ms / 1000.0
        if not np.all(np.isfinite(self.compute_s)):
            raise SpecError("population.ms_per_sample", "a client's local training time "
                            "overflows: draw or give smaller values")

    def online(self, t: float, busy: np.ndarray | None = None) -> np.ndarray:
        """Indices of the clients online at time ``t`` (drawn now), not ``busy``."""
        p = self.job.population.online_chance(t)
        n = len(self.c.ids)
        chance = p if self.c.availability is None else self.c.availability * p
        up = self.rng.random(n) < chance
        if busy is not None:
            up &= ~busy
        return np.flatnonzero(up)

    def sample(self, t: float, count: int, busy: np.ndarray | None = None) -> np.ndarray:
        """Up to ``count`` distinct online clients, uniformly among those online."""
        online = self.online(t, busy)
        if len(online) <= count:
            return self.rng.permutation(online)
        return self.rng.choice(online, size=count, replace=False)

    def next_hour(self, t: float) -> float:
        """The next hour boundary of the virtual day after ``t`` (when the hourly
        availability changes; the day starts at ``start_hour``, maybe mid-hour)."""
        start = self.job.population.start_hour
        return (math.floor(t / 3600.0 + start + 1e-12) + 1 - start) * 3600.0

    def drops(self, count: int) -> np.ndarray:
        """Which of ``count`` participants drop out before uploading."""
        p = self.job.population.dropout
        return self.rng.random(count) < p if p > 0 else np.zeros(count, dtype=bool)
