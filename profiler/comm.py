"""``trainsim profile comm``: measure collectives under torchrun, fit alpha-beta, store both.

The command starts ``torchrun`` itself (one process per rank on this host, gloo on CPU,
NCCL on GPU), stops every rank on timeout, merges the measurements into ``comm.csv`` and
fits ``time = alpha + beta * bytes`` per (collective, backend, fabric, group size). A
transport changes behaviour with message size (gloo and NCCL switch protocols), so the
fit is piecewise: the fewest size ranges (at least two points each, at most
``MAX_SEGMENTS``) whose lines stay within ``TOLERANCE`` of every point, chosen exactly by
dynamic programming (else the split whose worst range is best).
Each line is a non-negative least-squares fit (``alpha >= 0``, ``beta >= 0``). A range is a
*poor fit* when its line still misses a point by more than ``POOR_FIT_ERROR`` (25%), or
when the last range has no bandwidth (it prices every larger size). A run whose measured
groups have a poor fit writes nothing unless ``--accept-poor-fit``; then the note is kept
in ``comm_fit.csv``'s ``quality`` column and printed as a warning.

It also measures each collective *in situ* at a few sizes (:mod:`profiler.comm_worker`):
issued after a compute burst, as in a training step, instead of back to back. The extra
cost (``overhead_s`` in ``comm_insitu.csv``) is what the simulator adds to each collective.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from profiler.db import device_dir, merged_table, read_table, update_meta, write_table
from profiler.device import device_name, environment
from sim.io import atomic_write_text

__all__ = ["ProfileRunError", "PoorFitError", "run_comm_profile", "refit", "insitu_sizes",
           "INSITU_SIZES", "fit_alpha_beta", "fit_segments", "fit_problem", "poor_fits",
           "default_sizes", "TOLERANCE", "MAX_SEGMENTS", "POOR_FIT_ERROR"]

TOLERANCE = 0.10  # a size range is split while its line misses a point by more
MAX_SEGMENTS = 4
POOR_FIT_ERROR = 0.25  # a range whose line misses a point by more is a poor fit


class ProfileRunError(RuntimeError):
    """A measurement run failed or timed out (the CLI reports it in one line, exit 1)."""


def default_sizes(low: int = 1 << 10, high: int = 1 << 30, step: int = 4) -> list[int]:
    """1 KiB, 4 KiB, ... 1 GiB."""
    out, s = [], low
    while s <= high:
        out.append(s)
        s *= step
    return out


INSITU_SIZES = (1 << 16, 1 << 20, 1 << 24)  # 64 KiB, 1 MiB, 16 MiB


def insitu_sizes(sizes: list[int]) -> list[int]:
    """The in-situ sizes inside the measured range (its ends if none are)."""
    inside = [s for s in INSITU_SIZES if min(sizes) <= s <= max(sizes)]
    return inside or sorted({min(sizes), max(sizes)})


def _objective(a: np.ndarray, alpha: float, beta: float) -> float:
    return float(np.sum((a @ np.array([alpha, beta]) - 1) ** 2))


def fit_alpha_beta(sizes: np.ndarray, times: np.ndarray) -> tuple[float, float, float]:
    """Least squares in relative error with ``alpha >= 0`` and ``beta >= 0`` (non-negative
    least squares, exact for two unknowns: the unconstrained optimum if it is feasible, else
    the better of the two one-parameter optima on the boundary). Returns (alpha_s,
    beta_s_per_byte, max relative error). A negative intercept would be a negative latency
    (the unconstrained line is wrong for small sizes), a negative slope a time that falls
    with size; neither is fitted. Times must be finite and positive (ValueError)."""
    if not (np.all(np.isfinite(times)) and np.all(times > 0)):
        raise ValueError(f"times must be finite and > 0, got {times.tolist()}")
    a = np.stack([1 / times, sizes / times], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(times), rcond=None)
    if alpha < 0 or beta < 0:
        x, y = a[:, 0], a[:, 1]
        candidates = [(0.0, float(np.sum(y) / np.sum(y * y))),
                      (float(np.sum(x) / np.sum(x * x)), 0.0)]
        alpha, beta = min(candidates, key=lambda c: _objective(a, *c))
    err = float(np.max(np.abs((alpha + beta * sizes) / times - 1)))
    return float(alpha), float(beta), err


def fit_problem(segment: dict[str, Any], last: bool) -> str:
    """Why a fitted size range should not be trusted, or "" (see :data:`POOR_FIT_ERROR`).
    The last range also prices every larger size, so it must have a bandwidth (beta > 0);
    a lower range may be flat (latency-bound: its bytes take no measurable time)."""
    alpha, beta = segment["alpha_s"], segment["beta_s_per_byte"]
    if not (math.isfinite(alpha) and alpha >= 0):
        return f"alpha {alpha * 1e6:.1f} us is not >= 0 (a negative latency)"
    if not (math.isfinite(beta) and beta >= 0) or (last and beta == 0):
        return "bandwidth is not finite and positive (time does not grow with size up to " \
               "the largest size measured)"
    if segment["max_rel_error"] > POOR_FIT_ERROR:
        return f"fit error {segment['max_rel_error']:.0%} > {POOR_FIT_ERROR:.0%}"
    return ""


def _best_cuts(err: dict[tuple[int, int], float], n: int, k: int
               ) -> tuple[float, list[tuple[int, int]]]:
    """The split of points 0..n into ``k`` ranges of >= 2 points whose worst error is
    least (dynamic programming over the range errors ``err``)."""
    best: dict[tuple[int, int], tuple[float, list[tuple[int, int]]]] = {
        (1, j): (err[0, j], [(0, j)]) for j in range(2, n + 1)}
    for m in range(2, k + 1):
        for j in range(2 * m, n + 1):
            best[m, j] = min(((max(best[m - 1, i][0], err[i, j]), [*best[m - 1, i][1], (i, j)])
                              for i in range(2 * m - 2, j - 1)), key=lambda c: c[0])
    return best[k, n]


def _ranges(s: np.ndarray, t: np.ndarray) -> list[tuple[int, int]]:
    """The fewest ranges whose every line is within TOLERANCE, else the MAX_SEGMENTS
    ranges with the least worst error."""
    n = len(s)
    err = {(i, j): fit_alpha_beta(s[i:j], t[i:j])[2]
           for i in range(n) for j in range(i + 2, n + 1)}
    options = [_best_cuts(err, n, k) for k in range(1, min(MAX_SEGMENTS, n // 2) + 1)]
    within = [o for o in options if o[0] <= TOLERANCE]
    return (within[0] if within else min(options, key=lambda o: o[0]))[1]


def fit_segments(sizes: list[int], times: list[float]) -> list[dict[str, Any]]:
    """Piecewise alpha-beta over sorted sizes (at least two): the fewest size ranges of
    at least two points whose lines are within TOLERANCE of every point (at most
    MAX_SEGMENTS; if none is, the split whose worst range is best). Each range carries
    ``quality``: "" or why it is a poor fit (:func:`fit_problem`)."""
    s, t = np.asarray(sizes, dtype=float), np.asarray(times, dtype=float)
    ranges = [(0, len(s))] if len(s) < 4 else _ranges(s, t)
    out: list[dict[str, Any]] = []
    for n, (i, j) in enumerate(ranges):
        alpha, beta, err = fit_alpha_beta(s[i:j], t[i:j])
        seg = {"min_size_bytes": int(s[i]), "max_size_bytes": int(s[j - 1]),
               "alpha_s": alpha, "beta_s_per_byte": beta, "points": j - i,
               "max_rel_error": err}
        out.append({**seg, "quality": fit_problem(seg, n == len(ranges) - 1)})
    return out


def _fits(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["collective"], r["backend"], r["fabric"], r["group_size"]),
                          []).append(r)
    out = []
    for (kind, backend, fabric, n), rs in sorted(groups.items()):
        rs.sort(key=lambda r: r["size_bytes"])
        for seg in fit_segments([r["size_bytes"] for r in rs], [r["time_median_s"] for r in rs]):
            out.append({"collective": kind, "backend": backend, "fabric": fabric,
                        "group_size": n, **seg})
    return out


def refit(folder: Path) -> list[dict[str, Any]]:
    """Re-derive ``comm_fit.csv`` from everything in ``comm.csv``."""
    fits = _fits(read_table(folder, "comm").to_dict("records"))
    write_table(folder, "comm_fit", fits)
    return fits


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(nproc: int, sizes: list[int], collectives: list[str], out: Path, timeout_s: float,
            rounds: int, insitu: list[int]) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           f"--master-port={_free_port()}", "-m", "profiler.comm_worker", "--out", str(out),
           "--sizes", ",".join(map(str, sizes)), "--collectives", ",".join(collectives),
           "--rounds", str(rounds), "--insitu-sizes", ",".join(map(str, insitu)),
           "--insitu-out", str(out.with_name("insitu.json"))]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise ProfileRunError(f"comm profile did not finish in {timeout_s:.0f} s; all ranks "
                              "were stopped") from None
    if code != 0:
        raise ProfileRunError(f"torchrun exited with code {code} (its output is above)")


class PoorFitError(ProfileRunError):
    """A measured group's alpha-beta fit is poor (:func:`fit_problem`); nothing was written.
    ``fits``: every fit that would have been stored, for the report."""

    def __init__(self, message: str, fits: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.fits = fits


def poor_fits(fits: list[dict[str, Any]], groups: set[tuple[str, str, str, int]]
              ) -> list[dict[str, Any]]:
    """The fits of ``groups`` flagged as poor."""
    return [f for f in fits if f["quality"] and _group(f) in groups]


def _refuse(bad: list[dict[str, Any]], fits: list[dict[str, Any]]) -> None:
    f = bad[0]
    raise PoorFitError(
        f"{f['collective']} x{f['group_size']} {f['min_size_bytes']}-{f['max_size_bytes']} B: "
        f"{f['quality']} ({len(bad)} poor size range(s) in all); nothing written: measure "
        "again with more --rounds on a quieter machine, or store it flagged with "
        "--accept-poor-fit", fits)


def _measure(nproc: int, sizes: list[int], collectives: list[str], timeout_s: float,
             rounds: int, insitu: bool) -> tuple[list[dict], list[dict]]:
    """(back-to-back rows, in-situ rows) of one torchrun run."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "comm.json"
        _launch(nproc, sizes, collectives, out, timeout_s, rounds,
                insitu_sizes(sizes) if insitu else [])
        rows = json.loads(out.read_text())
        extra = out.with_name("insitu.json")
        insitu_rows = json.loads(extra.read_text()) if insitu and extra.is_file() else []
    return rows, insitu_rows


def run_comm_profile(nproc: int, root: str | Path, sizes: list[int], collectives: list[str],
                     timeout_s: float = 1800.0, rounds: int = 9, insitu: bool = True,
                     accept_poor_fit: bool = False) -> tuple[Path, list[dict]]:
    """Measure, merge into the DB, fit; returns the device folder and the fit rows.
    ``insitu``: also measure each collective in situ (:data:`INSITU_SIZES`). A poor fit of
    a measured group (:func:`fit_problem`) raises :class:`PoorFitError` before anything is
    written, unless ``accept_poor_fit``: then it is stored with its ``quality`` note."""
    device = "cuda" if _cuda() else "cpu"
    name = device_name(device)
    folder = device_dir(root, name)
    rows, insitu_rows = _measure(nproc, sizes, collectives, timeout_s, rounds, insitu)
    comm = merged_table(folder, "comm", rows)
    fits = _fits(comm.to_dict("records"))
    bad = poor_fits(fits, {_group(r) for r in rows})
    if bad and not accept_poor_fit:
        _refuse(bad, fits)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "comm.csv", comm.to_csv(index=False))
    if insitu_rows:  # a new in-situ run replaces its groups' rows, whatever sizes they had
        measured = {_group(r) for r in insitu_rows}
        kept = [r for r in read_table(folder, "comm_insitu").to_dict("records")
                if _group(r) not in measured]
        write_table(folder, "comm_insitu", kept + insitu_rows)
    write_table(folder, "comm_fit", fits)
    update_meta(folder, name, environment(device, 1),
                {"kind": "comm", "nproc": nproc, "rows": len(rows),
                 "insitu_rows": len(insitu_rows), "poor_fits": len(bad)})
    return folder, fits


def _group(row: dict[str, Any]) -> tuple[str, str, str, int]:
    return (row["collective"], row["backend"], row["fabric"], int(row["group_size"]))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
