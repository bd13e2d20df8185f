"""``trainsim profile comm``: measure collectives under torchrun, fit alpha-beta, store both.

The command starts ``torchrun`` itself (one process per rank on this host, gloo on CPU,
NCCL on GPU), stops every rank on timeout, merges the measurements into ``comm.csv`` and
fits ``time = alpha + beta * bytes`` per (collective, backend, fabric, group size). A
transport changes behaviour with message size (gloo and NCCL switch protocols), so the
fit is piecewise: a size range is split where one line cannot stay within
``TOLERANCE`` of every point, into at most ``MAX_SEGMENTS`` ranges of at least two points.

It also measures each collective *in situ* at a few sizes (:mod:`profiler.comm_worker`):
issued after a compute burst, as in a training step, instead of back to back. The extra
cost (``overhead_s`` in ``comm_insitu.csv``) is what the simulator adds to each collective.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from profiler.db import device_dir, merge_rows, read_table, update_meta, write_table
from profiler.device import device_name, environment

__all__ = ["ProfileRunError", "run_comm_profile", "refit", "insitu_sizes", "INSITU_SIZES",
           "fit_alpha_beta", "fit_segments",
           "default_sizes", "TOLERANCE", "MAX_SEGMENTS"]

TOLERANCE = 0.10


class ProfileRunError(RuntimeError):
    """A measurement run failed or timed out (the CLI reports it in one line, exit 1)."""
MAX_SEGMENTS = 4


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


def fit_alpha_beta(sizes: np.ndarray, times: np.ndarray) -> tuple[float, float, float]:
    """Least squares in relative error; returns (alpha_s, beta_s_per_byte, max relative
    error). On a size range that does not start at zero the line only has to stay positive
    over the range (a negative alpha is a steeper line, not a negative latency); a negative
    beta is not allowed (time never falls with size), nor a non-positive time."""
    a = np.stack([1 / times, sizes / times], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(times), rcond=None)
    if beta < 0:
        alpha, beta = float(np.sum(1 / times) / np.sum(1 / times**2)), 0.0
    elif alpha + beta * sizes[0] <= 0:
        alpha, beta = 0.0, float(np.sum(sizes / times) / np.sum((sizes / times) ** 2))
    err = float(np.max(np.abs((alpha + beta * sizes) / times - 1)))
    return float(alpha), float(beta), err


def fit_segments(sizes: list[int], times: list[float]) -> list[dict[str, float]]:
    """Piecewise alpha-beta over sorted sizes: split the range with the worst error at the
    point that minimises the worse half, until every range is within TOLERANCE."""
    s, t = np.asarray(sizes, dtype=float), np.asarray(times, dtype=float)
    segments = [(0, len(s))]
    while len(segments) < MAX_SEGMENTS:
        errs = [fit_alpha_beta(s[i:j], t[i:j])[2] if j - i >= 4 else 0.0 for i, j in segments]
        worst = int(np.argmax(errs))  # the worst range that can still be split in two
        i, j = segments[worst]
        if errs[worst] <= TOLERANCE:
            break
        cut = min(range(i + 2, j - 1), key=lambda c: max(fit_alpha_beta(s[i:c], t[i:c])[2],
                                                           fit_alpha_beta(s[c:j], t[c:j])[2]))
        segments[worst:worst + 1] = [(i, cut), (cut, j)]
    out = []
    for i, j in segments:
        alpha, beta, err = fit_alpha_beta(s[i:j], t[i:j])
        out.append({"min_size_bytes": int(s[i]), "max_size_bytes": int(s[j - 1]),
                    "alpha_s": alpha, "beta_s_per_byte": beta, "points": j - i,
                    "max_rel_error": err})
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


def run_comm_profile(nproc: int, root: str | Path, sizes: list[int], collectives: list[str],
                     timeout_s: float = 1800.0, rounds: int = 9, insitu: bool = True
                     ) -> tuple[Path, list[dict]]:
    """Measure, merge into the DB, fit; returns the device folder and the fit rows.
    ``insitu``: also measure each collective in situ (:data:`INSITU_SIZES`)."""
    device = "cuda" if _cuda() else "cpu"
    name = device_name(device)
    folder = device_dir(root, name)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "comm.json"
        _launch(nproc, sizes, collectives, out, timeout_s, rounds,
                insitu_sizes(sizes) if insitu else [])
        rows = json.loads(out.read_text())
        extra = out.with_name("insitu.json")
        insitu_rows = json.loads(extra.read_text()) if insitu and extra.is_file() else []
    merge_rows(folder, "comm", rows)
    if insitu_rows:  # a new in-situ run replaces its groups' rows, whatever sizes they had
        measured = {_group(r) for r in insitu_rows}
        kept = [r for r in read_table(folder, "comm_insitu").to_dict("records")
                if _group(r) not in measured]
        write_table(folder, "comm_insitu", kept + insitu_rows)
    fits = refit(folder)
    update_meta(folder, name, environment(device, 1),
                {"kind": "comm", "nproc": nproc, "rows": len(rows),
                 "insitu_rows": len(insitu_rows)})
    return folder, fits


def _group(row: dict[str, Any]) -> tuple[str, str, str, int]:
    return (row["collective"], row["backend"], row["fabric"], int(row["group_size"]))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
