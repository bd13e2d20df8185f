"""Running a sweep: stream every finished point to a JSON-lines file, resume, finish.

``OUT/points.jsonl`` starts with a header line (the sweep's identity); then one line per
finished point, appended, flushed and fsynced as it completes, so a sweep killed at any
moment loses no finished point. Restarted with the same command it skips the points whose
keys are already there (a last line cut short by the kill is dropped). When every point is
in, ``results.json`` and ``results.csv`` (sorted by the points' values) and ``summary.json``
are written atomically: equal for an uninterrupted, a resumed and a Ray run.

Points run on the machine's cores (``multiprocessing``, fork), or on a Ray cluster
(``ray_address``: an address, or ``"local"`` to start one here).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from optimizer.sweep.grid import (
    SCHEMA_VERSION,
    SweepSpec,
    check_spec,
    evaluate_point,
    grid_points,
    point_key,
    sort_key,
)
from sim.errors import SpecError
from sim.io import atomic_write_files

__all__ = ["run_sweep", "SweepOutcome", "read_points", "POINTS_FILE"]

POINTS_FILE = "points.jsonl"


@dataclass(frozen=True)
class SweepOutcome:
    rows: list[dict[str, Any]]  # the grid's rows, sorted by the points' values
    resumed: int  # points found in the file
    computed: int  # points run now
    files: list[Path]


def run_sweep(spec: SweepSpec, out: Path, workers: int | None = None,
              ray_address: str | None = None, progress: bool = True) -> SweepOutcome:
    """Run (or resume) ``spec`` into folder ``out``."""
    check_spec(spec)
    if ray_address and ray_address != "local":
        _import_ray()
        _check_reachable(ray_address)  # before anything is written or shown
    points = grid_points(spec)
    path = out / POINTS_FILE
    done = _open_points(path, spec)
    todo = [p for p in points if point_key(p) not in done]
    resumed = len(points) - len(todo)
    backend = _ray_points if ray_address else _local_points
    with path.open("a", encoding="utf-8") as f, _bar(len(points), resumed, progress) as bar:
        for row in backend(spec, todo, workers, ray_address):
            _append(f, row)
            done[row["key"]] = row
            bar.update(1)
    rows = sorted((done[point_key(p)] for p in points),
                  key=lambda r: (sort_key(r["params"], [k for k, _ in spec.axes]), r["key"]))
    from optimizer.sweep.report import final_files

    files = final_files(spec, rows, out)
    atomic_write_files(files)
    return SweepOutcome(rows, resumed, len(todo), [path, *files])


def _bar(total: int, initial: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc="sweep", unit="point", disable=not enabled)


# The points file ----------------------------------------------------------------------------
def _header(spec: SweepSpec) -> dict[str, Any]:
    return {"trainsim_sweep": SCHEMA_VERSION, "sweep": spec.identity()}


def _open_points(path: Path, spec: SweepSpec) -> dict[str, dict[str, Any]]:
    """The finished points of an earlier run of this sweep (creating the file with its
    header if there is none); a partial last line is cut off."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.stat().st_size == 0:
        with path.open("w", encoding="utf-8") as f:
            _append(f, _header(spec))
        return {}
    header, rows, good_bytes = read_points(path)
    if header != _header(spec):
        raise SpecError("--out", f"{path} holds another sweep ({_difference(header, spec)}); "
                        "rerun that command, or choose another --out")
    if good_bytes < path.stat().st_size:
        with path.open("r+b") as f:
            f.truncate(good_bytes)
            os.fsync(f.fileno())
    return {r["key"]: r for r in rows}


def _difference(header: dict[str, Any] | None, spec: SweepSpec) -> str:
    old = (header or {}).get("sweep")
    if not isinstance(old, dict):
        return "no sweep header"
    new = spec.identity()
    diff = [k for k in new if old.get(k) != new.get(k)]
    return ", ".join(f"{k}: {old.get(k)!r} there, {new[k]!r} now" for k in diff) or "version"


def read_points(path: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]], int]:
    """(header, point rows, bytes of complete lines) of a points file."""
    data = path.read_bytes()
    header, rows, good = None, [], 0
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break  # cut short by a kill
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            break
        good += len(line)
        if header is None:
            header = obj
        else:
            rows.append(obj)
    return header, rows, good


def _append(f: IO[str], obj: dict[str, Any]) -> None:
    """One line, on disk before the next point is counted."""
    f.write(json.dumps(obj, separators=(",", ":")) + "\n")
    f.flush()
    os.fsync(f.fileno())


# Backends ------------------------------------------------------------------------------------
_SPEC: dict[str, SweepSpec] = {}


def _init_worker(spec: SweepSpec) -> None:
    """A worker leaves interrupts to the parent and dies quietly when the pool ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _SPEC["spec"] = spec


def _run_point(params: dict[str, Any]) -> dict[str, Any]:
    return evaluate_point(_SPEC["spec"], params)


def _local_points(spec: SweepSpec, todo: list[dict[str, Any]], workers: int | None,
                  _address: str | None) -> Iterator[dict[str, Any]]:
    """Rows as they finish, on ``workers`` processes (default: all cores)."""
    workers = min(workers or os.cpu_count() or 1, max(1, len(todo)))
    if workers <= 1:
        yield from (evaluate_point(spec, p) for p in todo)
        return
    with mp.get_context("fork").Pool(workers, _init_worker, (spec,)) as pool:
        yield from pool.imap_unordered(_run_point, todo, chunksize=1)


def _ray_points(spec: SweepSpec, todo: list[dict[str, Any]], workers: int | None,
                address: str | None) -> Iterator[dict[str, Any]]:
    """Rows as they finish on a Ray cluster; ``"local"`` starts one on this machine with
    ``workers`` CPUs (default: all)."""
    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        local = address == "local"
        # TRAINSIM_* variables reach the workers of a cluster started before this driver
        env = {k: v for k, v in os.environ.items() if k.startswith("TRAINSIM_")}
        ray.init(address=None if local else address, num_cpus=workers if local else None,
                 include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 runtime_env={"env_vars": env} if env else None)
    try:
        # a point whose worker dies (killed, out of memory) runs again elsewhere
        remote = ray.remote(num_cpus=1, max_retries=3)(_evaluate_remote)
        pending = [remote.remote(spec, p) for p in todo]
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            yield ray.get(ready[0])
    finally:
        if started:
            ray.shutdown()


def _check_reachable(address: str) -> None:
    """A ``HOST:PORT`` address must answer before Ray is asked (it retries for minutes)."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto" and other forms: Ray's own resolution
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as exc:
        raise SpecError("--ray", f"no Ray cluster answers at {address} ({exc.strerror or exc}):"
                        " start one with `ray start --head`, or use --ray local") from None


def _evaluate_remote(spec: SweepSpec, params: dict[str, Any]) -> dict[str, Any]:
    kill = os.environ.get("TRAINSIM_SWEEP_KILL_WORKER_ONCE")  # fault injection (tests)
    if kill and not os.path.exists(kill):
        with open(kill, "w") as f:
            f.write(f"{os.getpid()}\n")
        os._exit(1)  # this worker process dies mid-point
    return evaluate_point(spec, params)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise SpecError("--ray", "needs Ray: pip install 'trainsim[sweep-ray]'") from None
    return ray

