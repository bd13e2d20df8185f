"""Compute that synchronisation adds to a worker's step: compressing and decompressing the
gradient, error feedback, DiLoCo's outer optimizer step and the averaging of gossip.

Element-wise work is memory-bound: ``passes`` reads or writes of the gradient at the
device's achievable memory bandwidth (``hbm_GBps * hbm_eff``). The passes per scheme are a
count of the tensors each touches, stated here so a user can check them: fp16 cast 1.5
(read 4, write 2 bytes an element of 4), int8 3 (absolute max, scale-and-round, decode),
1-bit 3, top-k 4 (a threshold selection, gather of values and indices, scatter on decode;
GPU top-k is slower than this, so it is optimistic), error feedback 2 more (add the
residual, store the new one). PowerSGD multiplies: ``4 n m r`` FLOPs per ``n x m`` matrix
(``P = M Q``, ``Q = M^T P``) at the device's best GEMM rate.
"""

from __future__ import annotations

from sim.spec.hardware import HardwareSpec
from sim.spec.sync import Compression

__all__ = ["compression_s", "elementwise_s", "outer_step_s"]

_PASSES = {"none": 0.0, "fp16": 1.5, "int8": 3.0, "onebit": 3.0, "topk": 4.0, "powersgd": 2.0}


def elementwise_s(gpu: HardwareSpec, nbytes: float, passes: float) -> float:
    """``passes`` memory-bound sweeps over ``nbytes`` on ``gpu``."""
    return passes * nbytes / (gpu.hbm_GBps * 1e9 * gpu.hbm_eff)


def compression_s(gpu: HardwareSpec, c: Compression, elements: float, grad_bytes: int, dtype: str,
                  hidden: int | None) -> float:
    """Encode plus decode of one worker's share (``elements``) of the gradient a step."""
    if c.kind == "none":
        return 0.0
    passes = _PASSES[c.kind] + (2.0 if c.error_feedback else 0.0)
    t = elementwise_s(gpu, elements * grad_bytes, passes)
    if c.kind == "powersgd":
        n = hidden or 4096
        m = 4 * n
        flops = 4 * elements * c.rank * (1 + n / m)  # M Q and M^T P over every matrix
        t += flops / (gpu.peak_tflops(dtype) * 1e12 * gpu.gemm_eff_max)
    return t


def outer_step_s(gpu: HardwareSpec, elements: float) -> float:
    """DiLoCo's outer Nesterov step on fp32 master weights: read the pseudo-gradient, the
    momentum and the weights, write momentum and weights (5 x 4 bytes an element)."""
    return elementwise_s(gpu, elements * 4, 5.0)
