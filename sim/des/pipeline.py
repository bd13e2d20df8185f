"""The pipeline part of a step: the blocking batched point-to-point calls between stages
(:func:`sim.layout.schedule.stage_program`: Megatron-LM's, or DualPipeV's reference's),
whose transfers start once sender and receiver are both in their calls and run as flows on
the network, and the embedding group's all-reduce of the tied word embedding between the
first and last stage (none under DualPipeV, whose first rank holds both); under DualPipe
instead each rank's all-reduce of its gradients with its mirror's (the same layers).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import simpy

from sim.des.comm import Collectives
from sim.des.context import Context, Proc, Unit
from sim.layout.memory import mirror_bytes
from sim.layout.placement import group_span
from sim.layout.schedule import Exchange, Msg
from sim.layout.stages import StageLayers, mirrored, virtual_stage_rank
from sim.network.alphabeta import default_algorithm, fabric_for

__all__ = ["Pipeline"]


class Pipeline:
    """Stage-to-stage traffic of one step."""

    def __init__(self, x: Context, comm: Collectives) -> None:
        self.x, self.comm = x, comm
        self._p2p_copies: dict[tuple[int, int, int], list[list[int]]] = {}

    def exchange(self, u: Unit, msgs: Exchange) -> Proc:
        """One blocking batched point-to-point call (Megatron-LM's or DualPipeV's): each
        transfer starts once its sender and receiver are both in their calls, and the call
        returns when all of its transfers are done. Waiting for a peer to arrive is bubble,
        the transfers pipeline communication. Without sequence parallelism each TP rank
        received 1/tp of a tensor, so the TP group then all-gathers each one (Megatron-LM's
        scatter/gather), which counts as pipeline communication too."""
        x = self.x
        t0 = x.env.now
        self.comm.note(u, "pp", "send", x.tp_bytes() / x.p.tp, len(msgs.sends))
        self.comm.note(u, "pp", "recv", x.tp_bytes() / x.p.tp, len(msgs.recvs))
        meetings = [self._post(u, self._peer(u, msg[2]), msg) for msg in msgs.sends]
        meetings += [self._post(self._sender(u, msg), u, msg) for msg in msgs.recvs]
        yield simpy.AllOf(x.env, [m[1] for m in meetings])
        started = max(m[2] for m in meetings)
        x.add(u, "bubble", max(0.0, started - t0))
        x.add(u, "pp", x.env.now - max(t0, started))
        x.acct[u].comm_total["pp"] += x.env.now - max(t0, started)
        x.log(u, "pp", "p2p", t0)
        if x.p.tp > 1 and not x.p.sequence_parallel:
            for msg in msgs.recvs:
                t1 = x.env.now
                yield from x.wait(u, "pp", self.comm.collective(
                    u, "tp", "all_gather", x.tp_bytes(), ("gather",) + msg), "pp gather")
                x.acct[u].comm_total["pp"] += x.env.now - t1

    def _post(self, a: Unit, b: Unit, msg: Msg) -> list[Any]:
        """The meeting of sender ``a`` and receiver ``b`` over ``msg``."""
        return self.comm.meeting(("p2p", a, b, msg), 2,
                                 lambda: self.x.env.process(self._transfer(a, b, msg)))

    def _peer(self, u: Unit, vs: int) -> Unit:
        return self.x.unit_at(virtual_stage_rank(self.x.p, vs), u.dp, u.cp)

    def _sender(self, u: Unit, msg: Msg) -> Unit:
        """Who sends ``msg`` to ``u``: the previous virtual stage for an activation, the
        next one for a gradient."""
        return self._peer(u, msg[2] - 1 if msg[0] == "F" else msg[2] + 1)

    def _pairs(self, a: Unit, b: Unit) -> list[int]:
        """Devices (sender, receiver, sender, receiver, ...) of a stage boundary: each TP
        rank sends its 1/tp share of the activation (Megatron's scatter/gather)."""
        out = []
        for s, r in zip(self.x.tp_devices(a.rank0), self.x.tp_devices(b.rank0), strict=True):
            out += [s, r]
        return out

    def _boundary_copies(self, a: Unit, b: Unit) -> list[list[int]]:
        """The same boundary in every replica of ``a``'s symmetry class."""
        x = self.x
        key = (a.stage, b.stage, x.klass(a))
        if key not in self._p2p_copies:
            self._p2p_copies[key] = [
                self._pairs(x.unit_at(a.stage, d, c), x.unit_at(b.stage, d, c))
                for d, c in x.classes.members[x.klass(a)]]
        return self._p2p_copies[key]

    def _transfer(self, u: Unit, v: Unit, msg: Msg) -> Proc:
        x = self.x
        sent_at = x.env.now
        size = x.tp_bytes() / x.p.tp
        copies = self._boundary_copies(u, v) if x.reduce else None
        yield x.env.process(x.engine.run("p2p", "ring", self._pairs(u, v), size, copies,
                                         x.dev_class.__getitem__))
        if x.record:
            x.timeline.append({"unit": u, "device": x.dev(u.rank0), "stream": "send",
                               "name": f"send {msg[0]}{msg[1]}", "start": sent_at,
                               "end": x.env.now, "to_device": x.dev(v.rank0)})

    def embedding_allreduce(self, u: Unit, stage: StageLayers) -> Proc:
        """Megatron-LM's embedding group: with tied embeddings and pp > 1 the last stage
        holds a copy of the word embedding, and after the data-parallel reduction each
        first-stage rank all-reduces its vocab x hidden / tp gradient (training dtype) with
        the last-stage rank of the same tp/dp/cp coordinates, before the optimizer step.
        DualPipe: every rank all-reduces its gradients (ZeRO-1: its shard) with the rank of
        the same coordinates at stage ``pp - 1 - r``, which holds the same layers."""
        x, p = self.x, self.x.p
        if mirrored(p):
            size, group = mirror_bytes(x.m, p, stage), "mirror"
        elif x.m.tied_embeddings and p.pp > 1 and u.stage in (0, p.pp - 1) and \
                p.schedule != "dualpipev":  # (dualpipev: both ends on the first rank)
            size, group = x.m.vocab_size * x.m.hidden_size / p.tp * x.act, "embedding"
        else:
            return
        span = group_span(p, x.c, "emb")  # the first and last stage: the worst mirrors
        algorithm = default_algorithm("all_reduce", fabric_for(x.c, span), size)
        meetings, (a, b) = [], sorted((u.stage, p.pp - 1 - u.stage))
        for t in range(p.tp):
            pair = self._pair(a, b, u.dp, u.cp, t)
            copies = [self._pair(a, b, d, c, t)
                      for d, c in x.classes.members[x.klass(u)]] if x.reduce else None
            meetings.append(self.comm.meeting(
                ("emb", tuple(pair)), 2, partial(self._all_reduce, algorithm, pair, size,
                                                 copies)))
        self.comm.note(u, group, "all_reduce", size)
        t0 = x.env.now
        yield simpy.AllOf(x.env, [m[1] for m in meetings])
        started = max(m[2] for m in meetings)
        x.add(u, "bubble", started - t0)
        x.add(u, "pp", x.env.now - started)
        x.acct[u].comm_total["pp"] += x.env.now - started
        x.log(u, "pp", "embedding all-reduce", started)

    def _all_reduce(self, algorithm: str, devices: list[int], size: float,
                    copies: list[list[int]] | None) -> simpy.Process:
        x = self.x
        return x.env.process(x.engine.run("all_reduce", algorithm, devices, size, copies,
                                          x.dev_class.__getitem__))

    def _pair(self, a: int, b: int, dp: int, cp: int, t: int) -> list[int]:
        """Devices of the ``t``-th TP rank of stages ``a`` and ``b``."""
        x = self.x
        offset = t * x.strides["tp"]
        return [x.dev(x.rank0(s, dp, cp) + offset) for s in (a, b)]
