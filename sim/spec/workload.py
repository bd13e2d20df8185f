"""A workload graph: any torch model as an ordered list of layers, for the torch-free simulator.

A :class:`ModelSpec` describes a decoder-only transformer by its shapes; a :class:`Workload`
describes any other network (CNNs, encoders, LSTMs, a user's ``nn.Module``) by what was
measured of each layer when ``profiler/`` traced it: parameter tensors, forward and backward
FLOPs, the bytes a layer reads and writes, and the bytes it saves for its backward pass. All
per-sample figures are for one sample of the traced input (``sample``); a batch of ``b``
samples scales them by ``b`` (the tracer checks that the FLOPs are linear in the batch).
``boundary_bytes`` is what a pipeline stage boundary right after the layer sends: every
activation produced up to the layer and read after it (a residual branch included).

On disk: JSON with ``schema_version`` (``trainsim trace --out``); ``sim/data/workloads/``
holds the presets ``trainsim models`` lists.

>>> w = Workload("toy", (Layer("fc", "Linear", (32, 4), forward_flops=64.0,
...                            backward_flops=128.0, input_bytes=32.0, output_bytes=16.0,
...                            saved_bytes=32.0),))
>>> w.param_count, w.forward_flops_per_sample
(36, 64.0)
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from sim.errors import SpecError
from sim.spec.limits import MAX_LAYERS, at_most

__all__ = ["Layer", "Measured", "Workload", "SCHEMA_VERSION", "load_workload",
           "workload_from_dict", "is_workload_file", "measured_times", "measured_device"]

SCHEMA_VERSION = 1
MAX_TENSOR_NUMEL = 2**40  # one parameter tensor: 1.1e12 elements, 4 TB in fp32
MAX_FLOPS_PER_SAMPLE = 1e18  # 10,000x a 405B transformer's forward pass over 8k tokens
_DTYPES = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Measured:
    """A measured time of one layer on one device at one batch size and training dtype
    (``profile compute``; bf16 under autocast)."""

    device: str
    batch: int
    forward_s: float
    backward_s: float
    dtype: str = "fp32"


@dataclass(frozen=True)
class Layer:
    """One leaf (or depth-limited) module, in forward execution order.

    ``param_tensors``: element counts of the trainable parameter tensors this layer owns, in
    registration order (a tensor shared by several modules belongs to the first that runs);
    ``frozen_tensors``: the same for parameters with ``requires_grad=False``. FLOPs and bytes
    are per sample, at the traced dtype.
    """

    name: str  # module path, e.g. "layer1.0.conv1"
    kind: str  # module class, e.g. "Conv2d"
    param_tensors: tuple[int, ...] = ()
    frozen_tensors: tuple[int, ...] = ()
    forward_flops: float = 0.0
    backward_flops: float = 0.0
    input_bytes: float = 0.0  # activations its forward operations read
    output_bytes: float = 0.0  # activations its forward operations write
    boundary_bytes: float = 0.0  # activations live across a cut right after this layer
    saved_bytes: float = 0.0  # held from forward to backward (parameters not counted)
    measured: tuple[Measured, ...] = ()

    @property
    def params(self) -> int:
        return sum(self.param_tensors)

    @property
    def frozen_params(self) -> int:
        return sum(self.frozen_tensors)


@dataclass(frozen=True)
class Workload:
    name: str
    layers: tuple[Layer, ...]
    dtype: str = "fp32"  # the dtype the bytes were traced at
    sample: str = ""  # one sample of the traced input, e.g. "3x224x224 float32"
    source: str = ""  # what was traced, e.g. "torchvision:resnet50"
    # measured AdamW step over all trainable parameters: (device, seconds) pairs
    optimizer_s: tuple[tuple[str, float], ...] = ()
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if not self.name:
            raise SpecError("workload.name", "must be a non-empty string")
        if not self.layers:
            raise SpecError("workload.layers", "must hold at least one layer")
        at_most("workload.layers", len(self.layers), MAX_LAYERS * 100, "layers")
        if self.dtype not in _DTYPES:
            raise SpecError("workload.dtype", f"must be one of {', '.join(_DTYPES)}, got "
                            f"{self.dtype!r}")
        names = [layer.name for layer in self.layers]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise SpecError("workload.layers", f"layer names must be unique, {dup!r} repeats")
        for i, layer in enumerate(self.layers):
            _check_layer(f"workload.layers[{i}]", layer)
        for pair in self.optimizer_s:
            if len(pair) != 2 or not isinstance(pair[0], str) or not isinstance(
                    pair[1], (int, float)) or not pair[1] > 0:
                raise SpecError("workload.optimizer_s", f"must be [device, seconds > 0] "
                                f"pairs, got {pair!r}")

    @property
    def param_count(self) -> int:
        """Trainable parameters (``sum(p.numel())`` over ``requires_grad`` parameters)."""
        return sum(layer.params for layer in self.layers)

    @property
    def frozen_param_count(self) -> int:
        return sum(layer.frozen_params for layer in self.layers)

    @property
    def forward_flops_per_sample(self) -> float:
        return sum(layer.forward_flops for layer in self.layers)

    @property
    def backward_flops_per_sample(self) -> float:
        return sum(layer.backward_flops for layer in self.layers)

    @property
    def param_tensors(self) -> list[int]:
        """Every trainable tensor's element count, in registration (forward) order."""
        return [n for layer in self.layers for n in layer.param_tensors]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: lists, and each layer without its zero or empty fields."""
        d = asdict(self)
        d["optimizer_s"] = [list(p) for p in self.optimizer_s]
        d["layers"] = [{k: list(v) if isinstance(v, tuple) else v
                        for k, v in asdict(layer).items() if v not in ((), 0.0)}
                       | {"name": layer.name, "kind": layer.kind} for layer in self.layers]
        return d


def _check_layer(where: str, layer: Layer) -> None:
    if not layer.name or not layer.kind:
        raise SpecError(f"{where}.name", "name and kind must be non-empty strings")
    for key in ("param_tensors", "frozen_tensors"):
        for n in getattr(layer, key):
            if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_TENSOR_NUMEL:
                raise SpecError(f"{where}.{key}", f"element counts must be integers in "
                                f"[1, {MAX_TENSOR_NUMEL:,}], got {n!r}")
    for key in ("forward_flops", "backward_flops", "input_bytes", "output_bytes",
                "boundary_bytes", "saved_bytes"):
        v = getattr(layer, key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) \
                or not 0 <= v <= MAX_FLOPS_PER_SAMPLE:
            raise SpecError(f"{where}.{key}", f"must be a finite number in [0, "
                            f"{MAX_FLOPS_PER_SAMPLE:g}] per sample, got {v!r}")
    for m in layer.measured:
        if m.batch < 1 or not (m.forward_s > 0 and m.backward_s >= 0):
            raise SpecError(f"{where}.measured", "needs batch >= 1, forward_s > 0 and "
                            f"backward_s >= 0, got {m}")


def workload_from_dict(d: Any, where: str = "workload") -> Workload:
    """A :class:`Workload` from its JSON form; unknown or mistyped keys are one-line errors."""
    if not isinstance(d, dict):
        raise SpecError(where, f"must be a JSON object, got {type(d).__name__}")
    version = d.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise SpecError(f"{where}.schema_version", f"must be {SCHEMA_VERSION}, got {version!r}")
    _known(d, {f.name for f in fields(Workload)}, where)
    layers = d.get("layers")
    if not isinstance(layers, list):
        raise SpecError(f"{where}.layers", "must be a list of layer objects")
    top = {k: v for k, v in d.items() if k != "layers"}
    pairs = top.get("optimizer_s", [])
    if not isinstance(pairs, list) or not all(isinstance(x, list) for x in pairs):
        raise SpecError(f"{where}.optimizer_s", "must be a list of [device, seconds] pairs")
    top["optimizer_s"] = tuple(tuple(x) for x in pairs)
    for key in ("name", "dtype", "sample", "source"):
        if key in top and not isinstance(top[key], str):
            raise SpecError(f"{where}.{key}", f"must be a string, got {top[key]!r}")
    return Workload(**top, layers=tuple(_layer(f"{where}.layers[{i}]", x)
                                        for i, x in enumerate(layers)))


def _known(d: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise SpecError(f"{where}.{unknown[0]}",
                        f"unknown key (known: {', '.join(sorted(allowed))})")


def _layer(where: str, d: Any) -> Layer:
    if not isinstance(d, dict):
        raise SpecError(where, f"must be a JSON object, got {type(d).__name__}")
    _known(d, {f.name for f in fields(Layer)}, where)
    kw: dict[str, Any] = dict(d)
    for key in ("name", "kind"):
        if not isinstance(kw.get(key), str):
            raise SpecError(f"{where}.{key}", f"must be a string, got {kw.get(key)!r}")
    for key in ("param_tensors", "frozen_tensors"):
        if not isinstance(kw.get(key, []), (list, tuple)):
            raise SpecError(f"{where}.{key}", "must be a list of element counts")
        kw[key] = tuple(kw.get(key, ()))
    measured = kw.pop("measured", [])
    if not isinstance(measured, list) or not all(isinstance(m, dict) for m in measured):
        raise SpecError(f"{where}.measured", "must be a list of objects")
    try:
        kw["measured"] = tuple(Measured(**m) for m in measured)
    except TypeError as exc:
        raise SpecError(f"{where}.measured", f"needs device, batch, forward_s, backward_s "
                        f"({exc})") from None
    for m in kw["measured"]:
        _check_measured(f"{where}.measured", m)
    return Layer(**kw)


def _check_measured(where: str, m: Measured) -> None:
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if not isinstance(m.device, str) or not m.device:
        raise SpecError(f"{where}.device", f"must be a device name, got {m.device!r}")
    if not isinstance(m.batch, int) or isinstance(m.batch, bool) or m.batch < 1:
        raise SpecError(f"{where}.batch", f"must be an integer >= 1, got {m.batch!r}")
    if not (number(m.forward_s) and number(m.backward_s)):
        raise SpecError(f"{where}.forward_s", f"forward_s and backward_s must be finite "
                        f"numbers, got {m.forward_s!r}, {m.backward_s!r}")
    if m.dtype not in _DTYPES:
        raise SpecError(f"{where}.dtype", f"must be one of {', '.join(_DTYPES)}, got "
                        f"{m.dtype!r}")


def is_workload_file(path: Path) -> bool:
    """A ``.json`` file whose top level holds ``layers`` (a workload, not a config.json)."""
    if path.suffix != ".json" or not path.is_file():
        return False
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(d, dict) and "layers" in d and "model_type" not in d


def load_workload(path: str | Path) -> Workload:
    path = Path(path)
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError("workload", f"cannot read {str(path)!r}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise SpecError("workload", f"{str(path)!r} is not JSON: {exc}") from None
    return workload_from_dict(d, "workload")


def measured_device(devices: set[str], device: str, host: str) -> str | None:
    """Which measured device a simulation on ``device`` (a catalog name) takes: that one;
    on ``cpu`` the host's CPU when it was measured, else any measured CPU."""
    if device in devices:
        return device
    if device == "cpu":
        cpus = sorted(d for d in devices if d.startswith("cpu"))
        return host if host in cpus else (cpus[0] if cpus else None)
    return None


def measured_times(layer: Layer, device: str, dtype: str = "fp32"
                   ) -> dict[int, tuple[float, float]]:
    """A layer's measured (forward_s, backward_s) on ``device`` in ``dtype``, by batch."""
    return {m.batch: (m.forward_s, m.backward_s) for m in layer.measured
            if m.device == device and m.dtype == dtype}
