"""DualPipe itself (DeepSeek's two-direction schedule, ``schedule = "dualpipe"``): the
programs against the published bubble and activations and against DualPipeV on half the
ranks, and the schedule through the plan, both tiers, memory and the collective account."""

from __future__ import annotations

from collections import Counter

import pytest

from sim.layout.dualpipe import peak_activations, rank_calls, rank_program, stages_of_rank
from sim.layout.dualpipe_time import makespan, published_bubble, uniform

SIZES = [(pp, m) for pp in (2, 4, 8, 16) for m in (2 * pp, 2 * pp + 2, 6 * pp + 2)]


@pytest.mark.parametrize("pp,m", SIZES)
def test_every_rank_runs_each_pass_of_its_chains_once(pp, m):
    for r in range(pp):
        passes = Counter()
        for p in rank_program(pp, m, r, True):
            if p.kind in ("F", "FB"):
                passes["F", p.mb, p.stage] += 1
            if p.kind in ("B", "FB"):
                passes["B", p.mb2 if p.kind == "FB" else p.mb,
                       p.stage2 if p.kind == "FB" else p.stage] += 1
        assert sorted(passes.values()) == [1] * (4 * (m // 2))
        assert {s for _, _, s in passes} == set(stages_of_rank(pp, r, True))


def test_ranks_hold_a_chain_each_way_and_mirrors_hold_the_same_layers():
    pp = 8
    for r in range(pp):
        down, back = sorted(stages_of_rank(pp, r, True))
        assert down == r and back == pp + (pp - 1 - r)  # chain 0 stage r, chain 1 pp-1-r
        mirror = sorted(stages_of_rank(pp, pp - 1 - r, True))
        assert {s % pp for s in (down, back)} == {s % pp for s in mirror}


@pytest.mark.parametrize("pp,m", SIZES)
def test_the_programs_give_the_published_bubble_and_activations(pp, m):
    """DeepSeek's table for DualPipe on PP ranks: (PP/2 - 1)(F&B + B - 3W) and PP + 1 chunk
    activations a device; without transfers it is DualPipeV on PP/2 ranks with half the
    micro-batches, and slower with them (the turn crosses ranks)."""
    u = uniform(1.0, 2.0, 1.0)
    t, busy = makespan(pp, m, u, mirrored=True)
    assert busy == [m * 3.0] * pp
    assert t - m * 3.0 == pytest.approx(published_bubble(pp, 1.0, 2.0, 1.0, 3.0, True))
    assert [peak_activations(pp, m, r, True) for r in range(pp)] == [pp + 1] * pp
    if pp > 2:
        assert t == makespan(pp // 2, m // 2, u)[0]
        assert makespan(pp, m, u, 0.1, True)[0] > makespan(pp // 2, m // 2, u, 0.1)[0]


def test_the_middle_ranks_send_each_other_the_turn():
    pp, m = 4, 8
    sent = {msg for r in (1, 2) for item in rank_calls(pp, m, r, True)
            if isinstance(item, tuple) for msg in item[0]}
    assert ("F", 0, 2) in sent and ("F", 0, pp + 2) in sent  # chain 0 and chain 1 turns
    assert ("B", 0, 1) in sent and ("B", 0, pp + 1) in sent


@pytest.mark.parametrize("pp,m", [(3, 6), (4, 6), (4, 9)])
def test_uneven_shapes_are_refused(pp, m):
    with pytest.raises(ValueError, match="DualPipe needs an even pp"):
        rank_program(pp, m, 0, True)
