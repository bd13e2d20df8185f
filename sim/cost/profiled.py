"""The profile-backed cost model: measured times, interpolated in log space.

For an operation and shape: an exact measurement if there is one; else multilinear
interpolation of ``log(time)`` over ``log(shape)`` between the surrounding points of one
profiled grid; else (outside every grid, or an operation the profile lacks) a
:class:`~sim.cost.costmodel.Roofline` whose rates are fitted to the profile's own measurements.
Every fallback is recorded in :attr:`Profiled.extrapolated`, which the Result reports.

Whole layers profiled beside their operations (op ``layer``) give a correction: the ratio
of the measured layer to the sum of its operations, interpolated over (tokens, hidden) at
the nearest profiled TP degree and held at the edge values outside them
(:meth:`Profiled.layer_factor`).
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Callable
from functools import cache
from pathlib import Path

from sim.cost.costmodel import Cost, CostModel, Roofline, op_bytes, op_flops, roofline_for
from sim.cost.fsdp import FsdpFit, fsdp_fit
from sim.cost.profile_db import (
    WHOLE_OPS,
    Key,
    Point,
    ProfileDB,
    insitu_overhead,
    load_profile_db,
    profile_files,
    resolve_device_dir,
    segment_time,
)
from sim.spec.cluster import ClusterSpec
from sim.spec.hardware import HardwareSpec, cpu_device_name
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.zero import regathers

__all__ = ["Profiled", "load_cost_model", "cost_model_for", "interpolate", "fit_roofline"]

Table = dict[Point, tuple[float, float]]


def _bracket(axis: list[float], v: float) -> list[tuple[float, float]] | None:
    """(value, weight) pairs around ``v`` on a sorted axis, weights linear in log space."""
    if v < axis[0] or v > axis[-1]:
        return None
    j = bisect.bisect_left(axis, v)
    if axis[j] == v:
        return [(v, 1.0)]
    lo, hi = axis[j - 1], axis[j]
    w = math.log(v / lo) / math.log(hi / lo)
    return [(lo, 1.0 - w), (hi, w)]


def _axes(table: Table) -> list[list[float]]:
    dims = len(next(iter(table)))
    return [sorted({p[i] for p in table}) for i in range(dims)]


def interpolate(table: Table, query: Point, axes: list[list[float]] | None = None
                ) -> tuple[float, float] | None:
    """Multilinear interpolation of log(time) on the grid ``table``; None outside it or when
    a corner of the surrounding cell was not measured."""
    axes = axes or _axes(table)
    brackets = [_bracket(ax, v) for ax, v in zip(axes, query, strict=True)]
    if any(b is None for b in brackets):
        return None
    out = [0.0, 0.0]
    for corner in itertools.product(*brackets):  # type: ignore[arg-type]
        point = tuple(c[0] for c in corner)
        if point not in table:
            return None
        weight = math.prod(c[1] for c in corner)
        for i, t in enumerate(table[point]):
            out[i] += weight * (math.log(t) if t > 0 else -math.inf)
    return math.exp(out[0]), (math.exp(out[1]) if out[1] > -math.inf else 0.0)


def _median_rate(pairs: list[tuple[float, float]], default: float) -> float:
    """Median of work / time over measured (work, seconds) pairs."""
    rates = [w / t for w, t in pairs if t > 0]
    return statistics.median(rates) if rates else default


def fit_roofline(db: ProfileDB, hw: HardwareSpec) -> Roofline:
    """Catalog roofline with its rates replaced by those the profile measured: GEMM
    FLOP/s (shape curve kept), fused-attention FLOP/s, and streaming bytes/s."""
    base = roofline_for(hw)
    gemm, attn, stream = dict(base.gemm_flops), dict(base.attention_flops), []
    for (op, _, dtype), grids in db.compute.items():
        points = [(s, t[0]) for g in grids.values() for s, t in g.items()]
        if op == "gemm":
            gemm[dtype] = _median_rate([(op_flops(*s) / base.gemm_efficiency(*s), t)
                                        for s, t in points], gemm.get(dtype, 0.0))
        elif op == "attention":
            attn[dtype] = _median_rate([(2.0 * s[0] * s[1] ** 2 * s[2], t) for s, t in points],
                                       attn.get(dtype, 0.0))
        elif op not in ("embedding", "optimizer", *WHOLE_OPS):
            stream += [(op_bytes(op, s[0], s[1], dtype), t) for s, t in points]
    mem = _median_rate([p for p in stream if p[0] >= 1e6], base.mem_Bps)
    return Roofline(gemm, base.gemm_dim_half, mem, attn,
                    expert_bias_streams=base.expert_bias_streams)


class Profiled:
    """A :class:`~sim.cost.costmodel.CostModel` reading one device's profile DB."""

    def __init__(self, db: ProfileDB, fallback: Roofline, grid: str | None = None) -> None:
        """``grid`` restricts lookups to one profiled grid (e.g. ``preset-cpu``)."""
        self.db, self.fallback = db, fallback
        self._extrapolated: set[str] = set()
        self._compute = {key: {g: t for g, t in grids.items() if grid in (None, g)}
                         for key, grids in db.compute.items()}
        self._axes = {(key, g): _axes(t) for key, grids in self._compute.items()
                      for g, t in grids.items()}
        self._layer_cache: dict[str, dict[int, tuple[Table, list[list[float]]]]] = {}
        self._tp_cache: dict[str, dict[tuple[int, tuple[object, ...]],
                                       tuple[Table, list[list[float]]]]] = {}
        self._fsdp_cache: dict[str, dict[int, FsdpFit]] = {}

    @property
    def extrapolated(self) -> set[str]:
        return self._extrapolated

    def layer_factor(self, m: ModelSpec, plan: Plan) -> Cost:
        """(forward, backward) ratio of measured whole layers to their operations' sum: of
        layers run over the plan's TP ranks (``tp-layer`` rows, :mod:`sim.cost.whole`) when
        the profile has them for this layer's structure, sequence length, TP degree and
        sequence parallelism (dense layers with standard attention), else of
        single-process layers at the nearest profiled TP degree."""
        if plan.tp > 1 and not (m.is_moe or m.is_mla):
            from sim.cost.compute import layer_variant

            hit = self._tp_hit("tp-layer", plan, (layer_variant(m, plan.seq_len),
                                                  float(m.hidden_size)))
            if hit is not None:
                return hit
        tables = self._layer_tables(plan.dtype)
        if not tables:
            return 1.0, 1.0
        tp = min(tables, key=lambda t: (abs(math.log(t / plan.tp)), t))
        table, axes = tables[tp]
        point = tuple(min(max(v, axis[0]), axis[-1]) for v, axis in
                      zip((float(plan.local_tokens), float(m.hidden_size)), axes, strict=True))
        hit = interpolate(table, point, axes)
        return hit if hit is not None else (1.0, 1.0)

    def _layer_tables(self, dtype: str) -> dict[int, tuple[Table, list[list[float]]]]:
        """Per TP degree: (tokens, hidden) -> ratio, from every profiled ``layer`` row."""
        if dtype in self._layer_cache:
            return self._layer_cache[dtype]
        from sim.cost.compute import ops_layer_time, variant_layer

        plain = Profiled(self.db, self.fallback)  # its own extrapolation log
        ratios: dict[int, Table] = {}
        for (op, variant, dt), grids in self._compute.items():
            if op != "layer" or dt != dtype:
                continue
            for table in grids.values():
                for (tokens, hidden, tp), (fwd, bwd) in table.items():
                    spec, seq = variant_layer(variant, int(hidden))
                    mb = max(1, int(tokens) // seq)
                    lt = ops_layer_time(plain, spec, Plan(global_batch_size=mb, seq_len=seq,
                                                          micro_batch_size=mb, tp=int(tp),
                                                          dtype=dtype))
                    k = self.db.compute_scale  # the op sums are scaled too
                    ratios.setdefault(int(tp), {})[(tokens, hidden)] = (
                        k * fwd / lt.forward, k * bwd / lt.backward)
        out = {tp: (table, _axes(table)) for tp, table in ratios.items()}
        self._layer_cache[dtype] = out
        return out

    def head_factor(self, m: ModelSpec, plan: Plan) -> float:
        """Ratio of measured TP output heads (``tp-head`` rows of this hidden size,
        vocabulary and norm) to their operations' sum, at the plan's TP degree and sequence
        parallelism; 1 without such rows."""
        if plan.tp == 1:
            return 1.0
        hit = self._tp_hit("tp-head", plan, (f"tp={plan.tp};norm={m.norm}",
                                             float(m.hidden_size), float(m.vocab_size)))
        return hit[0] if hit is not None else 1.0

    def fsdp_unit(self, plan: Plan, params: float) -> Cost:
        """FSDP2's host-side (forward, backward) seconds around one ZeRO-3 unit of
        ``params`` gathered parameters (``fsdp-units`` rows, :mod:`sim.cost.fsdp`); 0
        without rows for the plan's dtype and data-parallel degree."""
        fit = self._fsdp(plan)
        if fit is None:
            return 0.0, 0.0
        cost, held = fit.unit_s(params)
        if held:
            self._note("fsdp-units held at its measured sizes", (params,), plan.dtype)
        return cost

    def fsdp_root(self, plan: Plan) -> Cost:
        """The FSDP2 root's own (forward, backward) seconds per micro-batch, beyond its
        parameters' unit cost; 0 without rows."""
        fit = self._fsdp(plan)
        return fit.root if fit is not None else (0.0, 0.0)

    def _fsdp(self, plan: Plan) -> FsdpFit | None:
        """The fit for a ZeRO-3 plan that gathers its units again for the backward, as the
        rows were measured (FSDP2 resharding after the forward)."""
        if plan.zero_stage != 3 or plan.dp < 2 or not regathers(plan):
            return None
        if plan.dtype not in self._fsdp_cache:
            rows = {op: {shape: t for (o, variant, dt), grids in self._compute.items()
                         if o == op and dt == plan.dtype and variant.startswith("reshard=True")
                         for table in grids.values() for shape, t in table.items()}
                    for op in ("fsdp-units", "fsdp-plain")}
            self._fsdp_cache[plan.dtype] = fsdp_fit(Profiled(self.db, self.fallback),
                                                    plan.dtype, rows["fsdp-units"],
                                                    rows["fsdp-plain"], self.db.compute_scale)
        return self._fsdp_cache[plan.dtype].get(plan.dp)

    def _tp_hit(self, op: str, plan: Plan, what: tuple[object, ...]
                ) -> tuple[float, float] | None:
        """The correction of ``op`` rows of this structure ``what`` (variant and sizes) at
        the plan's TP degree, interpolated in its tokens (held at the edges of the measured
        range, noted); None without rows."""
        op += "-sp" if plan.sequence_parallel else ""
        entry = self._tp_tables(op, plan.dtype).get((plan.tp, what))
        if entry is None:
            return None
        table, axes = entry
        tokens = float(plan.local_tokens)
        if not axes[0][0] <= tokens <= axes[0][-1]:
            self._note(f"{op} held at its measured tokens", (tokens,), plan.dtype)
        return interpolate(table, (min(max(tokens, axes[0][0]), axes[0][-1]),), axes)

    def _tp_tables(self, op: str, dtype: str
                   ) -> dict[tuple[int, tuple[object, ...]], tuple[Table, list[list[float]]]]:
        """Per (TP degree, structure): tokens -> correction, from every usable ``op`` row."""
        key = f"{op}/{dtype}"
        if key in self._tp_cache:
            return self._tp_cache[key]
        plain = Profiled(self.db, self.fallback)
        ratios: dict[tuple[int, tuple[object, ...]], Table] = {}
        for (o, variant, dt), grids in self._compute.items():
            if o != op or dt != dtype:
                continue
            for table in grids.values():
                for shape, times in table.items():
                    hit = self._tp_row(plain, op, variant, dt, shape, times)
                    if hit is None:
                        self._note(f"{op} (its collectives, as the profile times them, take "
                                   "all of it, or no collective fit)", shape, dt)
                        continue
                    tp, what, ratio = hit
                    ratios.setdefault((tp, what), {})[(shape[0],)] = ratio
        out = {k: (t, _axes(t)) for k, t in ratios.items()}
        self._tp_cache[key] = out
        return out

    def _tp_row(self, plain: Profiled, op: str, variant: str, dt: str, shape: Point,
                times: tuple[float, float]
                ) -> tuple[int, tuple[object, ...], tuple[float, float]] | None:
        """(TP degree, structure, correction) of one ``tp-layer`` / ``tp-head`` row."""
        from sim.cost.compute import variant_layer
        from sim.cost.whole import head_spec, tp_head_ratio, tp_layer_ratio

        (tokens, hidden, third), k = shape, self.db.compute_scale
        t, h, sp = int(tokens), int(hidden), op.endswith("-sp")
        if op.startswith("tp-layer"):
            spec, seq = variant_layer(variant, h)
            r = tp_layer_ratio(plain, spec, seq, t, int(third), sp, dt, times, k)
            return None if r is None else (int(third), (variant, hidden), r)
        hr = tp_head_ratio(plain, variant, t, h, int(third), sp, dt, times, k)
        tp = head_spec(variant, h, int(third), t)[1]
        return None if hr is None else (tp, (variant, hidden, third), (hr, hr))

    def _lookup(self, key: Key, shape: Point) -> tuple[float, float] | None:
        grids = self._compute.get(key, {})
        for table in grids.values():
            if shape in table:
                return table[shape]
        for g in sorted(grids):
            hit = interpolate(grids[g], shape, self._axes[(key, g)])
            if hit is not None:
                return hit
        return None

    def _note(self, what: str, shape: Point, dtype: str) -> None:
        dims = "x".join(f"{v:g}" for v in shape)
        self._extrapolated.add(f"{what} {dims} {dtype}")

    def _measured(self, key: Key, shape: Point, fallback: Callable[[], Cost]) -> Cost:
        """The profiled (forward, backward) seconds, else the fitted roofline's, noted."""
        hit = self._lookup(key, shape)
        if hit is None:
            self._note(key[0], shape, key[2])
            hit = fallback()
        return hit[0] * self.db.compute_scale, hit[1] * self.db.compute_scale

    def gemm(self, m: float, n: float, k: float, dtype: str,
             gathered: tuple[float, float] = (1.0, 1.0)) -> Cost:
        return self._measured(("gemm", "", dtype), (m, n, k),
                              lambda: self.fallback.gemm(m, n, k, dtype, gathered))

    def attention(self, batch_heads: float, q_len: float, kv_len: float, head_dim: float,
                  dtype: str, flash: bool, dropout: bool) -> Cost:
        """Profiled causal SDPA at ``q_len``; a longer key range (context parallelism)
        scales it by ``kv_len / q_len``."""
        hit = self._lookup(("attention", "causal", dtype), (batch_heads, q_len, head_dim)) \
            if flash else None
        if hit is None:
            self._note("attention" if flash else "attention(standard)",
                       (batch_heads, q_len, head_dim), dtype)
            f, b = self.fallback.attention(batch_heads, q_len, kv_len, head_dim, dtype, flash,
                                           dropout)
            return f * self.db.compute_scale, b * self.db.compute_scale
        scale = self.db.compute_scale * kv_len / q_len
        return hit[0] * scale, hit[1] * scale

    def elementwise(self, op: str, tokens: float, width: float, dtype: str) -> Cost:
        return self._measured((op, "", dtype), (tokens, width),
                              lambda: self.fallback.elementwise(op, tokens, width, dtype))

    def expert_bias(self, tokens: float, width: float, dtype: str, down: bool) -> Cost:
        """Never profiled: the fitted roofline's streams, which are the device's (its
        stack's), noted."""
        self._note("expert_bias", (tokens, width), dtype)
        f, b = self.fallback.expert_bias(tokens, width, dtype, down)
        return f * self.db.compute_scale, b * self.db.compute_scale

    def embedding(self, tokens: float, hidden: float, vocab: float, dtype: str) -> Cost:
        return self._measured(("embedding", "", dtype), (tokens, hidden, vocab),
                              lambda: self.fallback.embedding(tokens, hidden, vocab, dtype))

    def optimizer(self, numel: float) -> float:
        return self._measured(("optimizer", "adam", "fp32"), (numel,),
                              lambda: (self.fallback.optimizer(numel), 0.0))[0]

    def collective(self, kind: str, group_size: int, inter_node: bool, size_bytes: float
                   ) -> float | None:
        if kind == "kv_ring":  # n - 1 neighbour sends of one rank's chunk
            hop = self.collective("send_recv", group_size, inter_node, size_bytes / group_size)
            return None if hop is None else (group_size - 1) * hop
        fabric = "inter" if inter_node else "intra"
        segments = self.db.comm_fit.get((kind, fabric, group_size))
        if segments is None:
            self._extrapolated.add(f"{kind} x{group_size} {fabric}: no profile fit, link model")
            return None
        overhead = insitu_overhead(self.db.comm_overhead.get((kind, fabric, group_size), []))
        return segment_time(segments, size_bytes) + overhead


@cache
def _load(folder: Path, stamp: tuple[float, ...], hw: HardwareSpec, stat: str
          ) -> tuple[ProfileDB, Roofline]:
    db = load_profile_db(folder, folder.name, stat)
    return db, fit_roofline(db, hw)


def load_cost_model(path: str | Path, hw: HardwareSpec, grid: str | None = None,
                    stat: str = "median") -> Profiled:
    """A fresh cost model (its own extrapolation log) over a cached DB, reading each compute
    row's ``stat`` (``median`` or ``p10``). In a DB root the device folder is the catalog
    name, or ``cpu-<model>`` of this host for ``cpu``."""
    hint = cpu_device_name() if hw.name == "cpu" else hw.name
    folder = resolve_device_dir(path, hint).resolve()
    stamp = tuple(f.stat().st_mtime for f in profile_files(folder))
    db, fallback = _load(folder, stamp, hw, stat)
    return Profiled(db, fallback, grid)


def cost_model_for(cluster: ClusterSpec) -> CostModel:
    """The cluster's profile DB when it names one, else the catalog roofline."""
    if cluster.profile:
        return load_cost_model(cluster.profile, cluster.gpu, stat=cluster.compute_stat)
    return roofline_for(cluster.gpu)
