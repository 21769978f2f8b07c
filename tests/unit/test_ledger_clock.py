"""LedgerClock: a process keeps the ledger server's time, within the bound it states."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from floodway.clock import ALIGN_EVERY_S, ALIGN_READINGS, LedgerClock, ServerTime
from floodway.testing import FakeClock, settle


class HostClock:
    """A host clock that moves only when told (each reading takes its round trip)."""

    def __init__(self, at: float = 1_000.0) -> None:
        self.at = at

    def now(self) -> float:
        return self.at

    async def sleep(self, seconds: float) -> None:
        self.at += seconds


def server(host: HostClock, skew: float, legs: list[tuple[float, float]]) -> ServerTime:
    """The ledger's clock, ``skew`` ahead of the host's; reading i takes legs[i] there and
    back."""
    trips = iter(legs)

    async def read() -> float:
        out, back = next(trips)
        host.at += out
        reading = host.at + skew
        host.at += back
        return reading

    return read


LEG = st.floats(min_value=0.0, max_value=0.5)


@given(
    skew=st.floats(min_value=-3600, max_value=3600),
    legs=st.lists(st.tuples(LEG, LEG), min_size=ALIGN_READINGS, max_size=ALIGN_READINGS),
)
async def test_the_offset_is_within_its_stated_error(
    skew: float, legs: list[tuple[float, float]]
) -> None:
    host = HostClock()
    clock = LedgerClock(host)
    await clock.align(server(host, skew, legs))
    assert clock.error is not None
    assert clock.error == pytest.approx(min(out + back for out, back in legs) / 2)
    assert abs(clock.offset - skew) <= clock.error + 1e-6
    assert abs(clock.now() - (host.now() + skew)) <= clock.error + 1e-6


async def test_the_shortest_round_trip_is_kept() -> None:
    host = HostClock()
    clock = LedgerClock(host)
    # The slow readings came back late and unevenly; the fast one is taken.
    await clock.align(server(host, 10.0, [(0.3, 0.01), (0.005, 0.005), (0.01, 0.4)]))
    assert clock.offset == pytest.approx(10.0) and clock.error == pytest.approx(0.005)


async def test_a_ledger_on_this_host_leaves_the_host_clock_alone() -> None:
    host = HostClock()
    clock = LedgerClock(host)

    async def same_host() -> float | None:
        return None

    await clock.follow(same_host)
    assert clock.offset == 0.0 and clock.error is None and clock.now() == host.now()
    await clock.unfollow()


async def test_a_step_of_the_host_clock_is_caught_up_with_at_the_next_alignment() -> None:
    host = FakeClock()
    skew = [5.0]

    async def read() -> float:
        return host.now() + skew[0]

    clock = LedgerClock(host)
    await clock.follow(read)
    await settle()  # the follower is asleep until the next alignment
    try:
        assert clock.offset == 5.0
        skew[0] = -2.0  # the host's clock was stepped 7 s forward
        await host.advance(ALIGN_EVERY_S - 1)
        assert clock.offset == 5.0
        await host.advance(1)
        assert clock.offset == -2.0
    finally:
        await clock.unfollow()
