"""Workload graphs run for real: the traced module (rebuilt from its ``source`` with the same
seed on every rank) under the plan's data and pipeline parallelism, with torch's own APIs —
DDP (ZeRO-0), DDP with ``ZeroRedundancyOptimizer`` (ZeRO-1), both under bf16 autocast for a
bf16 plan, FSDP2 ``fully_shard`` (bf16 through its mixed-precision policy) on each
top-level child and the root (ZeRO-2: kept gathered between forward and backward; ZeRO-3:
resharded), and ``torch.distributed.pipelining`` (split where each later stage's first layer
begins; GPipe or 1F1B). Ranks are laid out ``(pp, dp)`` with data parallelism innermost,
the plan's default placement.

The loss is the mean of the output's floating-point values (the model's own computation is
what is timed); the input is the traced example at the micro-batch size, the same every
step. :func:`graph_split` moves a pipeline boundary that falls where no module starts
(inside a module's own code, or on a module called twice) to the next layer where one does,
and the run and the prediction both use the split it returns.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from profiler.graph.timing import autocast
from sim.errors import SpecError
from sim.spec.plan import Plan
from sim.spec.workload import Workload

__all__ = ["GraphRunner", "graph_unsupported", "graph_split", "build_from_workload",
           "loss_of"]


def graph_unsupported(w: Workload, plan: Plan) -> tuple[str, str] | None:
    """(field, rule) of what the graph runner does not run, or None."""
    from sim.layout.graph import check_graph_plan

    try:
        check_graph_plan(w, plan)
    except SpecError as exc:
        return exc.field, exc.rule
    if plan.zero_stage >= 2 and plan.pp > 1:
        return "plan.zero_stage", "the executor runs FSDP (ZeRO-2/3) without a pipeline"
    if plan.dtype not in ("fp32", "bf16"):
        return "plan.dtype", f"{plan.dtype} is not run by the executor (fp32 or bf16)"
    if plan.dtype == "bf16" and plan.pp > 1:
        return "plan.dtype", "bf16 pipelines are not run by the executor yet (fp32)"
    if plan.recompute != "none":
        return "plan.recompute", "full is not run by the executor for workload graphs yet"
    if not w.source:
        return "model.source", "the workload names no source to rebuild the module from"
    return None


def _seq_len(w: Workload) -> int | None:
    """Tokens per sample of a traced sequence model (its sample is ``"S int64"``)."""
    dims = w.sample.split(" ")[0].split("x")
    return int(dims[0]) if len(dims) == 1 and dims[0].isdigit() else None


def build_from_workload(w: Workload, batch: int, device: str) -> tuple[nn.Module, Any]:
    from profiler.graph.sources import build

    module, example, _ = build(w.source, batch, _seq_len(w), device)
    return module, example


def loss_of(output: Any) -> torch.Tensor:
    leaves = [t for t in tree_leaves(output if not isinstance(output, dict)
                                     else list(output.values()))
              if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return sum((t.float().mean() for t in leaves), torch.zeros((), device=leaves[0].device))


def graph_split(w: Workload, plan: Plan, times: list[tuple[float, float]]
                ) -> tuple[int, ...] | None:
    """``layers_per_stage`` the run can split at (module docstring), from the plan's split
    or the simulator's balanced one; None without a pipeline."""
    from sim.layout.graph import graph_stages

    if plan.pp == 1:
        return None
    calls: dict[str, int] = {}
    meta, example = build_from_workload(w, 1, "meta")
    for n, m in meta.named_modules():
        if n:
            m.register_forward_pre_hook(
                lambda *_a, n=n: calls.__setitem__(n, calls.get(n, 0) + 1))
    with torch.no_grad():
        meta(**example) if isinstance(example, dict) else meta(example)
    names = [x.name for x in w.layers]
    cuts: list[int] = []
    for s in [r.start for r in graph_stages(w, plan, times)][1:]:
        j = next((i for i in range(max(s, cuts[-1] + 1 if cuts else 1), len(names))
                  if calls.get(names[i]) == 1), None)
        if j is None:
            raise SpecError("plan.pp", f"{plan.pp} stages: no module of {w.name} starts late "
                            "enough in the layer order to begin the next stage at")
        cuts.append(j)
    bounds = [0, *cuts, len(names)]
    return tuple(bounds[i + 1] - bounds[i] for i in range(plan.pp))


def _contiguous(_m: nn.Module, _a: Any, out: Any) -> Any:
    """A module's outputs, contiguous: a tensor crossing a pipeline boundary is sent, and
    received into a buffer of its layout (an LSTM's batch-first output is a transposed
    view), and gloo moves contiguous tensors only."""
    return tree_map(lambda t: t.contiguous() if isinstance(t, torch.Tensor)
                    and not t.is_contiguous() else t, out)


def _owned_inputs(_m: nn.Module, args: Any) -> Any:
    """A later stage's received tensors are leaves that need a gradient; a stage that starts
    with an in-place operation (MobileNet's activations) may not write into them, so it
    gets copies (the gradient still reaches the received tensors)."""
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) and t.is_leaf
                    and t.requires_grad else t, args)


class GraphRunner:
    """Trains a workload graph's plan on this rank (the worker's interface: ``step``,
    ``labels``, ``plan``, ``device``)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        from sim.spec.workload import workload_from_dict

        self.cfg, self.w = cfg, workload_from_dict(cfg["workload"])
        self.plan = p = Plan.from_dict(cfg["plan"])
        self.device = torch.device(cfg["device"])
        torch.manual_seed(cfg["seed"])  # identical initial weights on every rank
        module, self.example = build_from_workload(self.w, p.micro_batch_size,
                                                   self.device.type)
        self.mesh = init_device_mesh(self.device.type, (p.pp, p.dp), mesh_dim_names=("pp", "dp"))
        self.groups = {n: self.mesh[n].get_group() for n in ("pp", "dp") if self.mesh[n].size() > 1}
        self.pp_rank = self.mesh.get_local_rank("pp")
        self.schedule = None
        if p.pp > 1:
            module = self._stage(module)
        self.model = self._data_parallel(module)
        params = [q for q in self.model.parameters() if q.requires_grad]
        kw = {"lr": cfg["lr"], "weight_decay": 0.0}
        if p.zero_stage == 1 and p.dp > 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            self.optimizer: Any = ZeroRedundancyOptimizer(
                params, torch.optim.AdamW, process_group=self.groups["dp"], **kw)
        else:
            self.optimizer = torch.optim.AdamW(params, **kw)
        if p.pp > 1:
            self.schedule = self._schedule()

    def _stage(self, module: nn.Module) -> nn.Module:
        from torch.distributed.pipelining import SplitPoint, pipeline

        split = self.plan.layers_per_stage
        assert split is not None, "the launcher fixes the split (graph_split)"
        starts = [sum(split[:i]) for i in range(1, self.plan.pp)]
        spec = {self.w.layers[s].name: SplitPoint.BEGINNING for s in starts}
        args, kwargs = ((), self.example) if isinstance(self.example, dict) else \
            ((self.example,), {})
        for sub in module.modules():  # gloo sends and receives contiguous tensors only
            sub.register_forward_hook(_contiguous)
        self.pipe = pipeline(module, mb_args=args, mb_kwargs=kwargs, split_spec=spec)
        stage = self.pipe.get_stage_module(self.pp_rank)
        stage.register_forward_pre_hook(_owned_inputs)
        return stage

    def _data_parallel(self, module: nn.Module) -> nn.Module:
        p = self.plan
        if p.dp == 1:
            return module
        if p.zero_stage >= 2:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) \
                if p.dtype == "bf16" else MixedPrecisionPolicy()
            for child in module.children():
                if any(q.requires_grad for q in child.parameters()):
                    fully_shard(child, mesh=self.mesh["dp"], mp_policy=mp,
                                reshard_after_forward=p.zero_stage == 3)
            fully_shard(module, mesh=self.mesh["dp"], mp_policy=mp,
                        reshard_after_forward=p.zero_stage == 3)
            return module
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(module, process_group=self.groups["dp"], broadcast_buffers=False)

    def _schedule(self) -> Any:
        from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

        stage = self.pipe.build_stage(self.pp_rank, self.device, group=self.groups["pp"])
        if self.plan.dp > 1:  # the stage runs the DDP-wrapped module
            stage.submod = self.model
        cls = ScheduleGPipe if self.plan.schedule == "gpipe" else Schedule1F1B
        return cls(stage, self.plan.num_microbatches, loss_fn=lambda out, _t: loss_of(out))

    def _batch(self) -> Any:
        """The replica's batch: the example repeated for every micro-batch."""
        n = self.plan.num_microbatches
        return tree_map(lambda t: torch.cat([t] * n) if isinstance(t, torch.Tensor) else t,
                        self.example)

    def step(self, step: int) -> float | None:
        loss = self._pipeline() if self.schedule is not None else self._micro()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def _micro(self) -> float:
        n, total = self.plan.num_microbatches, 0.0
        for i in range(n):
            sync = getattr(self.model, "no_sync", None)
            ctx = sync() if sync is not None and i < n - 1 else contextlib.nullcontext()
            with ctx:
                with autocast(self.device.type, "bf16" if self.plan.dtype == "bf16"
                              and self.plan.zero_stage < 2 else "fp32"):  # FSDP: its policy
                    out = self.model(**self.example) if isinstance(self.example, dict) \
                        else self.model(self.example)
                loss = loss_of(out) / n
                loss.backward()
            total += float(loss.detach())
        return total

    def _pipeline(self) -> float | None:
        assert self.schedule is not None
        last = self.pp_rank == self.plan.pp - 1
        losses: list[torch.Tensor] = []
        batch = self._batch()
        local = self.plan.global_batch_size // self.plan.dp
        kwargs: dict[str, Any] = {"target": torch.zeros(local), "losses": losses} if last \
            else {}
        if self.pp_rank == 0:
            if isinstance(batch, dict):
                self.schedule.step(**batch, **kwargs)
            else:
                self.schedule.step(batch, **kwargs)
        else:
            self.schedule.step(**kwargs)
        return sum(float(v) for v in losses) / len(losses) if last else None

    def labels(self) -> dict[str, str]:
        return {g.group_name: name for name, g in self.groups.items()}

