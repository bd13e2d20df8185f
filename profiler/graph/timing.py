"""Measure a workload graph's layers for real: each layer's forward and backward seconds,
the optimizer step, and the whole training step (to check the sum against).

One clock runs through a training step and charges the time between two events to the
layer running then. Forward events are module hooks (the same layers as the trace:
:class:`profiler.graph.trace._Stack`); when a module's forward ends, the autograd nodes
it created are labelled with it (walking back from its outputs until nodes an earlier
layer labelled), and each gets a pre-hook, so in backward the clock switches to a node's
layer as autograd starts it. Hook bookkeeping is kept off the clock. On CUDA every event
synchronises first (layer times then include no overlap between layers); on CPU the wall
clock is the time.

The whole step (forward, a loss over the output, backward, AdamW step) is measured without
any hook, interleaved with the layer measurements, so both see the same machine; its AdamW
part is the optimizer step's time.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from profiler.graph.trace import _call, _Stack, scalar_of

__all__ = ["LayerTimes", "measure_layers", "measure_step", "autocast"]


@dataclass(frozen=True)
class LayerTimes:
    forward_s: dict[str, float]  # layer name (as traced) -> seconds
    backward_s: dict[str, float]


class _Clock:
    """Charges the time between two switches to the layer running in between: wall clock on
    CPU; on CUDA an event recorded at each switch, read after the step (the GPU's own time,
    no synchronisation between layers)."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        self.current: str | None = None
        self.acc: dict[str, float] = defaultdict(float)
        self.marks: list[tuple[str | None, Any]] = []
        self.t = time.perf_counter()

    def switch(self, layer: str | None) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((layer, event))
            return
        now = time.perf_counter()
        if self.current is not None:
            self.acc[self.current] += now - self.t
        self.current = layer
        self.t = time.perf_counter()  # the bookkeeping above stays off the clock

    def pause(self, seconds: float) -> None:
        """Hook work that took ``seconds`` of wall clock (not charged on CPU)."""
        self.t += seconds

    def finish(self) -> None:
        if self.cuda and self.marks:
            torch.cuda.synchronize()
            for (layer, a), (_, b) in zip(self.marks, self.marks[1:], strict=False):
                if layer is not None:
                    self.acc[layer] += a.elapsed_time(b) / 1e3


class _Hooks:
    """Forward hooks that switch the clock and label the autograd nodes of each layer."""

    def __init__(self, module: nn.Module, stack: _Stack, clock: _Clock,
                 backward_clock: _Clock) -> None:
        self.stack, self.clock, self.backward_clock = stack, clock, backward_clock
        self.labelled: set[Any] = set()
        self.handles: list[Any] = []
        for name, sub in module.named_modules():
            self.handles.append(sub.register_forward_pre_hook(
                lambda _m, _a, name=name: self._enter(name)))
            self.handles.append(sub.register_forward_hook(self._leave, always_call=True))

    def _enter(self, name: str) -> None:
        self.stack.names.append(name)
        self.clock.switch(self.stack.current())

    def _leave(self, _m: Any, _a: Any, out: Any) -> None:
        layer = self.stack.current()
        t0 = time.perf_counter()
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                self._label(t.grad_fn, layer)
        self.stack.names.pop()
        self.clock.pause(time.perf_counter() - t0)  # labelling stays off the CPU clock
        self.clock.switch(self.stack.current())

    def _label(self, node: Any, layer: str | None) -> None:
        todo = [node]
        while todo:
            n = todo.pop()
            if n is None or n in self.labelled:
                continue
            self.labelled.add(n)
            n.register_prehook(lambda _g, layer=layer: self.backward_clock.switch(layer))
            todo.extend(f for f, _ in n.next_functions)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def autocast(device: str, dtype: str) -> Any:
    """bf16 training as the frameworks run it (autocast, fp32 weights); fp32: nothing."""
    import contextlib

    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, dtype=torch.bfloat16)


def _one(module: nn.Module, example: Any, depth: int | None, device: str, dtype: str = "fp32"
         ) -> tuple[dict[str, float], dict[str, float]]:
    stack = _Stack(module, depth)
    fwd, bwd = _Clock(device), _Clock(device)
    hooks = _Hooks(module, stack, fwd, bwd)
    try:
        fwd.switch(None)
        with autocast(device, dtype):
            out = _call(module, example)
        fwd.switch(None)
        loss = scalar_of(out)
        bwd.switch(None)
        loss.backward()
        bwd.switch(None)
        fwd.finish()
        bwd.finish()
    finally:
        hooks.remove()
    module.zero_grad(set_to_none=True)
    root = type(module).__name__
    return ({k or root: v for k, v in fwd.acc.items()}, {k or root: v for k, v in bwd.acc.items()})


def measure_layers(module: nn.Module, example: Any, depth: int | None = None,
                   device: str = "cpu", repeats: int = 5, warmup: int = 1,
                   dtype: str = "fp32") -> LayerTimes:
    """Median forward and backward seconds of every layer over ``repeats`` steps."""
    module.train()
    for _ in range(warmup):
        _one(module, example, depth, device, dtype)
    runs = [_one(module, example, depth, device, dtype) for _ in range(repeats)]
    names = {k for f, b in runs for k in (*f, *b)}
    return LayerTimes({k: statistics.median(f.get(k, 0.0) for f, _ in runs) for k in names},
                      {k: statistics.median(b.get(k, 0.0) for _, b in runs) for k in names})


def measure_step(module: nn.Module, example: Any, device: str = "cpu", repeats: int = 5,
                 warmup: int = 1, dtype: str = "fp32") -> tuple[float, float]:
    """Median seconds of a whole training step (forward, loss, backward, AdamW; no hooks),
    and of its AdamW part: the optimizer step measured where it runs, after a backward
    pass has just written fresh gradients (alone, on warm gradients, it runs up to a third
    faster on a large model)."""
    module.train()
    opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-4)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step() -> tuple[float, float]:
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast(device, dtype):
            out = _call(module, example)
        scalar_of(out).backward()
        sync()
        t1 = time.perf_counter()
        opt.step()
        sync()
        t2 = time.perf_counter()
        return t2 - t0, t2 - t1

    for _ in range(warmup):
        step()
    samples = [step() for _ in range(repeats)]
    module.zero_grad(set_to_none=True)
    return statistics.median(s for s, _ in samples), statistics.median(o for _, o in samples)
