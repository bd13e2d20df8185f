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
