"""trainsim simulator: model, hardware, cluster and plan specs, and ``simulate``.

>>> from sim import simulate, load_model, load_cluster, Plan
>>> plan = Plan(global_batch_size=8, seq_len=256, dp=2)
>>> simulate(load_model("tiny"), load_cluster("cpu:2"), plan).fits_in_memory
True
"""

from sim.api import FIDELITIES, simulate
from sim.errors import NoFeasiblePlan, SpecError
from sim.result import Result
from sim.spec.cluster import ClusterSpec, load_cluster
from sim.spec.hardware import HardwareSpec, get_hardware
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan, load_plan, save_plan, validate
from sim.spec.zoo import load_model

__all__ = ["simulate", "FIDELITIES", "ClusterSpec", "load_cluster", "SpecError",
           "NoFeasiblePlan", "HardwareSpec", "get_hardware", "ModelSpec", "load_model", "Plan",
           "load_plan", "save_plan", "validate", "Result"]
