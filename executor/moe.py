"""MoE layers as Megatron-LM's all-to-all dispatcher runs them, on one rank or over an
expert grid (:mod:`sim.spec.experts`).

Routing is forced balance, the only routing the plans the executor takes describe
(:func:`executor.capabilities.unsupported`): slot ``j`` of local token ``t`` goes to expert
``(t * top_k + j) mod num_experts``, so that every expert receives the same number of tokens
(within one, where they do not divide), and the router's softmax over its scores for those
experts weighs their outputs (the router still trains). Megatron-LM's
``--moe-router-force-load-balancing`` balances in expectation, with random scores.

One layer and micro-batch, on each rank of an expert block (``etp x ep`` ranks, ETP index
fastest): an all-gather of every rank's per-expert token counts over the block (Megatron-LM
gathers them over its ``tp_ep`` group), then the dispatch all-to-all over the
expert-parallel group; with expert tensor parallelism the ETP ranks all-gather each other's
received tokens, run their shard of every local expert and reduce-scatter the partial
outputs back; then the combine all-to-all. The exchanges of tokens are autograd-aware
(``torch.distributed.nn.functional`` and the functional collectives), so backward runs
each in reverse.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed.nn.functional import all_to_all_single

__all__ = ["forward", "balanced_choice", "route"]


def balanced_choice(tokens: int, top_k: int, experts: int, device: torch.device
                    ) -> torch.Tensor:
    """(tokens, top_k) expert ids of forced balance: slot ``j`` of token ``t`` to expert
    ``(t * top_k + j) mod experts`` (a token's ``top_k`` experts are distinct)."""
    return (torch.arange(tokens * top_k, device=device) % experts).view(tokens, top_k)


def forward(moe: Any, x: Any) -> torch.Tensor:
    """The layer on ``x`` (batch, sequence, hidden); under tensor parallelism ``x`` is a
    DTensor sharded on the sequence, each rank routes its shard, and the result is this
    rank's shard (a plain tensor, as the residual stream is)."""
    logits = moe.router(x)  # under TP the router sees the shard and returns it plain
    local = x.to_local() if hasattr(x, "to_local") else x
    shape = local.shape
    tokens = local.reshape(-1, shape[-1])
    chosen = balanced_choice(tokens.shape[0], moe.top_k, moe.num_experts, tokens.device)
    weights = logits.reshape(-1, moe.num_experts).gather(-1, chosen).softmax(dim=-1)
    out = route(moe, tokens, chosen, weights).view(shape)
    if moe.shared is not None:
        out = out + moe.shared(x)
    return out


def route(moe: Any, tokens: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor
          ) -> torch.Tensor:
    """Weighted sum over each token's ``top_k`` experts: ``chosen`` and ``weights`` are
    (tokens, top_k)."""
    flat = chosen.reshape(-1)
    src = torch.arange(tokens.shape[0], device=tokens.device).repeat_interleave(moe.top_k)
    order = torch.argsort(flat, stable=True)
    sent = tokens[src[order]]  # grouped by expert, ascending
    counts = torch.bincount(flat, minlength=moe.num_experts)
    if moe.block_group is None:
        done = moe.experts(sent, _ids(counts))
    else:
        done = _exchange(moe, sent, counts)
    out = torch.zeros_like(tokens)
    scale = weights.reshape(-1)[order].unsqueeze(-1).to(done.dtype)
    return out.index_add(0, src[order], done * scale)


def _ids(counts: torch.Tensor) -> torch.Tensor:
    """Local expert id of each row of rows grouped by expert, ``counts[e]`` of expert e."""
    return torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)


def _exchange(moe: Any, sent: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    ep, etp = moe.ep, moe.etp
    per = moe.num_experts // ep
    every = torch.empty(ep * etp * counts.numel(), dtype=counts.dtype, device=counts.device)
    dist.all_gather_into_tensor(every, counts, group=moe.block_group)
    # [ep index, etp index, this rank's local experts]: rows each block rank sends here
    # (or, for an ETP peer, to that peer)
    mine = every.view(ep, etp, -1)[:, :, moe.ep_rank * per:(moe.ep_rank + 1) * per]
    send = counts.view(ep, per).sum(dim=1).tolist()
    recv = mine[:, moe.etp_rank].sum(dim=1).tolist()
    received = sent if ep == 1 else all_to_all_single(
        sent.new_empty(sum(recv), sent.shape[1]), sent, recv, send, group=moe.ep_group)
    if etp == 1:
        # tokens from every source rank, grouped by source; the experts take any order
        result = moe.experts(received, torch.cat([_ids(c) for c in mine[:, 0]]))
    else:
        result = _tensor_parallel(moe, received, mine)
    if ep == 1:
        return result
    return all_to_all_single(sent.new_empty(sent.shape), result, send, recv,
                             group=moe.ep_group)


def _tensor_parallel(moe: Any, received: torch.Tensor, mine: torch.Tensor) -> torch.Tensor:
    """The ETP ranks gather each other's received rows (padded to the longest: equal under
    forced balance), run their shard of each local expert on all of them, and
    reduce-scatter the partial sums back to the ranks that received them."""
    etp, group = moe.etp, moe.etp_group
    held = mine.sum(dim=(0, 2)).tolist()  # rows each ETP rank received
    width = max(held)
    pad = width - received.shape[0]
    padded = torch.cat([received, received.new_zeros(pad, received.shape[1])]) if pad \
        else received
    gathered = fc.all_gather_single(padded, 0, group)
    parts = [gathered[i * width:i * width + held[i]] for i in range(etp)]
    ids = torch.cat([_ids(c) for i in range(etp) for c in mine[:, i]])
    result = moe.experts(torch.cat(parts), ids)
    starts = [sum(held[:i]) for i in range(etp)]
    back = torch.cat([
        torch.cat([result[s:s + n], result.new_zeros(width - n, result.shape[1])])
        for s, n in zip(starts, held, strict=True)])
    mine_back = fc.reduce_scatter_single(back, "sum", 0, group)
    return mine_back[:received.shape[0]]
