"""Apply a Plan to the model with torch's own parallel APIs, in one ordered step.

Order (as torchtitan): device mesh from the plan's placement → pipeline split →
tensor/sequence parallel (DTensor ``parallelize_module``) → expert parallel → activation
checkpointing → data parallel (DDP, or FSDP2 ``fully_shard`` for ZeRO-2/3, DDP with
``ZeroRedundancyOptimizer`` for ZeRO-1).
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from executor.model import MoE, Transformer
from sim.errors import SpecError
from sim.layout.placement import rank_coords
from sim.layout.stages import virtual_stage_layers
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["Parallel", "parallelize", "build_mesh", "ddp_bucket_bytes", "MESH_DIMS"]

MESH_DIMS = ("pp", "dp", "cp", "tp")  # outermost first, as torch meshes are written


@dataclass
class Parallel:
    """What one rank runs: its model chunks (one, or vpp for interleaved pipelines)."""

    mesh: DeviceMesh
    chunks: list[nn.Module]
    stage_ids: list[int]  # virtual pipeline stage of each chunk
    groups: dict[str, Any] = field(default_factory=dict)  # name -> ProcessGroup (size > 1)
    tied_group: Any = None  # first and last stage: tied embedding gradients
    expert_dp_group: Any = None  # ranks holding the same experts (dp / ep of them)

    @property
    def first(self) -> bool:
        return 0 in self.stage_ids

    def last(self, plan: Plan) -> bool:
        return plan.pp * plan.vpp - 1 in self.stage_ids


def _logical_rank(plan: Plan, pp: int, dp: int, cp: int, tp: int) -> int:
    """Rank at these coordinates under the plan's placement (the dp coordinate is split
    into its expert-parallel part, innermost, and the rest, as in :mod:`sim.layout.placement`)."""
    _, stride = rank_coords(plan)
    coords = {"pp": pp, "ep": dp % plan.ep, "dp": dp // plan.ep, "cp": cp, "tp": tp}
    r = sum(coords[d] * stride[d] for d in stride)
    return plan.placement[r] if isinstance(plan.placement, tuple) else r


def mesh_ranks(plan: Plan) -> torch.Tensor:
    """The world's ranks as a (pp, dp, cp, tp) tensor."""
    sizes = (plan.pp, plan.dp, plan.cp, plan.tp)
    out = torch.empty(sizes, dtype=torch.int64)
    for idx in torch.cartesian_prod(*(torch.arange(s) for s in sizes)).view(-1, 4).tolist():
        out[tuple(idx)] = _logical_rank(plan, *idx)
    return out


def build_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    return DeviceMesh(device_type, mesh_ranks(plan), mesh_dim_names=MESH_DIMS)


def _new_groups(sets: list[list[int]]) -> Any:
    """Every rank creates every group (torch requires it); returns the one holding us."""
    mine = None
    for ranks in sets:
        g = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            mine = g
    return mine


def ddp_bucket_bytes(plan: Plan) -> int:
    """Gradient bucket of the simulator's data-parallel model (Megatron-LM's 40M
    parameters, at least 1M per DP rank), in bytes of the reduced gradient dtype."""
    from sim.layout.inventory import dp_bucket_params

    return int(dp_bucket_params(plan) * plan.activation_bytes)


def _check(plan: Plan, spec: ModelSpec) -> None:
    from executor.capabilities import unsupported

    why = unsupported(spec, plan)
    if why is not None:
        raise SpecError(*why)


# Pipeline split -----------------------------------------------------------------------------
def split_stage(model: Transformer, layers: range, first: bool, last: bool) -> Transformer:
    """A copy of ``model`` holding ``layers`` only; the embedding on the first stage, the
    final norm and output layer on the last."""
    chunk = copy.deepcopy(model)
    chunk.layers = nn.ModuleDict({str(i): chunk.layers[str(i)] for i in layers})
    if not first:
        chunk.tok_embeddings = chunk.pos_embeddings = None
    if not last:
        chunk.norm = chunk.output = None
    elif not first and chunk.output is not None and model.spec.tied_embeddings:
        # The last stage keeps its own copy of the tied weight; their gradients are summed
        # over the first and last stage after backward (Megatron-LM's embedding group).
        chunk.output.weight = nn.Parameter(model.tok_embeddings.weight.detach().clone())
    return chunk


def _chunks(model: Transformer, plan: Plan, pp_rank: int) -> tuple[list[Transformer], list[int]]:
    counts = virtual_stage_layers(plan, model.spec)
    if sum(counts) != model.spec.num_layers:
        raise SpecError("plan.layers_per_stage", f"sum {sum(counts)} != model.num_layers "
                        f"{model.spec.num_layers}")
    starts = [sum(counts[:i]) for i in range(len(counts))]
    ids = list(range(pp_rank, len(counts), plan.pp))
    chunks = [split_stage(model, range(starts[v], starts[v] + counts[v]), v == 0,
                          v == len(counts) - 1) for v in ids]
    return chunks, ids


# Tensor / sequence parallel -------------------------------------------------------------------
def _tp_block_plan(sp: bool) -> dict[str, Any]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    act = Shard(1) if sp else Replicate()
    # One gather (SP) or one backward all-reduce per sub-block, shared by its projections.
    prepare = functools.partial(PrepareModuleInput, input_layouts=(act, None),
                                desired_input_layouts=(Replicate(), None),
                                use_local_output=False)
    plan: dict[str, Any] = {
        "attention": prepare(),
        "attention.wqkv": ColwiseParallel(), "attention.wo": RowwiseParallel(output_layouts=act),
        "feed_forward": PrepareModuleInput(input_layouts=(act,),
                                           desired_input_layouts=(Replicate(),),
                                           use_local_output=False),
        "feed_forward.w13": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(
            output_layouts=act)}
    if sp:
        plan.update({"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()})
    return plan


@torch.no_grad()
def _interleave_rows(linear: nn.Linear, parts: tuple[int, ...], tp: int) -> None:
    """Reorder a fused projection's output rows from [p0 | p1 | ...] to rank blocks
    [p0_0 | p1_0 | ... | p0_1 | p1_1 | ...], so that the column split gives every rank its
    share of each part and the layer computes the same function as unsplit."""
    for param in (linear.weight, linear.bias):
        if param is None:
            continue
        unit = param.shape[0] // sum(parts)
        pieces = param.split([n * unit for n in parts])
        for piece in pieces:
            if piece.shape[0] % tp:
                raise SpecError("plan.tp", f"{piece.shape[0]} rows of a fused projection "
                                f"part do not split over tp {tp}")
        blocks = [c for r in range(tp) for piece in pieces for c in [piece.chunk(tp)[r]]]
        param.copy_(torch.cat(blocks))


def apply_tp(chunk: Transformer, mesh: DeviceMesh, sp: bool) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    act = Shard(1) if sp else Replicate()
    top: dict[str, Any] = {}
    if chunk.tok_embeddings is not None:  # vocab-parallel embedding
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=act)
    if chunk.output is not None:  # vocab-parallel logits, for loss_parallel
        if sp:
            top["norm"] = SequenceParallel()
        top["output"] = ColwiseParallel(input_layouts=act, output_layouts=Shard(-1),
                                        use_local_output=False)
    tied = chunk.output is not None and chunk.tok_embeddings is not None and \
        chunk.output.weight is chunk.tok_embeddings.weight
    parallelize_module(chunk, mesh, top)
    if tied:  # both shard the [vocab, hidden] weight on dim 0: share the one DTensor
        chunk.output.weight = chunk.tok_embeddings.weight  # type: ignore[union-attr]
    block = _tp_block_plan(sp)
    for layer in chunk.layers.values():
        tp = mesh.size()
        _interleave_rows(layer.attention.wqkv, layer.attention.parts, tp)
        if layer.feed_forward.gated:
            _interleave_rows(layer.feed_forward.w13, (1, 1), tp)
        parallelize_module(layer, mesh, block)


# Expert parallel, recompute, data parallel ---------------------------------------------------
def apply_ep(chunk: Transformer, group: Any, ep: int, ep_rank: int) -> None:
    """Keep this rank's ``num_experts / ep`` experts of every MoE layer."""
    for layer in chunk.layers.values():
        moe = layer.feed_forward
        if not isinstance(moe, MoE):
            continue
        if moe.num_experts % ep:
            raise SpecError("plan.ep", f"num_experts {moe.num_experts} is not a multiple of "
                            f"ep {ep}")
        per = moe.num_experts // ep
        moe.first_expert = ep_rank * per
        moe.experts = nn.ModuleList(moe.experts[ep_rank * per:(ep_rank + 1) * per])
        moe.ep_group = group


def apply_recompute(chunk: Transformer, mode: str) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def keep_matmuls(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        """Selective: keep GEMM outputs, recompute attention and element-wise ops."""
        saved = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                 torch.ops.aten.bmm.default)
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    kwargs: dict[str, Any] = {"preserve_rng_state": False}
    if mode == "selective":
        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts,
                                                 keep_matmuls)
    for name, layer in list(chunk.layers.items()):
        chunk.layers[name] = checkpoint_wrapper(layer, **kwargs)


def apply_dp(chunk: nn.Module, plan: Plan, mesh: DeviceMesh, group: Any) -> nn.Module:
    if plan.zero_stage >= 2:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) \
            if plan.dtype == "bf16" else MixedPrecisionPolicy()
        reshard = plan.zero_stage == 3
        dp_mesh = mesh["dp"]
        for layer in chunk.layers.values():  # type: ignore[union-attr]
            fully_shard(layer, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(chunk, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
        return chunk
    from torch.nn.parallel import DistributedDataParallel as DDP

    if plan.tp > 1:
        raise SpecError("plan.zero_stage", "with tp > 1 and dp > 1 the executor shards with "
                        "FSDP2: use zero_stage 2 or 3")
    experts = [n for n, _ in chunk.named_parameters() if ".experts." in n]
    if experts:  # expert weights differ per EP rank: reduced over the EP-replica group
        DDP._set_params_and_buffers_to_ignore_for_model(chunk, experts)
    ddp = DDP(chunk, process_group=group,
              bucket_cap_mb=ddp_bucket_bytes(plan) / 2**20,
              gradient_as_bucket_view=True, broadcast_buffers=False)
    if plan.dtype == "bf16":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

        ddp.register_comm_hook(group, bf16_compress_hook)
    return ddp


def parallelize(model: Transformer, plan: Plan, device_type: str) -> Parallel:
    """This rank's part of ``model`` with the plan applied (see the module docstring)."""
    _check(plan, model.spec)
    mesh = build_mesh(plan, device_type)
    pp_rank, dp_rank = mesh.get_coordinate()[:2]  # type: ignore[index]
    chunks, ids = _chunks(model, plan, pp_rank)
    par = Parallel(mesh, list(chunks), ids)
    for name in ("pp", "dp", "tp"):
        if mesh[name].size() > 1:
            par.groups[name] = mesh[name].get_group()
    ranks = mesh_ranks(plan)
    if plan.ep > 1:
        # Expert-parallel groups: consecutive dp coordinates (ep innermost, as the simulator).
        sets = [ranks[p, d0:d0 + plan.ep, c, t].tolist()
                for p in range(plan.pp) for d0 in range(0, plan.dp, plan.ep)
                for c in range(plan.cp) for t in range(plan.tp)]
        par.groups["ep"] = _new_groups(sets)
        if plan.dp > plan.ep:
            sets = [ranks[p, e::plan.ep, c, t].tolist() for p in range(plan.pp)
                    for e in range(plan.ep) for c in range(plan.cp) for t in range(plan.tp)]
            par.expert_dp_group = _new_groups(sets)
    if plan.pp > 1 and model.spec.tied_embeddings:
        sets = [[int(ranks[0, d, c, t]), int(ranks[-1, d, c, t])] for d in range(plan.dp)
                for c in range(plan.cp) for t in range(plan.tp)]
        par.tied_group = _new_groups(sets)
    for i, chunk in enumerate(par.chunks):
        assert isinstance(chunk, Transformer)
        if plan.tp > 1:
            apply_tp(chunk, mesh["tp"], plan.sequence_parallel)
        if plan.ep > 1:
            apply_ep(chunk, par.groups["ep"], plan.ep, dp_rank % plan.ep)
        if plan.recompute != "none":
            apply_recompute(chunk, plan.recompute)
        if plan.dp > 1:
            par.chunks[i] = apply_dp(chunk, plan, mesh, par.groups["dp"])
    return par
