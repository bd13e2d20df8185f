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

from executor.grid import expert_blocks, logical_rank, stage_order
from executor.model import FeedForward, MoE, Transformer
from sim.errors import SpecError
from sim.layout.stages import rank_virtual_stages, virtual_stage_layers
from sim.spec.experts import expert_tp, experts_follow_dense
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.zero import regathers

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


def mesh_ranks(plan: Plan) -> torch.Tensor:
    """The world's ranks as a (pp, dp, cp, tp) tensor."""
    sizes = (plan.pp, plan.dp, plan.cp, plan.tp)
    out = torch.empty(sizes, dtype=torch.int64)
    for idx in torch.cartesian_prod(*(torch.arange(s) for s in sizes)).view(-1, 4).tolist():
        out[tuple(idx)] = logical_rank(plan, *idx)
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
    ids = rank_virtual_stages(plan, pp_rank)
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


def _tp_moe_plan(moe: MoE) -> dict[str, Any]:
    """An MoE layer's MLP under tensor (and sequence) parallelism, as Megatron-LM runs it:
    the router sees each rank's sequence shard (its weight's gradient summed over TP, as a
    norm's); the shared expert is a tensor-parallel MLP on the gathered sequence; the routed
    experts are :mod:`executor.moe`'s."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan: dict[str, Any] = {"feed_forward.router": SequenceParallel(use_local_output=True)}
    if moe.shared is not None:
        plan.update({
            "feed_forward.shared": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                use_local_output=False),
            "feed_forward.shared.w13": ColwiseParallel(),
            "feed_forward.shared.w2": RowwiseParallel(output_layouts=Shard(1))})
    return plan


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
    attention = {k: v for k, v in block.items() if not k.startswith("feed_forward")}
    tp = mesh.size()
    for layer in chunk.layers.values():
        _interleave_rows(layer.attention.wqkv, layer.attention.parts, tp)
        ff = layer.feed_forward
        mlp = ff.shared if isinstance(ff, MoE) else ff
        if mlp is not None and mlp.gated:
            _interleave_rows(mlp.w13, (1, 1), tp)
        parallelize_module(layer, mesh, {**attention, **_tp_moe_plan(ff)}
                           if isinstance(ff, MoE) else block)


# Expert parallel, recompute, data parallel ---------------------------------------------------
@dataclass
class ExpertGrid:
    """This rank's place in the expert grid (:mod:`sim.spec.experts`) and its groups."""

    ep: int
    etp: int
    ep_rank: int
    etp_rank: int
    block: Any  # the etp x ep ranks whose token counts are gathered
    ep_group: Any
    etp_group: Any
    edp_group: Any  # ranks holding the same expert shards (None when only one does)


def expert_grid(plan: Plan, tp_group: Any) -> ExpertGrid:
    """Every rank creates every group of the grid (torch's rule) and keeps its own: the
    stage's ranks cut into blocks of ``etp x ep`` (ETP index fastest); a block is the
    expert-parallel groups of each ETP index, the ETP groups of each EP index; the same
    position in every block is an expert-data-parallel group."""
    etp, ep, me = expert_tp(plan), plan.ep, dist.get_rank()
    width = etp * ep
    stages = [stage_order(plan, p) for p in range(plan.pp)]
    blocks = expert_blocks(plan)
    ep_group = _new_groups([b[a::etp] for b in blocks for a in range(etp)]) if ep > 1 else None
    etp_group = tp_group if etp > 1 else None  # etp is 1 or tp (sim.spec.experts)
    block = ep_group if etp == 1 else etp_group if ep == 1 else _new_groups(blocks)
    edp = [[o[b + a] for b in range(0, len(o), width)] for o in stages for a in range(width)]
    edp_group = _new_groups(edp) if len(edp[0]) > 1 else None
    pos = next(b.index(me) for b in blocks if me in b)
    return ExpertGrid(ep, etp, pos // etp, pos % etp, block, ep_group, etp_group, edp_group)


@torch.no_grad()
def _shard_expert(ff: FeedForward, etp: int, rank: int) -> None:
    """Keep this ETP rank's share of an expert: w13's rows (each half's, when gated), w2's
    columns, as Megatron-LM's column- and row-parallel expert linears."""
    _interleave_rows(ff.w13, (1, 1) if ff.gated else (1,), etp)
    ff.w13.weight = nn.Parameter(ff.w13.weight.chunk(etp)[rank].clone())
    ff.w2.weight = nn.Parameter(ff.w2.weight.chunk(etp, dim=1)[rank].clone())


def apply_ep(chunk: Transformer, grid: ExpertGrid) -> None:
    """Keep this rank's ``num_experts / ep`` experts of every MoE layer (their ETP shard)."""
    for layer in chunk.layers.values():
        moe = layer.feed_forward
        if not isinstance(moe, MoE):
            continue
        if moe.num_experts % grid.ep:
            raise SpecError("plan.ep", f"num_experts {moe.num_experts} is not a multiple of "
                            f"ep {grid.ep}")
        per = moe.num_experts // grid.ep
        moe.experts.each = nn.ModuleList(
            moe.experts.each[grid.ep_rank * per:(grid.ep_rank + 1) * per])
        for ff in moe.experts if grid.etp > 1 else ():
            _shard_expert(ff, grid.etp, grid.etp_rank)
        moe.ep, moe.etp, moe.ep_rank, moe.etp_rank = grid.ep, grid.etp, grid.ep_rank, \
            grid.etp_rank
        moe.block_group, moe.ep_group, moe.etp_group = grid.block, grid.ep_group, \
            grid.etp_group


def apply_recompute(chunk: Transformer, mode: str, replay: str = "whole") -> None:
    """``full``: each layer checkpointed whole, its replay whole or stopped early (torch's
    ``early_stop``: at the last tensor the backward needs, ``plan.recompute_replay``);
    ``selective``: the attention core only (Megatron-LM's selective recomputation; no
    collective runs twice)."""
    if mode == "selective":
        for layer in chunk.layers.values():
            layer.attention.recompute_core = True
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for name, layer in list(chunk.layers.items()):
        chunk.layers[name] = checkpoint_wrapper(layer, preserve_rng_state=False,
                                                early_stop=replay == "early-stop")


def _fsdp(chunk: nn.Module, plan: Plan, dp_mesh: DeviceMesh, edp: Any) -> nn.Module:
    """FSDP2 per layer and over the chunk; an MoE layer's experts, unless they follow the
    dense parameters, are their own unit over ``edp`` (a mesh), or left out where no other
    rank holds them."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) \
        if plan.dtype == "bf16" else MixedPrecisionPolicy()
    kw = {"mp_policy": mp, "reshard_after_forward": regathers(plan)}
    ignored: set[nn.Parameter] = set()
    for layer in chunk.layers.values():  # type: ignore[union-attr]
        ff = layer.feed_forward
        if isinstance(ff, MoE) and not experts_follow_dense(plan):
            if edp is None:
                ignored |= set(ff.experts.parameters())
            else:
                fully_shard(ff.experts, mesh=edp, **kw)
        fully_shard(layer, mesh=dp_mesh, ignored_params=ignored or None, **kw)
    fully_shard(chunk, mesh=dp_mesh, ignored_params=ignored or None, **kw)
    return chunk


def apply_dp(chunk: nn.Module, plan: Plan, mesh: DeviceMesh, group: Any, edp: Any = None
             ) -> nn.Module:
    if plan.zero_stage >= 2:
        edp_mesh = None if edp is None else DeviceMesh.from_group(edp, mesh.device_type)
        return _fsdp(chunk, plan, mesh["dp"], edp_mesh)
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


def parallelize(model: Transformer, plan: Plan, device_type: str, check: bool = True
                ) -> Parallel:
    """This rank's part of ``model`` with the plan applied (see the module docstring);
    ``check=False`` runs a plan the executor refuses (validation scripts measuring why)."""
    if check:
        _check(plan, model.spec)
    mesh = build_mesh(plan, device_type)
    pp_rank = mesh.get_coordinate()[0]  # type: ignore[index]
    chunks, ids = _chunks(model, plan, pp_rank)
    par = Parallel(mesh, list(chunks), ids)
    for name in ("pp", "dp", "tp"):
        if mesh[name].size() > 1:
            par.groups[name] = mesh[name].get_group()
    ranks = mesh_ranks(plan)
    grid = expert_grid(plan, par.groups.get("tp")) if model.spec.is_moe else None
    if grid is not None:
        par.expert_dp_group = grid.edp_group
        if grid.ep_group is not None:
            par.groups["ep"] = grid.ep_group
        if grid.block not in (None, grid.ep_group, grid.etp_group):
            par.groups["tp_ep"] = grid.block
    if plan.pp > 1 and model.spec.tied_embeddings and plan.schedule != "dualpipev":
        sets = [[int(ranks[0, d, c, t]), int(ranks[-1, d, c, t])] for d in range(plan.dp)
                for c in range(plan.cp) for t in range(plan.tp)]
        par.tied_group = _new_groups(sets)  # (dualpipev: both ends on pp rank 0)
    for i, chunk in enumerate(par.chunks):
        assert isinstance(chunk, Transformer)
        if plan.tp > 1:
            apply_tp(chunk, mesh["tp"], plan.sequence_parallel)
        if grid is not None and grid.block is not None:
            apply_ep(chunk, grid)
        if plan.recompute != "none":
            apply_recompute(chunk, plan.recompute, plan.recompute_replay)
        if plan.dp > 1:
            par.chunks[i] = apply_dp(chunk, plan, mesh, par.groups["dp"],
                                     par.expert_dp_group)
    return par
