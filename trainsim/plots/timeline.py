"""Gantt chart of a DES Chrome trace (``simulate --fidelity des --trace``): one row per
device stream, one colour per stream (the legend), time in milliseconds.

A reduced run simulates one data-parallel replica and draws a tensor-parallel group as its
first GPU; the trace's ``otherData`` (:func:`sim.des.trace.chrome_trace`) says how many
GPUs are drawn of how many, and the title repeats it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.des.trace import STREAMS
from sim.errors import SpecError
from sim.io import read_text
from trainsim.plots.output import pair_paths, save_figures

__all__ = ["Trace", "parse_trace", "read_trace", "timeline_figure", "plot_timeline",
           "MAX_ROWS"]

MAX_ROWS = 48
OTHER = "#c8c8c8"  # a stream not in STREAMS
Key = tuple[Any, Any]  # (pid, tid)


@dataclass(frozen=True)
class Trace:
    """What the chart draws: each stream's name and (start, duration) spans in ms, and the
    trace's ``otherData`` (empty for traces without it)."""

    names: dict[Key, str]
    spans: dict[Key, list[tuple[float, float]]]
    other: dict[str, Any]


def parse_trace(data: Any) -> Trace:
    """A Chrome trace's JSON object as a :class:`Trace` (TypeError, KeyError or ValueError
    when it is not one)."""
    events, other = data["traceEvents"], data.get("otherData", {})
    if not isinstance(events, list) or not isinstance(other, dict):
        raise TypeError("traceEvents must be a list, otherData an object")
    names = {(e["pid"], e["tid"]): str(e["args"]["name"]) for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans: dict[Key, list[tuple[float, float]]] = {k: [] for k in names}
    for e in events:
        if e.get("ph") == "X" and (e["pid"], e["tid"]) in spans:
            spans[(e["pid"], e["tid"])].append((float(e["ts"]) / 1e3, float(e["dur"]) / 1e3))
    return Trace(names, spans, other)


def read_trace(path: Path) -> Trace:
    try:
        return parse_trace(json.loads(read_text(path, "trace")))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        raise SpecError("trace", f"{path} is not a Chrome trace with traceEvents") from None


def _title(name: str, other: dict[str, Any], rows: int, shown: int) -> str:
    lines = [f"DES timeline of one iteration ({name})"]
    if other.get("note"):
        lines.append(str(other["note"]))
    if shown < rows:
        lines.append(f"first {shown} of {rows} device streams")
    return "\n".join(lines)


def timeline_figure(trace: Trace, name: str = "trace", max_rows: int = MAX_ROWS) -> Any:
    """The Gantt chart's Figure: rows are device streams (at most ``max_rows``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names = trace.names
    rows = sorted(names, key=lambda k: k[1])[:max_rows]
    palette = plt.get_cmap("tab10")
    colors = {s: palette(i) for i, s in enumerate(STREAMS)}
    fig, ax = plt.subplots(figsize=(12, 0.3 * len(rows) + 2.4))
    drawn: set[str] = set()
    for y, key in enumerate(rows):
        stream = (names[key].split() or ["other"])[-1]
        drawn.add(stream if stream in colors else "other")
        ax.broken_barh(trace.spans[key], (y - 0.4, 0.8), color=colors.get(stream, OTHER))
    ax.set_yticks(range(len(rows)), [names[k] for k in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time since the iteration started (ms)")
    ax.set_ylabel("device stream (gpu, stream)")
    handles = [Patch(color=colors.get(s, OTHER), label=s)
               for s in (*STREAMS, "other") if s in drawn]
    ax.legend(handles=handles, title="stream", fontsize=7, title_fontsize=7,
              loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(_title(name, trace.other, len(names), len(rows)), fontsize=9)
    fig.tight_layout()
    return fig


def plot_timeline(trace: Path, path: Path, max_rows: int = MAX_ROWS, also_svg: bool = False
                  ) -> list[Path]:
    """Write the Gantt chart of ``trace`` to ``path`` (and with ``also_svg`` the PNG and
    the SVG beside each other); the files written."""
    fig = timeline_figure(read_trace(trace), trace.name, max_rows)
    return save_figures(fig, pair_paths(path) if also_svg else [path])
