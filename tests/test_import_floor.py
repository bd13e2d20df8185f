"""The house's floors: packages and ``sim/`` subpackages import only downwards, and no module
imports another that (directly or not) imports it back. Every import counts, also those
inside functions: a lazy import still ties two modules together.

``sim/`` floors, bottom to top: the root helpers (errors, io, result) <- spec <- layout <-
cost <- network <- analytic, des <- api <- the package itself. Packages: sim <- profiler,
optimizer, executor <- trainsim (no library package imports the front door).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "profiler", "optimizer", "executor", "trainsim")
SIM_FLOORS = {"sim.errors": 0, "sim.io": 0, "sim.result": 0, "sim.spec": 1, "sim.layout": 2,
              "sim.cost": 3, "sim.network": 4, "sim.analytic": 5, "sim.des": 5, "sim.api": 6,
              "sim": 7}
# Which packages each may import (besides itself).
PACKAGE_DEPS = {"sim": set(), "profiler": {"sim"}, "optimizer": {"sim"},
                "executor": {"sim", "profiler"}, "trainsim": set(PACKAGES) - {"trainsim"}}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _absolute(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    """The absolute module a ``from`` import names, relative ones (``from ..api``) resolved
    against the importing module ``here``."""
    if not node.level:
        return node.module or ""
    parts = here.split(".") if is_package else here.split(".")[:-1]
    base = parts[:len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(node: ast.AST, here: str, known: dict[str, Path]) -> list[str]:
    """Project modules an import statement names (``from a import b`` names ``a.b`` when
    that is a module, else ``a``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] in PACKAGES]
    if not isinstance(node, ast.ImportFrom):
        return []
    module = _absolute(node, here, known[here].name == "__init__.py")
    if module.split(".")[0] not in PACKAGES:
        return []
    return [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module
            for a in node.names]


def _graph() -> nx.DiGraph:
    known = _modules()
    g = nx.DiGraph()
    g.add_nodes_from(known)
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _targets(node, name, known):
                if target != name:
                    g.add_edge(name, target)
    return g


GRAPH = _graph()


def _floor(module: str) -> int:
    """The floor of a ``sim`` module: that of its longest listed prefix."""
    best = max((p for p in SIM_FLOORS if module == p or module.startswith(p + ".")), key=len)
    return SIM_FLOORS[best]


def test_graph_sees_the_project() -> None:
    assert GRAPH.has_edge("sim", "sim.api")
    assert GRAPH.number_of_edges() > 100


def test_relative_imports_resolve() -> None:
    """A relative import counts as the absolute one it stands for."""
    known = _modules()
    lazy = ast.parse("def f():\n    from ..api import simulate\n    from . import comm\n")
    nodes = [n for n in ast.walk(lazy) if isinstance(n, ast.ImportFrom)]
    assert _targets(nodes[0], "sim.des.comm", known) == ["sim.api"]
    assert _targets(nodes[1], "sim.des.comm", known) == ["sim.des.comm"]
    assert _targets(nodes[1], "sim.des", known) == ["sim.des.comm"]


def test_no_import_circles() -> None:
    circles = [sorted(c) for c in nx.strongly_connected_components(GRAPH) if len(c) > 1]
    assert circles == []


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_import_downwards(package: str) -> None:
    up = sorted((a, b) for a, b in GRAPH.edges if a.split(".")[0] == package
                and b.split(".")[0] not in PACKAGE_DEPS[package] | {package})
    assert up == []


def test_sim_subpackages_import_downwards() -> None:
    """spec <- layout <- cost <- network <- analytic/des <- api; analytic and des share a
    floor but do not import each other."""
    sim_edges = [(a, b) for a, b in GRAPH.edges if a.startswith("sim") and b.startswith("sim")]
    up = [(a, b) for a, b in sim_edges if _floor(b) > _floor(a)]
    across = [(a, b) for a, b in sim_edges if _floor(a) == _floor(b) == 5
              and a.split(".")[1] != b.split(".")[1]]
    assert up == [] and across == []


def test_sim_root_is_small() -> None:
    assert len(list((ROOT / "sim").glob("*.py"))) <= 6


def _too_long() -> tuple[list[str], list[str]]:
    """Modules over 400 lines and functions over 60, in every package, tests and
    experiments (the house's size rules)."""
    modules, functions = [], []
    for folder in (*PACKAGES, "tests", "experiments", "docs"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            name = str(path.relative_to(ROOT))
            if len(text.splitlines()) > 400:
                modules.append(name)
            functions += [f"{name}:{node.name}" for node in ast.walk(ast.parse(text))
                          if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                          and (node.end_lineno or node.lineno) - node.lineno + 1 > 60]
    return modules, functions


def test_modules_and_functions_are_short() -> None:
    assert _too_long() == ([], [])
