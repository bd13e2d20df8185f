"""Importing torchvision beside the CPU build of torch that our machines use.

The registry's torchvision wheels are CUDA-linked: beside ``torch==2.13.0+cpu`` the compiled
extension (``torchvision._C``, detection operators such as ``nms``) fails to load, and
``import torchvision`` then stops at ``register_fake("torchvision::nms")`` with "operator
torchvision::nms does not exist". The model builders are pure Python and need none of those
operators. When the extension does not load, :func:`import_torchvision` declares the two
schemas that torchvision's import registers fake kernels for (``nms``, ``qnms``) — schemas
only: calling them raises, so detection models are refused — and imports torchvision.
Where the extension loads (a matching CUDA build), torchvision is imported untouched.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

__all__ = ["import_torchvision", "extension_loaded", "TORCHVISION_FOR_TORCH"]

# torchvision 0.(minor + 15) pairs with torch 2.minor (0.28 with 2.13, 0.29 with 2.14)
TORCHVISION_FOR_TORCH = 15
_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_library: Any = None  # the Library object must outlive the import: it owns the schemas
_loaded: bool | None = None


def extension_loaded() -> bool | None:
    """Whether torchvision's compiled operators loaded (None before the first import)."""
    return _loaded


def _declare_schemas() -> None:
    import torch

    global _library
    if _library is None:
        _library = torch.library.Library("torchvision", "FRAGMENT")
        for schema in _SCHEMAS:
            name = schema.split("(", 1)[0]
            if not hasattr(torch.ops.torchvision, name):
                _library.define(schema)


def import_torchvision() -> ModuleType:
    """``torchvision``, imported as described above; ImportError names what to install."""
    global _loaded
    if "torchvision" in sys.modules and _loaded is not None:
        return sys.modules["torchvision"]
    try:
        import torchvision
        _loaded = True
        return torchvision
    except ModuleNotFoundError:
        raise ImportError(_missing()) from None
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]  # the half-done import
    _declare_schemas()
    import torchvision
    _loaded = False
    return torchvision


def _missing() -> str:
    import torch

    minor = int(torch.__version__.split(".")[1])
    return (f"torchvision is not installed: pip install 'torchvision~=0."
            f"{minor + TORCHVISION_FOR_TORCH}.0' (the release that pairs with torch "
            f"{torch.__version__.split('+')[0]})")
