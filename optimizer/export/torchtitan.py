"""torchtitan 0.3.0: a config module for its ``--module``/``--config`` entry point (0.3.0
reads no TOML) and the launch line. The module adds the model as a flavour of torchtitan's
own Llama 3 family and builds the trainer config from its ``llama3_8b`` recipe (optimizer,
data, checkpointing), replacing the model, parallelism, training and recomputation.

What torchtitan 0.3.0 cannot express is refused, naming the field: ZeRO-1 (FSDP shards
parameters too), fp16 (bf16/fp32 mixed precision only), the "standard" attention, a
replicated model under context parallelism (FSDP always shards over the CP ranks), MoE and
any architecture other than Llama's (RMSNorm, RoPE, SwiGLU, no biases).
"""

from __future__ import annotations

from sim.errors import SpecError
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["check", "module_source", "files", "MODULE", "CONFIG_FN"]

MODULE, CONFIG_FN = "trainsim_torchtitan", "trainsim_plan"
_SCHEDULE = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
             "dualpipev": "DualPipeV"}  # DualPipeV places the stages in a V itself
# ZeRO stage -> (data_parallel_shard_degree is dp, fsdp_reshard_after_forward): FSDP that
# keeps the gathered parameters from forward to backward stands for ZeRO-2 (gradients and
# optimizer state sharded; trainsim's ZeRO-2 gathers once a step, FSDP2 every micro-batch
# without a pipeline: the same program as ZeRO-3 with reshard_after_forward false),
# resharding after forward is ZeRO-3
_FSDP = {0: (False, "default"), 2: (True, "never"), 3: (True, "always")}


def _architecture(m: ModelSpec) -> str | None:
    """Why the model is not a Llama 3 flavour, or None."""
    if m.is_moe:
        return "MoE models (torchtitan's MoE families have other architectures)"
    wrong = [name for name, ok in (("norm rmsnorm", m.norm == "rmsnorm"),
                                   ("rope positions", m.position_embedding == "rope"),
                                   ("gated MLP", m.gated_mlp),
                                   ("no biases", not (m.linear_bias or m.qkv_bias)),
                                   ("no dropout", not m.dropout),
                                   ("no query/key norms", m.qk_norm == "none"),
                                   ("two norms per layer", m.norms_per_layer == 2),
                                   ("full attention", not m.sliding_window),
                                   ("standard attention", not m.is_mla),
                                   ("no multi-token prediction", not m.num_mtp_layers),
                                   ("head_dim = hidden/heads",
                                    m.head_size * m.num_heads == m.hidden_size)) if not ok]
    return f"{m.name} (needs {', '.join(wrong)})" if wrong else None


def check(plan: Plan, model: ModelSpec) -> None:
    why = _architecture(model)
    if why is not None:
        raise SpecError("model", f"torchtitan 0.3.0 exports Llama-architecture models only, "
                        f"not {why}")
    if plan.pp > 1 and model.tied_embeddings:
        raise SpecError("plan.pp", f"{plan.pp} with tied embeddings is not expressible in "
                        "torchtitan 0.3.0: it refuses weight tying with pipeline parallelism")
    if plan.schedule == "dualpipe":
        raise SpecError("plan.schedule", "dualpipe is not expressible in torchtitan 0.3.0: "
                        "torch's pipelining has DualPipeV, not the two-direction DualPipe "
                        "(use dualpipev)")
    if plan.zero_stage == 1:
        raise SpecError("plan.zero_stage", "ZeRO-1 is not expressible in torchtitan: its FSDP "
                        "shards parameters and gradients too (use zero_stage 0, 2 or 3)")
    if plan.cp > 1 and plan.zero_stage == 0:
        raise SpecError("plan.zero_stage", "0 with cp > 1 is not expressible in torchtitan: it "
                        "always shards parameters over the context-parallel ranks (FSDP)")
    if plan.recompute_modules is not None:
        raise SpecError("plan.recompute_modules", "is not expressible in torchtitan 0.3.0: "
                        "its selective recomputation is by operator (op SAC) or by layer, "
                        "not by module")
    if plan.cp > 1 and plan.cp_comm != "allgather":
        raise SpecError("plan.cp_comm", f"{plan.cp_comm} is not expressible in torchtitan "
                        "0.3.0: its context parallelism all-gathers K and V (FlexAttention, "
                        "and SDPA through torch's context_parallel); use cp_comm allgather")
    if plan.dtype not in ("bf16", "fp32", "fp8"):
        raise SpecError("plan.dtype", f"{plan.dtype} is not expressible in torchtitan (bf16, "
                        "fp32, or fp8 through its Float8 converter)")
    if plan.attention != "flash":
        raise SpecError("plan.attention", "standard (materialised scores) is not expressible "
                        "in torchtitan: its attention backends are fused (flex, varlen)")
    if not plan.overlap_grad_reduce:
        raise SpecError("plan.overlap_grad_reduce", "false is not expressible in torchtitan: "
                        "FSDP and DDP always overlap the gradient reduction")
    if plan.grad_reduce_dtype not in (None, "fp32"):
        raise SpecError("plan.grad_reduce_dtype", f"{plan.grad_reduce_dtype} is not expressible "
                        "in torchtitan 0.3.0: it reduces gradients in float32 only "
                        "(mixed_precision_reduce; use grad_reduce_dtype fp32)")
    if plan.recompute_replay != "whole":
        raise SpecError("plan.recompute_replay", f"{plan.recompute_replay} is not expressible "
                        "in torchtitan 0.3.0: its full activation checkpointing passes "
                        "early_stop=False, so the replay runs the whole block (use whole)")


def _split(plan: Plan, model: ModelSpec) -> list[list[str]] | None:
    """module_fqns_per_model_part: every (virtual) stage's modules, even splits included
    (torchtitan's own split counts the embedding and the output as layers)."""
    from sim.layout.stages import virtual_stage_layers

    if plan.pp == 1:
        return None
    parts, start = [], 0
    for n in virtual_stage_layers(plan, model):
        parts.append([f"layers.{i}" for i in range(start, start + n)])
        start += n
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    return parts


def _parallelism(plan: Plan, model: ModelSpec) -> dict[str, object]:
    sharded, reshard = _FSDP[plan.zero_stage]
    if not plan.reshard_after_forward:  # ZeRO-3 keeping the forward's weights
        reshard = "never"
    split = _split(plan, model)
    out: dict[str, object] = {
        "data_parallel_replicate_degree": 1 if sharded else plan.dp,
        "data_parallel_shard_degree": plan.dp if sharded else 1,
        "fsdp_reshard_after_forward": reshard, "tensor_parallel_degree": plan.tp,
        "enable_sequence_parallel": plan.sequence_parallel,
        "pipeline_parallel_degree": plan.pp, "context_parallel_degree": plan.cp,
        "expert_parallel_degree": plan.ep,
        "pipeline_parallel_schedule": _SCHEDULE[plan.schedule if plan.vpp == 1
                                                or plan.schedule == "dualpipev"
                                                else "interleaved-1f1b"],
        "pipeline_parallel_microbatch_size": plan.micro_batch_size}
    if split is not None:
        out["module_fqns_per_model_part"] = split
    return out


def _training(plan: Plan) -> dict[str, object]:
    # torchtitan runs local_batch_size sequences per step and rank: with pipelining that is
    # every micro-batch of one replica (cut into pipeline_parallel_microbatch_size pieces),
    # without it one micro-batch, the rest becoming gradient accumulation steps
    local = plan.global_batch_size // plan.dp if plan.pp > 1 else plan.micro_batch_size
    return {"global_batch_size": plan.global_batch_size, "local_batch_size": local,
            "seq_len": plan.seq_len,
            # torchtitan's CUDA graphs refuse pipelining: its own validation says so
            "disable_cuda_graphs": plan.pp > 1,
            "mixed_precision_param": "float32" if plan.dtype == "fp32" else "bfloat16"}


# (module, names) of the config module's imports: torchtitan's own classes
_IMPORTS = (("torchtitan.components.quantization", "Float8LinearConverter"),
            ("torchtitan.config", "ParallelismConfig, TrainingConfig"),
            ("torchtitan.distributed.activation_checkpoint", "FullAC, SelectiveAC"),
            ("torchtitan.models", "llama3"),
            ("torchtitan.models.common", "ComplexRoPE, Embedding, Linear, RMSNorm"),
            ("torchtitan.models.llama3.config_registry", "llama3_8b"))
_TEMPLATE = '''"""torchtitan 0.3.0 config written by `trainsim export --format torchtitan`:
{label}. Load it the way torchtitan's trainer does:
    PYTHONPATH=. torchrun ... -m torchtitan.train --module {module} --config {fn}
"""

{imports}

MODEL = {model}
PARALLELISM = {parallelism}
TRAINING = {training}
RECOMPUTE = {recompute!r}
FP8 = {fp8!r}


def _model(attn_backend, tp_gemm_backend="default"):
    """The model as a Llama 3 flavour. RoPE theta and scaling are Llama 3's (trainsim's
    model spec does not carry them; they do not change the step time)."""
    dim, vocab = MODEL["hidden_size"], MODEL["vocab_size"]
    return llama3.Llama3Model.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying=MODEL["tied_embeddings"],
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim,
                                        param_init=llama3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab,
                              param_init=llama3._output_linear_init(dim)),
        layers=llama3._build_llama3_layers(
            fuse_qkv=True, n_layers=MODEL["num_layers"], dim=dim, n_heads=MODEL["num_heads"],
            n_kv_heads=MODEL["kv_heads"], hidden_dim=MODEL["ffn_hidden_size"],
            rope=ComplexRoPE.Config(dim=dim // MODEL["num_heads"],
                                    max_seq_len=MODEL["max_seq_len"], theta=500000,
                                    scaling="llama"),
            attn_backend=attn_backend, tp_gemm_backend=tp_gemm_backend))


def {fn}():
    llama3.llama3_configs[MODEL["name"]] = _model
    # the output layer in bf16, as trainsim times it (and torchtitan's published runs ran it)
    converters = [Float8LinearConverter.Config(filter_fqns=["lm_head"])] if FP8 else None
    config = llama3_8b()
    config.model_spec = llama3.model_registry(MODEL["name"], converters=converters)
    config.parallelism = ParallelismConfig(**PARALLELISM)
    config.training = TrainingConfig(**TRAINING)
    config.activation_checkpoint = {{"none": None, "full": FullAC.Config(),
                                     "selective": SelectiveAC.Config()}}[RECOMPUTE]
{compile}    return config
'''


# async TP (plan.tp_overlap): torchtitan pipelines TP collectives with their matmuls only
# under torch.compile, which its CompileConfig then requires
_ASYNC_TP = ("    from torchtitan.config import CompileConfig\n\n"
             "    config.compile = CompileConfig(enable=True, "
             "enable_async_tensor_parallel=True)\n")


def _literal(value: dict[str, object]) -> str:
    import pprint

    return pprint.pformat(value, width=88, sort_dicts=False, compact=True)


def module_source(plan: Plan, model: ModelSpec) -> str:
    from optimizer.report import plan_label

    check(plan, model)
    spec = {"name": f"trainsim-{model.name}", "hidden_size": model.hidden_size,
            "vocab_size": model.vocab_size, "tied_embeddings": model.tied_embeddings,
            "num_layers": model.num_layers, "num_heads": model.num_heads,
            "kv_heads": model.kv_heads, "ffn_hidden_size": model.ffn_hidden_size,
            "max_seq_len": max(model.max_seq_len, plan.seq_len)}
    imports = "\n".join(f"from {module} import {names}" for module, names in _IMPORTS)
    label = f"{model.name} {plan_label(plan)}"
    return _TEMPLATE.format(imports=imports, label=label, module=MODULE, fn=CONFIG_FN,
                            model=_literal(spec),
                            parallelism=_literal(_parallelism(plan, model)),
                            training=_literal(_training(plan)), recompute=plan.recompute,
                            fp8=plan.dtype == "fp8", compile=_ASYNC_TP if plan.tp_overlap else "")


def files(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> dict[str, str]:
    from optimizer.export.common import FRAMEWORKS, PREAMBLE, env_lines, launcher
    from sim.network.algorithms import nccl_env

    script = ["#!/bin/bash", f"# {FRAMEWORKS['torchtitan']}: run beside {MODULE}.py on every "
              "node", *PREAMBLE, *env_lines(nccl_env(plan, "torchtitan")),
              f'PYTHONPATH="$(dirname "$0"):${{PYTHONPATH:-}}" {launcher(cluster)} '
              f"-m torchtitan.train --module {MODULE} --config {CONFIG_FN}"]
    if plan.grad_reduce_dtype is None and plan.grad_bytes < 4:
        script.insert(2, "# note: torchtitan reduces gradients in float32; trainsim timed this "
                      "plan with 16-bit reductions (set grad_reduce_dtype = \"fp32\" to match)")
    if plan.dtype == "fp8":
        gathers = " and, with sequence parallelism, gathers activations in bf16" \
            if plan.tp > 1 and plan.sequence_parallel else ""
        script.insert(2, "# note: torchtitan 0.3.0's Float8 converter has rowwise recipes only, "
                      f"so this run scales per row{gathers}; trainsim timed the tensorwise "
                      "recipe of torchtitan's published runs (fp8 tensor-parallel gathers; "
                      "docs/compute/analytic.md): expect it slower")
    if plan.schedule == "dualpipev" and plan.dp > 1:
        script.insert(2, "# note: with data parallelism torch 2.13's ScheduleDualPipeV trained to "
                      "other losses than 1F1B in trainsim's executor (docs/validation/"
                      "pipeline.md): check the loss against a 1F1B run")
    return {f"{MODULE}.py": module_source(plan, model), "torchtitan.sh": "\n".join(script) + "\n"}
