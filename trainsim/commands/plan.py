"""``trainsim plan new`` and ``trainsim plan check``: write and validate plan JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

from trainsim.common import CLUSTER_HELP, MODEL_HELP, Parser

__all__ = ["cmd_plan_new", "cmd_plan_check", "add_plan_parser"]

_PLAN_INT_HELP = {
    "global_batch_size": "sequences per iteration (required)",
    "seq_len": "tokens per sequence (required)",
    "micro_batch_size": "sequences per micro-batch (default 1)",
    "dp": "data-parallel degree (default 1)", "tp": "tensor-parallel degree (default 1)",
    "pp": "pipeline-parallel degree (default 1)", "cp": "context-parallel degree (default 1)",
    "ep": "expert-parallel degree; etp*ep divides tp*cp*dp (default 1)",
    "etp": "MoE: expert-tensor-parallel degree, 1 or tp (default: tp)",
    "vpp": "virtual stages per pipeline rank: interleaved-1f1b, or 2 for dualpipev and "
           "dualpipe (default 1)",
    "zero_stage": "ZeRO stage 0-3 (default 0)",
}
_PLAN_INTS = tuple(_PLAN_INT_HELP)


def cmd_plan_new(args: argparse.Namespace) -> int:
    from sim import Plan, load_cluster, load_model, save_plan, validate

    fields = {k: getattr(args, k) for k in _PLAN_INTS if getattr(args, k) is not None}
    for k in ("schedule", "recompute", "dtype", "grad_reduce_dtype", "placement", "attention"):
        if getattr(args, k) is not None:
            fields[k] = getattr(args, k)
    fields["sequence_parallel"] = args.sequence_parallel
    fields["reshard_after_forward"] = not args.keep_gathered_weights
    fields["tp_overlap"] = args.tp_overlap
    from trainsim.commands.sync import section_fields

    fields.update(section_fields(args))
    for k in ("moe_max_load", "moe_capacity_factor", "moe_dispatcher", "moe_dispatch_dtype",
              "moe_comm_sms", "moe_overlap", "cp_comm", "recompute_modules", "recompute_replay"):
        if getattr(args, k) is not None:
            fields[k] = getattr(args, k)
    plan = Plan.from_dict(fields)
    if args.model or args.cluster:
        validate(plan, load_model(args.model) if args.model else None,
                 load_cluster(args.cluster) if args.cluster else None)
    text = json.dumps(plan.to_dict(), indent=2)
    if args.out:
        save_plan(plan, args.out)
    print(text)
    return 0


def cmd_plan_check(args: argparse.Namespace) -> int:
    from sim import load_cluster, load_model, load_plan, validate

    plan = load_plan(args.plan)
    validate(plan, load_model(args.model) if args.model else None,
             load_cluster(args.cluster) if args.cluster else None)
    print(f"{args.plan}: valid ({plan.world_size} ranks, {plan.num_microbatches} micro-batches)")
    return 0


def add_plan_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="create or check a plan JSON file")
    psub = p.add_subparsers(dest="plan_cmd", required=True, parser_class=Parser)
    new = psub.add_parser("new", help="write a plan from flags",
                          description="Build a plan JSON; omitted fields take the defaults "
                          "shown here (and in docs/reference/plan.md).")
    for k, text in _PLAN_INT_HELP.items():
        new.add_argument("--" + k.replace("_", "-"), dest=k, type=int, help=text,
                         required=k in ("global_batch_size", "seq_len"))
    new.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved-1f1b", "dualpipev",
                                            "dualpipe"],
                     help="pipeline schedule (default 1f1b)")
    new.add_argument("--recompute", choices=["none", "selective", "full"],
                     help="activation recomputation (default none)")
    new.add_argument("--recompute-modules", nargs="+", metavar="MODULE",
                     help="with --recompute selective: the modules it re-runs (core_attn, "
                     "layernorm, mlp, moe_act, shared_experts; default core_attn)")
    new.add_argument("--recompute-replay", choices=["whole", "early-stop"],
                     help="with --recompute full: the replay runs the whole layer (Megatron-LM, "
                     "torchtitan; default) or stops early at the last tensor backward needs "
                     "(torch's non-reentrant checkpoint, e.g. NeMo Automodel)")
    new.add_argument("--dtype", choices=["bf16", "fp16", "fp8", "fp32"],
                     help="training precision (default bf16)")
    new.add_argument("--grad-reduce-dtype", choices=["fp32", "bf16", "fp16"],
                     help="dtype gradients are accumulated and reduced in (default: fp32 for "
                     "fp32 training, else 16 bits; Megatron-LM's default under bf16 is fp32)")
    new.add_argument("--attention", choices=["flash", "standard"], help="flash (default) or "
                     "standard (materialises the s x s scores)")
    new.add_argument("--placement", help="rank order, innermost first (default tp-cp-ep-dp-pp)")
    new.add_argument("--sequence-parallel", action="store_true",
                     help="split norm/dropout activations over the TP group (needs tp > 1)")
    new.add_argument("--tp-overlap", action="store_true",
                     help="fuse the TP all-gathers and reduce-scatters with their GEMMs "
                     "(torch's async TP, Megatron-LM's --tp-comm-overlap; needs "
                     "--sequence-parallel)")
    new.add_argument("--keep-gathered-weights", action="store_true",
                     help="ZeRO-3: keep each layer's gathered weights from its forward to its "
                     "backward (one gather a micro-batch; FSDP2's reshard_after_forward=False)")
    new.add_argument("--cp-comm", choices=["p2p", "allgather", "a2a"],
                     help="context parallelism's exchange: the K/V ring beside the attention "
                     "(p2p, default), K/V all-gathered before it (allgather), or Ulysses' "
                     "all-to-all of the heads (a2a)")
    _moe_options(new)
    from trainsim.commands.sync import plan_sections

    plan_sections(new)
    new.add_argument("--model", help="also check against this model: " + MODEL_HELP)
    new.add_argument("--cluster", help="also check against this cluster: " + CLUSTER_HELP)
    new.add_argument("--out", metavar="FILE", help="write the plan here (atomically)")
    new.set_defaults(func=cmd_plan_new)
    check = psub.add_parser("check", help="validate a plan, optionally against model/cluster")
    check.add_argument("plan", help="plan JSON file")
    check.add_argument("--model", help=MODEL_HELP)
    check.add_argument("--cluster", help=CLUSTER_HELP)
    check.set_defaults(func=cmd_plan_check)


def _moe_options(new: Any) -> None:
    new.add_argument("--moe-max-load", type=float, metavar="F",
                     help="MoE: tokens on the most-loaded expert-parallel rank over the mean "
                     "(default 1: forced balance)")
    new.add_argument("--moe-capacity-factor", type=float, metavar="C",
                     help="MoE: an expert keeps at most C times its balanced share of tokens "
                     "and drops the rest (default: dropless)")
    new.add_argument("--moe-dispatcher", choices=["alltoall", "allgather", "deepep"],
                     help="MoE token dispatch (default alltoall)")
    new.add_argument("--moe-dispatch-dtype", choices=["fp8"],
                     help="MoE: dispatch tokens in fp8 in the forward (DeepEP's: an fp32 scale "
                     "per 128 channels; the combine and the backward stay 16-bit)")
    new.add_argument("--moe-comm-sms", type=int, metavar="S",
                     help="MoE: SMs the dispatch and combine kernels hold while they run "
                     "beside compute (default: 20 for deepep, none for the NCCL dispatchers)")
    new.add_argument("--moe-overlap", choices=["none", "shared-expert", "a2a", "operator"],
                     help="MoE: what hides the expert all-to-alls: the shared expert, "
                     "another micro-batch's compute (a2a), or the layer's own GEMMs "
                     "(operator, MegaScale-MoE's) (default none)")
