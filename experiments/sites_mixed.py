"""Sites that differ (issue 17): a site of H100s beside a site of A100s, and two sites of
different sizes, Llama 3 8B, WAN 1 to 400 Gb/s; the batch split evenly and by site speed.

Run: ``.venv/bin/python experiments/sites_mixed.py`` (a few minutes here). Writes
``experiments/results/sites_mixed.csv``, ``sites_mixed_limit.csv`` and a figure.

Clusters: the ``regions2`` preset's two regions (us-east, us-west; one-way WAN latency
43.5 ms, half the published AWS round trip in ``sim/data/wan.csv``), every WAN bandwidth
swept, 1/10/100/400 Gb/s per direction.

- ``h100+a100``: 8 DGX H100 nodes at us-east (8 x 400 Gb/s NICs) and 8 DGX A100 nodes at
  us-west (the site's own ``gpu`` and ``inter_node``: 8 x 200 Gb/s HDR NICs); Llama 3 8B,
  TP 4 x DP 32 (16 replicas a site), 512 sequences of 8,192 tokens a step.
- ``16+8 nodes``: DGX H100 at both, 16 nodes at us-east and 8 at us-west; TP 4 x DP 48 (32
  and 16 replicas), 576 sequences a step.

Splits: ``even`` (every replica the same micro-batches) and ``by speed``
(``optimizer.sites.balance_sites``: the least slowest-site step over whole micro-batches a
replica, analytic tier). Ways: flat BSP, hierarchical BSP, DiLoCo H = 50 and 500 (fp32),
streaming DiLoCo H = 50 with 5 fragments hidden behind 5 inner steps; both tiers (the DES's
in-site steps, its WAN exchange as flows). ``of_single_site`` is against the same plan on
one cluster holding every node (the same GPUs).

The single-site limit: the WAN made as wide as 10^5 Gb/s and as near as 2 us; flat BSP
across the sites against the single cluster, both tiers, both splits (target: within 1%).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from optimizer.sites import balance_sites
from sim import simulate
from sim.layout.placement import site_aware
from sim.spec.cluster import ClusterSpec, cluster_from_dict, load_cluster
from sim.spec.plan import Plan
from sim.spec.zoo import load_any
from sim.strategies.sites import (
    SiteSync,
    batch_split,
    simulate_sites,
    single_site,
    site_steps,
    wan_sweep,
)

RATES = (1.0, 10.0, 100.0, 400.0)
SYNCS = (SiteSync("flat"), SiteSync("hierarchical"), SiteSync("diloco", H=50),
         SiteSync("diloco", H=500), SiteSync("streaming-diloco", H=50, fragments=5, overlap=5))


def clusters() -> dict[str, tuple[ClusterSpec, Plan]]:
    base = load_cluster("regions2-dgx-h100:8").to_dict()
    mixed = {**base, "name": "h100+a100", "sites": [
        {"name": "us-east", "nodes": 8},
        {"name": "us-west", "nodes": 8, "gpu": "a100-sxm4-80gb",
         "inter_node": {"nic_Gbps": 200.0, "nics_per_node": 8}}]}
    sizes = {**base, "name": "16+8 nodes", "nodes": 24, "sites": [
        {"name": "us-east", "nodes": 16}, {"name": "us-west", "nodes": 8}]}
    return {
        "h100+a100": (cluster_from_dict(mixed, "h100+a100"),
                      Plan(global_batch_size=512, seq_len=8192, dp=32, tp=4,
                           micro_batch_size=1)),
        "16+8 nodes": (cluster_from_dict(sizes, "16+8 nodes"),
                       Plan(global_batch_size=576, seq_len=8192, dp=48, tp=4,
                            micro_batch_size=1)),
    }


def study() -> pd.DataFrame:
    model, rows = load_any("llama3-8b"), []
    for case, (base, even) in clusters().items():
        for split, plan in (("even", even), ("by speed", balance_sites(model, base, even))):
            steps = {f: site_steps(model, base, plan, f) for f in ("analytic", "des")}
            for g in RATES:
                c = wan_sweep(base, g)
                for s in SYNCS:
                    a, d = (simulate_sites(model, c, plan, s, f, steps[f])
                            for f in ("analytic", "des"))
                    rows.append({"case": case, "split": split,
                                 "micro_batches": batch_split(base, plan),
                                 "wan_Gbps": g, "sync": s.label(),
                                 "tokens_per_s": a.tokens_per_s,
                                 "tokens_per_s_des": d.tokens_per_s,
                                 "of_single_site": a.of_single_site,
                                 "of_single_site_des": d.of_single_site,
                                 "single_site_tokens_per_s": a.single_site_tokens_per_s,
                                 **{f"step_s_{k}": v for k, v in a.site_step_s.items()},
                                 "step_s": a.step_s, "wan_s_per_sync": a.wan_s_per_sync})
            print(f"{case}, {split} ({batch_split(base, plan)}): done", flush=True)
    return pd.DataFrame(rows)


def limit() -> pd.DataFrame:
    model, rows = load_any("llama3-8b"), []
    for case, (base, even) in clusters().items():
        lan = cluster_from_dict({**base.to_dict(), "wan": [
            {"a": "us-east", "b": "us-west", "Gbps": 1e5, "latency_ms": 0.002}]}, case)
        for split, plan in (("even", even), ("by speed", balance_sites(model, base, even))):
            plan = site_aware(plan, lan)
            for fid in ("analytic", "des"):
                one = simulate(model, single_site(lan), plan, fidelity=fid).iteration_time_s
                two = simulate(model, lan, plan, fidelity=fid).iteration_time_s
                rows.append({"case": case, "split": split, "fidelity": fid,
                             "single_cluster_s": one, "two_sites_lan_wan_s": two,
                             "difference": two / one - 1})
    return pd.DataFrame(rows)


def figure(df: pd.DataFrame, path: Path) -> None:
    import matplotlib.pyplot as plt

    from trainsim.plots.output import save_figure

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.6), sharey=True)
    for ax, (case, sub) in zip(axes, df.groupby("case", sort=False), strict=True):
        for i, (sync, s) in enumerate(sub.groupby("sync", sort=False)):
            for split, style in (("even", "--"), ("by speed", "-")):
                t = s[s["split"] == split]
                ax.plot(t["wan_Gbps"], t["tokens_per_s"] / 1e3, style, marker="o",
                        color=f"C{i}", label=f"{sync}, {split}")
        ax.set_title(f"Llama 3 8B across {case} (43.5 ms one way)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("WAN bandwidth per direction (Gb/s)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("Throughput (thousand tokens/s, analytic)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=5, fontsize=7,
               title="synchronisation, batch split (dashed: even; solid: by site speed)")
    fig.tight_layout(rect=(0, 0, 1, 0.82))
    save_figure(fig, path)


def main() -> int:
    from study_multisite import finish  # (run as a script: experiments/ is on the path)

    return finish(study(), limit(), "sites_mixed", figure)


if __name__ == "__main__":
    sys.exit(main())
