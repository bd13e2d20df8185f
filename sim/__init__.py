"""trainsim simulator: model, hardware, cluster and plan specs, and ``simulate``.

>>> from sim import simulate, load_model, load_cluster, Plan
>>> plan = Plan(global_batch_size=8, seq_len=256, dp=2)
>>> simulate(load_model("tiny"), load_cluster("cpu:2"), plan).fits_in_memory
True
"""

from sim.api import FIDELITIES, simulate
from sim.cluster import ClusterSpec, load_cluster
from sim.errors import NoFeasiblePlan, SpecError
from sim.hardware import HardwareSpec, get_hardware
from sim.model import ModelSpec, load_model
from sim.plan import Plan, load_plan, save_plan, validate
from sim.result import Result

__all__ = ["simulate", "FIDELITIES", "ClusterSpec", "load_cluster", "SpecError",
           "NoFeasiblePlan", "HardwareSpec", "get_hardware", "ModelSpec", "load_model", "Plan",
           "load_plan", "save_plan", "validate", "Result"]
