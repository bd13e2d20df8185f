"""Megatron-LM ``pretrain_gpt.py`` (core_r0.16, megatron-core 0.16.1): environment, launcher
and arguments. Every plan field is an argument (ZeRO-2/3 through Megatron-FSDP, any layer
split through ``--pipeline-model-parallel-layout``); GPipe is refused (Megatron-LM runs
1F1B whenever pp > 1).
"""

from __future__ import annotations

from sim.errors import SpecError
from sim.spec.cluster import ClusterSpec
from sim.spec.experts import expert_tp
from sim.spec.hardware import DTYPE_BYTES
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["check", "megatron_args", "megatron_env", "files", "layout"]

_DTYPE = {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp8": ["--bf16", "--fp8-format hybrid"],
          "fp32": []}
# ZeRO stage -> how Megatron-LM shards the data-parallel state (Megatron-FSDP checkpoints
# only in its fsdp_dtensor format: validate_args asserts it)
_FSDP = ["--use-megatron-fsdp", "--ckpt-format fsdp_dtensor"]
_ZERO = {0: [], 1: ["--use-distributed-optimizer"],
         2: [*_FSDP, "--data-parallel-sharding-strategy optim_grads"],
         3: [*_FSDP, "--data-parallel-sharding-strategy optim_grads_params"]}


def _check_model(m: ModelSpec) -> None:
    """The model features pretrain_gpt.py's GPT layer does not build."""
    if m.qk_norm == "full":
        raise SpecError("model.qk_norm", "full (one norm over all heads' queries, one over "
                        "the keys) is not expressible in Megatron-LM: --qk-layernorm norms each "
                        "head")
    if m.norms_per_layer != 2:
        raise SpecError("model.norms_per_layer", f"{m.norms_per_layer} is not expressible in "
                        "Megatron-LM's GPT layer (a norm before attention and one before the "
                        "MLP)")
    if m.sliding_window:
        raise SpecError("model.sliding_window", "sliding-window layers are not exported to "
                        "Megatron-LM yet (--window-size with --window-attn-skip-freq would need "
                        "the layer pattern, which the model spec does not keep)")


def check(plan: Plan, model: ModelSpec) -> None:
    _check_model(model)
    if plan.pp > 1 and plan.schedule == "gpipe":
        raise SpecError("plan.schedule", "gpipe is not expressible in Megatron-LM: with pp > 1 "
                        "it runs 1F1B (or interleaved 1F1B)")
    if plan.schedule == "dualpipev":
        raise SpecError("plan.schedule", "dualpipev is not expressible in Megatron-LM (it has "
                        "no DualPipe schedule): export to torchtitan")
    if plan.schedule == "dualpipe":
        raise SpecError("plan.schedule", "dualpipe is not expressible in Megatron-LM (it has "
                        "no DualPipe schedule)")
    if plan.grad_reduce_dtype not in (None, "fp32", {"fp8": "bf16"}.get(plan.dtype, plan.dtype)):
        raise SpecError("plan.grad_reduce_dtype", f"{plan.grad_reduce_dtype} with {plan.dtype} "
                        "training is not expressible in Megatron-LM: gradients are reduced in "
                        "fp32, or in the parameters' dtype (--grad-reduce-in-bf16 under bf16)")
    if plan.zero_stage >= 2 and plan.pp > 1:
        raise SpecError("plan.zero_stage", f"ZeRO-{plan.zero_stage} (Megatron-FSDP) with pp = "
                        f"{plan.pp} is not expressible: Megatron-FSDP does not pipeline")
    if plan.recompute_replay != "whole":
        raise SpecError("plan.recompute_replay", f"{plan.recompute_replay} is not expressible "
                        "in Megatron-LM: its recomputation replays the whole layer (use whole)")
    if plan.tp_overlap and plan.attention != "flash":
        raise SpecError("plan.tp_overlap", "with standard attention is not expressible in "
                        "Megatron-LM: its local spec's linear layers ignore --tp-comm-overlap "
                        "(Transformer Engine's do it; use attention flash)")
    if not plan.reshard_after_forward:
        raise SpecError("plan.reshard_after_forward", "false is not expressible in Megatron-LM: "
                        "Megatron-FSDP gathers the weights again for the backward (use true)")
    late = {"layernorm", "moe_act"} & set(plan.recompute_modules or ())
    if plan.dtype == "fp8" and late:
        raise SpecError("plan.recompute_modules", f"{' and '.join(sorted(late))} with fp8 is "
                        "not expressible in Megatron-LM: its delayed fp8 scaling (the export's "
                        "recipe) refuses them")


def layout(plan: Plan, model: ModelSpec) -> str:
    """``--pipeline-model-parallel-layout``: one ``|``-separated entry per (virtual) stage in
    model order, ``E`` the embedding, ``t`` a transformer layer, ``m`` a multi-token
    prediction layer (on the last stage, as simulated), ``L`` the loss."""
    from sim.layout.stages import virtual_stage_layers

    stages = ["t" * n if n else "" for n in virtual_stage_layers(plan, model)]
    stages[0], stages[-1] = "E" + stages[0], stages[-1] + "m" * model.num_mtp_layers + "L"
    return "|".join(stages)


def _moe_args(m: ModelSpec, plan: Plan) -> list[str]:
    if not m.is_moe:
        return []
    freq = [0 if (i in m.mlp_only_layers or (i + 1) % m.moe_layer_step) else 1
            for i in range(m.num_layers)]
    dispatcher = {"alltoall": ["--moe-token-dispatcher-type alltoall"],
                  "allgather": ["--moe-token-dispatcher-type allgather"],
                  "deepep": ["--moe-token-dispatcher-type flex",
                             "--moe-flex-dispatcher-backend deepep"]}[plan.moe_dispatcher]
    if plan.moe_dispatcher == "deepep" and plan.moe_comm_sms is not None:
        dispatcher.append(f"--moe-deepep-num-sms {plan.moe_comm_sms}")
    args = [f"--num-experts {m.num_experts}", f"--moe-router-topk {m.top_k}",
            f"--moe-ffn-hidden-size {m.expert_ffn}", *dispatcher,
            f"--moe-layer-freq [{','.join(map(str, freq))}]",
            f"--expert-tensor-parallel-size {expert_tp(plan)}"]
    if m.shared_expert_ffn_hidden_size:
        args.append(f"--moe-shared-expert-intermediate-size {m.shared_expert_ffn_hidden_size}")
        args += ["--moe-shared-expert-gate"] if m.shared_expert_gate else []
    args += {"none": [], "shared-expert": ["--moe-shared-expert-overlap"],
             "a2a": ["--overlap-moe-expert-parallel-comm"]}[plan.moe_overlap]
    if plan.moe_capacity_factor is not None:  # drop what exceeds it, by router probability
        args += [f"--moe-expert-capacity-factor {plan.moe_capacity_factor:g}",
                 "--moe-token-drop-policy probs"]
    if m.expert_groups:
        args += [f"--moe-router-num-groups {m.expert_groups}",
                 f"--moe-router-group-topk {m.expert_groups_per_token}"]
    return args


def _mla_args(m: ModelSpec) -> list[str]:
    """Multi-head latent attention (megatron-core's MLATransformerConfig): ``--qk-head-dim``
    is the part of a head without position, as ``head_dim`` here."""
    if not m.is_mla:
        return []
    args = ["--multi-latent-attention", f"--kv-lora-rank {m.kv_lora_rank}",
            f"--qk-head-dim {m.head_dim}", f"--qk-pos-emb-head-dim {m.qk_rope_head_dim}",
            f"--v-head-dim {m.v_head_dim}"]
    return args + ([f"--q-lora-rank {m.q_lora_rank}"] if m.q_lora_rank else [])


def _model_args(m: ModelSpec, plan: Plan) -> list[str]:
    # RoPE reads no position table; Megatron-LM still asks max_position_embeddings >= seq
    positions = max(m.max_seq_len, plan.seq_len) if m.position_embedding == "rope" \
        else m.max_seq_len
    dropout = "0.1" if m.dropout else "0.0"
    args = [f"--num-layers {m.num_layers}", f"--hidden-size {m.hidden_size}",
            f"--num-attention-heads {m.num_heads}", f"--ffn-hidden-size {m.ffn_hidden_size}",
            f"--kv-channels {m.head_dim if m.is_mla else m.head_size}",
            f"--max-position-embeddings {positions}",
            # NullTokenizer(v) has v + 1 rows (an end-of-document id): exactly the model's
            # vocabulary, padded only to a multiple of tp
            "--tokenizer-type NullTokenizer", f"--vocab-size {m.vocab_size - 1}",
            "--make-vocab-size-divisible-by 1",
            f"--hidden-dropout {dropout}", f"--attention-dropout {dropout}",
            f"--normalization {'RMSNorm' if m.norm == 'rmsnorm' else 'LayerNorm'}",
            "--position-embedding-type "
            + ("rope" if m.position_embedding == "rope" else "learned_absolute")]
    if m.kv_heads != m.num_heads:
        args += ["--group-query-attention", f"--num-query-groups {m.kv_heads}"]
    args += ["--swiglu"] if m.gated_mlp else []
    args += [] if m.tied_embeddings else ["--untie-embeddings-and-output-weights"]
    args += [] if m.linear_bias else ["--disable-bias-linear"]
    args += ["--add-qkv-bias"] if m.qkv_bias and not m.linear_bias else []
    args += ["--qk-layernorm"] if m.qk_norm == "head" else []
    args += [f"--mtp-num-layers {m.num_mtp_layers}"] if m.num_mtp_layers else []
    return args + _mla_args(m) + _moe_args(m, plan)


_CP_COMM = {"p2p": "p2p", "allgather": "all_gather", "a2a": "a2a"}


def megatron_args(plan: Plan, model: ModelSpec) -> list[str]:
    """``pretrain_gpt.py`` arguments, one flag (and its value) per item."""
    check(plan, model)
    args = [f"--tensor-model-parallel-size {plan.tp}",
            f"--pipeline-model-parallel-size {plan.pp}",
            f"--context-parallel-size {plan.cp}", f"--expert-model-parallel-size {plan.ep}",
            f"--micro-batch-size {plan.micro_batch_size}",
            f"--global-batch-size {plan.global_batch_size}", f"--seq-length {plan.seq_len}"]
    if plan.layers_per_stage is not None:
        args.append(f"--pipeline-model-parallel-layout {layout(plan, model)}")
    elif plan.vpp > 1:
        args.append(f"--num-virtual-stages-per-pipeline-rank {plan.vpp}")
    args += ["--sequence-parallel"] if plan.sequence_parallel else []
    args += ["--tp-comm-overlap"] if plan.tp_overlap else []  # Transformer Engine's userbuffers
    if plan.cp > 1:  # Transformer Engine's names (its all-gather is "all_gather")
        args.append(f"--cp-comm-type {_CP_COMM[plan.cp_comm]}")
    args += _ZERO[plan.zero_stage]
    if plan.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform",
                 "--recompute-num-layers 1"]
    elif plan.recompute == "selective":
        args.append("--recompute-granularity selective")
        if plan.recompute_modules is not None:
            args.append("--recompute-modules " + " ".join(plan.recompute_modules))
            # megatron-core recomputes the experts' activation inside grouped GEMMs only
            args += ["--moe-grouped-gemm"] if "moe_act" in plan.recompute_modules else []
    # "standard" materialises the s x s scores: Megatron-core's own DotProductAttention,
    # which validate_args allows only with the local (non-Transformer-Engine) layer spec
    args += ["--attention-backend flash"] if plan.attention == "flash" else \
        ["--attention-backend local", "--spec local"]
    args += ["--overlap-grad-reduce"] if plan.overlap_grad_reduce else []
    return args + _DTYPE[plan.dtype] + _grad_reduce(plan) + _model_args(model, plan)


def _grad_reduce(plan: Plan) -> list[str]:
    """Megatron-LM accumulates and reduces gradients in fp32 under bf16 unless told
    otherwise, in the parameters' dtype under fp16 and fp32."""
    if plan.dtype in ("bf16", "fp8"):
        return ["--grad-reduce-in-bf16"] if plan.grad_bytes == 2 else []
    return ["--accumulate-allreduce-grads-in-fp32"] if plan.grad_bytes > \
        DTYPE_BYTES[plan.dtype] else []


def megatron_env(plan: Plan) -> dict[str, str]:
    from sim.network.algorithms import nccl_env

    env = nccl_env(plan, "megatron")
    # validate_args (before Blackwell) asks for 1 with TP/CP, for ordering their
    # communication; Megatron-FSDP asserts the opposite (it only warns about TP/CP then)
    if (plan.tp > 1 or plan.cp > 1) and plan.zero_stage < 2:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    return env


def files(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> dict[str, str]:
    import shlex

    from optimizer.export.common import FRAMEWORKS, PREAMBLE, env_lines, launcher

    lines = ["#!/bin/bash", f"# {FRAMEWORKS['megatron']}: run from a Megatron-LM checkout on "
             "every node. --mock-data trains on synthetic tokens: replace it with --data-path "
             "and a tokenizer for real data.", *PREAMBLE, *env_lines(megatron_env(plan))]
    args = [" ".join(shlex.quote(w) for w in a.split(" "))  # values hold no spaces
            for a in megatron_args(plan, model) + ["--mock-data", "--train-iters 100"]]
    text = "\n".join(lines) + f"\n{launcher(cluster)} pretrain_gpt.py \\\n    " \
        + " \\\n    ".join(args) + "\n"
    return {"megatron_args.sh": text}
