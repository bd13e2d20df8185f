"""Where a figure goes: the output path checked before any work, and the files written
atomically (all of a figure's files, or none).

Rules (each broken one is a :class:`~sim.errors.SpecError` naming the option): the path
ends in one of the command's suffixes (``.png``, and ``.svg`` where the command takes it);
it is not a directory; its folder exists or can be created (the nearest existing ancestor
is a writable folder). Commands that write PNG and SVG beside each other take either name
and check both.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sim.errors import SpecError

__all__ = ["FIGURE_SUFFIXES", "check_out", "check_pair", "pair_paths", "save_figure",
           "save_figures"]

FIGURE_SUFFIXES = (".png", ".svg")


def check_out(name: str | Path, option: str, suffixes: tuple[str, ...] = FIGURE_SUFFIXES
              ) -> Path:
    """``name`` as a figure file to write, or a SpecError naming ``option`` and the rule."""
    path = Path(name)
    wanted = " or ".join(suffixes)
    if path.is_dir():
        raise SpecError(option, f"{str(name)!r} is a folder; give a file name ending in "
                        f"{wanted}")
    if path.suffix.lower() not in suffixes:
        raise SpecError(option, f"must end in {wanted}, got {str(name)!r}")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise SpecError(option, f"cannot create the folder of {str(name)!r}: {folder} is a "
                        "file")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SpecError(option, f"cannot write in {folder} (permission denied)")
    return path


def pair_paths(path: Path) -> list[Path]:
    """The PNG and the SVG written for ``path`` (either name)."""
    return [path.with_suffix(".png"), path.with_suffix(".svg")]


def check_pair(name: str | Path, option: str) -> Path:
    """``name`` (.png or .svg) for a command that writes both, each checked."""
    path = check_out(name, option)
    for other in pair_paths(path):
        check_out(other, option)
    return path


def save_figures(fig: Any, paths: list[Path]) -> list[Path]:
    """Write a figure to every path (format by suffix) and close it: each to a temporary
    file first, renamed over its path only once all are written; on failure none is left."""
    import matplotlib.pyplot as plt

    tmps = [p.with_name(f".{p.name}.tmp{p.suffix}") for p in paths]
    made = sorted({d for p in paths for d in (p.parent, *p.parent.parents) if not d.exists()},
                  key=lambda d: len(d.parts), reverse=True)  # deepest first
    try:
        for path, tmp in zip(paths, tmps, strict=True):
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(tmp, dpi=120)
        for path, tmp in zip(paths, tmps, strict=True):
            tmp.replace(path)
    except BaseException:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        for folder in made:  # the folders made for this figure, if empty
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    finally:
        plt.close(fig)
    return paths


def save_figure(fig: Any, path: Path) -> Path:
    """Write a figure atomically (a temporary file renamed over ``path``) and close it."""
    return save_figures(fig, [path])[0]
