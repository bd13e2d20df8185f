"""The data-parallel part of a step: gradients reduced in buckets on a separate stream while
backward goes on (Megatron-LM's DDP buckets), ZeRO-3's per-layer weight gathers and gradient
reduce-scatters, the tail of the reduction after the last backward, and ZeRO-1/2's gather
of the updated weights after the optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import simpy

from sim.des.comm import Collectives
from sim.des.context import Context, Proc, Unit
from sim.layout.dualpipe import chain_microbatches
from sim.layout.inventory import chunk_bucket_params
from sim.layout.memory import layer_rank_params, rank_params
from sim.layout.stages import StageLayers, mirrored

__all__ = ["DataParallel"]


def _count(x: Context, u: Unit, t0: float, _event: simpy.Event) -> None:
    """A ZeRO-3 gather's seconds into the unit's data-parallel total, hidden or not, as a
    reduction's are."""
    x.acct[u].comm_total["dp"] += x.env.now - t0


class DataParallel:
    """Each unit's data-parallel stream and its pending gradient bucket."""

    def __init__(self, x: Context, comm: Collectives) -> None:
        self.x, self.comm = x, comm
        self._stream = {u: simpy.Resource(x.env, 1) for u in x.units}
        self._jobs: dict[Unit, list[simpy.Process]] = {u: [] for u in x.units}
        self._pending: dict[Unit, list[float]] = {}
        self._seq: dict[Unit, int] = {}
        self.bucket_params = chunk_bucket_params(x.p)

    def reduces_after(self, u: Unit, mb: int) -> bool:
        """Whether gradients are reduced during this micro-batch's backward (its chain's
        last: under DualPipe each chunk runs half the replica's micro-batches)."""
        p = self.x.p
        if p.zero_stage == 2:
            return True
        last = chain_microbatches(p.replica_microbatches[u.dp], mirrored(p)) - 1
        return p.overlap_grad_reduce and mb == last

    def grad_ready(self, u: Unit, dense: float, expert: float, tag: tuple) -> None:
        """Gradients of ``dense`` + ``expert`` parameters are ready; a full bucket starts."""
        pending = self._pending.setdefault(u, [0.0, 0.0])
        pending[0] += dense
        pending[1] += expert
        if pending[0] + pending[1] >= self.bucket_params:
            self.flush(u, tag)

    def flush(self, u: Unit, tag: tuple) -> None:
        """Start reducing the pending bucket."""
        dense, expert = self._pending.get(u, [0.0, 0.0])
        self._pending[u] = [0.0, 0.0]
        if dense + expert <= 0:
            return
        coll = "all_reduce" if self.x.p.zero_stage == 0 else "reduce_scatter"
        seq = self._seq[u] = self._seq.get(u, 0) + 1
        job = self.x.env.process(self._job(u, coll, dense, expert, tag + (seq,)))
        self._jobs[u].append(job)

    def _job(self, u: Unit, coll: str, dense: float, expert: float, tag: tuple) -> Proc:
        x, comm = self.x, self.comm
        with self._stream[u].request() as turn:
            yield turn
            t0 = yield from x.on_core(u, lambda: simpy.AllOf(x.env, [
                comm.collective(u, "dp", coll, dense * x.p.grad_bytes, tag + ("dense",)),
                comm.collective(u, "edp", coll, expert * x.p.grad_bytes, tag + ("expert",))]))
            x.acct[u].comm_total["dp"] += x.env.now - t0
            x.log(u, "dp", f"dp {coll}", t0)

    def z3_gather(self, u: Unit, layers: list[bool], i: int, tag: tuple
                  ) -> simpy.Event | None:
        """ZeRO-3: event of layer ``i``'s weight gather (``None``: nothing to gather)."""
        x, comm = self.x, self.comm
        if x.p.zero_stage != 3 or not 0 <= i < len(layers):
            return None
        dense, expert = layer_rank_params(x.m, x.p, layers[i])

        def start() -> simpy.Event:
            done = simpy.AllOf(x.env, [
                comm.collective(u, "dp", "all_gather", dense * x.act, tag + (i, "gd")),
                comm.collective(u, "edp", "all_gather", expert * x.act, tag + (i, "ge"))])
            done.callbacks.append(partial(_count, x, u, x.env.now))
            return done
        if x.core is None:
            return start()
        return x.env.process(self._in_stream(u, start))

    def _in_stream(self, u: Unit, start: Callable[[], simpy.Event]) -> Proc:
        """Without overlap the gathers queue with the reductions on the one data-parallel
        stream (gloo runs a process group's collectives in issue order), so a unit never
        holds its core for one while a peer holds its own for the other."""
        with self._stream[u].request() as turn:
            yield turn
            yield from self.x.on_core(u, start)

    def z3_reduce(self, u: Unit, moe: bool, tag: tuple) -> None:
        """ZeRO-3: reduce-scatter one layer's gradient in the background."""
        x = self.x
        dense, expert = layer_rank_params(x.m, x.p, moe)
        job = x.env.process(self._job(u, "reduce_scatter", dense, expert, tag))
        self._jobs[u].append(job)

    def settle(self, u: Unit) -> Proc:
        """The end of a backward under ZeRO-2/3: compute waits for the reduce-scatters it
        issued (DeepSpeed synchronises after each backward's reduction epilogue; FSDP2's
        post-backward callback makes the compute stream wait for the last reduce-scatter),
        so they do not run on into the next micro-batch."""
        pending = self._jobs[u] = [job for job in self._jobs[u] if not job.triggered]
        if pending:
            yield from self.x.wait(u, "dp", simpy.AllOf(self.x.env, pending), "dp settle")

    def tail(self, u: Unit, stage: StageLayers) -> Proc:
        """The reduction left after the last backward: all of it without overlap, then the
        wait for every background job."""
        x, p = self.x, self.x.p
        if not p.overlap_grad_reduce and p.zero_stage < 2:
            dense, expert = rank_params(x.m, p, stage)
            self._pending[u] = [dense, expert]
            self.flush(u, ("tail",))
        if self._jobs[u]:
            yield from x.wait(u, "dp", simpy.AllOf(x.env, self._jobs[u]), "dp wait")

    def zero_gather(self, u: Unit, stage: StageLayers) -> Proc:
        """ZeRO-1/2: gather the updated weights after the optimizer step."""
        x, comm = self.x, self.comm
        if x.p.zero_stage not in (1, 2):
            return
        dense, expert = rank_params(x.m, x.p, stage)
        t0 = x.env.now
        yield from x.wait(u, "dp", simpy.AllOf(x.env, [
            comm.collective(u, "dp", "all_gather", dense * x.act, ("zero-ag", "d")),
            comm.collective(u, "edp", "all_gather", expert * x.act, ("zero-ag", "e"))]),
            "zero gather")
        x.acct[u].comm_total["dp"] += x.env.now - t0
