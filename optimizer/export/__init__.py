"""Launch files for real frameworks, from a plan: each format targets one pinned framework
version and either expresses every field of the plan or refuses with a one-line error
naming the field (:class:`sim.errors.SpecError`); nothing is dropped or changed silently.

=============  =========================================================================
format         what it writes, for which version
=============  =========================================================================
megatron       ``megatron_args.sh``: environment and ``torchrun ... pretrain_gpt.py``
               arguments for Megatron-LM core_r0.16 (megatron-core 0.16.1)
torchtitan     ``trainsim_torchtitan.py``: a config module for torchtitan 0.3.0's
               ``--module/--config`` entry point, and ``torchtitan.sh`` launching it
deepspeed      ``deepspeed_config.json`` for DeepSpeed 0.19.8 (data-parallel ZeRO plans)
=============  =========================================================================

The fourth format, ``torchrun`` (this project's own worker), is the executor's:
:mod:`executor.export`. Where the plan's placement is not the frameworks' rank order (TP
innermost, then CP, DP, PP) a ``rank_table.json`` (global rank -> node and local device) is
written too. A plan's collective algorithms become ``NCCL_ALGO`` when one algorithm serves
every group.
"""

from __future__ import annotations

from optimizer.export import deepspeed, megatron, torchtitan
from optimizer.export.common import FRAMEWORKS, check_common, rank_files
from sim.errors import SpecError
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["export", "refusal", "FORMATS", "FRAMEWORKS"]

FORMATS = ("megatron", "torchtitan", "deepspeed")
_MODULES = {"megatron": megatron, "torchtitan": torchtitan, "deepspeed": deepspeed}


def refusal(fmt: str, plan: Plan, model: ModelSpec) -> SpecError | None:
    """Why ``fmt`` cannot express ``plan`` (None when it can). Cheap: the optimizer asks it
    of every plan in the space when a framework is targeted."""
    if fmt not in _MODULES:
        raise SpecError("--format", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
    try:
        check_common(plan, fmt)
        _MODULES[fmt].check(plan, model)
    except SpecError as exc:
        return exc
    return None


def export(fmt: str, plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> dict[str, str]:
    """File name -> text for one framework (plus ``rank_table.json`` when needed)."""
    from sim.spec.plan import validate

    validate(plan, model, cluster)
    why = refusal(fmt, plan, model)
    if why is not None:
        raise why
    return _MODULES[fmt].files(plan, model, cluster) | rank_files(plan, cluster)
