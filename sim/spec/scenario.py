"""What-if scenarios: named edits of a base cluster (and plan), validated like any input.

An edit is a dotted key and a value, from the command line (``--set inter_node.nic_Gbps=800``)
or a TOML file. Cluster keys are those of a cluster file (``nodes``, ``gpu``,
``intra_node.bandwidth_GBps``, ``inter_node.topology``, ...); plan keys are the plan's fields
(``tp``, ``micro_batch_size``, ``recompute``, ...); ``faults.straggler``,
``faults.straggler_dist``, ``faults.seed`` and ``faults.fail_link`` add stragglers and
failures as on the command line (:mod:`sim.spec.faults`). An edited cluster is rebuilt through
:func:`sim.spec.cluster.cluster_from_dict`, so a bad value fails with the same one-line error as
in a cluster file. A field still at its derived default (the node fabric's bandwidth, which
follows the GPU's NVLink rate or PCIe) follows an edit of what it derives from.

A scenario file holds edits for one scenario, or several named ones::

    gpu = "h200-sxm-141gb"          # applied to every scenario below
    [scenario.nic800]
    inter_node.nic_Gbps = 800
    [scenario.rail]
    inter_node = { topology = "rail-optimized" }

>>> from sim.spec.cluster import load_cluster
>>> apply_cluster_edits(load_cluster("dgx-h100:2"), [("inter_node.nic_Gbps", 800)]).nic_GBps_per_gpu
100.0
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.errors import SpecError, field_name
from sim.io import read_toml
from sim.spec.cluster import PCIE_GBPS, ClusterSpec, InterNode, IntraNode, cluster_from_dict
from sim.spec.hardware import get_hardware
from sim.spec.plan import Plan
from sim.spec.sync import SECTIONS

__all__ = ["Scenario", "Edit", "CLUSTER_KEYS", "PLAN_KEYS", "FAULT_KEYS", "parse_value",
           "parse_assignment", "flatten_edits", "check_key", "is_cluster_key",
           "apply_cluster_edits", "apply_plan_edits", "load_scenarios", "scenarios_from_args",
           "edit_label", "check_fault"]

Edit = tuple[str, Any]

CLUSTER_KEYS = (("nodes", "gpus_per_node", "gpu", "profile", "compute_stat", "node_groups")
                + tuple(f"intra_node.{f.name}" for f in dataclasses.fields(IntraNode))
                + tuple(f"inter_node.{f.name}" for f in dataclasses.fields(InterNode)))
PLAN_KEYS = tuple(f.name for f in dataclasses.fields(Plan)) + tuple(
    f"{name}.{f.name}" for name, cls in SECTIONS for f in dataclasses.fields(cls))
FAULT_KEYS = ("faults.straggler", "faults.straggler_dist", "faults.seed", "faults.fail_link")
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Scenario:
    """A named list of edits, applied in order (a later edit of a key wins)."""

    name: str
    edits: tuple[Edit, ...] = ()

    @property
    def cluster_edits(self) -> tuple[Edit, ...]:
        return tuple(e for e in self.edits if is_cluster_key(e[0]))

    @property
    def plan_edits(self) -> tuple[Edit, ...]:
        return tuple(e for e in self.edits if not is_cluster_key(e[0])
                     and e[0] not in FAULT_KEYS)

    @property
    def fault_edits(self) -> tuple[Edit, ...]:
        """Stragglers and failures (:func:`sim.spec.faults.with_edits`)."""
        return tuple(e for e in self.edits if e[0] in FAULT_KEYS)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "edits": dict(self.edits)}


# Parsing ------------------------------------------------------------------------------------
def parse_value(text: str) -> Any:
    """A command-line value: a TOML scalar or array (``800``, ``1.5``, ``true``, ``"x"``,
    ``[1, 2]``), else the text itself as a string (``h200-sxm-141gb``)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text.strip()


def parse_assignment(text: str, option: str = "--set") -> Edit:
    """``key=value`` from the command line, key checked against the known keys."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or not value.strip():
        raise SpecError(option, f"must be KEY=VALUE (e.g. inter_node.nic_Gbps=800), "
                        f"got {text!r}")
    check_key(key)
    return key, parse_value(value)


def is_cluster_key(key: str) -> bool:
    return key in CLUSTER_KEYS


def check_key(key: str, extra: Sequence[str] = ()) -> None:
    """Raise a one-line error naming ``key`` unless it is a cluster or plan key (or one of
    ``extra``)."""
    if key in CLUSTER_KEYS or key in PLAN_KEYS or key in FAULT_KEYS or key in extra:
        return
    shown = key if all(part.isidentifier() for part in key.split(".")) else field_name(key)
    if key in ("schema_version", "name"):
        raise SpecError(shown, "cannot be edited in a scenario")
    known = ", ".join(list(extra) + list(CLUSTER_KEYS) + list(FAULT_KEYS)
                      + ["plan fields: " + ", ".join(PLAN_KEYS)])
    raise SpecError(shown, f"unknown scenario key (known: {known})")


def flatten_edits(table: dict[str, Any], prefix: str = "") -> list[Edit]:
    """TOML tables to dotted keys: ``{"inter_node": {"nic_Gbps": 800}}`` ->
    ``[("inter_node.nic_Gbps", 800)]``. Arrays and scalars are values."""
    out: list[Edit] = []
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out += flatten_edits(value, dotted + ".")
        else:
            out.append((dotted, value))
    return out


def edit_label(edits: Iterable[Edit]) -> str:
    """``inter_node.nic_Gbps=800,gpu=h200-sxm-141gb`` (``base`` when there are none)."""
    return ",".join(f"{k}={v}" for k, v in edits) or "base"


# Applying -----------------------------------------------------------------------------------
def apply_cluster_edits(cluster: ClusterSpec, edits: Iterable[Edit], name: str | None = None
                        ) -> ClusterSpec:
    """``cluster`` with ``edits`` applied, rebuilt and validated like a cluster file."""
    edits = [e for e in edits if is_cluster_key(e[0])]
    if not edits:
        return cluster
    data = cluster.to_dict()
    for key, value in edits:
        head, _, tail = key.partition(".")
        if tail:
            data[head][tail] = value
        else:
            data[head] = value
    if not any(k == "intra_node.bandwidth_GBps" for k, _ in edits) \
            and _intra_is_default(cluster):
        data["intra_node"]["bandwidth_GBps"] = None
    keys = {k for k, _ in edits}
    if "node_groups" in keys:  # nodes and GPU follow the new groups unless edited too
        for k in ("nodes", "gpu"):
            if k not in keys:
                data.pop(k)
    if "gpu" in data and not isinstance(data["gpu"], str):
        raise SpecError("gpu", f"must be a catalog name, got {data['gpu']!r}")
    data["name"] = name or f"{cluster.name}[{edit_label(edits)}]"
    return cluster_from_dict(data, data["name"])


def _intra_is_default(cluster: ClusterSpec) -> bool:
    """True when the node fabric's bandwidth is the one its kind and GPU imply."""
    kind = cluster.intra_node.kind
    implied = PCIE_GBPS if kind == "pcie" else cluster.gpu.nvlink_GBps
    return kind != "loopback" and cluster.intra_node.bandwidth_GBps == implied


def apply_plan_edits(plan: Plan, edits: Iterable[Edit]) -> Plan:
    """``plan`` with the plan keys of ``edits`` replaced, validated by :class:`Plan`."""
    edits = [e for e in edits if not is_cluster_key(e[0]) and e[0] not in FAULT_KEYS]
    if not edits:
        return plan
    fields = plan.to_dict()
    keyed = {key.partition(".")[0] for key, _ in edits if key in _SECTION_KEYS}
    for section in keyed:  # a new kind starts from its own defaults
        fields[section] = {}
    for key, value in edits:  # ``sync.staleness``: a field of a plan section
        section, _, name = key.partition(".")
        if name:
            fields[section] = {**fields[section], name: value}
        else:
            fields[key] = value
    return plan_from_fields(fields)


_SECTION_KEYS = ("sync.kind", "communication.architecture", "compression.kind")


def plan_from_fields(fields: dict[str, Any]) -> Plan:
    """A plan from a dict of fields; a value of the wrong type is a one-line error."""
    try:
        return Plan.from_dict(fields)
    except TypeError as exc:
        raise SpecError("plan", str(exc)) from None


def check_gpu(value: Any) -> None:
    """A ``gpu`` edit must name a catalog device (checked before anything runs)."""
    if not isinstance(value, str):
        raise SpecError("gpu", f"must be a catalog name, got {value!r}")
    get_hardware(value)


def check_fault(key: str, value: Any) -> None:
    """A ``faults.*`` edit must parse (checked before anything runs)."""
    from sim.spec.faults import with_edits

    with_edits(None, [(key, value)])


# Files and the command line -----------------------------------------------------------------
def load_scenarios(path: str | Path) -> list[Scenario]:
    """The scenarios of a TOML file: its ``[scenario.NAME]`` tables, each after the file's
    top-level edits; or, with no such table, one scenario named after the file."""
    p = Path(path)
    data = read_toml(p, "scenario", f"scenario[{p.name}]")
    named = data.pop("scenario", None)
    common = _checked(flatten_edits(data), f"{p.name}:")
    if named is None:
        return [Scenario(p.stem, tuple(common))]
    if not isinstance(named, dict) or not named or not all(
            isinstance(v, dict) for v in named.values()):
        raise SpecError(f"{p.name}:scenario", "must be tables [scenario.NAME] of edits")
    for name in named:
        if not _NAME_RE.fullmatch(name) or name == "base":
            raise SpecError(f"{p.name}:scenario.{field_name(name)}", "a scenario name must be "
                            "letters, digits, '.', '_' or '-' (it names a folder), not 'base'")
    return [Scenario(name, tuple(common + _checked(flatten_edits(table),
                                                   f"{p.name}:scenario.{name}.")))
            for name, table in named.items()]


def _checked(edits: list[Edit], where: str) -> list[Edit]:
    for key, value in edits:
        try:
            check_key(key)
            if key == "gpu":
                check_gpu(value)
            if key in FAULT_KEYS:
                check_fault(key, value)
        except SpecError as exc:
            raise SpecError(where + exc.field, exc.rule) from None
    return edits


def scenarios_from_args(sets: Sequence[str], scenario_file: str | None) -> list[Scenario]:
    """The scenarios of ``--scenario FILE`` (or one unnamed), each followed by the
    ``--set`` edits, which therefore win."""
    edits = [parse_assignment(s) for s in sets]
    for key, value in edits:
        if key == "gpu":
            check_gpu(value)
        if key in FAULT_KEYS:
            check_fault(key, value)
    if scenario_file is None:
        return [Scenario(edit_label(edits), tuple(edits))]
    return [dataclasses.replace(s, edits=s.edits + tuple(edits))
            for s in load_scenarios(scenario_file)]
