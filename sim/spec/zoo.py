"""The model zoo and :func:`load_model`: a model by zoo name, Hugging Face ``config.json``
path or ModelSpec TOML path.

Zoo presets are TOML files in ``sim/data/models/``.
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

__all__ = ["zoo_names", "load_zoo", "load_model"]


def _zoo_dir() -> Any:
    return resources.files("sim").joinpath("data", "models")


def zoo_names() -> list[str]:
    """Names of the built-in model presets."""
    return sorted(p.name[:-5] for p in _zoo_dir().iterdir() if p.name.endswith(".toml"))


def load_zoo(name: str) -> ModelSpec:
    """A built-in preset by name, e.g. ``load_zoo("llama3-8b").num_layers == 32``."""
    path = _zoo_dir().joinpath(f"{name}.toml")
    if not path.is_file():
        raise SpecError("model", f"unknown zoo preset {name!r} (known: {', '.join(zoo_names())}) "
                        "and no such config.json file")
    data = tomllib.loads(path.read_text())
    data.setdefault("name", name)
    return ModelSpec.from_dict(data, source=f"model[{name}]")


def load_model(ref: str) -> ModelSpec:
    """A zoo name, a Hugging Face ``config.json`` path, or a ModelSpec TOML path."""
    if not ref.strip():  # Path("") is the current folder: it could pick up any config.json
        raise SpecError("model", f"is empty ({ref!r}): give a zoo name (trainsim models), "
                        "a config.json or its folder, or a TOML file")
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
