"""Compute time of one transformer layer for one micro-batch on one rank.

The layer is composed from its building blocks, each timed by a :mod:`sim.cost.costmodel`
(roofline or profile): norms, QKV projection, rotary embedding, attention, output
projection, dropout and residual adds, the MLP (or the router, experts and shared expert
of an MoE layer) — at the shapes the plan's TP/CP/EP split gives one rank. With sequence
parallelism the norms, dropouts and residual adds work on ``tokens / tp``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.cost.costmodel import Cost, CostModel
from sim.layout.memory import chunk_edge_params, layer_rank_params
from sim.layout.routing import routing
from sim.spec.experts import expert_tp
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.recompute import recomputed, recomputed_norms, stops_early

__all__ = ["LayerTime", "layer_time", "ops_layer_time", "logits_time", "ops_logits_time",
           "embedding_time",
           "expert_time", "expert_gemms", "attention_gemms", "mlp_gemms",
           "optimizer_time", "layer_variant", "variant_layer", "fsdp_root_time"]

# Fields of a layer's structure that a profiled whole layer records (its DB "variant").
_LAYER_FIELDS = ("num_heads", "num_kv_heads", "head_dim", "ffn_hidden_size", "gated_mlp",
                 "norm", "position_embedding", "linear_bias", "qkv_bias", "dropout")


@dataclass(frozen=True)
class LayerTime:
    """Seconds of one layer for one micro-batch on one rank."""

    forward: float
    backward: float
    attention_forward: float  # the attention core alone (what selective recompute re-runs)
    attention_backward: float
    shared_forward: float = 0.0  # an MoE layer's shared expert (what can hide its all-to-alls)
    shared_backward: float = 0.0
    # the forward of the modules selective recomputation re-runs (sim.spec.recompute), or
    # of full recomputation's replay when it stops early
    recompute_forward: float = 0.0
    # (forward, backward) seconds of the GEMMs beside a layer's exchanges, for operator-
    # level overlap (sim.cost.overlap): the routed experts' first (gate and up) and last
    # (down) GEMMs on the most-loaded rank; the attention's input projections (QKV, or
    # MLA's) and its output projection; a dense layer's MLP up (and gate) and down
    expert_gemms: tuple[Cost, Cost] = ((0.0, 0.0), (0.0, 0.0))
    attention_gemms: tuple[Cost, Cost] = ((0.0, 0.0), (0.0, 0.0))
    mlp_gemms: tuple[Cost, Cost] = ((0.0, 0.0), (0.0, 0.0))  # a dense layer's up, down
    # FSDP2's host-side (forward, backward) seconds around the layer's ZeRO-3 unit
    # (sim.cost.fsdp), included in ``forward`` and ``backward``
    fsdp: Cost = (0.0, 0.0)

    def replay(self, recompute: str, early_stop: bool) -> float:
        """Seconds the backward re-runs: the forward (full), less what an early-stopped
        replay leaves out, or the modules selective recomputation names. A checkpointed
        layer's replay runs inside its FSDP2 unit: no hooks or copies again."""
        if recompute == "full":
            return self.recompute_forward if early_stop else self.forward - self.fsdp[0]
        return self.recompute_forward if recompute == "selective" else 0.0

    @property
    def weight_grad(self) -> float:
        """The backward's weight-gradient part (``dW = X^T dY``: a forward GEMM's FLOPs per
        GEMM): the forward less its attention core (DualPipeV defers it) and FSDP2's work."""
        return self.forward - self.attention_forward - self.fsdp[0]


def _add(*costs: Cost) -> Cost:
    return sum(c[0] for c in costs), sum(c[1] for c in costs)


def _scale(c: Cost, k: float) -> Cost:
    return c[0] * k, c[1] * k


def _mlp(cm: CostModel, m: ModelSpec, plan: Plan, tokens: float, ffn: int,
         expert_ways: int | None = None) -> Cost:
    """One MLP of width ``ffn``: up (and gate), activation, down (:func:`mlp_gemms`)."""
    act = "swiglu" if m.gated_mlp else "gelu"
    w = plan.tp if expert_ways is None else expert_ways
    up, down = mlp_gemms(cm, m, plan, tokens, ffn, expert_ways)
    return _add(up, cm.elementwise(act, tokens, ffn / w, plan.activation_dtype), down)


def mlp_gemms(cm: CostModel, m: ModelSpec, plan: Plan, tokens: float, ffn: int,
              expert_ways: int | None = None) -> tuple[Cost, Cost]:
    """An MLP's up (and gate) GEMM and its down GEMM, width ``ffn``: by default a
    tensor-parallel MLP (split over TP, its input and output gradient gathered by sequence
    parallelism); with ``expert_ways`` routed experts split that many ways (their tokens
    dispatched to them, not gathered)."""
    up = 2 if m.gated_mlp else 1
    w, sp = (plan.tp, _sp(plan)) if expert_ways is None else (expert_ways, 1)
    return (cm.gemm(tokens, up * ffn / w, m.hidden_size, plan.dtype, (sp, 1)),
            cm.gemm(tokens, m.hidden_size, ffn / w, plan.dtype, (1, sp)))


def _sp(plan: Plan) -> int:
    """How many ways sequence parallelism gathers a column-parallel layer's input and a
    row-parallel layer's output gradient (an fp8 cast before it runs on the shard:
    :meth:`sim.cost.costmodel.Roofline.gemm`)."""
    return plan.tp if plan.sequence_parallel else 1


def expert_time(cm: CostModel, m: ModelSpec, plan: Plan, tokens: float) -> Cost:
    """The local experts of the most-loaded expert-parallel rank (:mod:`sim.layout.routing`;
    forced balance by default) for ``tokens`` tokens on this rank's tensor-parallel group.
    An expert's shard (``etp`` ways) gets the tokens of its ``etp x ep`` block: with
    ``etp = tp`` the group's tokens from each of ``ep`` groups; with ``etp = 1`` each rank's
    sequence shard from each of ``ep`` ranks, at full width."""
    per_expert, e = _expert_tokens(m, plan, tokens)
    one = _mlp(cm, m, plan, per_expert, m.expert_ffn, e)
    if m.linear_bias:  # biased experts (gpt-oss): up (and gate), then down
        up = 2 if m.gated_mlp else 1
        one = _add(one, cm.expert_bias(per_expert, up * m.expert_ffn / e, plan.activation_dtype,
                                       down=False),
                   cm.expert_bias(per_expert, m.hidden_size, plan.activation_dtype, down=True))
    return _scale(one, m.num_experts / plan.ep)


def expert_gemms(cm: CostModel, m: ModelSpec, plan: Plan, tokens: float) -> tuple[Cost, Cost]:
    """The routed experts' first (gate and up) and last (down) GEMMs of
    :func:`expert_time`, each over all local experts."""
    per_expert, e = _expert_tokens(m, plan, tokens)
    up, down = mlp_gemms(cm, m, plan, per_expert, m.expert_ffn, e)
    k = m.num_experts / plan.ep
    return _scale(up, k), _scale(down, k)


def _expert_tokens(m: ModelSpec, plan: Plan, tokens: float) -> tuple[float, int]:
    """(tokens of each local expert on the most-loaded rank, the experts' TP degree)."""
    e = expert_tp(plan)
    share = tokens if e == plan.tp else tokens / plan.tp * e
    return share * m.top_k * plan.ep / m.num_experts * routing(m, plan).load_factor, e


def _shared(cm: CostModel, m: ModelSpec, plan: Plan, tokens: float) -> Cost:
    return _mlp(cm, m, plan, tokens, m.shared_expert_ffn_hidden_size) \
        if m.shared_expert_ffn_hidden_size else (0.0, 0.0)


def _moe(cm: CostModel, m: ModelSpec, plan: Plan, tokens: float) -> Cost:
    """Router, the local experts and the shared expert."""
    experts = expert_time(cm, m, plan, tokens)
    router = cm.gemm(tokens, m.num_experts, m.hidden_size, plan.dtype)
    return _add(experts, router, _shared(cm, m, plan, tokens))


def _attention_block(cm: CostModel, m: ModelSpec, plan: Plan, tokens: float) -> Cost:
    if m.is_mla:
        return _mla_block(cm, m, plan, tokens)
    t = plan.tp
    qkv, proj = attention_gemms(cm, m, plan, tokens)
    rope = cm.elementwise("rope", tokens, (m.q_dim + m.kv_dim) / t, plan.activation_dtype) \
        if m.position_embedding == "rope" else (0.0, 0.0)
    return _add(qkv, proj, rope)


def attention_gemms(cm: CostModel, m: ModelSpec, plan: Plan, tokens: float
                    ) -> tuple[Cost, Cost]:
    """The attention's input projections (QKV; MLA's down- and up-projections) and its
    output projection."""
    t, dt, h = plan.tp, plan.dtype, m.hidden_size
    if not m.is_mla:
        return (cm.gemm(tokens, (m.q_dim + 2 * m.kv_dim) / t, h, dt, (_sp(plan), 1)),
                cm.gemm(tokens, h, m.q_dim / t, dt, (1, _sp(plan))))
    down = m.kv_lora_rank + m.qk_rope_head_dim + m.q_lora_rank
    return (_add(cm.gemm(tokens, down, h, dt),
                 cm.gemm(tokens, m.num_heads * (m.head_dim + m.v_head_dim) / t,
                         m.kv_lora_rank, dt),
                 cm.gemm(tokens, m.q_dim / t, m.q_lora_rank or h, dt)),
            cm.gemm(tokens, h, m.o_dim / t, dt))


def _mla_block(cm: CostModel, m: ModelSpec, plan: Plan, tokens: float) -> Cost:
    """Multi-head latent attention: down-projections and latent norms whole on every TP
    rank (Megatron-LM duplicates them), up-projections and the output projection split;
    rotary embedding on the queries' and the shared key's rotary parts."""
    t, act = plan.tp, plan.activation_dtype
    return _add(*attention_gemms(cm, m, plan, tokens),
                cm.elementwise(m.norm, tokens, m.q_lora_rank + m.kv_lora_rank, act),
                cm.elementwise("rope", tokens, (m.num_heads / t + 1) * m.qk_rope_head_dim, act))


def _attention_core(cm: CostModel, m: ModelSpec, plan: Plan) -> Cost:
    """With MLA, queries and keys are wider than values: timed at their mean width, which
    gives the core's FLOPs exactly."""
    head = (m.head_size + m.v_head_dim) / 2 if m.is_mla else m.head_size
    if plan.cp_comm == "a2a":  # Ulysses: the whole sequence of 1/cp of the heads
        return cm.attention(m.num_heads / plan.tp / plan.cp * plan.micro_batch_size,
                            plan.seq_len, plan.seq_len, head, plan.activation_dtype,
                            plan.attention == "flash", m.dropout)
    return cm.attention(m.num_heads / plan.tp * plan.micro_batch_size, plan.seq_len / plan.cp,
                        plan.seq_len, head, plan.activation_dtype, plan.attention == "flash",
                        m.dropout)


def _pointwise(cm: CostModel, m: ModelSpec, plan: Plan, tokens: float) -> Cost:
    """Two norms, two residual adds and (if the model has them) two dropouts."""
    local = tokens / (plan.tp if plan.sequence_parallel else 1)
    dt, h = plan.activation_dtype, m.hidden_size
    parts = [cm.elementwise(m.norm, local, h, dt), cm.elementwise("residual", local, h, dt)]
    if m.dropout:
        parts.append(cm.elementwise("dropout", local, h, dt))
    return _scale(_add(*parts), 2)


def layer_variant(m: ModelSpec, seq_len: int) -> str:
    """A layer's structure as a profile-DB variant string (hidden size and tokens are the
    row's shape): ``seq=512;num_heads=8;...``."""
    values = {"seq": seq_len, **{f: getattr(m, f) for f in _LAYER_FIELDS}}
    values["num_kv_heads"], values["head_dim"] = m.kv_heads, m.head_size
    return ";".join(f"{k}={v}" for k, v in values.items())


def variant_layer(variant: str, hidden: int) -> tuple[ModelSpec, int]:
    """(one-layer ModelSpec, sequence length) of a :func:`layer_variant` string."""
    raw = dict(item.split("=", 1) for item in variant.split(";"))
    seq = int(raw.pop("seq"))
    typed: dict[str, object] = {}
    for k, v in raw.items():
        typed[k] = v == "True" if v in ("True", "False") else int(v) if v.isdigit() else v
    spec = ModelSpec(name="profiled-layer", num_layers=1, hidden_size=hidden, vocab_size=1000,
                     max_seq_len=seq, **typed)  # type: ignore[arg-type]
    return spec, seq


def layer_time(cm: CostModel, m: ModelSpec, plan: Plan, moe: bool = False) -> LayerTime:
    """Forward and backward seconds of one layer for one micro-batch on one rank: the sum
    of its operations, times the measured whole-layer/operation-sum ratio where the cost
    model has whole layers profiled (what the operations leave out: autograd and dispatch
    overhead, views and copies between them)."""
    lt = ops_layer_time(cm, m, plan, moe)
    factor = getattr(cm, "layer_factor", None)
    f, b = factor(m, plan) if factor is not None else (1.0, 1.0)
    over = getattr(cm, "layer_overhead_s", 0.0)  # the roofline's calibrated fixed cost
    replay = over if stops_early(plan) else 0.0  # a whole layer's replay: its fixed cost too
    zf, zb = _fsdp(cm, plan, sum(layer_rank_params(m, plan, moe)))
    def fb(pair: tuple[Cost, Cost]) -> tuple[Cost, Cost]:
        return (pair[0][0] * f, pair[0][1] * b), (pair[1][0] * f, pair[1][1] * b)
    return LayerTime(lt.forward * f + over + zf, lt.backward * b + 2 * over + zb,
                     lt.attention_forward * f, lt.attention_backward * b,
                     lt.shared_forward * f, lt.shared_backward * b,
                     lt.recompute_forward * f + replay, fb(lt.expert_gemms),
                     fb(lt.attention_gemms), fb(lt.mlp_gemms), (zf, zb))


def _fsdp(cm: CostModel, plan: Plan, params: float) -> Cost:
    """FSDP2's host-side (forward, backward) seconds around one ZeRO-3 unit of ``params``
    parameters, where the cost model has them measured (:mod:`sim.cost.fsdp`)."""
    unit = getattr(cm, "fsdp_unit", None)
    return unit(plan, params) if unit is not None and plan.zero_stage == 3 else (0.0, 0.0)


def ops_layer_time(cm: CostModel, m: ModelSpec, plan: Plan, moe: bool = False) -> LayerTime:
    """:func:`layer_time` as the plain sum of the layer's operations."""
    tokens = plan.local_tokens
    mlp = _moe(cm, m, plan, tokens) if moe else _mlp(cm, m, plan, tokens, m.ffn_hidden_size)
    core = _attention_core(cm, m, plan)
    rest = _add(_attention_block(cm, m, plan, tokens), mlp, _pointwise(cm, m, plan, tokens))
    shared = _shared(cm, m, plan, tokens) if moe else (0.0, 0.0)
    again = _recomputed_forward(cm, m, plan, moe, {"core_attn": core[0], "mlp": mlp[0],
                                                   "shared_experts": shared[0]})
    zero = ((0.0, 0.0), (0.0, 0.0))
    dense = zero if moe else mlp_gemms(cm, m, plan, tokens, m.ffn_hidden_size)
    if stops_early(plan):  # the replay ends before a dense layer's down projection, whose
        # inputs torch saves before running it (an MoE layer's grouped GEMMs save after)
        again = rest[0] + core[0] - dense[1][0]
    return LayerTime(rest[0] + core[0], rest[1] + core[1], core[0], core[1], *shared, again,
                     expert_gemms(cm, m, plan, tokens) if moe else zero,
                     attention_gemms(cm, m, plan, tokens), dense)


def _recomputed_forward(cm: CostModel, m: ModelSpec, plan: Plan, moe: bool,
                        timed: dict[str, float]) -> float:
    """Forward seconds of the modules selective recomputation re-runs in this layer (a
    dense layer's ``mlp``, an MoE layer's ``moe_act`` and ``shared_experts``)."""
    mods = recomputed(plan)
    if not mods:
        return 0.0
    local = plan.local_tokens / (plan.tp if plan.sequence_parallel else 1)
    seconds = {"core_attn": lambda: timed["core_attn"],
               "layernorm": lambda: recomputed_norms(m, plan, moe) * cm.elementwise(
                   m.norm, local, m.hidden_size, plan.activation_dtype)[0],
               "mlp": lambda: 0.0 if moe else timed["mlp"],
               "shared_experts": lambda: timed["shared_experts"] if moe else 0.0,
               "moe_act": lambda: _expert_act(cm, m, plan) if moe else 0.0}
    return sum(seconds[k]() for k in mods)


def _expert_act(cm: CostModel, m: ModelSpec, plan: Plan) -> float:
    """Forward seconds of the routed experts' activation function on this rank (the
    most-loaded rank's tokens, as :func:`expert_time`)."""
    per_expert, e = _expert_tokens(m, plan, plan.local_tokens)
    act = "swiglu" if m.gated_mlp else "gelu"
    one = cm.elementwise(act, per_expert, m.expert_ffn / e, plan.activation_dtype)[0]
    return one * m.num_experts / plan.ep


def _head(cm: CostModel, m: ModelSpec, plan: Plan) -> Cost:
    """Final norm, output projection and cross-entropy loss. The output projection runs in
    16 bits under fp8 training, as torchtitan's published runs (its float8 converter left
    ``output`` out) and Megatron-LM (a plain ``ColumnParallelLinear``, not Transformer
    Engine's) run it."""
    tokens = plan.local_tokens
    local = tokens / (plan.tp if plan.sequence_parallel else 1)
    loss = "loss-parallel" if plan.tp > 1 else "loss"  # vocab-parallel: unfused passes
    dt, h = plan.activation_dtype, m.hidden_size
    return _add(cm.elementwise(m.norm, local, h, dt),
                cm.gemm(tokens, m.vocab_size / plan.tp, h, dt),
                cm.elementwise(loss, tokens, m.vocab_size / plan.tp, dt))


def ops_logits_time(cm: CostModel, m: ModelSpec, plan: Plan) -> float:
    """Forward + backward of one output head as the plain sum of its operations."""
    return sum(_head(cm, m, plan))


def logits_time(cm: CostModel, m: ModelSpec, plan: Plan) -> float:
    """Forward + backward of the final norm, output projection and cross-entropy loss (times
    the measured whole-head/operation-sum ratio where the cost model has TP heads profiled
    as they run); with multi-token prediction also each module's two input norms, ``2h ->
    h`` projection, and its own norm, output projection and loss (its layer is timed with
    the layers)."""
    factor = getattr(cm, "head_factor", None)
    head = ops_logits_time(cm, m, plan) * (factor(m, plan) if factor is not None else 1.0)
    root = fsdp_root_time(cm, m, plan)
    if not m.num_mtp_layers:
        return head + root
    local = plan.local_tokens / (plan.tp if plan.sequence_parallel else 1)
    h = m.hidden_size
    extra = _add(_scale(cm.elementwise(m.norm, local, h, plan.activation_dtype), 2),
                 cm.gemm(plan.local_tokens, h / plan.tp, 2 * h, plan.dtype))
    return head + m.num_mtp_layers * (head + sum(extra)) + root


def fsdp_root_time(cm: CostModel, m: ModelSpec, plan: Plan) -> float:
    """FSDP2's host-side seconds (forward + backward) of a ZeRO-3 chunk's root unit, where
    measured (:mod:`sim.cost.fsdp`): its parameters' (embedding, output layer, multi-token
    prediction; the last stage's under a pipeline) unit cost and its own; charged with the
    output head."""
    root = getattr(cm, "fsdp_root", None)
    if root is None or plan.zero_stage != 3:
        return 0.0
    # -1: the last virtual stage (holding the tied embedding too when pp = 1)
    edges = chunk_edge_params(m, plan, 0 if plan.pp == 1 else -1)
    return sum(_fsdp(cm, plan, edges)) + sum(root(plan))


def logits_weight_time(cm: CostModel, m: ModelSpec, plan: Plan) -> float:
    """The output layer's weight gradient: a third of :func:`logits_time` less FSDP2's root
    (the tiers split it one third forward, two thirds backward; one GEMM's worth of the
    backward)."""
    return (logits_time(cm, m, plan) - fsdp_root_time(cm, m, plan)) / 3


def embedding_time(cm: CostModel, m: ModelSpec, plan: Plan) -> float:
    """Forward + backward of the input embedding lookup."""
    fwd, bwd = cm.embedding(plan.local_tokens, m.hidden_size, m.vocab_size, plan.activation_dtype)
    return fwd + bwd


def optimizer_time(cm: CostModel, params: float) -> float:
    """One Adam step over ``params`` local parameters, and the step's fixed cost (a software
    stack's: data loading, gradient clipping, launches; 0 unless a stack sets it)."""
    return cm.optimizer(params) + getattr(cm, "step_overhead_s", 0.0)
