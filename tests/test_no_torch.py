import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_sim_and_optimizer_never_import_torch_statically():
    pattern = re.compile(r"^\s*(import torch|from torch)", re.M)
    for pkg in ("sim", "optimizer"):
        for path in (ROOT / pkg).rglob("*.py"):
            assert not pattern.search(path.read_text()), path


def test_simulating_loads_no_torch():
    code = ("import sys, sim, sim.api, optimizer, trainsim.cli\n"
            "from trainsim.cli import main\n"
            "main(['models'])\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True)


def test_simulating_analytically_loads_no_des_simpy_or_networkx():
    """``import sim`` and an analytic ``simulate`` stay light: the DES, SimPy and networkx
    (the network graph) load only when a discrete-event simulation runs."""
    code = ("import sys\n"
            "from sim import Plan, load_cluster, load_model, simulate\n"
            "simulate(load_model('tiny'), load_cluster('cpu:2'), Plan(8, 256, dp=2))\n"
            "heavy = [m for m in ('sim.des.run', 'simpy', 'networkx') if m in sys.modules]\n"
            "assert heavy == [], heavy\n"
            "simulate(load_model('tiny'), load_cluster('cpu:2'), Plan(8, 256, dp=2), 'des')\n"
            "assert 'simpy' in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True)
