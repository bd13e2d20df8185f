"""Where a traced module comes from: ``--model`` references, built on the meta device.

* ``torchvision:NAME`` — a torchvision classification builder (``weights=None``: nothing is
  downloaded), on a 3 x 224 x 224 image (299 x 299 for ``inception_v3``);
* ``hf-encoder:PATH`` — a BERT-style encoder from a Hugging Face ``config.json`` (a file or
  its folder) through transformers' own builder, with its masked-language-model head, on
  ``seq_len`` token ids;
* ``builtin:lstm-lm`` — a 2-layer LSTM language model (Zaremba et al.'s medium model:
  vocabulary 10,000, 650 units, 35 steps);
* ``FILE.py:FUNCTION`` — a user's function returning ``(module, example_input)``, called with
  the batch size when it takes an argument; dimension 0 of the example's first tensor is
  the batch. The function runs under ``torch.device("meta")``
  and what it returns is moved to the meta device.

Every failure a user can cause is a one-line :class:`SpecError` naming ``--model``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from sim.errors import SpecError

__all__ = ["build", "BUILTINS", "TORCHVISION_ZOO", "image_size"]

# The torchvision builders the zoo ships traced (any classification builder traces).
TORCHVISION_ZOO = ("resnet18", "resnet50", "resnet101", "resnet152", "vgg16", "vgg19",
                   "inception_v3", "mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small",
                   "efficientnet_b0", "vit_b_16")


class LSTMLanguageModel(nn.Module):
    """Embedding -> stacked LSTM -> linear decoder over the vocabulary (untied)."""

    def __init__(self, vocab: int = 10_000, hidden: int = 650, layers: int = 2,
                 dropout: float = 0.5) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.drop = nn.Dropout(dropout)
        self.lstm = nn.LSTM(hidden, hidden, layers, dropout=dropout, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.drop(self.embedding(tokens)))
        return self.decoder(self.drop(out))


def _lstm_lm(batch: int, seq_len: int | None) -> tuple[nn.Module, Any]:
    return LSTMLanguageModel(), torch.randint(0, 10_000, (batch, seq_len or 35))


BUILTINS: dict[str, Callable[[int, int | None], tuple[nn.Module, Any]]] = {
    "lstm-lm": _lstm_lm}


def image_size(name: str) -> int:
    return 299 if name == "inception_v3" else 224


def _torchvision(name: str, batch: int) -> tuple[nn.Module, Any]:
    from profiler.graph.vision import import_torchvision

    try:
        tv = import_torchvision()
    except ImportError as exc:
        raise SpecError("--model", str(exc)) from None
    known = sorted(tv.models.list_models(module=tv.models))
    if name not in known:
        raise SpecError("--model", f"torchvision has no classification model {name!r} "
                        f"(known: {', '.join(known)})")
    size = image_size(name)
    kwargs = {"init_weights": False} if name in ("inception_v3", "googlenet") else {}
    return tv.models.get_model(name, weights=None, **kwargs), torch.randn(batch, 3, size, size)


def _config_path(path: str) -> Path:
    """A config file, its folder, or the name of one shipped with trainsim (the presets'
    sources: ``hf-encoder:bert-base-uncased.json``)."""
    p = Path(path)
    p = p / "config.json" if p.is_dir() else p
    shipped = Path(str(resources.files("profiler").joinpath("graph", "configs", p.name)))
    return shipped if not p.exists() and p.parent == Path(".") and shipped.is_file() else p


def _hf_encoder(path: str, batch: int, seq_len: int | None) -> tuple[nn.Module, Any]:
    p = _config_path(path)
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError("--model", f"hf-encoder: cannot read {str(p)!r} as JSON: {exc}") from None
    if not isinstance(cfg, dict) or cfg.get("model_type") not in ("bert", "roberta"):
        kind = cfg.get("model_type") if isinstance(cfg, dict) else None
        raise SpecError("--model", f"hf-encoder: model_type must be bert or roberta, got "
                        f"{kind!r}")
    from profiler.graph.vision import import_torchvision

    with contextlib.suppress(ImportError):  # transformers imports torchvision if installed
        import_torchvision()
    try:
        import transformers
    except ImportError:
        raise SpecError("--model", "hf-encoder needs transformers: pip install "
                        "'trainsim[trace]'") from None
    try:
        config = transformers.AutoConfig.for_model(**cfg)
        config.attn_implementation = "sdpa"
        model = transformers.AutoModelForMaskedLM.from_config(config)
    except Exception as exc:  # transformers' own validation of the config's values
        raise SpecError("--model", f"hf-encoder: transformers cannot build {str(p)!r}: "
                        f"{type(exc).__name__}: {_first_line(exc)}") from None
    seq = seq_len or 128
    if seq > config.max_position_embeddings:
        raise SpecError("--seq-len", f"must be at most the encoder's max_position_embeddings "
                        f"{config.max_position_embeddings}, got {seq}")
    return model, {"input_ids": torch.randint(0, config.vocab_size, (batch, seq))}


def _user_function(file: str, function: str) -> Callable[..., Any]:
    path = Path(file)
    if not path.is_file():
        raise SpecError("--model", f"no file {file!r} (FILE.py:FUNCTION)")
    spec = importlib.util.spec_from_file_location(f"trainsim_user_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise SpecError("--model", f"{file!r} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise SpecError("--model", f"{file!r} is not Python: {exc.msg} (line {exc.lineno})"
                        ) from None
    except Exception as exc:  # the user's module failed to import: say what it raised
        raise SpecError("--model", f"importing {file!r} raised {type(exc).__name__}: "
                        f"{_first_line(exc)}") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        raise SpecError("--model", f"{file!r} has no function {function!r}")
    return fn


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


def _user(ref: str, batch: int | None) -> tuple[nn.Module, Any]:
    """``FUNCTION(batch)`` when it takes an argument, else ``FUNCTION()`` (whose example's
    batch is then the only one: another ``batch`` is refused)."""
    import inspect

    file, _, function = ref.rpartition(":")
    fn = _user_function(file, function)
    takes_batch = bool(inspect.signature(fn).parameters)
    try:
        made = fn(batch or 2) if takes_batch else fn()
    except (Exception, SystemExit) as exc:
        raise SpecError("--model", f"{function}() raised {type(exc).__name__}: "
                        f"{_first_line(exc)}") from None
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module)):
        raise SpecError("--model", f"{function}() must return (torch.nn.Module, example_input), "
                        f"got {type(made).__name__}")
    if not takes_batch and batch is not None:
        first = next((t for t in tree_leaves(made[1]) if isinstance(t, torch.Tensor)), None)
        if first is not None and first.dim() and int(first.shape[0]) != batch:
            raise SpecError("--batch", f"{function}() takes no batch argument and its example "
                            f"has batch {int(first.shape[0])}, not {batch}: give it a batch "
                            "parameter to build other batches")
    return made


def _to(module: nn.Module, example: Any, device: str) -> tuple[nn.Module, Any]:
    from torch.utils._pytree import tree_map

    return module.to(device), tree_map(
        lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, example)


def _to_meta(module: nn.Module, example: Any) -> tuple[nn.Module, Any]:
    return _to(module, example, "meta")


def build(ref: str, batch: int | None = 2, seq_len: int | None = None, device: str = "meta"
          ) -> tuple[nn.Module, Any, str]:
    """(module, example input, name) on ``device`` (meta: shapes only, for tracing; cpu or
    cuda: initialised weights, for measuring) for a ``--model`` reference."""
    kind, sep, rest = ref.partition(":")
    if not sep or not rest:
        raise SpecError("--model", f"must be torchvision:NAME, hf-encoder:CONFIG, builtin:NAME "
                        f"or FILE.py:FUNCTION, got {ref!r}")
    if batch is not None and batch < 1:
        raise SpecError("--batch", f"must be >= 1, got {batch}")
    batch_given, batch = batch, batch or 2  # a user's FILE.py:FN may fix its own batch
    with torch.device(device):
        if kind == "torchvision":
            module, example = _torchvision(rest, batch)
            name = rest
        elif kind == "hf-encoder":
            module, example = _hf_encoder(rest, batch, seq_len)
            name = (Path(rest).resolve().parent.name if Path(rest).name == "config.json"
                    else Path(rest).stem) or "encoder"
        elif kind == "builtin":
            if rest not in BUILTINS:
                raise SpecError("--model", f"unknown builtin {rest!r} (known: "
                                f"{', '.join(BUILTINS)})")
            module, example = BUILTINS[rest](batch, seq_len)
            name = rest
        elif ref.rpartition(":")[0].endswith(".py"):
            module, example = _user(ref, batch_given)
            name = ref.rpartition(":")[2]
        else:
            raise SpecError("--model", f"must be torchvision:NAME, hf-encoder:CONFIG, "
                            f"builtin:NAME or FILE.py:FUNCTION, got {ref!r}")
    if device == "meta":
        return (*_to_meta(module, example), name)
    return (*_to(module, example, device), name)
