"""The one-shared-link engine against the general flow network on stars, and its rules."""

from __future__ import annotations

import math
import random

import pytest
import simpy

from sim.network.flows import Network
from sim.network.shared_link import SharedLink, share_transfers


def _reference(capacity: float, starts: list[float], sizes: list[float],
               caps: list[float]) -> list[float]:
    """Finish times from the progressive-filling flow network: link 0 the shared one,
    link 1 + i transfer i's own access link."""
    env = simpy.Environment()
    net = Network(env, [capacity] + caps, [0.0] * (1 + len(caps)))
    done = [math.nan] * len(starts)

    def one(i: int):  # noqa: ANN202
        yield env.timeout(starts[i])
        yield net.transfer([0, 1 + i], sizes[i], latency_s=0.0)
        done[i] = env.now

    for i in range(len(starts)):
        env.process(one(i))
    env.run()
    return done


@pytest.mark.parametrize("seed", range(12))
def test_matches_the_flow_network_on_a_star(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 40)
    starts = [rng.choice([0.0, rng.uniform(0, 5)]) for _ in range(n)]
    sizes = [rng.uniform(1e5, 5e7) for _ in range(n)]
    caps = [rng.choice([rng.uniform(1e5, 2e7), 5e8]) for _ in range(n)]
    capacity = rng.uniform(1e6, 1e8)
    got = share_transfers(capacity, starts, sizes, caps)
    want = _reference(capacity, starts, sizes, caps)
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, rel=1e-7, abs=1e-9)


def test_uncontended_transfers_run_at_their_caps() -> None:
    starts, sizes, caps = [0.0, 1.0, 2.5], [10.0, 30.0, 5.0], [2.0, 3.0, 1.0]
    assert share_transfers(100.0, starts, sizes, caps) == [5.0, 11.0, 7.5]


def test_equal_transfers_split_the_link_evenly() -> None:
    # four 100-byte transfers on a 40 B/s link: 10 B/s each, all end at 10 s
    assert share_transfers(40.0, [0.0] * 4, [100.0] * 4, [math.inf] * 4) == [10.0] * 4


def test_a_slow_cap_leaves_its_share_to_the_others() -> None:
    # caps 5 and inf on 25 B/s: the capped one gets 5, the other 20
    link = SharedLink(25.0)
    link.add(0, 50.0, 5.0)
    link.add(1, 100.0)
    assert (link.rate(0), link.rate(1)) == (5.0, 20.0)
    assert link.pop_done() == [1]
    assert link.now == pytest.approx(5.0)
    assert link.pop_done() == [0]
    assert link.now == pytest.approx(10.0)


def test_a_cancelled_transfer_frees_its_share() -> None:
    link = SharedLink(10.0)
    link.add(0, 100.0)
    link.add(1, 100.0)
    link.advance(4.0)  # 20 bytes each
    assert link.remove(1) == pytest.approx(80.0)
    assert link.next_finish == pytest.approx(12.0)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        SharedLink(0.0)
    link = SharedLink(1.0)
    link.add(0, 1.0)
    with pytest.raises(ValueError, match="already"):
        link.add(0, 1.0)
    with pytest.raises(ValueError, match="forward"):
        link.advance(-1.0)
