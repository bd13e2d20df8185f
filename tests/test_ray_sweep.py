"""Sweeps on a real Ray cluster started on this machine (``ray start --head``; its workers
are separate processes): the local pool's results, a killed worker's point run again, a
killed driver resumed from what it wrote, an address with no cluster refused in one line.
The cluster is stopped afterwards."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import assert_bad_input, cli
from test_sweep import SPEC, kill_resume_and_compare

from optimizer.sweep.run import run_sweep

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="Ray is not installed (pip install 'trainsim[sweep-ray]')")
ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster():
    """A head node with 2 CPUs; every Ray process on the machine is stopped afterwards.
    Token authentication off: once any local ``ray.init()`` has written ~/.ray/auth_token,
    a head started without this asks drivers for the token (seen with Ray 2.60)."""
    port = _free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([RAY, "start", "--head", f"--port={port}", "--num-cpus=2",
                    "--include-dashboard=false", "--disable-usage-stats"], check=True,
                   capture_output=True, env=env, timeout=120)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)


def test_the_cluster_gives_the_local_pools_results(cluster, tmp_path):
    local = run_sweep(SPEC, tmp_path / "mp", workers=2, progress=False)
    on_ray = run_sweep(SPEC, tmp_path / "ray", workers=2, ray_address=cluster, progress=False)
    assert on_ray.rows == local.rows
    assert (tmp_path / "ray" / "results.csv").read_text() == \
        (tmp_path / "mp" / "results.csv").read_text()


def test_a_killed_workers_point_runs_again(cluster, tmp_path, monkeypatch):
    marker = tmp_path / "killed-once"
    monkeypatch.setenv("TRAINSIM_SWEEP_KILL_WORKER_ONCE", str(marker))
    out = run_sweep(SPEC, tmp_path / "ray", workers=2, ray_address=cluster, progress=False)
    assert marker.is_file()  # one worker process died in the middle of a point
    assert len(out.rows) == SPEC.size and all(r["status"] == "ok" for r in out.rows
                                              if r["params"]["tp"] != 3)
    assert out.rows == run_sweep(SPEC, tmp_path / "mp", workers=2, progress=False).rows


def test_a_killed_driver_resumes_with_nothing_lost_or_twice(cluster, tmp_path):
    kill_resume_and_compare(["--ray", cluster], tmp_path, 120)


def test_an_address_with_no_cluster_is_one_line(capsys, tmp_path):
    out = tmp_path / "sweep"
    code, stdout, err = cli(capsys, "sweep", "--model", "tiny", "--cluster", "cpu:2",
                            "--global-batch-size", "8", "--seq-len", "256", "--vary", "dp=1,2",
                            "--ray", f"127.0.0.1:{_free_port()}", "--out", str(out))
    assert_bad_input(code, stdout, err, "--ray", "no Ray cluster answers")
    assert not out.exists()
