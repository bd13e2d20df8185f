"""Cost models: seconds of each building block of a transformer layer, forward and backward.

Two implementations of one interface (every method returns ``(forward_s, backward_s)``):

* :class:`Roofline` — from rates: a GEMM runs at ``gemm_flops · Π d/(d + dim_half)`` over
  its three dimensions or at the memory roofline if slower; element-wise operations stream
  their bytes at ``mem_Bps``; fused attention runs at ``attention_flops`` on the causal half.
  Backward = 2× forward (2.5× for fused attention, which recomputes the scores). A software
  stack (:mod:`sim.spec.stack`) scales element-wise time (fusion) and adds fp8 casts to
  fp8 GEMMs, a fixed cost per layer and per step.
  :func:`roofline_for` takes the rates from the hardware catalog.
* :class:`Profiled` (in :mod:`sim.cost.profiled`) — measured times from a profile DB,
  interpolated in log space, falling back to a :class:`Roofline` fitted to the profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from sim.spec.hardware import DTYPE_BYTES, HardwareSpec

__all__ = ["Cost", "CostModel", "Roofline", "roofline_for", "BACKWARD_FACTOR",
           "FLASH_BACKWARD_FACTOR", "ADAM_BYTES_PER_PARAM", "op_bytes", "op_flops"]

Cost = tuple[float, float]
BACKWARD_FACTOR = 2.0
FLASH_BACKWARD_FACTOR = 2.5
ADAM_BYTES_PER_PARAM = 32.0  # read fp32 master, m, v, grad; write master, m, v, 16-bit copy

# Bytes streamed per element of the forward pass, per element-wise operation.
_STREAM_ELEMS = {"layernorm": 2.0, "rmsnorm": 2.0, "residual": 3.0, "dropout": 2.5, "rope": 4.0,
                 "gelu": 2.0, "swiglu": 3.0, "embedding": 1.0, "loss": 2.0,
                 "loss-parallel": 2.0}  # vocab-parallel: profiled; the roofline as fused


class CostModel(Protocol):
    """Forward and backward seconds of each layer building block on one device."""

    def gemm(self, m: float, n: float, k: float, dtype: str,
             gathered: tuple[float, float] = (1.0, 1.0)) -> Cost: ...

    def attention(self, batch_heads: float, q_len: float, kv_len: float, head_dim: float,
                  dtype: str, flash: bool, dropout: bool) -> Cost: ...

    def elementwise(self, op: str, tokens: float, width: float, dtype: str) -> Cost: ...

    def expert_bias(self, tokens: float, width: float, dtype: str, down: bool) -> Cost: ...

    def embedding(self, tokens: float, hidden: float, vocab: float, dtype: str) -> Cost: ...

    def optimizer(self, numel: float) -> float: ...

    def collective(self, kind: str, group_size: int, inter_node: bool, size_bytes: float
                   ) -> float | None: ...

    @property
    def extrapolated(self) -> set[str]: ...


def op_flops(m: float, n: float, k: float) -> float:
    """FLOPs of a forward GEMM ``(m x k) @ (k x n)``."""
    return 2.0 * m * n * k


def op_bytes(op: str, tokens: float, width: float, dtype: str) -> float:
    """Bytes a forward element-wise op streams (``loss``: 16-bit logits in, fp32 out)."""
    e = DTYPE_BYTES[dtype] if op not in ("loss", "loss-parallel") else 3.0
    return _STREAM_ELEMS[op] * tokens * width * e


@dataclass
class Roofline:
    """Rates of one device: FLOP/s per dtype for large GEMMs and fused attention, B/s."""

    gemm_flops: dict[str, float]
    gemm_dim_half: float
    mem_Bps: float
    attention_flops: dict[str, float]
    _extrapolated: set[str] = field(default_factory=set)
    layer_overhead_s: float = 0.0  # a layer's fixed forward cost (backward: twice)
    step_overhead_s: float = 0.0  # a training step's fixed cost beside the optimizer's
    elementwise_scale: float = 1.0  # element-wise time relative to one kernel each
    fp8_cast_bytes: float = 0.0  # bytes per element to quantise an fp8 GEMM operand
    # elements streamed per grouped-GEMM output element to add experts' biases: (up forward,
    # up backward, down forward, down backward)
    expert_bias_streams: tuple[float, float, float, float] = (2.0, 1.0, 2.0, 1.0)

    @property
    def extrapolated(self) -> set[str]:
        return self._extrapolated

    def gemm_efficiency(self, m: float, n: float, k: float) -> float:
        h = self.gemm_dim_half
        return (m / (m + h)) * (n / (n + h)) * (k / (k + h))

    def gemm(self, m: float, n: float, k: float, dtype: str,
             gathered: tuple[float, float] = (1.0, 1.0), batch: float = 1.0) -> Cost:
        """A GEMM's (forward, backward) seconds. Under fp8 each operand is cast to fp8 at
        the stack's ``fp8_cast_bytes`` an element: the input and the weight forward, the
        output gradient backward; ``gathered`` says how many ways the input and the output
        gradient are all-gathered after their cast (sequence parallelism: the cast runs on
        the shard, :func:`sim.layout.stages.tp_gathers`)."""
        compute = op_flops(m, n, k) * batch / (self.gemm_flops[dtype]
                                               * self.gemm_efficiency(m, n, k))
        memory = (m * k + k * n + m * n) * batch * DTYPE_BYTES[dtype] / self.mem_Bps
        fwd = max(compute, memory)
        if dtype != "fp8" or not self.fp8_cast_bytes:
            return fwd, BACKWARD_FACTOR * fwd
        cast = self.fp8_cast_bytes * batch / self.mem_Bps
        inputs, grads = gathered
        return fwd + (m * k / inputs + n * k) * cast, BACKWARD_FACTOR * fwd + m * n / grads * cast

    def attention(self, batch_heads: float, q_len: float, kv_len: float, head_dim: float,
                  dtype: str, flash: bool, dropout: bool) -> Cost:
        if flash:  # causal: the kernel skips the masked half
            flops = 4.0 * batch_heads * q_len * kv_len * head_dim * 0.5
            fwd = flops / self.attention_flops[dtype]
            return fwd, FLASH_BACKWARD_FACTOR * fwd
        scores = self.gemm(q_len, kv_len, head_dim, dtype, batch=batch_heads)[0]
        weighted = self.gemm(q_len, head_dim, kv_len, dtype, batch=batch_heads)[0]
        per_elem = 4 + (5 if dropout else 0)  # scale+mask+softmax read/write, dropout
        softmax = batch_heads * q_len * kv_len * per_elem / self.mem_Bps
        fwd = scores + weighted + softmax
        return fwd, BACKWARD_FACTOR * fwd

    def elementwise(self, op: str, tokens: float, width: float, dtype: str) -> Cost:
        fwd = op_bytes(op, tokens, width, dtype) / self.mem_Bps * self.elementwise_scale
        return fwd, BACKWARD_FACTOR * fwd

    def expert_bias(self, tokens: float, width: float, dtype: str, down: bool) -> Cost:
        """Adding the experts' biases to a grouped GEMM's ``tokens x width`` output (the up
        projection's, or the ``down`` one's): the device's streams forward and backward."""
        f, b = self.expert_bias_streams[2:] if down else self.expert_bias_streams[:2]
        one = tokens * width * DTYPE_BYTES[dtype] / self.mem_Bps
        return f * one, b * one

    def embedding(self, tokens: float, hidden: float, vocab: float, dtype: str) -> Cost:
        fwd = op_bytes("embedding", tokens, hidden, dtype) / self.mem_Bps  # a gather
        return fwd, BACKWARD_FACTOR * fwd

    def optimizer(self, numel: float) -> float:
        return numel * ADAM_BYTES_PER_PARAM / self.mem_Bps

    def collective(self, kind: str, group_size: int, inter_node: bool, size_bytes: float
                   ) -> float | None:
        """No measurements: the caller uses the link model (:mod:`sim.network.alphabeta`)."""
        return None


def roofline_for(hw: HardwareSpec) -> Roofline:
    """The catalog's rates: peak × measured efficiencies."""
    gemm, attn = {}, {}
    for dtype in DTYPE_BYTES:
        try:
            peak = hw.peak_tflops(dtype) * 1e12
        except ValueError:  # a dtype this device lacks: validation reports it
            continue
        gemm[dtype] = peak * hw.gemm_eff_max
        attn[dtype] = peak * hw.attention_eff
    return Roofline(gemm, hw.gemm_dim_half, hw.hbm_GBps * 1e9 * hw.hbm_eff, attn,
                    layer_overhead_s=hw.layer_overhead_us * 1e-6,
                    step_overhead_s=hw.step_overhead_ms * 1e-3,
                    elementwise_scale=hw.elementwise_scale, fp8_cast_bytes=hw.fp8_cast_bytes,
                    expert_bias_streams=expert_bias_streams(hw))


def expert_bias_streams(hw: HardwareSpec) -> tuple[float, float, float, float]:
    """The device's streams to add experts' biases: up forward, up backward, down forward,
    down backward."""
    return (hw.expert_bias_up_fwd, hw.expert_bias_up_bwd, hw.expert_bias_down_fwd,
            hw.expert_bias_down_bwd)
