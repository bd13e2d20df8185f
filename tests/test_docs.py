"""The documentation works: every command of the 5-minute tour (the README's and the site's)
runs for real and writes the files it promises, and the site builds with
``mkdocs build --strict`` (generated references and results tables included)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Where each tour is: a file and the heading of its section (None: the whole file).
TOURS = {"README.md": "## 5-minute tour", "docs/tour.md": None}
# What the tour must show (issue: simulate; des + trace; optimize + export; a sweep + plot).
TOUR_MUST_SHOW = [("simulate",), ("simulate", "--fidelity", "des", "--trace"), ("optimize",),
                  ("export",), ("sweep",), ("plot", "sweep")]


def tour_commands(path: str, heading: str | None) -> list[list[str]]:
    """The ``trainsim ...`` lines of the ```sh blocks of a tour, split like a shell would."""
    text = (ROOT / path).read_text(encoding="utf-8")
    if heading is not None:
        assert heading in text, f"{path} has no section {heading!r}"
        text = text.split(heading, 1)[1].split("\n## ", 1)[0]
    fences = re.findall(r"^```(\w*)\n", text, flags=re.M)[::2]  # opening fences only
    assert set(fences) <= {"sh"}, f"{path}: a tour's blocks are ```sh, got {fences}"
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            args = shlex.split(line, comments=True)
            assert args[:1] in ([], ["trainsim"]), f"{path}: not a trainsim command: {line}"
            if args:
                commands.append(args)
    return commands


def _option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args[:-1] else None


def promised_files(args: list[str]) -> list[str]:
    """Paths (relative to the working folder) a tour command promises to write."""
    command, out = " ".join(args[1:3]), _option(args, "--out")
    files = [f for f in [_option(args, "--trace")] if f]
    if out is None:
        return files
    if command.startswith("plot "):
        return files + [out, str(Path(out).with_suffix(".svg"))]
    inside = {"simulate": ["inputs.json", "result.json", "summary.txt"],
              "optimize": ["best_plan.json", "plans.csv", "report.json"],
              "sweep": ["points.jsonl", "results.json", "results.csv", "summary.json"]}
    names = inside.get(args[1])
    return files + ([f"{out}/{n}" for n in names] if names else [out])


def _tours() -> dict[tuple[str, ...], list[list[str]]]:
    """Each distinct tour (identical tours run once), keyed by the files that hold it."""
    by_commands: dict[str, tuple[list[str], list[list[str]]]] = {}
    for path, heading in TOURS.items():
        commands = tour_commands(path, heading)
        key = repr(commands)
        by_commands.setdefault(key, ([], commands))[0].append(path)
    return {tuple(paths): commands for paths, commands in by_commands.values()}


@pytest.mark.parametrize("path", TOURS)
def test_tour_shows_the_main_jobs(path):
    commands = tour_commands(path, TOURS[path])
    for words in TOUR_MUST_SHOW:
        assert any(a[1] == words[0] and all(w in a for w in words) for a in commands), \
            (path, words)


@pytest.mark.parametrize("paths", list(_tours()), ids=lambda p: "+".join(p))
def test_tour_commands_run(tmp_path, paths):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), "MPLBACKEND": "Agg"}
    for args in _tours()[paths]:
        proc = subprocess.run([sys.executable, "-m", "trainsim", *args[1:]], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, env=env)
        shown = " ".join(args)
        assert proc.returncode == 0, f"{shown}\nexit {proc.returncode}\n{proc.stderr}"
        for name in promised_files(args):
            path = tmp_path / name
            assert path.exists(), f"{shown} did not write {name}"
            assert path.is_file() or any(path.iterdir()), f"{shown} wrote an empty {name}"


def test_promised_files():
    assert promised_files(["trainsim", "plot", "sweep", "r", "--out", "a/b.png"]) == \
        ["a/b.png", "a/b.svg"]
    assert promised_files(["trainsim", "simulate", "--trace", "t.json"]) == ["t.json"]
    assert promised_files(["trainsim", "export", "--out", "e"]) == ["e"]


PATH_IN_CODE = re.compile(
    r"`((?:sim|profiler|optimizer|executor|trainsim|tests|experiments|docs|examples)/[\w./*-]*)`")


def test_paths_named_in_the_docs_exist():
    """Every repository path the README, the site and the notes name in code exists, so a
    moved module shows up here rather than as a stale page."""
    pages = [ROOT / "README.md", ROOT / "experiments" / "NOTES.md",
             *sorted((ROOT / "docs").rglob("*.md"))]
    missing = []
    for page in pages:
        for name in PATH_IN_CODE.findall(page.read_text(encoding="utf-8")):
            name = name.rstrip("/")
            found = any(ROOT.glob(name)) if "*" in name else \
                (ROOT / name).exists() or (ROOT / f"{name}.py").exists()
            if not found:
                missing.append(f"{page.relative_to(ROOT)}: {name}")
    assert missing == []


def test_docs_build_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[dev]')")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in ("reference/plan", "reference/cluster", "validation/megatron", "notes"):
        assert (tmp_path / "site" / page / "index.html").is_file(), page
    plan = (tmp_path / "site" / "reference" / "plan" / "index.html").read_text(encoding="utf-8")
    assert "global_batch_size" in plan and "micro_batches_per_replica" in plan


def test_readme_python_example_runs():
    """The README's ``python`` blocks run as written."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


def test_malformed_markers_fail_the_build():
    """A marker the hook cannot read is an error, not a silently missing table."""
    from types import SimpleNamespace

    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import gen_pages
        from mkdocs.exceptions import PluginError
    except ImportError:
        pytest.skip("mkdocs is not installed (pip install -e '.[dev]')")
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    page = SimpleNamespace(file=SimpleNamespace(src_uri="x.md"))
    for bad in ("<!-- trainsim: dataclass Plan -->", "<!-- trainsim:Dataclass Plan -->",
                "<!-- trainsim_dataclass Plan -->", "<!-- trainsim:zoo bogus -->",
                "<!-- trainsim:nosuch -->"):
        with pytest.raises(PluginError):
            gen_pages.on_page_markdown(bad, page, None, None)


PATH_IN_PY = re.compile(r"(?<![\w/.])((?:sim|profiler|optimizer|executor|trainsim|tests|"
                        r"experiments|docs)/[a-z0-9_/.-]*\.(?:py|md|csv|toml|json|png))")


def test_paths_named_in_the_code_exist():
    """Docstrings and comments that name a repository file name one that exists."""
    missing = []
    for package in ("sim", "profiler", "optimizer", "executor", "trainsim", "tests",
                    "experiments", "docs"):
        for source in sorted((ROOT / package).rglob("*.py")):
            for name in PATH_IN_PY.findall(source.read_text(encoding="utf-8")):
                if not (ROOT / name).exists():
                    missing.append(f"{source.relative_to(ROOT)}: {name}")
    assert missing == []
