"""Two-stage synchronisation in the real runs (Overlapped Synchronization Parallel style;
:mod:`executor.sync.worker` runs it for ``sync.kind = "two-stage"``).

Each step a worker splits its gradient into an *important* part and the rest:

1. the important part (the ``important_fraction`` of elements with the largest magnitude
   in the previous step's mean gradient, which every worker holds alike so they agree; or
   the parameters of the ``important_layers``, by module name; the first step takes all)
   is all-reduced at once and applied as the workers' mean;
2. the rest is applied as the worker's own gradient (the local-gradient correction of the
   stale part) while its all-reduce runs in the background, overlapped with the next
   step's forward and backward; before the next first stage the worker waits for it and
   corrects its parameters by ``-lr (mean - own)`` on those elements.

With plain SGD the parameters after the correction are exactly those of a BSP step one
stage late. The last step's second stage is waited for at the end.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from executor.sync.compress import ring_bytes

__all__ = ["TwoStage"]

vec = torch.nn.utils.parameters_to_vector


class TwoStage:
    def __init__(self, worker: Any) -> None:
        self.w = worker
        sync = worker.plan.sync
        self.fraction = sync.important_fraction
        self.static: torch.Tensor | None = None
        if sync.important_layers:
            self.static = _layer_mask(worker.model, sync.important_layers)
        self.last_mean: torch.Tensor | None = None
        self.pending: tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.lr = float(worker.cfg["lr"])

    def _mask(self, numel: int) -> torch.Tensor:
        if self.static is not None:
            return self.static
        if self.last_mean is None:  # nothing agreed on yet: all of it at once
            return torch.ones(numel, dtype=torch.bool)
        keep = max(1, int(round(self.fraction * numel)))
        mask = torch.zeros(numel, dtype=torch.bool)
        mask[self.last_mean.abs().topk(keep).indices] = True
        return mask

    def finish(self) -> None:
        """Wait for the pending second stage and correct by it."""
        if self.pending is None:
            return
        handle, buf, rest, own = self.pending
        handle.wait()
        mean = buf / self.w.n
        flat = vec(self.w.params).detach()
        flat[rest] -= self.lr * (mean - own)
        torch.nn.utils.vector_to_parameters(flat, self.w.params)
        if self.last_mean is not None:
            self.last_mean[rest] = mean
        self.pending = None

    def step(self, k: int) -> None:
        w = self.w
        grads = vec([p.grad for p in w.params])  # this step's gradient, before the correction
        self.finish()
        mask = self._mask(grads.numel())
        important = grads[mask].clone()
        dist.all_reduce(important)
        mean = grads.clone()
        mean[mask] = important / w.n
        rest = (~mask).nonzero().flatten()
        if rest.numel():
            buf = grads[rest].clone()
            handle = dist.all_reduce(buf, async_op=True)
            self.pending = (handle, buf, rest, grads[rest].clone())
        self.last_mean = mean.clone()
        torch.nn.utils.vector_to_parameters(mean, [p.grad for p in w.params])
        w.opt.step()
        w.updates = k + 1
        w.log["sent_bytes"].append(ring_bytes(4 * grads.numel(), w.n))


def _layer_mask(model: torch.nn.Module, layers: tuple[str, ...]) -> torch.Tensor:
    """The flat-parameter elements of the named modules (``important_layers``)."""
    parts, found = [], set()
    for name, p in model.named_parameters():
        module = name.rsplit(".", 1)[0]
        hit = module in layers
        found |= {module} if hit else set()
        parts.append(torch.full((p.numel(),), hit, dtype=torch.bool))
    missing = sorted(set(layers) - found)
    if missing:
        from sim.errors import SpecError

        names = sorted({n.rsplit(".", 1)[0] for n, _ in model.named_parameters()})
        raise SpecError("plan.sync.important_layers", f"{missing[0]!r} is not a layer of the "
                        f"model (layers with parameters: {', '.join(names)})")
    return torch.cat(parts)
