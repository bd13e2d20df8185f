"""Which device we are measuring: its profile-DB name and the software versions."""

from __future__ import annotations

import datetime
import platform
import re
from pathlib import Path
from typing import Any

import torch

from sim.spec.hardware import cpu_device_name, host_cpu_model

__all__ = ["device_name", "environment", "cuda_device_name"]

# Substrings of torch.cuda.get_device_name() -> catalog name.
_GPU_NAMES = (("H200", "h200-sxm-141gb"), ("H100", "h100-sxm5-80gb"),
              ("A100", "a100-sxm4-80gb"), ("B200", "b200"), ("MI300X", "mi300x"))


def cuda_device_name(raw: str) -> str:
    """Catalog name for a CUDA device name, e.g. ``"NVIDIA H200"`` -> ``h200-sxm-141gb``;
    an unknown device gets a slug of its own name."""
    for needle, name in _GPU_NAMES:
        if needle in raw.upper():
            return name
    return re.sub(r"[^a-z0-9]+", "-", raw.lower()).strip("-")


def device_name(device: str) -> str:
    if device == "cuda":
        return cuda_device_name(torch.cuda.get_device_name(0))
    return cpu_device_name()


def _driver_version() -> str | None:
    path = Path("/proc/driver/nvidia/version")
    if not path.is_file():
        return None
    match = re.search(r"Kernel Module\s+([\d.]+)", path.read_text())
    return match.group(1) if match else None


def environment(device: str, threads: int | None) -> dict[str, Any]:
    """What a measurement depends on, recorded beside it in meta.json."""
    env: dict[str, Any] = {
        "host": platform.node(), "cpu_model": host_cpu_model(), "python": platform.python_version(),
        "torch": torch.__version__, "threads": threads,
        "time_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    if device == "cuda":
        env.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version(), driver=_driver_version(),
                   nccl=".".join(map(str, torch.cuda.nccl.version())))
    return env
