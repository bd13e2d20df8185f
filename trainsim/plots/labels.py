"""Axis labels for the fields plots draw: a swept parameter (``tp`` -> "Tensor-parallel
degree") or a result figure (``iteration_time_s`` -> "Iteration time (s)"), with units.

A name not listed gets its unit from its suffix (``_s``, ``_us``, ``_Gbps``, ``_GBps``,
``_gib``) and keeps its spelling, so a label never hides which field is drawn.
"""

from __future__ import annotations

__all__ = ["param_label", "metric_label"]

_PARAMS = {
    "tp": "Tensor-parallel degree", "pp": "Pipeline-parallel degree",
    "dp": "Data-parallel degree", "cp": "Context-parallel degree",
    "ep": "Expert-parallel degree", "vpp": "Virtual stages per pipeline rank",
    "global_batch_size": "Global batch size (sequences)",
    "seq_len": "Sequence length (tokens)", "micro_batch_size": "Micro-batch size (sequences)",
    "zero_stage": "ZeRO stage", "schedule": "Pipeline schedule",
    "recompute": "Activation recomputation", "dtype": "Training precision",
    "sequence_parallel": "Sequence parallelism", "attention": "Attention kernel",
    "nodes": "Nodes", "gpus_per_node": "GPUs per node", "gpu": "GPU type",
    "inter_node.nic_Gbps": "NIC rate (Gb/s)", "inter_node.nics_per_node": "NICs per node",
    "inter_node.oversubscription": "Oversubscription (x:1)",
    "inter_node.latency_us": "Network latency (µs)", "inter_node.topology": "Network topology",
    "inter_node.pod_gpus": "GPUs per pod", "intra_node.kind": "Node fabric",
    "intra_node.bandwidth_GBps": "Node fabric bandwidth (GB/s per direction)",
    "intra_node.latency_us": "Node fabric latency (µs)",
    "fidelity": "Fidelity", "model": "Model", "straggler": "Straggler",
}
_KIND = {"compute": "Compute", "tp": "Tensor-parallel communication",
         "cp": "Context-parallel communication", "ep": "Expert-parallel communication",
         "pp": "Pipeline communication", "dp": "Data-parallel communication",
         "optimizer": "Optimizer step", "bubble": "Pipeline bubble"}
_METRICS = {
    "iteration_time_s": "Iteration time (s)", "tokens_per_s": "Throughput (tokens/s)",
    "mfu": "Model FLOPs utilisation (fraction of peak)",
    "model_tflops_per_gpu": "Model TFLOP/s per GPU",
    "hardware_tflops_per_gpu": "Hardware TFLOP/s per GPU",
    "peak_memory_gib": "Peak memory per GPU (GiB)",
    "bubble_fraction": "Pipeline bubble (fraction of the pipeline phase)",
    "gpus": "GPUs",
    **{k: f"{v} on the critical path (s)" for k, v in _KIND.items()},
}
_UNITS = (("_GBps", "GB/s"), ("_Gbps", "Gb/s"), ("_gib", "GiB"), ("_us", "µs"), ("_s", "s"))


def _fallback(name: str) -> str:
    for suffix, unit in _UNITS:
        if name.endswith(suffix):
            return f"{name[:-len(suffix)]} ({unit})"
    return name


def param_label(name: str) -> str:
    """A swept parameter's axis label."""
    return _PARAMS.get(name) or _fallback(name)


def metric_label(name: str) -> str:
    """A result figure's axis label (a breakdown kind: its seconds on the critical path)."""
    return _METRICS.get(name) or _fallback(name)
