"""How data-parallel workers synchronise (``plan.sync``), how their gradients travel
(``plan.communication``: all-reduce or parameter servers) and what shrinks them on the wire
(``plan.compression``). BSP over all-reduce, uncompressed, is the default: the one-step
tiers (:func:`sim.api.simulate`) model it; everything else runs in the multi-step simulator
(:func:`sim.strategies.simulate.simulate_sync`).

Each strategy owns its parameters; giving another strategy's parameter is an error, so a
plan never carries a field that does nothing::

    {"kind": "ssp", "staleness": 2}                 # bounded staleness, 2 clocks
    {"kind": "local-sgd", "period": 8}              # average every 8 local steps
    {"kind": "gossip", "graph": "ring"}             # D-PSGD over a ring

>>> Sync.from_dict({"kind": "ssp", "staleness": "inf"}).staleness
inf
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from sim.errors import SpecError, field_name
from sim.spec.gossip import gossip_edges
from sim.spec.limits import MAX_DEVICES

__all__ = ["Sync", "Communication", "Compression", "SYNC_KINDS", "GRAPHS", "GOSSIP_MODES",
           "ARCHITECTURES", "COMPRESSIONS", "architecture", "check_sync", "is_default_sync",
           "coerce_sync", "sync_to_dict", "parse_section", "SECTIONS", "as_bsp"]

SYNC_KINDS = ("bsp", "asp", "ssp", "local-sgd", "diloco", "two-stage", "gossip",
              "backup-workers")
GRAPHS = ("ring", "torus2d", "exponential", "edges")
# D-PSGD: synchronous neighbour averaging (Lian et al. 2017); AD-PSGD: asynchronous pairwise
# averaging (Lian et al. 2018); SGP: push-sum, one peer a step (Assran et al. 2019).
GOSSIP_MODES = ("d-psgd", "ad-psgd", "sgp")
PSEUDO_GRADIENT_DTYPES = ("fp32", "bf16", "fp16", "int8")
ARCHITECTURES = ("auto", "allreduce", "ps")
PS_PLACEMENTS = ("dedicated", "colocated")
SHARDINGS = ("size-balanced", "round-robin", "flat")
COMPRESSIONS = ("none", "fp16", "int8", "topk", "powersgd", "onebit")
MAX_PERIOD = 10**6  # local steps between averages: far beyond DiLoCo's 500

# Which kinds own each Sync parameter (the rest must leave it at its default).
_OWNERS = {"staleness": ("ssp",), "period": ("local-sgd", "diloco"),
           "warmup_steps": ("local-sgd",), "outer_lr": ("diloco",),
           "outer_momentum": ("diloco",), "pseudo_gradient_dtype": ("diloco",),
           "important_fraction": ("two-stage",), "important_layers": ("two-stage",),
           "graph": ("gossip",), "edges": ("gossip",), "gossip_mode": ("gossip",),
           "backups": ("backup-workers",)}
_COMM_OWNERS = {"servers": "ps", "placement": "ps", "sharding": "ps", "server_cpu_GBps": "ps",
                "server_nic_Gbps": "ps", "aggregate": "ps", "partition_MB": "ps"}
AGGREGATES = ("worker", "node")
MAX_PARTITION_MB = 1e6  # a partition of a terabyte: beyond any gradient
_COMPRESSION_OWNERS = {"ratio": ("topk",), "rank": ("powersgd",),
                       "error_feedback": COMPRESSIONS[1:], "warmup_steps": COMPRESSIONS[1:]}


@dataclass(frozen=True)
class Sync:
    """A synchronisation strategy of the data-parallel workers and its parameters."""

    kind: str = "bsp"
    staleness: float = 0  # ssp: clocks a worker may run ahead of the slowest (inf: asp)
    period: int = 1  # local-sgd / diloco: local steps between averages (H)
    warmup_steps: int = 0  # local-sgd: BSP steps first (post-local SGD)
    outer_lr: float = 0.7  # diloco: outer Nesterov SGD (Douillard et al. 2023's values)
    outer_momentum: float = 0.9
    pseudo_gradient_dtype: str = "fp32"  # diloco: what the outer all-reduce carries
    important_fraction: float = 0.1  # two-stage: share of the gradient synchronised at once
    important_layers: tuple[str, ...] = ()  # two-stage: these layers instead (by name)
    graph: str = "ring"  # gossip: ring, torus2d, exponential or edges
    edges: tuple[tuple[int, int], ...] = ()  # gossip graph "edges": worker pairs
    gossip_mode: str = "d-psgd"  # d-psgd, ad-psgd or sgp
    backups: int = 0  # backup-workers: the b slowest of each step are not waited for

    @classmethod
    def from_dict(cls, data: Any) -> Sync:
        data = _fields(cls, data, "plan.sync", "kind")
        if data.get("staleness") in ("inf", "Infinity"):
            data["staleness"] = math.inf
        for name in ("important_layers", "edges"):
            if isinstance(data.get(name), list):
                data[name] = tuple(tuple(e) if isinstance(e, list) else e for e in data[name])
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for name, owners in _OWNERS.items():
            if self.kind in owners:
                value = getattr(self, name)
                out[name] = "inf" if value == math.inf else _lists(value)
        return out


@dataclass(frozen=True)
class Communication:
    """All-reduce among the workers, or parameter servers (BytePS-style: CPU servers with
    their own NICs, on spare machines or on the workers' nodes)."""

    architecture: str = "auto"  # auto: ps for asp/ssp/backup-workers, else allreduce
    servers: int = 1  # parameter-server shards
    placement: str = "dedicated"  # dedicated machines, or colocated on the workers' nodes
    # parameter tensors over servers: size-balanced or round-robin (whole tensors), or flat
    # (equal slices of the flattened parameters, a tensor split across servers)
    sharding: str = "size-balanced"
    # bytes/s a server's CPU sums into its shard (read two, write one): an assumption
    # (docs/guide/sync.md), about a third of one socket's ~60 GB/s STREAM bandwidth
    server_cpu_GBps: float = 20.0
    server_nic_Gbps: float | None = None  # a dedicated server's NIC (null: the nodes' NIC)
    # worker: every worker pushes its own gradient; node: a node's workers sum theirs over
    # the node fabric first and the node pushes once (BytePS; staleness then counts nodes)
    aggregate: str = "worker"
    # 0: a worker pushes its shards after its whole step; > 0: BSP's gradient travels in
    # partitions of this many MB, each pushed as the backward produces it and pulled once
    # its server has every worker's (BytePS' pipelining; its default is 4 MB)
    partition_MB: float = 0.0

    @classmethod
    def from_dict(cls, data: Any) -> Communication:
        return cls(**_fields(cls, data, "plan.communication", "architecture"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"architecture": self.architecture}
        if self.architecture == "ps":
            out.update({k: getattr(self, k) for k in _COMM_OWNERS})
        return out


@dataclass(frozen=True)
class Compression:
    """Gradient compression on the wire: what it keeps, and error feedback of the rest."""

    kind: str = "none"
    ratio: float = 0.01  # topk: fraction of the elements kept
    rank: int = 4  # powersgd: rank of the low-rank factors
    error_feedback: bool = True  # add what compression lost to the next gradient
    warmup_steps: int = 0  # uncompressed steps first

    @classmethod
    def from_dict(cls, data: Any) -> Compression:
        return cls(**_fields(cls, data, "plan.compression", "kind"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind != "none":
            out.update({k: getattr(self, k) for k, owners in _COMPRESSION_OWNERS.items()
                        if self.kind in owners})
            out.update(error_feedback=self.error_feedback, warmup_steps=self.warmup_steps)
        return out


def _lists(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_lists(v) for v in value]
    return value


def _fields(cls: type, data: Any, where: str, key: str) -> dict[str, Any]:
    """``data`` as keyword arguments of ``cls``: a string is the ``key`` field alone."""
    if isinstance(data, str):
        return {key: data}
    if not isinstance(data, dict):
        raise SpecError(where, f"must be an object (or a {key} name), got {data!r}")
    known = [f.name for f in dataclasses.fields(cls)]
    for name in data:
        if name not in known:
            raise SpecError(f"{where}.{field_name(name)}", f"unknown field (known: "
                            f"{', '.join(known)})")
    return dict(data)


SECTIONS = (("sync", Sync), ("communication", Communication), ("compression", Compression))


def coerce_sync(plan: Any) -> None:
    """Turn dicts (or kind names) given for the three sections into their dataclasses, in
    place on the frozen plan (called before validation)."""
    for name, cls in SECTIONS:
        value = getattr(plan, name)
        if not isinstance(value, cls):
            object.__setattr__(plan, name, cls.from_dict(value))


def sync_to_dict(plan: Any) -> dict[str, Any]:
    return {name: getattr(plan, name).to_dict() for name, _ in SECTIONS}


def is_default_sync(plan: Any) -> bool:
    """BSP over all-reduce, uncompressed: what the one-step tiers simulate."""
    return (plan.sync.kind == "bsp" and architecture(plan) == "allreduce"
            and plan.compression.kind == "none")


def as_bsp(plan: Any) -> Any:
    """``plan`` with the default synchronisation: BSP over all-reduce, uncompressed."""
    return dataclasses.replace(plan, sync=Sync(), communication=Communication(),
                               compression=Compression())


def architecture(plan: Any) -> str:
    """The communication architecture in effect (``auto`` resolved)."""
    arch = plan.communication.architecture
    if arch != "auto":
        return arch
    kind = plan.sync.kind
    return "ps" if kind in ("asp", "ssp", "backup-workers") else \
        "gossip" if kind == "gossip" else "allreduce"


# Validation ---------------------------------------------------------------------------------
def check_sync(plan: Any) -> None:
    """The three sections alone and against the plan's data-parallel degree."""
    _check_sync_fields(plan.sync)
    _check_communication(plan.communication)
    _check_compression(plan.compression)
    _check_combination(plan)
    if plan.sync.kind == "gossip":
        gossip_edges(plan.sync.graph, plan.sync.edges, plan.dp)  # raises for a bad graph


def _choice(field: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecError(field, f"must be one of {', '.join(choices)}, got {value!r}")


def _int(field: str, value: Any, low: int, high: int = MAX_DEVICES) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SpecError(field, f"must be an integer in {low}..{high:,}, got {value!r}")


def _real(field: str, value: Any, rule: str, ok: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
            or not ok(value):
        raise SpecError(field, f"must be {rule}, got {value!r}")
    return float(value)


def _owned(section: str, obj: Any, owners: dict[str, Any], key: str) -> None:
    """Parameters of another kind left at their defaults."""
    default = type(obj)()
    kind = getattr(obj, key)
    for name, who in owners.items():
        if getattr(obj, name) != getattr(default, name) and kind not in who:
            names = list(who) if isinstance(who, tuple) else [who]
            whom = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
            raise SpecError(f"plan.{section}.{name}", f"is a parameter of {whom}, not of "
                            f"{key} {kind!r}")


def _check_sync_fields(s: Sync) -> None:
    _choice("plan.sync.kind", s.kind, SYNC_KINDS)
    _owned("sync", s, _OWNERS, "kind")
    _real("plan.sync.staleness", s.staleness, "an integer >= 0 or \"inf\" (clocks ahead of "
          "the slowest worker)", lambda v: v >= 0 and (v == math.inf or v == int(v)))
    _int("plan.sync.period", s.period, 1, MAX_PERIOD)
    _int("plan.sync.warmup_steps", s.warmup_steps, 0, MAX_PERIOD)
    _real("plan.sync.outer_lr", s.outer_lr, "a finite number > 0",
          lambda v: 0 < v < math.inf)
    _real("plan.sync.outer_momentum", s.outer_momentum, "in [0, 1)", lambda v: 0 <= v < 1)
    _choice("plan.sync.pseudo_gradient_dtype", s.pseudo_gradient_dtype, PSEUDO_GRADIENT_DTYPES)
    _real("plan.sync.important_fraction", s.important_fraction, "in (0, 1]",
          lambda v: 0 < v <= 1)
    if not isinstance(s.important_layers, tuple) or not all(
            isinstance(n, str) and n for n in s.important_layers):
        raise SpecError("plan.sync.important_layers", "must be a list of layer names")
    _choice("plan.sync.graph", s.graph, GRAPHS)
    _choice("plan.sync.gossip_mode", s.gossip_mode, GOSSIP_MODES)
    _int("plan.sync.backups", s.backups, 0)
    if s.kind == "gossip" and s.gossip_mode == "sgp" and s.graph != "exponential":
        raise SpecError("plan.sync.graph", f"sgp pushes to one peer a step over the "
                        f"exponential graph: give graph \"exponential\", got {s.graph!r}")
    if s.kind == "backup-workers" and s.backups < 1:
        raise SpecError("plan.sync.backups", "backup-workers needs backups >= 1 (workers "
                        "not waited for), got 0")


def _check_communication(c: Communication) -> None:
    _choice("plan.communication.architecture", c.architecture, ARCHITECTURES)
    _owned("communication", c, _COMM_OWNERS, "architecture")
    _int("plan.communication.servers", c.servers, 1)
    _choice("plan.communication.placement", c.placement, PS_PLACEMENTS)
    _choice("plan.communication.sharding", c.sharding, SHARDINGS)
    _real("plan.communication.server_cpu_GBps", c.server_cpu_GBps, "a finite number > 0",
          lambda v: 0 < v < math.inf)
    if c.server_nic_Gbps is not None:
        _real("plan.communication.server_nic_Gbps", c.server_nic_Gbps, "a finite number > 0 "
              "or null", lambda v: 0 < v < math.inf)
    _choice("plan.communication.aggregate", c.aggregate, AGGREGATES)
    _real("plan.communication.partition_MB", c.partition_MB, f"0 (whole shards) or in "
          f"[1e-06, {MAX_PARTITION_MB:g}] (a byte at least)",
          lambda v: v == 0 or 1e-6 <= v <= MAX_PARTITION_MB)


def _check_compression(c: Compression) -> None:
    _choice("plan.compression.kind", c.kind, COMPRESSIONS)
    _owned("compression", c, _COMPRESSION_OWNERS, "kind")
    _real("plan.compression.ratio", c.ratio, "in (0, 1] (the fraction of elements kept)",
          lambda v: 0 < v <= 1)
    _int("plan.compression.rank", c.rank, 1, 4096)
    if not isinstance(c.error_feedback, bool):
        raise SpecError("plan.compression.error_feedback", f"must be true or false, got "
                        f"{c.error_feedback!r}")
    _int("plan.compression.warmup_steps", c.warmup_steps, 0, MAX_PERIOD)


# What each strategy can run over: asynchronous updates need a server to apply them.
_ARCHS = {"bsp": ("allreduce", "ps"), "asp": ("ps",), "ssp": ("ps",),
          "local-sgd": ("allreduce",), "diloco": ("allreduce",), "two-stage": ("allreduce",),
          "gossip": ("gossip",), "backup-workers": ("ps",)}


def _check_combination(plan: Any) -> None:
    kind, arch = plan.sync.kind, architecture(plan)
    if arch not in _ARCHS[kind]:
        need = " or ".join(_ARCHS[kind]) + (" (neighbour exchanges: leave it auto)"
                                            if kind == "gossip" else "")
        raise SpecError("plan.communication.architecture", f"{kind} runs over {need}, "
                        f"got {arch!r}")
    if is_default_sync(plan):
        return
    if kind != "bsp" and plan.dp < 2:
        raise SpecError("plan.sync.kind", f"{kind} synchronises data-parallel workers: needs "
                        f"dp >= 2, got dp = {plan.dp}")
    for name, value, rule in (("zero_stage", plan.zero_stage, 0), ("ep", plan.ep, 1)):
        if value != rule:
            raise SpecError(f"plan.{name}", f"must be {rule} with sync {kind!r} over {arch} "
                            f"(each worker keeps whole replicas of its state), got {value}")
    if plan.micro_batches_per_replica is not None:
        raise SpecError("plan.micro_batches_per_replica", f"must be null with sync {kind!r} "
                        f"over {arch} (worker speeds come from --straggler and the cluster)")
    if plan.compression.kind == "powersgd" and arch != "allreduce":
        raise SpecError("plan.compression.kind", f"powersgd all-reduces its low-rank factors: "
                        f"needs communication over allreduce, got {arch}")
    if plan.communication.partition_MB and kind != "bsp":
        raise SpecError("plan.communication.partition_MB", f"partitions pipeline BSP's "
                        f"pushes and pulls: needs sync bsp, got {kind!r} (use 0)")
    if kind == "backup-workers" and plan.sync.backups >= plan.dp:
        raise SpecError("plan.sync.backups", f"must be below dp = {plan.dp} (someone must "
                        f"finish the step), got {plan.sync.backups}")


# Command line -------------------------------------------------------------------------------
def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets: ``a=1,b=[1, 2]`` -> ``["a=1", "b=[1, 2]"]``."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [*parts, cur] if cur or parts else []


def parse_section(option: str, text: str, key: str) -> dict[str, Any]:
    """``KIND[:NAME=VALUE,...]`` from the command line (``ssp:staleness=2``,
    ``ps:servers=2,placement=colocated``) as a section dict; values are TOML scalars or
    arrays (``edges=[[0, 1], [1, 2]]``), ``inf`` for an unbounded staleness."""
    import tomllib

    kind, _, rest = text.partition(":")
    out: dict[str, Any] = {key: kind.strip()}
    for item in _split_top(rest):
        name, eq, value = item.partition("=")
        if not eq or not name.strip() or not value.strip():
            raise SpecError(option, f"must be {key.upper()}[:NAME=VALUE,...] (e.g. "
                            f"ssp:staleness=2), got {text!r}")
        try:
            out[name.strip()] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            out[name.strip()] = value.strip()
    return out
