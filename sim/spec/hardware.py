"""The hardware catalog: peak rates, memory and efficiency of each device type.

The catalog is ``sim/data/hardware.csv`` in long form (device, field, value, source),
so every number carries the source it came from.
"""

from __future__ import annotations

import csv
import math
import platform
import re
from dataclasses import MISSING, dataclass, fields
from functools import cache
from importlib import resources
from typing import Any

from sim.errors import SpecError

__all__ = ["HardwareSpec", "DTYPES", "catalog", "get_hardware", "catalog_sources",
           "host_cpu_model", "cpu_device_name"]

DTYPES = ("bf16", "fp16", "fp8", "fp32")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator (or one CPU core for ``cpu``). Rates per device, per direction."""

    name: str  # catalog name
    bf16_tflops: float  # dense bf16 tensor-core peak, TFLOP/s
    fp16_tflops: float  # dense fp16 tensor-core peak, TFLOP/s
    fp8_tflops: float  # nan where unsupported
    tf32_tflops: float  # dense TF32 peak, TFLOP/s (what fp32 training's matmuls use)
    fp32_tflops: float  # fp32 (non-tensor-core) peak, TFLOP/s
    memory_gib: float  # device memory, GiB
    hbm_GBps: float  # memory bandwidth, GB/s
    nvlink_GBps: float  # NVLink bandwidth per device, per direction, GB/s (0 without NVLink)
    gemm_eff_max: float  # best fraction of peak a large GEMM reaches
    gemm_dim_half: float  # GEMM dimension at which that fraction halves (per dimension)
    hbm_eff: float  # achievable fraction of HBM bandwidth
    attention_eff: float  # fused (flash) attention fraction of peak
    comm_eff: float  # ring bus bandwidth / link bandwidth for large messages
    nvls_eff: float  # NVLS (in-switch) all-reduce bus bandwidth / link bandwidth; 0: none
    reserved_gib: float  # memory taken by runtime, communication buffers, fragmentation
    comm_overlap: float = 1.0  # 1: collectives run beside compute; 0: on the same cores (CPU)
    # fixed cost of one transformer layer's forward on top of its operations (kernel launch,
    # framework dispatch), µs; its backward twice that; 0 in the catalog: fitted by trainsim
    # calibrate (a profiled cost model measures it instead)
    layer_overhead_us: float = 0.0
    # achievable fraction of the NICs' line rate for large messages (nccl-tests inter-node
    # bus bandwidth is typically 90-95% of line rate); a calibration factor for stacks that
    # reach less (trainsim calibrate)
    nic_eff: float = 0.92
    # streaming multiprocessors (AMD: compute units); communication kernels that run beside
    # compute take some of them (plan.moe_comm_sms); 0: none (cpu)
    sm_count: float = 0.0
    # What a software stack adds around the kernels (sim/data/stacks.toml sets them; 0 / 1 in
    # the catalog keep every earlier result). A fixed cost of each training step on top of
    # the optimizer's (data loading, gradient norm and clipping, launch of the optimizer's
    # kernels, logging), ms:
    step_overhead_ms: float = 0.0
    # element-wise operations' time relative to one kernel each, as the roofline streams
    # them (1: eager; below 1: fused by a compiler, e.g. torch.compile)
    elementwise_scale: float = 1.0
    # bytes streamed per element to quantise a GEMM operand to fp8 under fp8 training: the
    # input and weight forward, the output gradient backward (delayed scaling 3: read 16
    # bits, write 8, the scale from the amax history; current scaling 5: an amax pass over
    # the 16-bit tensor first); 0: not counted
    fp8_cast_bytes: float = 0.0
    # elements streamed per element of a grouped expert GEMM's output to add biased experts'
    # biases (gpt-oss), forward and backward, for the up (and gate) projection and the down
    # projection. 2 / 1: an add of its own (read the output, write it; the bias gradient a
    # reduction reading the output gradient once: torch's grouped GEMMs take no bias);
    # 0: in the GEMM's epilogue. Stacks set what their code streams (sim/data/stacks.toml)
    expert_bias_up_fwd: float = 2.0
    expert_bias_up_bwd: float = 1.0
    expert_bias_down_fwd: float = 2.0
    expert_bias_down_bwd: float = 1.0
    # share of a GEMM's time that hides the tensor-parallel collective fused with it under
    # plan.tp_overlap (1: the ideal max(c, g); 0: none, the collective waits as without the
    # overlap); stacks set what their overlap reaches (sim/data/stacks.toml)
    tp_overlap_eff: float = 1.0
    stack: str = ""  # the software stack whose values these are (sim.spec.stack); "": none

    def peak_tflops(self, dtype: str) -> float:
        """Dense tensor-core peak for a training dtype (fp32 training uses TF32 matmuls)."""
        key = {"bf16": "bf16_tflops", "fp16": "fp16_tflops", "fp8": "fp8_tflops",
               "fp32": "tf32_tflops"}.get(dtype)
        if key is None:
            raise SpecError("plan.dtype", f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
        value = float(getattr(self, key))
        if math.isnan(value) or value <= 0:
            raise SpecError("plan.dtype", f"{dtype} is not supported by {self.name}")
        return value


def _rows() -> list[dict[str, str]]:
    text = resources.files("sim").joinpath("data/hardware.csv").read_text()
    return list(csv.DictReader(text.splitlines()))


@cache
def catalog() -> dict[str, HardwareSpec]:
    """All catalog devices by name."""
    by_device: dict[str, dict[str, float]] = {}
    for row in _rows():
        value = float(row["value"]) if row["value"] else math.nan
        by_device.setdefault(row["device"], {})[row["field"]] = value
    names = [f.name for f in fields(HardwareSpec) if f.name not in ("name", "stack")]
    defaults: dict[str, float] = {f.name: float(f.default) for f in fields(HardwareSpec)
                                  if f.default is not MISSING and f.name != "stack"}

    def spec(dev: str, vals: dict[str, float]) -> HardwareSpec:
        kw: dict[str, Any] = {n: vals[n] if n in vals else defaults[n] for n in names}
        return HardwareSpec(dev, **kw)

    return {dev: spec(dev, vals) for dev, vals in by_device.items()}


def catalog_sources(device: str) -> dict[str, str]:
    """Field -> source text for one device."""
    return {r["field"]: r["source"] for r in _rows() if r["device"] == device}


def get_hardware(name: str) -> HardwareSpec:
    """A catalog device by name, e.g. ``get_hardware("a100-sxm4-80gb").bf16_tflops == 312``."""
    cat = catalog()
    if name not in cat:
        raise SpecError("gpu", f"unknown device {name!r} (catalog: {', '.join(sorted(cat))})")
    return cat[name]


def host_cpu_model() -> str:
    """This host's CPU model name (``/proc/cpuinfo``, else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_device_name(model: str | None = None) -> str:
    """Profile-DB device name of a CPU: ``cpu-`` and a slug of its model name,
    e.g. ``cpu_device_name("AMD EPYC") == "cpu-amd-epyc"``."""
    slug = re.sub(r"[^a-z0-9]+", "-", (model or host_cpu_model()).lower()).strip("-")
    return f"cpu-{slug or 'unknown'}"
