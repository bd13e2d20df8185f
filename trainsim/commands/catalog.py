"""``trainsim models``, ``hardware``, ``cluster`` and ``topology``: what the catalogs hold."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from trainsim.common import CLUSTER_HELP, MODEL_HELP

__all__ = ["add_catalog_parsers"]


def cmd_models(args: argparse.Namespace) -> int:
    from sim.spec.workload import Workload
    from sim.spec.zoo import load_any, workload_names, zoo_names
    from trainsim.report import format_model, format_workload

    one = args.model is not None  # --model "" names no model: an error, not the whole zoo
    models = [load_any(args.model)] if one else \
        [load_any(n) for n in zoo_names()] + [load_any(n) for n in workload_names()]
    if args.json:
        data = [m.to_dict() for m in models]
        print(json.dumps(data[0] if one else data, indent=2))
        return 0
    lines = [format_workload(m) if isinstance(m, Workload) else format_model(m) for m in models]
    if not one:
        n = len(zoo_names())
        lines = ["transformers:", *lines[:n], "workload graphs (trainsim trace):", *lines[n:]]
    print("\n".join(lines))
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:
    from sim.spec.hardware import catalog, catalog_sources

    if args.stacks:
        from sim.spec.stack import stacks

        for st in stacks().values():
            print(f"{st.name}: {st.description}")
            for field, value in st.values.items():
                print(f"    {field:<20} {value:<8g} {st.sources[field]}")
        return 0
    for name, hw in sorted(catalog().items()):
        print(f"{name:<16} bf16 {hw.bf16_tflops:7.1f} TFLOP/s  {hw.memory_gib:6.1f} GiB  "
              f"HBM {hw.hbm_GBps:6.0f} GB/s  NVLink {hw.nvlink_GBps:5.0f} GB/s/dir")
        if args.sources:
            for field, source in catalog_sources(name).items():
                print(f"    {field:<14} {source}")
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    from sim.spec.cluster import load_cluster, preset_names

    if not args.cluster:
        print("presets: " + ", ".join(preset_names())
              + "; or a TOML file (see docs/reference/cluster.md)")
        return 0
    c = load_cluster(args.cluster)
    print(json.dumps(c.to_dict(), indent=2) if args.json else
          f"{c.name}: {c.nodes} nodes x {c.gpus_per_node} {c.gpu.name} = {c.world_size} devices; "
          f"{c.intra_node.kind} {c.intra_node.bandwidth_GBps} GB/s/dir; "
          f"{c.inter_node.topology} {c.inter_node.nics_per_node} x {c.inter_node.nic_Gbps} Gb/s "
          f"NICs per node ({c.nic_GBps_per_gpu:.1f} GB/s per device)")
    if not args.json:
        first = 0
        for g in c.node_groups:  # a mixed cluster's groups, in node order
            print(f"  nodes {first}-{first + g.nodes - 1}: {g.gpu.name}; {g.intra_GBps:g} "
                  f"GB/s/dir node fabric; {g.nics_per_node} x {g.nic_Gbps:g} Gb/s NICs")
            first += g.nodes
    return 0


def cmd_topology(args: argparse.Namespace) -> int:
    from sim.network.topology import bisection_Bps, build_topology
    from sim.spec.cluster import load_cluster
    from trainsim.plots.output import check_out

    png = check_out(Path(args.png), "--png", (".png",)) if args.png else None  # before work
    cluster = load_cluster(args.cluster)
    topo = build_topology(cluster)
    kinds: dict[str, int] = {}
    for v in topo.graph.nodes:
        kind = "device" if isinstance(v, int) else str(v[0])
        kinds[kind] = kinds.get(kind, 0) + 1
    print(f"{cluster.name}: {cluster.inter_node.topology}, {topo.graph.number_of_nodes()} "
          f"vertices ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}), "
          f"{topo.graph.number_of_edges() // 2} links")
    if cluster.nodes > 1 and not args.no_bisection:
        print(f"bisection bandwidth: {bisection_Bps(topo) / 1e9:,.0f} GB/s per direction")
    if png:
        from trainsim.plots.topology import draw_topology

        print(f"wrote {draw_topology(topo, png)}")
    return 0


def add_catalog_parsers(sub: Any) -> None:
    p = sub.add_parser("models", help="list zoo models, or show one model")
    p.add_argument("--model", help=MODEL_HELP)
    p.add_argument("--json", action="store_true", help="print JSON (a list without --model)")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser("hardware", help="list the hardware catalog")
    p.add_argument("--sources", action="store_true", help="show where each number comes from")
    p.add_argument("--stacks", action="store_true", help="list the software stacks (what a "
                   "framework adds around the kernels) and where each value comes from")
    p.set_defaults(func=cmd_hardware)
    p = sub.add_parser("cluster", help="list cluster presets, or show one cluster")
    p.add_argument("--cluster", help=CLUSTER_HELP)
    p.add_argument("--json", action="store_true", help="print the resolved cluster as JSON")
    p.set_defaults(func=cmd_cluster)
    p = sub.add_parser("topology", help="summarise (and draw) a cluster's network graph")
    p.add_argument("--cluster", required=True, help=CLUSTER_HELP)
    p.add_argument("--png", metavar="FILE", help="draw the graph in layers to this .png "
                   "(a big cluster: its first 2 and last 2 nodes)")
    p.add_argument("--no-bisection", action="store_true",
                   help="skip the max-flow bisection bandwidth (slow on large clusters)")
    p.set_defaults(func=cmd_topology)
