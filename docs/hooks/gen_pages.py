"""MkDocs hook: the pages that must not drift from the code and the measurements.

* ``experiments/NOTES.md`` (the measurement diaries) becomes the page ``notes.md``, and the
  figures in ``experiments/results/*.png`` become ``validation/results/*.png``.
* ``<!-- trainsim:dataclass NAME FORMAT -->`` in a page becomes field tables generated from
  the dataclass ``NAME`` (``ModelSpec``, ``ClusterSpec``, ``Plan`` or ``Result``, imported as
  ``from sim import ...``) and every dataclass nested in its fields, reached through
  ``typing.get_type_hints`` (never by module path). Field descriptions come from the class
  docstring's ``Attributes:`` section, a comment block right above the field, a comment on
  its line, or a string right after it; a field without one still gets its row.
  ``FORMAT`` (``toml`` or ``json``) says how defaults are written.
* ``<!-- trainsim:zoo -->`` becomes the table of zoo models (``sim/data/models/*.toml``, each
  loaded with ``sim.load_model``); ``<!-- trainsim:hardware -->`` the hardware catalog
  (``sim/data/hardware.csv``).
* ``<!-- trainsim:modules PACKAGE -->`` (e.g. ``sim/des``) becomes a table of the package's
  modules, each with the first paragraph of its docstring (read with ``ast``, not imported),
  so the architecture pages list the modules that exist.
* ``<!-- trainsim:csv FILE | COMMAND -->`` becomes a table of ``experiments/results/FILE``
  and the command that writes it (``COMMAND`` starts with ``experiments/SCRIPT.py``, which
  must exist). ``<!-- trainsim:other-csvs -->`` lists every CSV no page names.

Anything unknown or missing raises, so ``mkdocs build --strict`` fails instead of drifting.
"""

from __future__ import annotations

import ast
import csv
import math
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from reference_tables import cell, dataclass_marker, hardware_marker, rst_to_md, zoo_marker

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"
NOTES = ROOT / "experiments" / "NOTES.md"
MARKER = re.compile(r"<!--\s*trainsim:(?P<kind>[a-z-]+)\s*(?P<args>.*?)\s*-->")
# Anything that looks like a marker (any case, any separator): it must parse as one.
LOOSE = re.compile(r"<!--\s*trainsim[\W_].*?-->", re.I | re.S)
LONG_TABLE_ROWS = 25  # longer tables are folded
MAX_CELL = 70  # characters of a CSV cell shown

_named_csvs: set[str] = set()


# mkdocs events --------------------------------------------------------------------------
def on_files(files: Files, config: Any) -> Files:
    """Add the notes page and the result figures to the site."""
    if not NOTES.is_file():
        raise PluginError(f"{NOTES} is missing (the measurement notes page)")
    _named_csvs.clear()
    for f in files.documentation_pages():
        if f.abs_src_path:
            text = Path(f.abs_src_path).read_text(encoding="utf-8")
            _named_csvs.update(m["args"].partition("|")[0].strip() for m in MARKER.finditer(text)
                               if m["kind"] == "csv")
    files.append(File.generated(config, "notes.md", abs_src_path=str(NOTES)))
    for png in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"validation/results/{png.name}",
                                    abs_src_path=str(png)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    for loose in LOOSE.finditer(markdown):
        if not MARKER.fullmatch(loose.group(0)):
            raise PluginError(f"{page.file.src_uri}: malformed marker {loose.group(0)!r} "
                              "(want <!-- trainsim:KIND ARGS -->)")
    return MARKER.sub(lambda m: _expand(m["kind"], m["args"], page.file.src_uri), markdown)


def on_pre_build(config: Any) -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def on_serve(server: Any, config: Any, builder: Any) -> Any:
    for path in (NOTES, RESULTS, ROOT / "sim"):
        server.watch(str(path))
    return server


def _expand(kind: str, args: str, where: str) -> str:
    handlers = {"dataclass": dataclass_marker, "modules": _modules_marker, "csv": _csv_marker,
                "zoo": zoo_marker, "hardware": hardware_marker,
                "other-csvs": _other_csvs_marker}
    if kind not in handlers:
        raise PluginError(f"{where}: unknown marker trainsim:{kind}")
    try:
        return handlers[kind](args)
    except PluginError as exc:
        raise PluginError(f"{where}: {exc}") from None


# Module tables ---------------------------------------------------------------------------
def _modules_marker(args: str) -> str:
    where, _, flat = args.strip().partition(" ")
    package = ROOT / where
    if not where or not (package / "__init__.py").is_file() or flat not in ("", "flat"):
        raise PluginError(f"trainsim:modules {args!r}: want a package of this repository "
                          "and optionally 'flat'")
    rows = ["| module | what it owns |", "| --- | --- |"]
    for path in sorted(package.glob("*.py") if flat else package.rglob("*.py")):
        summary = _summary(path)
        if path.stem in ("__init__", "__main__") and (path.parent == package or summary == "—"):
            continue
        name = path.relative_to(package).with_suffix("").as_posix().removesuffix("/__init__")
        rows.append(f"| `{name}` | {cell(summary)} |")
    return "\n".join(rows)


def _summary(path: Path) -> str:
    """The first paragraph of a module's docstring, without doctest examples."""
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    except SyntaxError:
        return "(does not parse)"
    first = doc.strip().split("\n\n", 1)[0]
    return rst_to_md(first) if first and not first.startswith(">>>") else "—"


# Results tables -------------------------------------------------------------------------
def _csv_marker(args: str) -> str:
    name, sep, command = (s.strip() for s in args.partition("|"))
    path = RESULTS / name
    if not sep or not command:
        raise PluginError(f"trainsim:csv {args!r}: write FILE | COMMAND")
    script = ROOT / command.split()[0]
    if not path.is_file():
        raise PluginError(f"experiments/results/{name} does not exist")
    if not (script.is_file() and script.parent.name == "experiments"):
        raise PluginError(f"{command.split()[0]}: no such script in experiments/")
    return _csv_section(path, f"`{command}`")


def _csv_section(path: Path, made_by: str) -> str:
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return f"`experiments/results/{path.name}` is empty."
    header, body = rows[0], rows[1:]
    table = ["| " + " | ".join(f"`{h}`" for h in header) + " |",
             "|" + "|".join("---:" if _numeric(body, i) else "---" for i in range(len(header)))
             + "|"]
    table += ["| " + " | ".join(_csv_cell(c) for c in r) + " |" for r in body]
    caption = f"`experiments/results/{path.name}`, written by {made_by} ({len(body)} rows)."
    if len(body) <= LONG_TABLE_ROWS:
        return caption + "\n\n" + "\n".join(table)
    folded = textwrap.indent("\n".join(table), "    ")
    return f'{caption}\n\n??? note "All {len(body)} rows"\n\n{folded}'


def _numeric(body: list[list[str]], col: int) -> bool:
    cells = [r[col] for r in body if col < len(r) and r[col] != ""]
    return bool(cells) and all(_as_float(c) is not None for c in cells)


def _as_float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _csv_cell(text: str) -> str:
    number = _as_float(text)
    if number is not None and len(text) > 9 and math.isfinite(number) \
            and not text.lstrip("-").isdigit():
        text = f"{number:.6g}"
    if len(text) > MAX_CELL:
        text = text[:MAX_CELL - 1] + "…"
    return cell(text)


def _other_csvs_marker(args: str) -> str:
    """Every results CSV that no page names (collected in :func:`on_files`)."""
    if args.strip():
        raise PluginError(f"trainsim:other-csvs takes no arguments, got {args!r}")
    rest = [p for p in sorted(RESULTS.glob("*.csv")) if p.name not in _named_csvs]
    if not rest:
        return "Every results table has its page."
    return "\n\n".join(f"### `{p.name}`\n\n" + _csv_section(p, "a script in `experiments/`")
                       for p in rest)
