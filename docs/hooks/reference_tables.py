"""Reference tables for the docs hook (``gen_pages.py``): the fields of the input and
result dataclasses, the model zoo and the hardware catalog, generated from the code and the
shipped data when the site is built."""

from __future__ import annotations

import ast
import csv
import dataclasses
import inspect
import io
import json
import math
import re
import textwrap
import tokenize
import types
import typing
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[2]
STABLE = ("ModelSpec", "ClusterSpec", "Plan", "Result")  # names ``sim`` exports for good


# Dataclass references -------------------------------------------------------------------
def dataclass_marker(args: str) -> str:
    name, _, fmt = args.partition(" ")
    fmt = fmt.strip() or "json"
    if name not in STABLE or fmt not in ("json", "toml"):
        raise PluginError(f"trainsim:dataclass {args!r}: want one of {STABLE} and json|toml")
    import sim

    root = getattr(sim, name)
    return "\n\n".join(_class_table(cls, fmt) for cls in _dataclass_tree(root))


def _dataclass_tree(root: type) -> list[type]:
    """``root`` and every dataclass its fields refer to (depth first, each once)."""
    seen: list[type] = []

    def visit(cls: type) -> None:
        if cls in seen:
            return
        seen.append(cls)
        for hint in _hints(cls).values():
            for inner in _dataclasses_in(hint):
                visit(inner)

    visit(root)
    return seen


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception as exc:  # the nested classes' tables would vanish without a word
        raise PluginError(f"cannot resolve the field types of {cls.__name__}: {exc}") from exc


def _dataclasses_in(hint: Any) -> list[type]:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return [hint]
    return [c for arg in typing.get_args(hint) for c in _dataclasses_in(arg)]


def _class_table(cls: type, fmt: str) -> str:
    docs = field_docs(cls)
    intro = _class_summary(cls)
    rows = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    for f in dataclasses.fields(cls):
        rows.append(f"| `{f.name}` | {_type_text(f)} | {_default_text(f, fmt)} | "
                    f"{cell(docs.get(f.name, ''))} |")
    return f"### `{cls.__name__}`\n\n{intro}\n\n" + "\n".join(rows)


def _class_summary(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    if doc.startswith(f"{cls.__name__}("):  # dataclass's generated signature, not prose
        return ""
    doc = doc.split("\nAttributes:", 1)[0].strip()
    return rst_to_md(doc)


def _type_text(f: dataclasses.Field[Any]) -> str:
    text = f.type if isinstance(f.type, str) else _hint_text(f.type)
    return f"`{text}`"


def _hint_text(hint: Any) -> str:
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return " | ".join(_hint_text(a) for a in typing.get_args(hint))
    text = repr(hint).replace("typing.", "")
    return re.sub(r"\b[\w.]+\.(\w+)", r"\1", text)


def _default_text(f: dataclasses.Field[Any], fmt: str) -> str:
    if f.default is not dataclasses.MISSING:
        return f"`{_literal(f.default, fmt)}`"
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return f"see [`{type(value).__name__}`](#{type(value).__name__.lower()})"
        return f"`{_literal(value, fmt)}`"
    return "**required**"


def _literal(value: Any, fmt: str) -> str:
    if value is None:
        return "null" if fmt == "json" else "(unset)"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, tuple):
        value = list(value)
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> description, from the class docstring's ``Attributes:`` section and
    from the source: a comment block right above a field, a comment on its line(s), or a
    string literal right after it. Fields without any are absent."""
    docs = _attributes_section(inspect.getdoc(cls) or "")
    try:
        src = textwrap.dedent(inspect.getsource(cls))
        tree = ast.parse(src)
    except (OSError, TypeError, SyntaxError):
        return docs
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    lines = src.splitlines()
    comments = _comments(src)
    for i, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        parts = _comment_above(node.lineno, lines, comments)
        end = node.end_lineno or node.lineno
        parts += [comments[n] for n in range(node.lineno, end + 1)
                  if n in comments and not lines[n - 1].lstrip().startswith("#")]
        after = body[i + 1] if i + 1 < len(body) else None
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                and isinstance(after.value.value, str):
            parts.append(inspect.cleandoc(after.value.value))
        text = " ".join(p for p in parts if p)
        if text:
            docs[node.target.id] = rst_to_md(text)
    return docs


def _comments(src: str) -> dict[int, str]:
    out: dict[int, str] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.COMMENT:
                out[tok.start[0]] = tok.string.lstrip("#").strip()
    except (tokenize.TokenError, SyntaxError):
        pass
    return out


def _comment_above(lineno: int, lines: list[str], comments: dict[int, str]) -> list[str]:
    block: list[str] = []
    n = lineno - 1
    while n >= 1 and n in comments and lines[n - 1].lstrip().startswith("#"):
        block.insert(0, comments[n])
        n -= 1
    return block


def _attributes_section(doc: str) -> dict[str, str]:
    """Google-style ``Attributes:`` entries (``name: text`` or ``name (type): text``)."""
    out: dict[str, str] = {}
    if "\nAttributes:" not in doc:
        return out
    current = None
    for line in doc.split("\nAttributes:", 1)[1].splitlines():
        m = re.match(r"^\s{2,}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
        if m:
            current = m[1]
            out[current] = m[2]
        elif line.strip() and current and line.startswith(" " * 6):
            out[current] += " " + line.strip()
        elif line.strip() and not line.startswith(" "):
            break
    return {k: rst_to_md(v) for k, v in out.items()}


def rst_to_md(text: str) -> str:
    text = re.sub(r":\w+:`~?([^`]+)`", lambda m: f"`{m[1].split('.')[-1]}`", text)
    return text.replace("``", "`")


def cell(text: str) -> str:
    """Text for one table cell: one line, pipes outside code spans escaped."""
    parts = " ".join(text.split()).split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


# Zoo and hardware catalog ---------------------------------------------------------------
ZOO_COLUMNS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
               "vocab_size", "gated_mlp", "norm", "position_embedding", "num_experts", "top_k")


def _no_args(kind: str, args: str) -> None:
    if args.strip():
        raise PluginError(f"trainsim:{kind} takes no arguments, got {args!r}")


def zoo_marker(args: str) -> str:
    from sim import load_model

    _no_args("zoo", args)
    names = sorted(p.stem for p in (ROOT / "sim" / "data" / "models").glob("*.toml"))
    if not names:
        raise PluginError("no zoo models in sim/data/models")
    rows = ["| name | " + " | ".join(ZOO_COLUMNS) + " |", "|---" * (len(ZOO_COLUMNS) + 1) + "|"]
    for name in names:
        m = load_model(name)
        cells = [json.dumps(getattr(m, c)).strip('"') for c in ZOO_COLUMNS]
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def hardware_marker(args: str) -> str:
    _no_args("hardware", args)
    path = ROOT / "sim" / "data" / "hardware.csv"
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    devices = list(dict.fromkeys(r["device"] for r in rows))
    fields = list(dict.fromkeys(r["field"] for r in rows))
    value = {(r["device"], r["field"]): r["value"] for r in rows}
    out = ["| field | " + " | ".join(f"`{d}`" for d in devices) + " |",
           "|---" * (len(devices) + 1) + "|"]
    for fld in fields:
        out.append(f"| `{fld}` | " + " | ".join(value.get((d, fld), "") or "—"
                                               for d in devices) + " |")
    return "\n".join(out)
