"""One rank of an executor run; started by ``torchrun`` (see :mod:`executor.launch`).

``python -m executor.worker CONFIG.json`` reads the model, plan and run settings, trains
``warmup + steps`` steps on a learnable synthetic task, then one more step while recording
its collectives, and writes ``rank<R>.json`` beside the config. Progress goes to
``progress<R>`` (the launcher's hang detection); a failure goes to ``error<R>.txt`` as one
line before the rank exits non-zero.
"""

from __future__ import annotations

import contextlib
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from executor.collectives import CollectiveRecorder, attribute, summarize, trace_collectives
from executor.model import Transformer
from executor.parallel import Parallel, parallelize
from executor.rank import progress, rank_main
from sim.spec.experts import experts_follow_dense
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["main", "synthetic_batch"]


def synthetic_batch(step: int, sequences: int, seq_len: int, vocab: int, seed: int,
                    alphabet: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences over the first ``alphabet`` tokens where each token fixes the next,
    x' = (5x + 7) mod alphabet, from a random start: the loss falls from ln(vocab) as the
    model learns the map (one step of real training moves it)."""
    a = min(alphabet, vocab)
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    seq = torch.empty(sequences, seq_len + 1, dtype=torch.int64)
    seq[:, 0] = torch.randint(0, a, (sequences,), generator=g)
    for t in range(seq_len):
        seq[:, t + 1] = (5 * seq[:, t] + 7) % a
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def _rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())


class Runner:
    """Trains the plan on this rank."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.spec = ModelSpec.from_dict(cfg["model"])
        self.plan = Plan.from_dict(cfg["plan"])
        self.device = torch.device(cfg["device"])
        torch.manual_seed(cfg["seed"])  # identical initial weights on every rank
        model = Transformer(self.spec, self.plan.seq_len)
        self.par: Parallel = parallelize(model.to(self.device), self.plan, self.device.type,
                                         check=not cfg.get("run_refused", False))
        params = [p for c in self.par.chunks for p in c.parameters()]
        self.optimizer = self._optimizer(params)
        self.schedule = self._schedule() if self.plan.pp > 1 else None
        mesh = self.par.mesh
        self.dp_rank = mesh.get_local_rank("dp")
        self.loss_parallel = self.plan.tp > 1

    def _optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        """AdamW (the default), or plain SGD, whose step is proportional to the gradient:
        a run that scales some gradients wrongly then trains differently (AdamW's first
        steps hardly see a constant factor)."""
        if self.cfg.get("optimizer", "adamw") == "sgd":
            cls, kw = torch.optim.SGD, {"lr": self.cfg["lr"]}
        else:
            cls, kw = torch.optim.AdamW, {"lr": self.cfg["lr"], "betas": (0.9, 0.95),
                                          "weight_decay": 0.0}
        if self.plan.zero_stage == 1 and self.plan.dp > 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            return ZeroRedundancyOptimizer(params, cls, process_group=self.par.groups["dp"],
                                           **kw)
        return cls(params, **kw)

    def _schedule(self) -> Any:
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleDualPipeV,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
        )

        num = self.plan.pp * self.plan.vpp
        group = self.par.groups["pp"]
        stages = [PipelineStage(c, v, num, self.device, group=group)
                  for c, v in zip(self.par.chunks, self.par.stage_ids, strict=True)]
        n = self.plan.num_microbatches
        if self.plan.schedule == "interleaved-1f1b":
            return ScheduleInterleaved1F1B(stages, n, loss_fn=_loss)
        if self.plan.schedule == "dualpipev":
            return ScheduleDualPipeV(stages, n, loss_fn=_loss)
        cls = ScheduleGPipe if self.plan.schedule == "gpipe" else Schedule1F1B
        return cls(stages[0], n, loss_fn=_loss)

    # One step ---------------------------------------------------------------------------------
    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.plan
        local = p.global_batch_size // p.dp
        ids, target = synthetic_batch(step, p.global_batch_size, p.seq_len,
                                      self.spec.vocab_size, self.cfg["seed"])
        rows = slice(self.dp_rank * local, (self.dp_rank + 1) * local)
        return ids[rows].to(self.device), target[rows].to(self.device)

    def _context(self) -> Any:
        if not self.loss_parallel:
            return contextlib.nullcontext()
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def step(self, step: int) -> float | None:
        """Forward and backward of every micro-batch, gradient sync, optimizer step; the
        mean loss where this rank computes it (the last pipeline stage)."""
        ids, target = self.batch(step)
        with self._context():
            loss = self._pipeline(ids, target) if self.schedule else self._micro(ids, target)
        self._sync_extra_grads()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def _micro(self, ids: torch.Tensor, target: torch.Tensor) -> float:
        n = self.plan.num_microbatches
        model = self.par.chunks[0]
        total = 0.0
        for i, (x, y) in enumerate(zip(ids.chunk(n), target.chunk(n), strict=True)):
            last = i == n - 1
            sync = getattr(model, "no_sync", None)
            ctx = sync() if sync is not None and not last else contextlib.nullcontext()
            with ctx:
                loss = _loss(model(x), y) / n
                loss.backward()
            total += float(loss.detach().full_tensor() if hasattr(loss, "full_tensor")
                           else loss.detach())
        return total

    def _pipeline(self, ids: torch.Tensor, target: torch.Tensor) -> float | None:
        assert self.schedule is not None
        last = self.par.last(self.plan)
        losses: list[torch.Tensor] = []
        kwargs: dict[str, Any] = {"target": target, "losses": losses} if last else {}
        args = (ids,) if self.par.first else ()
        self.schedule.step(*args, **kwargs)
        if not last:
            return None
        vals = [float(v.full_tensor() if hasattr(v, "full_tensor") else v) for v in losses]
        return sum(vals) / len(vals)

    def _sync_extra_grads(self) -> None:
        """Tied embedding gradients over the first and last stage (pipelines; summed on
        the rank under dualpipev, which holds both), expert gradients over the ranks
        holding the same experts, and sequence-parallel norm weights' partial gradients
        (one all-reduce each, before the optimizer reads them)."""
        self._reduce_partial_grads()
        grads = self._tied_grads() if self.spec.tied_embeddings and self.plan.pp > 1 else []
        if self.par.tied_group is not None:
            for grad in grads:
                dist.all_reduce(grad, group=self.par.tied_group)
        elif len(grads) == 2:
            total = grads[0] + grads[1]
            for grad in grads:
                grad.copy_(total)
        self.sync_expert_grads()

    def _tied_grads(self) -> list[torch.Tensor]:
        """This rank's gradients of the tied weight (the embedding's, the output layer's
        copy), as local tensors laid out as their parameters are."""
        out = []
        for chunk in self.par.chunks:
            inner = getattr(chunk, "module", chunk)
            for part in (inner.tok_embeddings, inner.output):
                grad = None if part is None else part.weight.grad
                if grad is None:
                    continue
                if hasattr(grad, "to_local"):  # both ends' shards alike: the embedding's
                    # gradient may come back replicated
                    grad = part.weight.grad = grad.redistribute(  # type: ignore[union-attr]
                        grad.device_mesh, part.weight.placements)
                    grad = grad.to_local()
                out.append(grad)
        return out

    def sync_expert_grads(self) -> None:
        """Expert gradients, where the experts are not the data-parallel wrapper's: summed
        over the ranks holding the same shard (one all-reduce of all of them; FSDP2 has
        averaged them over those ranks instead) and divided by the data-parallel degree,
        which gives each the data-parallel mean as a dense gradient has (each rank's
        gradient holds every token that reached its experts, from any replica)."""
        p, group = self.plan, self.par.expert_dp_group
        fsdp = p.zero_stage >= 2 and p.dp > 1
        if not self.spec.is_moe or (fsdp and experts_follow_dense(p)):
            return
        params = [q for c in self.par.chunks for n, q in c.named_parameters()
                  if ".experts." in n]
        size = 1 if group is None else dist.get_world_size(group)
        if fsdp:
            scale = size / p.dp if group is not None else 1 / p.dp
        else:
            for q in params:  # an expert no token reached: its peers' gradients still count
                if q.grad is None:
                    q.grad = torch.zeros_like(q)
            if group is not None and params:
                _all_reduce_in(p.dtype, [q.grad for q in params], group)
            scale = 1 / p.dp
        for q in params:
            if q.grad is not None:
                q.grad.mul_(scale)

    def _reduce_partial_grads(self) -> None:
        if not self.plan.sequence_parallel:
            return
        from torch.distributed.tensor import DTensor

        for chunk in self.par.chunks:
            for p in chunk.parameters():
                g = p.grad
                if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
                    p.grad = g.redistribute(g.device_mesh, p.placements)  # type: ignore[attr-defined]

    def labels(self) -> dict[str, str]:
        out = {g.group_name: name for name, g in self.par.groups.items()}
        if self.par.tied_group is not None:
            out[self.par.tied_group.group_name] = "embedding"
        if self.par.expert_dp_group is not None:
            out[self.par.expert_dp_group.group_name] = "edp"
        return out


def record_step(runner: Any, step: int, trace_path: Path) -> list[tuple[str, str, int, int]]:
    """One more step under the torch profiler and the collective recorder: every
    collective it issued with its group (see :mod:`executor.collectives`)."""
    from torch.profiler import ProfilerActivity, profile

    recorder = CollectiveRecorder(runner.labels())
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof, recorder:
        runner.step(step)
    prof.export_chrome_trace(str(trace_path))
    traced = trace_collectives(json.loads(trace_path.read_text()))
    nested = "tp" if runner.plan.tp > 1 else "unattributed"
    return attribute(recorder.log, traced, nested)


def run(cfg: dict[str, Any], out: Path, rank: int) -> dict[str, Any]:
    base_rss = _rss_bytes()
    if "workload" in cfg:  # a workload graph (executor/graph_run.py)
        from executor.graph_run import GraphRunner

        runner: Any = GraphRunner(cfg)
    else:
        runner = Runner(cfg)
    fault = cfg.get("fault") or {}
    times, losses = [], []
    total = cfg["warmup"] + cfg["steps"]
    for step in range(total):
        if fault.get("rank") == rank and fault.get("step") == step:
            if fault["kind"] == "crash":
                raise RuntimeError(f"injected crash at step {step}")
            time.sleep(10**6)  # injected hang
        progress(out, rank, 2 * step + 1, f"in step {step + 1} of {total}")
        dist.barrier()
        t0 = time.perf_counter()
        loss = runner.step(step)
        times.append(time.perf_counter() - t0)
        losses.append(loss)
        progress(out, rank, 2 * step + 2, f"finished step {step + 1} of {total}")
    log = record_step(runner, total, out / f"trace{rank}.json")
    peak = torch.cuda.max_memory_allocated() if runner.device.type == "cuda" else _rss_bytes()
    return {"rank": rank, "step_s": times, "loss": losses, "peak_bytes": peak,
            "base_rss_bytes": base_rss, "peak_rss_bytes": _rss_bytes(),
            "collectives": summarize(log),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def _all_reduce_in(dtype: str, grads: list[torch.Tensor], group: Any) -> None:
    """Sum ``grads`` over ``group`` in one all-reduce of the training dtype (bf16 on the
    wire, as DDP's compress hook sends the dense gradients)."""
    flat = torch.cat([g.reshape(-1) for g in grads])
    wire = flat.to(torch.bfloat16) if dtype == "bf16" else flat
    dist.all_reduce(wire, group=group)
    for g, part in zip(grads, wire.split([g.numel() for g in grads]), strict=True):
        g.copy_(part.view_as(g))


def main(argv: list[str] | None = None) -> int:
    return rank_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())

