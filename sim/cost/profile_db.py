"""Reading a profile DB (written by ``trainsim profile``) without torch or pandas.

A DB is a folder with one sub-folder per device (``cpu-amd-epyc``, ``h200-sxm-141gb``),
each holding ``meta.json`` and CSV tables with units in their column names:

* ``compute.csv``: ``op, variant, dtype, grid, m, n, k, fwd_median_s, fwd_p10_s, fwd_p90_s,
  bwd_median_s, bwd_p10_s, bwd_p90_s, repeats, threads``. Shapes per op: ``gemm`` (m, n, k) is
  ``(m x k) @ (k x n)``; ``attention`` (batch*heads, seq, head_dim), causal; element-wise ops
  (tokens, width); ``embedding`` (tokens, hidden, vocab); ``optimizer`` (numel); ``layer``
  (tokens, hidden, tp) is a whole transformer layer on one TP rank, its structure in
  ``variant`` (:func:`sim.cost.compute.layer_variant`); ``tp-layer`` and ``tp-layer-sp``
  (tokens, hidden, tp) the same layer run over ``tp`` ranks with its TP collectives
  (without and with sequence parallelism), ``tp-head`` and ``tp-head-sp`` (tokens, hidden,
  vocab) the final norm, vocab-parallel output and loss so run, variant ``tp=T;norm=N``
  (:mod:`executor.layer_profile`); ``fsdp-units`` and ``fsdp-plain`` (parameters per unit,
  child units, dp) a root and its child units sharded by FSDP2 over ``dp`` ranks, and the
  same modules unwrapped (:mod:`executor.fsdp_profile`, :mod:`sim.cost.fsdp`).
* ``comm.csv``: one row per (collective, backend, fabric, group_size, size_bytes) with
  ``time_median_s`` and nccl-tests style ``algbw_GBps`` and ``busbw_GBps``.
* ``comm_fit.csv``: ``alpha_s, beta_s_per_byte`` per (collective, backend, fabric,
  group_size) and size range ``min_size_bytes``..``max_size_bytes`` (piecewise: transports
  change protocol with message size), fitted to ``comm.csv``.
* ``comm_insitu.csv`` (optional): per (collective, backend, fabric, group_size, size_bytes)
  the back-to-back time ``isolated_s``, the cost ``insitu_s`` of the same collective issued
  after a compute burst of ``burst_s`` as in a training step, and ``overhead_s``, their
  difference; the simulator adds its median over sizes to each such collective.
* Each compute row keeps the median of its timed samples and their 10th percentile
  (``p10``: with the 3-7 samples a row takes, the fastest one); the cost model reads one of
  them (``compute_stat``, default ``median``). On a shared machine the median carries
  whatever interference other work caused while the profile ran; the p10 leaves most of it
  out.
* ``comm_fit.csv`` may carry ``quality``: "" or why a range is a poor fit (written by
  ``trainsim profile comm --accept-poor-fit``; see :mod:`profiler.comm`).

A *calibrated profile* is a folder of its own, never inside the profile it calibrates:
``meta.json`` names the calibrated device folder under ``calibrates`` and
``calibration.json`` holds ``compute_scale`` (for ``median``) and ``compute_scale_p10``,
the factors ``trainsim compare --calibrate`` found between real runs and predictions made
with that statistic. Reading it reads the calibrated folder's tables and scales every
compute time read with that statistic by its factor; :attr:`ProfileDB.calibration` names
the file. A ``calibration.json`` inside a measured profile (written there by trainsim
before calibrations moved out) is ignored: a calibration applies only when its calibrated
profile is the one asked for. ``compare --calibrate`` writes calibrated profiles under
:func:`user_profiles_root` (``$TRAINSIM_HOME/profiles``, default ``~/.trainsim/profiles``).
"""

from __future__ import annotations

import csv
import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from sim.errors import SpecError
from sim.io import read_text
from sim.spec.cluster import COMPUTE_STATS

__all__ = ["ProfileDB", "load_profile_db", "COMPUTE_STATS", "calibration_key",
           "resolve_device_dir", "tables_dir", "profile_files", "user_home",
           "user_profiles_root", "shipped_profiles_root", "segment_time", "insitu_overhead",
           "COMPUTE_COLUMNS", "COMM_COLUMNS", "FIT_COLUMNS", "INSITU_COLUMNS", "SHAPE_DIMS",
           "WHOLE_OPS"]

COMPUTE_COLUMNS = ["op", "variant", "dtype", "grid", "m", "n", "k", "fwd_median_s",
                   "fwd_p10_s", "fwd_p90_s", "bwd_median_s", "bwd_p10_s", "bwd_p90_s",
                   "repeats", "threads"]
COMM_COLUMNS = ["collective", "backend", "fabric", "group_size", "size_bytes",
                "time_median_s", "time_p10_s", "time_p90_s", "algbw_GBps", "busbw_GBps",
                "repeats"]
FIT_COLUMNS = ["collective", "backend", "fabric", "group_size", "min_size_bytes",
               "max_size_bytes", "alpha_s", "beta_s_per_byte", "points", "max_rel_error",
               "quality"]
OPTIONAL_COLUMNS = {"quality"}  # absent from tables written before it was added
INSITU_COLUMNS = ["collective", "backend", "fabric", "group_size", "size_bytes", "isolated_s",
                  "insitu_s", "overhead_s", "burst_s", "repeats"]
# How many of (m, n, k) each op uses.
SHAPE_DIMS = {"gemm": 3, "attention": 3, "embedding": 3, "optimizer": 1, "layer": 3,
              "tp-layer": 3, "tp-layer-sp": 3, "tp-head": 3, "tp-head-sp": 3,
              "fsdp-units": 3, "fsdp-plain": 3}
# whole layers and heads: not building blocks (no roofline rate is fitted to them)
WHOLE_OPS = ("layer", "tp-layer", "tp-layer-sp", "tp-head", "tp-head-sp", "fsdp-units",
             "fsdp-plain")


def calibration_key(stat: str) -> str:
    """The ``calibration.json`` key of the compute scale for predictions made with ``stat``."""
    return "compute_scale" if stat == "median" else f"compute_scale_{stat}"


Key = tuple[str, str, str]  # op, variant, dtype
Point = tuple[float, ...]


@dataclass
class ProfileDB:
    """One device's measurements, indexed for lookup."""

    path: Path
    meta: dict
    compute: dict[Key, dict[str, dict[Point, tuple[float, float]]]] = field(
        default_factory=dict)  # key -> grid -> shape -> (fwd_s, bwd_s)
    comm_fit: dict[tuple[str, str, int], list[tuple[float, float, float]]] = field(
        default_factory=dict)  # (collective, fabric, group_size) -> [(min B, alpha, beta)]
    comm_overhead: dict[tuple[str, str, int], list[tuple[float, float]]] = field(
        default_factory=dict)  # (collective, fabric, group_size) -> [(size B, overhead s)]
    compute_scale: float = 1.0  # from calibration.json (``trainsim compare --calibrate``)
    calibration: Path | None = None  # the calibration.json applied, if any

    @property
    def device(self) -> str:
        return str(self.meta.get("device", self.path.name))


def resolve_device_dir(path: str | Path, device_hint: str) -> Path:
    """``path`` is a device folder (has meta.json) or a DB root holding ``device_hint``."""
    p = Path(path)
    if (p / "meta.json").is_file():
        return p
    if (p / device_hint / "meta.json").is_file():
        return p / device_hint
    found = sorted(d.name for d in p.iterdir() if (d / "meta.json").is_file()) \
        if p.is_dir() else []
    raise SpecError("profile", f"{path} is not a profile DB for {device_hint!r} "
                    f"(devices there: {', '.join(found) or 'none'})")


def user_home() -> Path:
    """Where trainsim keeps what a user's commands write: ``$TRAINSIM_HOME``, default
    ``~/.trainsim``."""
    return Path(os.environ.get("TRAINSIM_HOME") or Path.home() / ".trainsim")


def user_profiles_root() -> Path:
    """The user's profile root (calibrated profiles from ``compare --calibrate``)."""
    return user_home() / "profiles"


def shipped_profiles_root() -> Path:
    """The profiles installed with trainsim (package data: no command writes there)."""
    return Path(__file__).resolve().parents[1] / "data" / "profiles"


def _meta(folder: Path) -> dict:
    try:
        meta = json.loads(read_text(folder / "meta.json", "profile"))
    except json.JSONDecodeError as exc:
        raise SpecError("profile", f"{folder / 'meta.json'} is not valid JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise SpecError("profile", f"{folder / 'meta.json'} is not a JSON object")
    return meta


def tables_dir(folder: Path, meta: dict) -> Path:
    """The folder whose tables a device folder reads: itself, or for a calibrated profile
    the measured folder it calibrates (which must be a measured profile itself)."""
    base = meta.get("calibrates")
    if base is None:
        return folder
    path = Path(str(base))
    if not (path / "meta.json").is_file():
        raise SpecError("profile", f"{folder} calibrates {base}, which is not a profile DB")
    if "calibrates" in _meta(path):
        raise SpecError("profile", f"{folder} calibrates {base}, itself a calibrated profile")
    return path


def profile_files(folder: Path) -> list[Path]:
    """Every file a device folder's cost model depends on (a calibrated profile's and
    those of the folder it calibrates)."""
    folders = {folder, tables_dir(folder, _meta(folder))}
    return sorted(f for d in folders for f in d.glob("*") if f.is_file())


def _rows(path: Path, columns: list[str]) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    rows = list(csv.DictReader(read_text(path, "profile").splitlines()))
    if rows and set(columns) - set(rows[0]) - OPTIONAL_COLUMNS:
        missing = sorted(set(columns) - set(rows[0]) - OPTIONAL_COLUMNS)
        raise SpecError("profile", f"{path} lacks columns {', '.join(missing)}")
    return rows


def _shape(row: dict[str, str]) -> Point:
    dims = SHAPE_DIMS.get(row["op"], 2)
    return tuple(float(row[c]) for c in ("m", "n", "k")[:dims])


def load_profile_db(path: str | Path, device_hint: str, stat: str = "median") -> ProfileDB:
    """One device's tables; compute times are each row's ``stat`` (:data:`COMPUTE_STATS`)."""
    if stat not in COMPUTE_STATS:
        raise SpecError("compute_stat", f"must be one of {', '.join(COMPUTE_STATS)}, "
                        f"got {stat!r}")
    folder = resolve_device_dir(path, device_hint)
    meta = _meta(folder)
    tables = tables_dir(folder, meta)
    db = ProfileDB(folder, meta)
    for row in _rows(tables / "compute.csv", COMPUTE_COLUMNS):
        key = (row["op"], row["variant"], row["dtype"])
        grid = db.compute.setdefault(key, {}).setdefault(row["grid"], {})
        grid[_shape(row)] = (float(row[f"fwd_{stat}_s"]), float(row[f"bwd_{stat}_s"] or 0.0))
    for row in _rows(tables / "comm_fit.csv", FIT_COLUMNS):
        coll = (row["collective"], row["fabric"], int(row["group_size"]))
        db.comm_fit.setdefault(coll, []).append((float(row["min_size_bytes"]),
                                                float(row["alpha_s"]),
                                                float(row["beta_s_per_byte"])))
    for segments in db.comm_fit.values():
        segments.sort()
    for row in _rows(tables / "comm_insitu.csv", INSITU_COLUMNS):
        coll = (row["collective"], row["fabric"], int(row["group_size"]))
        db.comm_overhead.setdefault(coll, []).append((float(row["size_bytes"]),
                                                     float(row["overhead_s"])))
    for points in db.comm_overhead.values():
        points.sort()
    if tables != folder:  # a calibrated profile: its own calibration.json applies
        db.calibration = folder / "calibration.json"
        db.compute_scale = _compute_scale(db.calibration, calibration_key(stat))
    return db


def _compute_scale(path: Path, key: str) -> float:
    """The factor under ``key``; 1 without a file or without a calibration for ``key``."""
    if not path.exists():
        return 1.0
    try:
        data = json.loads(read_text(path, "profile"))
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        raise SpecError("profile", f"{path} is not a calibration file (a JSON object)")
    value = data.get(key, 1.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise SpecError("profile", f"{path}: {key} must be a number > 0, got {value!r}")
    return float(value)


def segment_time(segments: list[tuple[float, float, float]], size_bytes: float) -> float:
    """alpha + beta * size on the size range holding ``size_bytes`` (the first range below
    the smallest, the last above the largest)."""
    chosen = segments[0]
    for seg in segments:
        if seg[0] <= size_bytes:
            chosen = seg
    return chosen[1] + chosen[2] * size_bytes


def insitu_overhead(points: list[tuple[float, float]]) -> float:
    """Seconds a collective costs beyond its back-to-back time when issued amid compute:
    the median over the measured sizes (the cost is one of arriving apart and waking the
    communication thread, not of bytes, and single sizes are noisy), never below zero."""
    if not points:
        return 0.0
    return max(0.0, statistics.median(o for _, o in points))
