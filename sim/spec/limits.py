"""Upper limits on the sizes trainsim accepts, each with its reason.

Every limit sits far above the largest real system or model, and low enough that the
simulator answers, or refuses, in seconds instead of hanging or running out of memory.
Measured on a 2-core VM (Llama 3 8B, pure data parallelism): 1,048,576 GPUs take 1.3 s
in the analytic tier and 3 minutes and 8 GB in the DES (its topology has a vertex per
device and NIC); 10,000 layers take 0.4 s analytic, 2 s DES. The analytic tier is closed
form in batch and sequence; the DES runs every micro-batch, so it takes at most
:data:`MAX_DES_MICROBATCHES` per replica. ``docs/reference/model.md`` and ``cluster.md``
list these limits (a test checks).

>>> at_most("plan.seq_len", 2**25, MAX_SEQ_LEN, "tokens")
Traceback (most recent call last):
...
sim.errors.SpecError: plan.seq_len: must be at most 16,777,216 tokens, got 33,554,432
"""

from __future__ import annotations

from typing import Any

from sim.errors import SpecError

__all__ = ["MAX_DEVICES", "MAX_DES_MICROBATCHES", "MAX_NICS_PER_NODE", "MAX_LAYERS",
           "MAX_WIDTH", "MAX_VOCAB", "MAX_SEQ_LEN", "MAX_GLOBAL_BATCH", "MAX_NORMS_PER_LAYER",
           "MODEL_LIMITS", "at_most", "show_int", "check_cluster_size", "preset_count"]

# Devices in a cluster (nodes x gpus_per_node), also NICs (nodes x nics_per_node) and any
# one parallel degree: 5x the largest clusters built (xAI Colossus, ~200,000 GPUs).
MAX_DEVICES = 2**20
# NICs per node: 8 on a DGX, 72 on a GB200 NVL72 rack taken as one node. The rail-optimized
# topology links every rail switch of a pod to every spine: nics_per_node^2 links per pod.
MAX_NICS_PER_NODE = 128
MAX_LAYERS = 10_000  # transformer layers: 80x Llama 3 405B's 126, 10x DeepNet's 1,000
# Widths (hidden, MLP, head_dim) and head counts: 40x the widest published model
# (Megatron-LM's 1T configuration: hidden 25,600, MLP 102,400, 160 heads).
MAX_WIDTH = 2**20
MAX_VOCAB = 2**24  # vocabulary rows: 64x Gemma 3's 262,208
# Tokens per sequence (plan.seq_len, model.max_seq_len, sliding windows): 1.6x the
# longest published context (MiniMax-Text-01, 10,240,000 positions).
MAX_SEQ_LEN = 2**24
# Sequences per iteration: a million times Llama 3 405B's batch (2,048 sequences of 8,192).
MAX_GLOBAL_BATCH = 2**31
MAX_NORMS_PER_LAYER = 8  # hidden-size norms in one layer: Gemma 2 and 3 have the most, 4
# Micro-batches per replica in the DES tier, which runs each one (65,536 of Llama 3 8B at
# pp 8 took 4 minutes): 30x a 2,048-sequence batch accumulated on one replica.
MAX_DES_MICROBATCHES = 2**16
# DualPipeV's programs, which both tiers run pass by pass: pp x micro-batches per replica
# (64 ranks x 4,096 micro-batches; a program of 2^18 takes about a second to build)
MAX_DUALPIPEV_RANK_MICROBATCHES = 2**18

# ModelSpec field -> (limit, unit in the message).
MODEL_LIMITS: dict[str, tuple[int, str]] = {
    "num_layers": (MAX_LAYERS, "layers"),
    "hidden_size": (MAX_WIDTH, ""),
    "num_heads": (MAX_WIDTH, "heads"),
    "num_kv_heads": (MAX_WIDTH, "heads"),
    "head_dim": (MAX_WIDTH, ""),
    "ffn_hidden_size": (MAX_WIDTH, ""),
    "moe_ffn_hidden_size": (MAX_WIDTH, ""),
    "shared_expert_ffn_hidden_size": (MAX_WIDTH, ""),
    "num_experts": (MAX_WIDTH, "experts"),
    "vocab_size": (MAX_VOCAB, "tokens"),
    "max_seq_len": (MAX_SEQ_LEN, "tokens"),
    "sliding_window": (MAX_SEQ_LEN, "tokens"),
    "moe_layer_step": (MAX_LAYERS, "layers"),
    "norms_per_layer": (MAX_NORMS_PER_LAYER, "norms"),
    "q_lora_rank": (MAX_WIDTH, ""),
    "kv_lora_rank": (MAX_WIDTH, ""),
    "qk_rope_head_dim": (MAX_WIDTH, ""),
    "v_head_dim": (MAX_WIDTH, ""),
    "expert_groups": (MAX_WIDTH, "groups"),
    "num_mtp_layers": (MAX_LAYERS, "layers"),
}


def show_int(value: int) -> str:
    """``value`` with thousands separators; its size alone when it is too long to print
    (Python refuses to turn an integer of over 4,300 digits into text)."""
    if value.bit_length() > 256:
        return f"an integer of {value.bit_length():,} bits"
    return f"{value:,}"


def at_most(field: str, value: Any, limit: int, unit: str = "") -> None:
    """Raise a SpecError naming ``field`` when the integer ``value`` exceeds ``limit``
    (other types pass: the caller's type check names them)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > limit:
        what = f"{limit:,} {unit}".rstrip()
        raise SpecError(field, f"must be at most {what}, got {show_int(value)}")


def check_cluster_size(nodes: int, gpus_per_node: int, nics: list[tuple[int, int]]) -> None:
    """At most :data:`MAX_DEVICES` devices and NICs; ``nics`` lists (nodes, NICs per node)
    of each node group. The DES topology has a vertex and a link for each."""
    world = nodes * gpus_per_node
    if world > MAX_DEVICES:
        raise SpecError("nodes*gpus_per_node", f"{show_int(nodes)}*{show_int(gpus_per_node)} = "
                        f"{show_int(world)} must be at most {MAX_DEVICES:,} devices")
    for _, per_node in nics:
        at_most("inter_node.nics_per_node", per_node, MAX_NICS_PER_NODE, "NICs")
    total = sum(n * per_node for n, per_node in nics)
    at_most("nodes*inter_node.nics_per_node", total, MAX_DEVICES, "NICs")


def preset_count(text: str) -> int | None:
    """The count after ``name:`` in a preset, None unless it is digits; counts over
    :data:`MAX_DEVICES` are refused here (``int()`` of a 5,000-digit string would raise)."""
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(MAX_DEVICES)) or int(digits) > MAX_DEVICES:
        shown = digits if len(digits) <= 20 else f"{digits[:20]}... ({len(digits):,} digits)"
        raise SpecError("cluster", f"the count after ':' must be at most {MAX_DEVICES:,}, "
                        f"got {shown}")
    return int(digits)
