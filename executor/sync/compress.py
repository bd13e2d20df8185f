"""Compressed gradient averaging for the real BSP runs over all-reduce
(:mod:`executor.sync.worker`), the same schemes and bytes as the simulator's
(:func:`sim.layout.sync.wire_bytes_per_element`):

- ``fp16``, ``powersgd``: torch's own DDP communication hooks (``fp16_compress_hook``;
  ``PowerSGDState`` + ``powerSGD_hook`` with the plan's rank, error feedback and
  uncompressed warm-up steps) on a ``DistributedDataParallel`` wrapper of the model;
- ``int8`` (an fp32 scale per 256 elements) and ``onebit`` (signs, an fp32 mean magnitude
  per 256 elements): a compressed all-reduce in two phases, as 1-bit Adam's: every worker
  sends its encoded ``j``-th chunk to worker ``j``, which decodes and averages them, encodes
  the mean and all-gathers it (each worker sends about twice its encoded gradient);
- ``topk``: each worker keeps the ``ratio`` largest magnitudes (fp32 value + int32 index),
  all-gathers them and averages into a dense gradient.

With error feedback (the plan's ``error_feedback``) what a worker's encoding lost is added
to its next gradient (worker side only; the second phase's loss is not fed back). The
first ``warmup_steps`` steps are not compressed. Every function returns the bytes the
worker sent, counted from the tensors it sent.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Compressor", "BLOCK", "ring_bytes"]

BLOCK = 256  # elements a scale covers (int8, onebit)


def ring_bytes(payload: float, n: int) -> int:
    """Bytes one of ``n`` workers sends in a ring all-reduce of ``payload`` bytes."""
    return int(round(payload * 2 * (n - 1) / n))


def _blocks(x: torch.Tensor) -> torch.Tensor:
    pad = (-x.numel()) % BLOCK
    return torch.cat([x, x.new_zeros(pad)]).view(-1, BLOCK)


def _encode(kind: str, x: torch.Tensor) -> list[torch.Tensor]:
    b = _blocks(x)
    if kind == "int8":
        scale = b.abs().amax(dim=1).clamp_min(1e-30) / 127
        return [torch.round(b / scale[:, None]).to(torch.int8).flatten(), scale]
    scale = b.abs().mean(dim=1)  # onebit
    bits = (b >= 0).flatten().view(-1, 8).to(torch.uint8)
    packed = (bits << torch.arange(8, dtype=torch.uint8)).sum(dim=1).to(torch.uint8)
    return [packed, scale]


def _decode(kind: str, parts: list[torch.Tensor], numel: int) -> torch.Tensor:
    data, scale = parts
    if kind == "int8":
        out = data.view(-1, BLOCK).float() * scale[:, None]
    else:
        bits = (data[:, None] >> torch.arange(8, dtype=torch.uint8)) & 1
        signs = bits.flatten().float() * 2 - 1
        out = signs.view(-1, BLOCK) * scale[:, None]
    return out.flatten()[:numel]


def _nbytes(parts: list[torch.Tensor]) -> int:
    return sum(p.numel() * p.element_size() for p in parts)


class Compressor:
    """One worker's compression state for ``plan.compression`` over ``n`` workers."""

    def __init__(self, compression: Any, n: int, rank: int) -> None:
        self.c, self.n, self.rank = compression, n, rank
        self.residual: torch.Tensor | None = None
        self.steps = 0

    def hook_ddp(self, model: torch.nn.Module) -> torch.nn.Module:
        """fp16 / powersgd: the model wrapped in DDP with torch's hook registered."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, bucket_cap_mb=1024)
        if self.c.kind == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        else:
            state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=self.c.rank,
                start_powerSGD_iter=max(2, self.c.warmup_steps),
                use_error_feedback=self.c.error_feedback, warm_start=False)
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return ddp

    def ddp_bytes(self, model: torch.nn.Module) -> int:
        """Bytes a worker sends a step under a DDP hook (ring all-reduce: 2 (n - 1) / n of
        the payload): fp16 2 bytes an element; PowerSGD's P and Q factors of each matrix
        (of each compressed one: torch skips those it would not shrink 2x), else fp32."""
        payload = 0.0
        warm = self.steps < max(2, self.c.warmup_steps) and self.c.kind == "powersgd"
        for p in model.parameters():
            if self.c.kind == "fp16":
                payload += 2 * p.numel()
            elif p.dim() > 1 and not warm:
                n, m = p.shape[0], p[0].numel()
                r = min(self.c.rank, n, m)
                payload += 4 * (r * (n + m) if n * m >= 2 * r * (n + m) else n * m)
            else:
                payload += 4 * p.numel()
        self.steps += 1
        return ring_bytes(payload, self.n)

    def average(self, flat: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The workers' mean of ``flat`` through the compression (int8, onebit, topk, or
        uncompressed in the warm-up) and the bytes this worker sent."""
        self.steps += 1
        if self.steps <= self.c.warmup_steps:
            dist.all_reduce(flat)
            return flat / self.n, ring_bytes(4 * flat.numel(), self.n)
        if self.c.error_feedback and self.residual is not None:
            flat = flat + self.residual
        mean, sent, kept = (self._topk(flat) if self.c.kind == "topk"
                            else self._two_phase(flat))
        if self.c.error_feedback:
            self.residual = flat - kept
        return mean, sent

    def _topk(self, flat: torch.Tensor) -> tuple[torch.Tensor, int, torch.Tensor]:
        k = max(1, int(round(self.c.ratio * flat.numel())))
        idx = flat.abs().topk(k).indices.to(torch.int32)
        vals = flat[idx.long()]
        all_v = [torch.empty_like(vals) for _ in range(self.n)]
        all_i = [torch.empty_like(idx) for _ in range(self.n)]
        dist.all_gather(all_v, vals)
        dist.all_gather(all_i, idx)
        dense = torch.zeros_like(flat)
        for v, i in zip(all_v, all_i, strict=True):
            dense.index_add_(0, i.long(), v)
        kept = torch.zeros_like(flat).index_copy_(0, idx.long(), vals)
        return dense / self.n, (self.n - 1) * (vals.numel() * 4 + idx.numel() * 4), kept

    def _two_phase(self, flat: torch.Tensor) -> tuple[torch.Tensor, int, torch.Tensor]:
        kind, n, numel = self.c.kind, self.n, flat.numel()
        size = -(-numel // n)
        padded = torch.cat([flat, flat.new_zeros(size * n - numel)])
        chunks = list(padded.split(size))
        mine = [_encode(kind, c) for c in chunks]
        kept = torch.cat([_decode(kind, e, size) for e in mine])[:numel]
        got = [[torch.empty_like(p) for p in mine[self.rank]] for _ in range(n)]
        reqs, sent = [], 0
        for j in range(n):
            if j == self.rank:
                got[j] = mine[j]
                continue
            for p in mine[j]:
                reqs.append(dist.isend(p, dst=j))
                sent += p.numel() * p.element_size()
            reqs += [dist.irecv(buf, src=j) for buf in got[j]]
        for r in reqs:
            r.wait()
        mean = sum(_decode(kind, g, size) for g in got) / n
        enc = _encode(kind, mean)
        gathered = [[torch.empty_like(p) for p in enc] for _ in range(n)]
        for part, bufs in zip(enc, zip(*gathered, strict=True), strict=True):
            dist.all_gather(list(bufs), part)
        sent += (n - 1) * _nbytes(enc)
        out = torch.cat([_decode(kind, g, size) for g in gathered])[:numel]
        return out, sent, kept
