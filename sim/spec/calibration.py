"""A calibration file: a few named factors of the hardware catalog, fitted to measured runs
(``trainsim calibrate``, :mod:`optimizer.calibrate`) and applied to a cluster's devices
(``--calibration FILE``).

```json
{"schema_version": 1, "device": "a100-sxm4-80gb",
 "factors": {"gemm_eff_max": 0.66, "attention_eff": 0.31, "layer_overhead_us": 40.0},
 "fitted_on": 3, "fit": [...]}
```

A calibration records the software stack (:mod:`sim.spec.stack`) its runs were on, and
applies to a cluster on the same stack only (its factors replace the stack's). A factor
replaces the catalog's value of that field for every device of that name in the
cluster (a cluster without such a device is an error: a calibration of one part does not
carry to another). The cluster's name then says which calibration it carries, so every
result names it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from sim.errors import SpecError
from sim.io import read_text
from sim.spec.cluster import ClusterSpec

__all__ = ["FACTORS", "BOUNDS", "ADDITIVE", "ANALYTIC_ONLY", "load_calibration",
           "apply_calibration", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1
# field -> (low, high): what a fit may move, and within what
BOUNDS = {"gemm_eff_max": (0.2, 1.0), "attention_eff": (0.05, 1.0), "hbm_eff": (0.3, 1.0),
          "comm_eff": (0.2, 1.0), "layer_overhead_us": (0.0, 5000.0),
          "nic_eff": (0.02, 1.0), "comm_overlap": (0.05, 1.0)}
FACTORS = tuple(BOUNDS)
ADDITIVE = ("layer_overhead_us",)  # fitted in linear units, may rest at 0
# factors the DES does not see: it runs collectives beside compute (comm_overlap > 0) or on
# the compute's cores (0), with no share in between
ANALYTIC_ONLY = ("comm_overlap",)


def _check(factors: Any, where: str) -> dict[str, float]:
    if not isinstance(factors, dict) or not factors:
        raise SpecError(f"{where}.factors", f"must be a table of one or more of "
                        f"{', '.join(FACTORS)}")
    out = {}
    for k, v in factors.items():
        if k not in BOUNDS:
            raise SpecError(f"{where}.factors.{k}", f"unknown factor (known: "
                            f"{', '.join(FACTORS)})")
        lo, hi = BOUNDS[k]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or not lo <= v <= hi:
            raise SpecError(f"{where}.factors.{k}", f"must be in [{lo}, {hi}], got {v!r}")
        out[k] = float(v)
    return out


def load_calibration(path: str | Path) -> dict[str, Any]:
    """A calibration file, checked: its schema, device and factors within their bounds."""
    p = Path(path)
    try:
        data = json.loads(read_text(p, "--calibration"))
    except json.JSONDecodeError as exc:
        raise SpecError(f"calibration[{p.name}]", f"not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        raise SpecError(f"calibration[{p.name}].schema_version", f"must be {SCHEMA_VERSION} "
                        "(a file written by trainsim calibrate)")
    if not isinstance(data.get("stack", ""), str):
        raise SpecError(f"calibration[{p.name}].stack", "must be a stack name")
    if not isinstance(data.get("device"), str):
        raise SpecError(f"calibration[{p.name}].device", "must name a catalog device")
    data["factors"] = _check(data.get("factors"), f"calibration[{p.name}]")
    data["path"] = str(p)
    return data


def apply_calibration(cluster: ClusterSpec, cal: dict[str, Any]) -> ClusterSpec:
    """The cluster with the calibration's factors on its devices of the calibrated name."""
    device, factors = cal["device"], _check(cal["factors"], "calibration")
    names = {cluster.gpu.name} | {g.gpu.name for g in cluster.node_groups}
    if device not in names:
        raise SpecError("--calibration", f"calibrates {device!r}, which cluster "
                        f"{cluster.name!r} does not have ({', '.join(sorted(names))})")
    stack = cal.get("stack", "")  # files written before stacks carry none
    if stack != cluster.stack and "stack" in cal:
        raise SpecError("--calibration", f"was fitted under stack {stack or 'none'!r}; the "
                        f"cluster runs {cluster.stack or 'none'!r} (set the same stack)")

    def moved(g: Any) -> Any:
        return dataclasses.replace(g, **factors) if g.name == device else g

    label = cal.get("path") or "inline"
    return dataclasses.replace(
        cluster, name=f"{cluster.name} (calibrated: {Path(label).name})",
        gpu=moved(cluster.gpu), node_groups=tuple(
            dataclasses.replace(n, gpu=moved(n.gpu)) for n in cluster.node_groups))
