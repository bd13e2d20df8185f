"""File I/O for inputs and results: decoding errors become SpecErrors, and writes are atomic.

A reader never sees a half-written file, and a failed write leaves what was there intact.
"""

from __future__ import annotations

import os
import tempfile
import tomllib
from pathlib import Path

from sim.errors import SpecError

__all__ = ["read_text", "atomic_write_text", "atomic_write_files", "table_fields",
           "read_chrome_trace"]


def table_fields(data: dict, key: str, cls: type) -> dict:
    """The TOML table ``data[key]`` (empty if absent), checked to be a table whose keys are
    fields of the dataclass ``cls``; an unknown key is named with the known ones."""
    import dataclasses

    from sim.errors import field_name

    sub = data.get(key, {})
    if not isinstance(sub, dict):
        raise SpecError(key, "must be a TOML table")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(sub) - known)
    if unknown:
        raise SpecError(f"{key}.{field_name(unknown[0])}",
                        f"unknown field (known: {', '.join(sorted(known))})")
    return dict(sub)


def read_toml(path: Path, what: str, label: str) -> dict:
    """The parsed TOML of an input file (errors as :func:`read_text`'s; invalid TOML names
    ``label``, e.g. ``cluster[a.toml]``)."""
    try:
        return tomllib.loads(read_text(path, what))
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(label, f"not valid TOML: {exc}") from None


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of an input file; ``what`` names it in errors (e.g. ``plan``)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(what, f"{path} is not UTF-8 text ({exc.reason} at byte "
                        f"{exc.start})") from None
    except FileNotFoundError:
        raise SpecError(what, f"no such file: {path}") from None
    except OSError as exc:
        raise SpecError(what, f"cannot read {path}: {exc.strerror}") from None


def read_chrome_trace(path: Path, what: str) -> list[dict]:
    """The complete (``ph: X``) events of a Chrome trace (what torch.profiler's
    ``export_chrome_trace`` writes); ``what`` names the input in errors."""
    import json

    try:
        data = json.loads(read_text(path, what))
    except json.JSONDecodeError as exc:
        raise SpecError(what, f"{path} is not valid JSON: {exc}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise SpecError(what, f"{path} has no traceEvents list (not a Chrome trace)")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]


def _file_mode() -> int:
    """What ``open()`` would give a new file under the current umask (mkstemp gives 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


_MODE = _file_mode()


def _stage(path: Path, text: str) -> str:
    """Write ``text`` to a fsynced temporary file beside ``path``; return its name."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, _MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def atomic_write_files(files: dict[Path, str]) -> None:
    """Write several files all-or-nothing: every target is checked and every text staged
    before the first one replaces anything. OSErrors name the target path."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, text in files.items():
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                if path.exists() and not path.is_file():
                    raise IsADirectoryError(21, "exists and is not a regular file")
                staged.append((_stage(path, text), path))
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, str(path)) from None
        for tmp, path in staged:
            os.replace(tmp, path)
    finally:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    """Write one file atomically (see :func:`atomic_write_files`)."""
    atomic_write_files({path: text})
