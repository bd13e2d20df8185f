"""Human-readable tables of specs and results (the CLI prints these)."""

from __future__ import annotations

from sim.layout.flops import active_param_count, model_flops_per_token, param_count
from sim.result import BREAKDOWN_KINDS, Result
from sim.spec.faults import Faults
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.workload import Workload

__all__ = ["format_result", "format_model", "format_workload"]


def _pct(x: float, total: float) -> str:
    return f"{100 * x / total:5.1f}%" if total else "    -"


def _inputs(plan: Plan | None, faults: Faults | None) -> list[str]:
    """The plan and the applied faults, so a summary says what it is a summary of."""
    from optimizer.report import plan_label

    lines = []
    if plan is not None:
        lines.append(f"  plan                  {plan_label(plan)}, global batch "
                     f"{plan.global_batch_size} x {plan.seq_len} tokens, {plan.dtype}")
    if faults is not None and not faults.empty:
        d = faults.to_dict()
        applied = [("stragglers", ", ".join(d["stragglers"])),
                   ("drawn slow-downs", ", ".join(d["distributions"])
                    + (f" (seed {faults.seed})" if d["distributions"] else "")),
                   ("failed links", ", ".join(f"{n} at {t:g} s" for n, t in faults.failures))]
        lines += [f"  {name:<21} {text}" for name, text in applied if text]
    return lines


def format_result(r: Result, plan: Plan | None = None, faults: Faults | None = None) -> str:
    """The text summary of ``r``; ``plan`` and ``faults``, when given, are echoed at the top."""
    it = r.iteration_time_s
    head = [f"{r.model} on {r.cluster} ({r.gpus} devices), fidelity {r.fidelity}",
            *_inputs(plan, faults)]
    if "cannot_complete" in r.simulation:
        return "\n".join(head + [f"  STEP CANNOT COMPLETE: {r.simulation['cannot_complete']}"])
    lines = [
        *head,
        f"  iteration time        {it:.4g} s   ({r.num_microbatches} micro-batches)",
        f"  tokens/s              {r.tokens_per_s:,.0f}",
        f"  samples/s             {r.samples_per_s:,.1f}",
        f"  model TFLOP/s/GPU     {r.model_tflops_per_gpu:.4g}   (MFU {100 * r.mfu:.1f}%)",
        f"  hardware TFLOP/s/GPU  {r.hardware_tflops_per_gpu:.4g}",
        f"  peak memory           {r.peak_memory_gib:.1f} / {r.memory_capacity_gib:.1f} GiB"
        f"   {'fits' if r.fits_in_memory else 'DOES NOT FIT'}",
        f"  pipeline bubble       {100 * r.bubble_fraction:.1f}%",
        "  time on the critical path:",
    ]
    lines += [f"    {k:<10} {r.breakdown[k]:10.4g} s  {_pct(r.breakdown[k], it)}"
              for k in BREAKDOWN_KINDS if r.breakdown.get(k)]
    if r.extrapolated:
        lines.append(f"  {len(r.extrapolated)} operations outside the profile, timed by its "
                     f"fitted roofline (see --json 'extrapolated')")
    lines += [f"  warning: {w}" for w in r.warnings]
    return "\n".join(lines)


def format_model(m: ModelSpec, seq_len: int | None = None) -> str:
    s = seq_len or m.max_seq_len
    total, active = param_count(m), active_param_count(m)
    moe = f", {m.num_experts} experts top-{m.top_k}" if m.is_moe else ""
    return (f"{m.name:<14} {total / 1e9:9.3f} B params ({active / 1e9:.3f} B active)  "
            f"{m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads}/{m.kv_heads} heads"
            f"{moe}; {model_flops_per_token(m, s) / 1e9:.2f} GFLOP/token at seq {s}")


def format_workload(w: Workload) -> str:
    saved = sum(layer.saved_bytes for layer in w.layers)
    return (f"{w.name:<18} {w.param_count / 1e6:9.3f} M params  {len(w.layers)} layers; "
            f"{w.forward_flops_per_sample / 1e9:.2f} GFLOP forward per sample ({w.sample}), "
            f"{saved / 2**20:.1f} MiB saved for backward per sample")
