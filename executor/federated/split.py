"""Non-IID splits of a labelled dataset over federated clients.

``dirichlet_split`` follows Hsu et al. 2019 ("Measuring the effects of non-identical data
distribution"): for each class, the shares of its examples across clients are drawn from
``Dirichlet(alpha)``; small ``alpha`` gives each client few classes, ``alpha = inf`` an IID
split (a shuffle dealt out evenly). Every client keeps at least ``min_samples`` examples
(drawn again until it does, at most 100 times).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["dirichlet_split"]


def dirichlet_split(labels: np.ndarray, clients: int, alpha: float, seed: int,
                    min_samples: int = 2) -> list[np.ndarray]:
    """Indices of ``labels`` for each of ``clients`` clients."""
    if clients < 1 or clients * min_samples > len(labels):
        raise ValueError(f"cannot give {clients} clients {min_samples}+ of {len(labels)} "
                         "examples each")
    rng = np.random.default_rng([seed, 101])
    if math.isinf(alpha):
        return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)),
                                                         clients)]
    for _ in range(100):
        parts: list[list[int]] = [[] for _ in range(clients)]
        for cls in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == cls))
            shares = rng.dirichlet(np.full(clients, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for c, chunk in enumerate(np.split(idx, cuts)):
                parts[c] += chunk.tolist()
        if min(len(p) for p in parts) >= min_samples:
            return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    raise ValueError(f"alpha={alpha} left a client with fewer than {min_samples} examples "
                     "in 100 draws: use fewer clients or a larger alpha")
