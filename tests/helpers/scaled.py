"""Scaled inputs for what-if questions and invariant checks: a cost model whose every
duration is another's times a factor, and a cluster whose links are a factor slower.

``ScaledCost(cost, k)`` is a GPU ``1/k`` times as fast in everything it computes.
``scale_cluster(cluster, k)`` multiplies every latency by ``k`` and divides every bandwidth
by ``k``. Both together scale every duration of a simulation by ``k``, so the iteration
time must scale by exactly ``k`` (a property test checks both tiers).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sim.cost.costmodel import Cost, CostModel
from sim.spec.cluster import ClusterSpec

__all__ = ["ScaledCost", "scale_cluster"]


@dataclass
class ScaledCost:
    """``inner``'s seconds times ``factor``, for every operation and measured collective."""

    inner: CostModel
    factor: float

    def _both(self, c: Cost) -> Cost:
        return c[0] * self.factor, c[1] * self.factor

    def gemm(self, m: float, n: float, k: float, dtype: str,
             gathered: tuple[float, float] = (1.0, 1.0)) -> Cost:
        return self._both(self.inner.gemm(m, n, k, dtype, gathered))

    def attention(self, batch_heads: float, q_len: float, kv_len: float, head_dim: float,
                  dtype: str, flash: bool, dropout: bool) -> Cost:
        return self._both(self.inner.attention(batch_heads, q_len, kv_len, head_dim, dtype,
                                               flash, dropout))

    def elementwise(self, op: str, tokens: float, width: float, dtype: str) -> Cost:
        return self._both(self.inner.elementwise(op, tokens, width, dtype))

    def expert_bias(self, tokens: float, width: float, dtype: str, down: bool) -> Cost:
        return self._both(self.inner.expert_bias(tokens, width, dtype, down))

    def embedding(self, tokens: float, hidden: float, vocab: float, dtype: str) -> Cost:
        return self._both(self.inner.embedding(tokens, hidden, vocab, dtype))

    def optimizer(self, numel: float) -> float:
        return self.inner.optimizer(numel) * self.factor

    def collective(self, kind: str, group_size: int, inter_node: bool, size_bytes: float
                   ) -> float | None:
        t = self.inner.collective(kind, group_size, inter_node, size_bytes)
        return None if t is None else t * self.factor

    @property
    def extrapolated(self) -> set[str]:
        return self.inner.extrapolated

    def __getattr__(self, name: str) -> Any:
        """A profiled model's ``layer_factor`` (whole layer / sum of operations) is a ratio,
        the same at any speed; nothing else is passed through unscaled."""
        if name == "layer_factor":
            return getattr(self.inner, name)
        raise AttributeError(name)


def scale_cluster(cluster: ClusterSpec, k: float) -> ClusterSpec:
    """Every link ``k`` times slower: latencies times ``k``, bandwidths divided by ``k``."""
    intra, inter = cluster.intra_node, cluster.inter_node
    return dataclasses.replace(
        cluster, name=f"{cluster.name}[links x{k:g}]",
        intra_node=dataclasses.replace(intra, bandwidth_GBps=cluster.intra_GBps / k,
                                       latency_us=intra.latency_us * k),
        inter_node=dataclasses.replace(inter, nic_Gbps=inter.nic_Gbps / k,
                                       latency_us=inter.latency_us * k))
