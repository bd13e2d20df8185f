"""The model zoo and :func:`load_model`: a model by zoo name, Hugging Face ``config.json``
path or ModelSpec TOML path; :func:`load_any` also takes workload graphs.

Transformer presets are TOML files in ``sim/data/models/``; workload graphs (CNNs, encoders,
an LSTM: :mod:`sim.spec.workload`) are JSON files in ``sim/data/workloads/``.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from sim.errors import SpecError
from sim.io import read_toml
from sim.spec.hf_config import load_hf_config
from sim.spec.model import ModelSpec
from sim.spec.workload import Workload, is_workload_file, load_workload

__all__ = ["zoo_names", "load_zoo", "load_model", "workload_names", "load_any"]


def _zoo_dir() -> Any:
    return resources.files("sim").joinpath("data", "models")


def _workload_dir() -> Any:
    return resources.files("sim").joinpath("data", "workloads")


def workload_names() -> list[str]:
    """Names of the built-in workload graphs."""
    return sorted(p.name[:-5] for p in _workload_dir().iterdir() if p.name.endswith(".json"))


def _workload_ref(ref: str) -> Path | None:
    """The workload file ``ref`` names (a preset or a workload JSON), or None."""
    if ref in workload_names():
        return Path(str(_workload_dir().joinpath(f"{ref}.json")))
    path = Path(ref)
    return path if is_workload_file(path) else None


def load_any(ref: str) -> ModelSpec | Workload:
    """A transformer (:func:`load_model`) or a workload graph (a preset name or a file
    written by ``trainsim trace``)."""
    path = _workload_ref(ref) if ref.strip() else None
    return load_workload(path) if path is not None else load_model(ref)


def zoo_names() -> list[str]:
    """Names of the built-in model presets."""
    return sorted(p.name[:-5] for p in _zoo_dir().iterdir() if p.name.endswith(".toml"))


def load_zoo(name: str) -> ModelSpec:
    """A built-in preset by name, e.g. ``load_zoo("llama3-8b").num_layers == 32``."""
    path = _zoo_dir().joinpath(f"{name}.toml")
    if not path.is_file():
        raise SpecError("model", f"unknown zoo preset {name!r} (known: {', '.join(zoo_names())}; "
                        f"workloads: {', '.join(workload_names())}) and no such config.json "
                        "file")
    data = tomllib.loads(path.read_text())
    data.setdefault("name", name)
    return ModelSpec.from_dict(data, source=f"model[{name}]")


def load_model(ref: str) -> ModelSpec:
    """A zoo name, a Hugging Face ``config.json`` path, or a ModelSpec TOML path."""
    if not ref.strip():  # Path("") is the current folder: it could pick up any config.json
        raise SpecError("model", f"is empty ({ref!r}): give a zoo name (trainsim models), "
                        "a config.json or its folder, or a TOML file")
    if _workload_ref(ref) is not None:
        raise SpecError("model", f"{ref!r} is a workload graph (CNN, encoder, LSTM): this "
                        "command takes transformer models only")
    path = Path(ref)
    if path.suffix == ".toml" and path.is_file():
        data = read_toml(path, "model", f"model[{ref}]")
        data.setdefault("name", path.stem)
        return ModelSpec.from_dict(data, source=f"model[{path.name}]")
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.suffix == ".json" or path.is_file():
        return load_hf_config(path)
    return load_zoo(ref)
