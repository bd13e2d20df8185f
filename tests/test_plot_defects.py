"""Defects a new user hit in the plots, each pinned: a bad output path is one line and exit 2
with nothing written; every figure has a title, axis labels and a legend; the heat map's
colours are on a fixed 0-100% scale; the topology is drawn in layers with readable labels
and link rates; a timeline of a reduced run says which GPUs it shows."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import matplotlib
import pytest
from helpers.cli import assert_bad_input, cli

from sim import Plan, load_cluster, load_model
from sim.cost.profiled import cost_model_for
from sim.des.run import simulate_des
from sim.des.trace import chrome_trace
from sim.network.topology import build_topology
from sim.result import BREAKDOWN_KINDS
from trainsim.plots.figures import breakdown_figure
from trainsim.plots.labels import metric_label, param_label
from trainsim.plots.layers import layered_positions, tier_of, vertex_label
from trainsim.plots.links import links_figure
from trainsim.plots.output import save_figures
from trainsim.plots.search import pareto_figure, top_breakdown_figure
from trainsim.plots.sweep import sensitivity_figure, sweep_figure
from trainsim.plots.timeline import parse_trace, timeline_figure
from trainsim.plots.topology import drawn_vertices, shown_nodes, topology_figure

matplotlib.use("Agg")


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _labelled(fig: Any) -> Any:
    """The figure's main axes, after checking its title, both axis labels and a legend."""
    ax = fig.axes[0]
    assert ax.get_title(), "no title"
    assert ax.get_xlabel() and ax.get_ylabel(), (ax.get_xlabel(), ax.get_ylabel())
    assert ax.get_legend() is not None, "no legend"
    return ax


# 1. bad output paths -----------------------------------------------------------------------
COMMANDS = {  # each with an input that does not exist: the output is checked first
    "topology": (["topology", "--cluster", "dgx-h100:2", "--no-bisection"], "--png",
                 ".png"),
    "timeline": (["plot", "timeline", "missing.json"], "--out", ".png or .svg"),
    "breakdown": (["plot", "breakdown", "missing.json"], "--out", ".png or .svg"),
    "sweep": (["plot", "sweep", "missing", "--x", "tp"], "--out", ".png or .svg"),
    "sensitivity": (["plot", "sensitivity", "missing"], "--out", ".png or .svg"),
    "links": (["plot", "links", "--model", "tiny", "--cluster", "cpu:2", "--plan",
               "missing.json"], "--out", ".png or .svg"),
}
BAD = {"a folder": ("folder", "is a folder"), "a .txt file": ("x.txt", "must end in"),
       "under a file": ("afile/x.png", "is a file"), "no suffix": ("plot", "must end in")}


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_bad_output_path_is_one_line_and_writes_nothing(capsys, tmp_path, monkeypatch,
                                                        command, bad):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    (tmp_path / "afile").write_text("x")
    args, option, suffixes = COMMANDS[command]
    name, rule = BAD[bad]
    before = _files(tmp_path)
    rc, out, err = cli(capsys, *args, option, name)
    assert_bad_input(rc, out, err, f"{option}: ", rule)
    if rule == "must end in":
        assert suffixes in err
    assert _files(tmp_path) == before


def test_the_svg_beside_a_png_is_checked_too(capsys, tmp_path):
    (tmp_path / "t.svg").mkdir()  # the SVG that `--out t.png` would also write
    rc, out, err = cli(capsys, "plot", "timeline", "missing.json", "--out",
                       str(tmp_path / "t.png"))
    assert_bad_input(rc, out, err, "--out: ", "t.svg' is a folder")


def test_topology_png_makes_its_folder_and_leaves_nothing_else(capsys, tmp_path):
    target = tmp_path / "new" / "sub" / "net.png"
    rc, out, err = cli(capsys, "topology", "--cluster", "dgx-h100:2", "--no-bisection",
                       "--png", str(target))
    assert (rc, err) == (0, "") and f"wrote {target}" in out
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _files(tmp_path) == {"new", "new/sub", "new/sub/net.png"}


def test_a_failed_save_leaves_no_file_and_no_new_folder(tmp_path):
    fig = breakdown_figure([("a", {"compute": 1.0}, 1.0)])
    calls: list[Path] = []

    def savefig(path: Path, **_: Any) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        path.write_bytes(b"half")

    fig.savefig = savefig
    with pytest.raises(OSError, match="disk full"):
        save_figures(fig, [tmp_path / "new" / "b.png", tmp_path / "new" / "b.svg"])
    assert len(calls) == 2 and _files(tmp_path) == set()


def test_timeline_of_a_bad_trace_is_one_line(capsys, tmp_path):
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": 5}))
    rc, out, err = cli(capsys, "plot", "timeline", str(tmp_path / "t.json"), "--out",
                       str(tmp_path / "t.png"))
    assert_bad_input(rc, out, err, "trace: ", "is not a Chrome trace")
    assert _files(tmp_path) == {"t.json"}


# 2. titles, axis labels with units, legends -------------------------------------------------
def test_breakdown_has_title_labels_and_legend():
    ax = _labelled(breakdown_figure([("a", {"compute": 0.6, "dp": 0.4}, 1.0)], share=True))
    assert "(%)" in ax.get_xlabel()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(BREAKDOWN_KINDS)
    ax = _labelled(breakdown_figure([("a", {"compute": 0.6}, 1.0)], title="mine"))
    assert ax.get_title() == "mine" and "(s)" in ax.get_xlabel()


def _sweep_rows() -> list[dict[str, Any]]:
    return [{"status": "ok", "params": {"tp": tp, "inter_node.nic_Gbps": nic},
             "iteration_time_s": 8.0 / tp + 100 / nic, "breakdown": {"dp": 1.0 / nic}}
            for tp in (1, 2, 4) for nic in (100, 400)]


def test_sweep_axes_are_human_labels_with_units():
    ax = _labelled(sweep_figure(_sweep_rows(), "tp", "iteration_time_s", None, []))
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("Tensor-parallel degree",
                                                  "Iteration time (s)")
    assert ax.get_title() == "Iteration time (s) against Tensor-parallel degree"
    ax = _labelled(sweep_figure(_sweep_rows(), "inter_node.nic_Gbps", "dp", None,
                                [("tp", 2)]))
    assert ax.get_xlabel() == "NIC rate (Gb/s)"
    assert ax.get_ylabel() == "Data-parallel communication on the critical path (s)"
    assert "(where tp=2)" in ax.get_title()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["tp=2"]


def test_sensitivity_has_title_labels_and_legend():
    ax = _labelled(sensitivity_figure(_sweep_rows(), "iteration_time_s"))
    assert "Iteration time (s)" in ax.get_title() and "(%)" in ax.get_xlabel()
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert "Tensor-parallel degree [tp]" in ticks and "NIC rate (Gb/s) [inter_node.nic_Gbps]" \
        in ticks


def test_every_result_figure_and_common_parameter_has_a_label():
    for kind in BREAKDOWN_KINDS:
        assert metric_label(kind).endswith("on the critical path (s)"), kind
    for field in ("tp", "pp", "dp", "cp", "ep", "global_batch_size", "seq_len",
                  "inter_node.nic_Gbps", "gpu"):
        assert param_label(field) != field, field
    assert metric_label("tokens_per_s") == "Throughput (tokens/s)"
    assert param_label("intra_node.latency_us") == "Node fabric latency (µs)"
    assert param_label("foo_GBps") == "foo (GB/s)" and metric_label("bar") == "bar"


def test_search_figures_have_titles():
    plan = Plan(global_batch_size=8, seq_len=256, dp=2)
    des = SimpleNamespace(breakdown={"compute": 0.5, "dp": 0.5}, iteration_time_s=1.0)
    cand = SimpleNamespace(plan=plan, des=des, peak_gib=10.0, analytic_s=1.0, best_s=1.0)
    rep = SimpleNamespace(model="tiny", cluster="cpu:2", ranked=[cand], baseline=None,
                          best=cand, candidates=[cand])
    ax = _labelled(top_breakdown_figure(rep))
    assert ax.get_title() == "Critical path of the top 1 plans (DES): tiny on cpu:2"
    ax = _labelled(pareto_figure(rep))
    assert "tiny on cpu:2" in ax.get_title() and "(tokens/s)" in ax.get_ylabel()


def test_heat_map_colours_are_0_to_100_percent():
    topo = build_topology(load_cluster("dgx-h100:2"))
    fig = links_figure(topo, [{"link": "gpu0->sw0", "utilization": 0.1}], "t")
    ax = _labelled(fig)
    bar = fig.axes[-1]  # the colourbar
    assert bar.get_ylim() == (0.0, 100.0) and "(%)" in bar.get_ylabel()
    plasma = matplotlib.colormaps["plasma"]
    colours = {tuple(c) for coll in ax.collections for c in coll.get_edgecolor()}
    assert tuple(plasma(0.1)) in colours  # 10% looks like 10%,
    assert tuple(plasma(1.0)) not in colours  # not like a saturated link


# 3. the topology in layers ------------------------------------------------------------------
def test_topology_is_layered_devices_below_switches():
    topo = build_topology(load_cluster("dgx-h100:128"))
    nodes = shown_nodes(128)
    assert nodes == [0, 1, 126, 127]
    vertices = drawn_vertices(topo, nodes)
    pos = layered_positions(topo, vertices)
    assert {v for v in vertices if isinstance(v, int)} == \
        {d for n in nodes for d in range(8 * n, 8 * n + 8)}
    for v, (_, y) in pos.items():
        assert y == tier_of(v)
    lowest_switch = min(y for v, (_, y) in pos.items() if not isinstance(v, int))
    assert max(y for v, (_, y) in pos.items() if isinstance(v, int)) < lowest_switch
    assert pos[("sw", 0)][1] < pos[("pod", 0)][1]


def test_topology_figure_is_readable_and_says_what_it_leaves_out():
    fig = topology_figure(build_topology(load_cluster("dgx-h100:128")))
    ax = _labelled(fig)
    assert "showing 4 of 128 nodes (0, 1, 126, 127)" in ax.get_title()
    texts = {t.get_text() for t in ax.texts}
    assert {"gpu 0", "gpu 1023", "node 127", "nic 126.3", "leaf 0"} <= texts
    assert not any("(" in t for t in texts)  # no ('node', 2) tuples
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "nic – leaf: 368 Gb/s (32 links)" in legend  # 400 Gb/s x 0.92, as simulated
    assert any(t.endswith("GB/s") for t in texts) and any(t.endswith("Gb/s") for t in texts)


def test_vertex_labels():
    assert [vertex_label(v) for v in (7, ("sw", 2), ("nic", 2, 0), ("pod", 0),
                                      ("rail", 0, 3), ("spine", 1), ("rt", 5), ("core",))] \
        == ["gpu 7", "node 2", "nic 2.0", "leaf 0", "rail 0.3", "spine 1", "router 5", "core"]


# 4. timelines and traces of a reduced run ---------------------------------------------------
def _trace(cluster: str, plan: Plan, reduce: bool) -> dict[str, Any]:
    c, m = load_cluster(cluster), load_model("tiny")
    t = simulate_des(m, c, plan, cost_model_for(c), reduce=reduce, record=True)
    return chrome_trace(t.timeline, c)


def test_a_reduced_timeline_says_which_gpus_it_shows():
    plan = Plan(global_batch_size=16, seq_len=256, dp=4, tp=2, pp=2)
    reduced = _trace("dgx-h100:2", plan, reduce=True)
    assert reduced["otherData"] == {
        "gpus_shown": 2, "gpus_total": 16,
        "note": "showing 2 of 16 GPUs: data-parallel replicas are identical (one simulated), "
                "and a tensor-parallel group runs in lock step (drawn as its first GPU)"}
    ax = _labelled(timeline_figure(parse_trace(reduced), "t.json"))
    assert reduced["otherData"]["note"] in ax.get_title() and "(ms)" in ax.get_xlabel()
    assert {t.get_text() for t in ax.get_legend().get_texts()} >= {"compute", "tp", "pp"}
    full = _trace("dgx-h100:2", plan, reduce=False)["otherData"]
    assert full["gpus_shown"] == 8 and "data-parallel" not in full["note"]


def test_a_timeline_of_every_gpu_has_no_note():
    trace = _trace("cpu:2", Plan(global_batch_size=4, seq_len=64, dp=2), reduce=False)
    assert "otherData" not in trace
    title = timeline_figure(parse_trace(trace), "t.json", max_rows=3).axes[0].get_title()
    assert "showing" not in title and "first 3 of" in title
