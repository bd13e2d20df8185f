"""Trace a torch module into a :class:`sim.spec.workload.Workload` on the meta device.

Nothing is allocated or computed: the module and its example input live on ``meta``, where
every operation only produces shapes. One forward and one backward pass:

* **forward**: forward hooks keep the stack of running modules; operations of a module's own
  ``forward`` outside its children form a layer named after that module. A dispatch mode sees
  every aten operation: its FLOPs (``torch.utils.flop_counter``'s formulas, those of
  ``FlopCounterMode``), the activation bytes it reads and writes (views move nothing;
  parameters and buffers are not activations), and which layer produced and which last read
  every storage (the bytes live across each cut: ``boundary_bytes``). ``saved_tensors_hooks``
  see every tensor autograd keeps for backward (each storage counted once). A function mode
  labels every autograd node the layer's operations create with the layer;
* **backward**: each operation's FLOPs go to the layer whose node autograd is running
  (``torch._C._current_autograd_node``) — exact through residual branches, where module
  hooks in backward are not.

``depth`` folds everything below that module depth into its ancestor (``None``: leaves).
Each parameter belongs to the module that registers it; a module that never runs (the
``out_proj`` that ``nn.MultiheadAttention`` calls functionally) gives its parameters to its
nearest ancestor that does.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from sim.errors import SpecError
from sim.spec.workload import Layer, Workload

__all__ = ["trace_module", "scalar_of"]

_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _flops(func: Any, args: Any, kwargs: Any, out: Any) -> float:
    if func._overloadpacket is torch.ops.aten.convolution_backward:
        return _conv_backward_flops(*args)
    count = flop_registry.get(func._overloadpacket)
    return float(count(*args, **(kwargs or {}), out_val=out)) if count is not None else 0.0


def _conv_backward_flops(grad_out: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                         *rest: Any) -> float:
    """Each requested gradient (input, weight) costs the forward convolution's FLOPs:
    2 x (output elements, or input elements when transposed) x (weight elements per output
    channel). FlopCounterMode's formula ignores ``groups``, counting a depthwise
    convolution's backward C times over; this one does not."""
    transposed, mask = rest[4], rest[-1]
    per_channel = math.prod(w.shape[1:])
    forward = 2.0 * math.prod((x if transposed else grad_out).shape) * per_channel
    return forward * (int(bool(mask[0])) + int(bool(mask[1])))


@dataclass
class _Stack:
    """Which layer is running: the module stack, cut at ``depth``."""

    root: nn.Module
    depth: int | None
    names: list[str] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # layers in first-run order
    index: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)

    def current(self) -> str | None:
        if not self.names:
            return None
        name = self.names[-1]
        if self.depth is not None and name:
            name = ".".join(name.split(".")[: self.depth])
        if name not in self.index:
            module = self.root.get_submodule(name) if name else self.root
            self.kinds[name] = type(module).__name__
            self.index[name] = len(self.order)
            self.order.append(name)
        return name

    def hooks(self) -> list[Any]:
        def push(_m: Any, _a: Any, name: str) -> None:
            self.names.append(name)

        def pop(_m: Any, _a: Any, _o: Any) -> None:  # returns None: the output stays
            self.names.pop()

        handles = []
        for name, module in self.root.named_modules():
            handles.append(module.register_forward_pre_hook(
                lambda m, a, name=name: push(m, a, name)))
            handles.append(module.register_forward_hook(pop, always_call=True))
        return handles


class _Labeller(TorchFunctionMode):
    """Labels the autograd nodes each layer's operations create with that layer."""

    def __init__(self, stack: _Stack) -> None:
        super().__init__()
        self.stack = stack
        self.label: dict[Any, str] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        layer = self.stack.current()
        if layer is not None:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                    self._walk(t.grad_fn, layer)
        return out

    def _walk(self, node: Any, layer: str) -> None:
        todo = [node]
        while todo:
            n = todo.pop()
            if n is None or n in self.label:
                continue
            self.label[n] = layer
            todo.extend(f for f, _ in n.next_functions)


@dataclass
class _Counts:
    forward: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    backward: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    read: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    written: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    saved: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    unattributed_flops: float = 0.0


class _Forward(TorchDispatchMode):
    """FLOPs and activation bytes per layer, and each storage's producer and last reader."""

    def __init__(self, stack: _Stack, state: set[int], counts: _Counts) -> None:
        super().__init__()
        self.stack, self.state, self.counts = stack, state, counts
        self.producer: dict[int, int] = {}
        self.last_reader: dict[int, int] = {}
        self.size: dict[int, int] = {}
        self.keep: list[torch.Tensor] = []  # storages stay alive, so their ids stay unique

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        layer = self.stack.current()
        if layer is None:
            return out
        self.counts.forward[layer] += _flops(func, args, kwargs, out)
        index, moves = self.stack.index[layer], not getattr(func, "is_view", False)
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and _key(t) not in self.state:
                k = _key(t)
                self.counts.read[layer] += t.nbytes if moves else 0
                self.last_reader[k] = max(self.last_reader.get(k, index), index)
                self.producer.setdefault(k, -1)  # not produced by a layer: the model's input
                self.size.setdefault(k, t.untyped_storage().nbytes())
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and _key(t) not in self.state:
                k = _key(t)
                self.counts.written[layer] += t.nbytes if moves else 0
                self.producer.setdefault(k, index)
                self.size[k] = max(self.size.get(k, 0), t.untyped_storage().nbytes())
                self.keep.append(t)
        return out

    def boundaries(self, n: int) -> list[float]:
        """Bytes live across the cut after each of ``n`` layers."""
        delta = [0.0] * (n + 1)
        for k, last in self.last_reader.items():
            first = max(self.producer[k], 0)  # the model's input: live from the first cut
            if last > first:
                delta[first] += self.size[k]
                delta[last] -= self.size[k]
        out, live = [], 0.0
        for i in range(n):
            live += delta[i]
            out.append(live)
        return out


class _Backward(TorchDispatchMode):
    """Backward FLOPs per layer: the layer that labelled the running autograd node."""

    def __init__(self, label: dict[Any, str], counts: _Counts) -> None:
        super().__init__()
        self.label, self.counts = label, counts

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        flops = _flops(func, args, kwargs, out)
        if flops:
            layer = self.label.get(torch._C._current_autograd_node())
            if layer is None:
                self.counts.unattributed_flops += flops
            else:
                self.counts.backward[layer] += flops
        return out


def scalar_of(output: Any) -> torch.Tensor:
    """A scalar that depends on every floating-point tensor of a model's output (a loss
    stand-in: its backward reaches every layer that produced the output)."""
    leaves = [t for t in tree_leaves(_plain(output)) if isinstance(t, torch.Tensor)
              and t.is_floating_point() and t.requires_grad]
    if not leaves:
        raise SpecError("model", "its output holds no floating-point tensor that needs a "
                        "gradient: nothing to train")
    return sum((t.float().sum() for t in leaves), torch.zeros((), device=leaves[0].device))


def _plain(output: Any) -> Any:
    """Named tuples and ``ModelOutput``-like dicts become plain containers."""
    if isinstance(output, dict):
        return list(output.values())
    if isinstance(output, tuple) and hasattr(output, "_fields"):
        return tuple(output)
    return output


def _call(module: nn.Module, example: Any) -> Any:
    if isinstance(example, dict):
        return module(**example)
    if isinstance(example, (tuple, list)):
        return module(*example)
    return module(example)


def _run(module: nn.Module, example: Any, depth: int | None
         ) -> tuple[_Stack, _Forward, _Counts]:
    state = {_key(t) for t in [*module.parameters(), *module.buffers()]}
    stack, counts, saved_by = _Stack(module, depth), _Counts(), set()
    forward, labeller = _Forward(stack, state, counts), _Labeller(stack)

    def pack(t: torch.Tensor) -> torch.Tensor:
        k, layer = _key(t), stack.current()
        if layer is not None and k not in state and k not in saved_by:
            saved_by.add(k)
            counts.saved[layer] += t.untyped_storage().nbytes()
        return t

    handles = stack.hooks()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), forward, labeller:
            out = _call(module, example)
    finally:
        for h in handles:
            h.remove()
    loss = scalar_of(out)
    with _Backward(labeller.label, counts):
        loss.backward()
    return stack, forward, counts


def _owners(module: nn.Module, layers: list[str], depth: int | None
            ) -> dict[str, tuple[list[int], list[int]]]:
    """Parameters (trainable, frozen) of each layer. A parameter belongs to the first layer
    (in running order) among the modules that register it (a tied weight to the layer that
    runs first); when none of them is a layer (a module that never ran, such as the
    ``out_proj`` that ``nn.MultiheadAttention`` calls functionally), to the nearest ancestor
    that is (or the root)."""
    def cut(name: str) -> str:
        return name if depth is None else ".".join(name.split(".")[:depth])

    holders: dict[int, tuple[torch.nn.Parameter, list[str]]] = {}
    for mod_name, sub in module.named_modules(remove_duplicate=False):
        for p in sub.parameters(recurse=False):
            holders.setdefault(id(p), (p, []))[1].append(cut(mod_name))
    rank = {name: i for i, name in enumerate(layers)}
    owned: dict[str, tuple[list[int], list[int]]] = {n: ([], []) for n in layers}
    for p, names in holders.values():
        running = [n for n in names if n in rank]
        owner = min(running, key=rank.__getitem__) if running else names[0]
        while owner not in owned:
            owner = owner.rpartition(".")[0] if owner else ""
            if owner == "" and "" not in owned:
                owned[""] = ([], [])
                layers.insert(0, "")
        owned[owner][0 if p.requires_grad else 1].append(p.numel())
    return owned


def _batch_of(example: Any) -> int:
    first = next((t for t in tree_leaves(example) if isinstance(t, torch.Tensor)), None)
    if first is None or first.dim() == 0:
        raise SpecError("model", "the example input holds no tensor with a batch dimension "
                        "(dimension 0)")
    return int(first.shape[0])


def _check_linear(module: nn.Module, example: Any, batch: int) -> float:
    """FlopCounterMode's forward FLOPs at the example's batch; one-line error when twice
    the batch is not twice the FLOPs (dimension 0 is then not the batch)."""
    def total(ex: Any) -> float:
        with FlopCounterMode(display=False) as counter:
            _call(module, ex)
        return float(counter.get_total_flops())

    once = total(example)
    twice = total(tree_map(lambda t: torch.cat([t, t]) if isinstance(t, torch.Tensor)
                           and t.dim() else t, example))
    if once and abs(twice / once - 2.0) > 0.02:
        raise SpecError("model", f"forward FLOPs are not linear in dimension 0 of the input "
                        f"(batch {batch} -> {2 * batch} gives {twice / once:.3f}x): dimension 0 "
                        "must be the batch")
    return once


def trace_module(module: nn.Module, example: Any, name: str, source: str = "",
                 depth: int | None = None) -> Workload:
    """The workload of ``module`` on ``example`` (both on the meta device; dimension 0 of the
    example's first tensor is the batch). One-line SpecError when the module cannot train."""
    if depth is not None and depth < 1:
        raise SpecError("--depth", f"must be >= 1, got {depth}")
    module.train()
    batch = _batch_of(example)
    try:
        _check_linear(module, example, batch)
        stack, forward, c = _run(module, example, depth)
    except SpecError:
        raise
    except Exception as exc:  # the module's own code failed on its example input
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise SpecError("model", f"forward or backward on the example input raised "
                        f"{type(exc).__name__}: {first}") from None
    layers = list(stack.order)
    owners = _owners(module, layers, depth)
    cut = dict(zip(stack.order, forward.boundaries(len(stack.order)), strict=True))
    root = type(module).__name__
    out = [Layer(name=layer or root, kind=stack.kinds.get(layer, root),
                 param_tensors=tuple(owners[layer][0]), frozen_tensors=tuple(owners[layer][1]),
                 forward_flops=c.forward.get(layer, 0.0) / batch,
                 backward_flops=c.backward.get(layer, 0.0) / batch,
                 input_bytes=c.read.get(layer, 0.0) / batch,
                 output_bytes=c.written.get(layer, 0.0) / batch,
                 boundary_bytes=cut.get(layer, 0.0) / batch,
                 saved_bytes=c.saved.get(layer, 0.0) / batch) for layer in layers]
    x = next(t for t in tree_leaves(example) if isinstance(t, torch.Tensor))
    sample = "x".join(map(str, x.shape[1:])) + f" {str(x.dtype).removeprefix('torch.')}"
    p = next(module.parameters(), None)
    dtype = _DTYPE_NAMES.get(p.dtype, "fp32") if p is not None else "fp32"
    return Workload(name=name, layers=tuple(out), sample=sample or "scalar", source=source,
                    dtype=dtype)
