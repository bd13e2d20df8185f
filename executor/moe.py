"""Token routing of MoE layers, on one rank or exchanged over an expert-parallel group.

torch has no expert-parallel module of its own; the exchange uses its autograd-aware
``all_to_all_single`` (``torch.distributed.nn.functional``), as torchtitan's MoE does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_to_all_single

__all__ = ["route"]


def _local(moe: Any, tokens: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
    """Each token row through the expert ``expert_ids`` names (ids local to this rank)."""
    out = torch.empty_like(tokens)
    for e, expert in enumerate(moe.experts):
        rows = (expert_ids == e).nonzero(as_tuple=True)[0]
        out[rows] = expert(tokens[rows]) if rows.numel() else out[rows]
    return out


def route(moe: Any, tokens: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor
          ) -> torch.Tensor:
    """Weighted sum over each token's ``top_k`` experts: ``chosen`` and ``weights`` are
    (tokens, top_k). With ``moe.ep_group`` set, this rank holds experts
    ``first_expert ..`` and tokens travel to their experts' ranks and back (two all-to-alls
    of the routed tokens, after one of the per-rank counts)."""
    flat = chosen.reshape(-1)
    src = torch.arange(tokens.shape[0], device=tokens.device).repeat_interleave(moe.top_k)
    order = torch.argsort(flat, stable=True)
    sent = tokens[src[order]]
    group = moe.ep_group
    if group is None:
        done = _local(moe, sent, flat[order])
    else:
        done = _exchange(moe, group, sent, flat[order])
    out = torch.zeros_like(tokens)
    scale = weights.reshape(-1)[order].unsqueeze(-1).to(done.dtype)
    return out.index_add(0, src[order], done * scale)


def _exchange(moe: Any, group: Any, sent: torch.Tensor, experts: torch.Tensor
              ) -> torch.Tensor:
    size = dist.get_world_size(group)
    per_rank = moe.num_experts // size
    counts = torch.bincount(experts // per_rank, minlength=size)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)
    send_splits, recv_splits = counts.tolist(), recv_counts.tolist()
    ids = torch.empty(sum(recv_splits), dtype=experts.dtype, device=experts.device)
    dist.all_to_all_single(ids, experts, recv_splits, send_splits, group=group)
    received = sent.new_empty(sum(recv_splits), sent.shape[1])
    received = all_to_all_single(received, sent, recv_splits, send_splits, group=group)
    local_ids = ids - moe.first_expert
    # Tokens from every source rank, grouped by source; the experts handle any order.
    result = _local(moe, received, local_ids)
    back = sent.new_empty(sent.shape)
    return all_to_all_single(back, result, send_splits, recv_splits, group=group)
