"""matplotlib figures of results (imported lazily: simulating needs no plotting)."""

from __future__ import annotations

from pathlib import Path

from sim.result import BREAKDOWN_KINDS, Result

__all__ = ["plot_breakdown", "breakdown_bars", "plot_timeline", "draw_topology", "save_figure"]


def plot_breakdown(results: list[tuple[str, Result]], path: Path) -> Path:
    """Horizontal stacked bars: each scenario's critical path as a share of its iteration."""
    rows = [(label, dict(r.breakdown), r.iteration_time_s) for label, r in results]
    return save_figure(_bars(rows, share=True), path)


def breakdown_bars(rows: list[tuple[str, dict[str, float], float]], path: Path,
                   share: bool = False) -> list[Path]:
    """Horizontal stacked bars of (label, seconds by kind, iteration seconds): seconds on
    the critical path, or with ``share`` each kind's percentage of its iteration; written
    as PNG and SVG beside each other."""
    fig = _bars(rows, share)
    svg = save_figure(fig, path.with_suffix(".svg"))
    return [save_figure(fig, path.with_suffix(".png")), svg]


def _bars(rows: list[tuple[str, dict[str, float], float]], share: bool) -> object:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.6 * len(rows) + 1.6))
    labels = [label for label, _, _ in rows]
    left = [0.0] * len(rows)
    for kind in BREAKDOWN_KINDS:
        width = [(100 * b.get(kind, 0.0) / it if share else b.get(kind, 0.0))
                 for _, b, it in rows]
        ax.barh(labels, width, left=left, label=kind)
        left = [a + w for a, w in zip(left, width, strict=True)]
    ax.set_xlabel("share of iteration time (%)" if share else "seconds per iteration")
    ax.invert_yaxis()
    ax.legend(ncol=4, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    return fig


def save_figure(fig: object, path: Path) -> Path:
    """Write a figure atomically (a temporary file renamed over ``path``) and close it."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
    fig.savefig(tmp, dpi=120)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    tmp.replace(path)
    return path


def plot_timeline(trace: Path, path: Path, max_rows: int = 48, also_svg: bool = False
                  ) -> list[Path]:
    """Gantt chart of a Chrome trace: one row per device stream, colour per stream; the
    files written (``path``, and with ``also_svg`` an SVG beside it)."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sim.errors import SpecError
    from sim.io import read_text

    try:
        events = json.loads(read_text(trace, "trace"))["traceEvents"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise SpecError("trace", f"{trace} is not a Chrome trace with traceEvents") from None
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    rows = sorted(names, key=lambda k: k[1])[:max_rows]
    palette = plt.get_cmap("tab10")
    colors = {s: palette(i) for i, s in enumerate(("compute", "tp", "cp", "ep", "pp", "dp",
                                                    "optimizer", "send"))}
    fig, ax = plt.subplots(figsize=(12, 0.3 * len(rows) + 1.5))
    for y, key in enumerate(rows):
        spans = [(e["ts"] / 1e3, e["dur"] / 1e3) for e in events
                 if e.get("ph") == "X" and (e["pid"], e["tid"]) == key]
        stream = names[key].split()[-1]
        ax.broken_barh(spans, (y - 0.4, 0.8), color=colors.get(stream, "grey"))
    ax.set_yticks(range(len(rows)), [names[k] for k in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    fig.tight_layout()
    svg = [save_figure(fig, path.with_suffix(".svg"))] if also_svg else []
    return [save_figure(fig, path), *svg]


def draw_topology(topo: object, path: Path) -> Path:
    """The network at node level (a node's devices and NICs drawn as one vertex)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    graph = topo.graph  # type: ignore[attr-defined]
    cluster = topo.cluster  # type: ignore[attr-defined]

    def group(v: object) -> object:
        if isinstance(v, int):
            return ("node", v // cluster.gpus_per_node)
        if v[0] in ("sw", "nic", "rt"):  # type: ignore[index]
            return ("node", v[1])  # type: ignore[index]
        return v

    g = nx.Graph()
    for u, v in graph.edges:
        a, b = group(u), group(v)
        if a != b:
            g.add_edge(a, b)
    g.add_nodes_from(group(v) for v in graph.nodes)
    fig, ax = plt.subplots(figsize=(10, 7))
    pos = nx.spring_layout(g, seed=0)
    kinds = [str(v[0]) for v in g.nodes]
    palette = {k: i for i, k in enumerate(sorted(set(kinds)))}
    nx.draw_networkx(g, pos, ax=ax, node_size=60, with_labels=g.number_of_nodes() <= 40,
                     font_size=6, node_color=[palette[k] for k in kinds], cmap="tab10")
    ax.set_title(f"{cluster.name} ({cluster.inter_node.topology}), node level")
    ax.axis("off")
    return save_figure(fig, path)
