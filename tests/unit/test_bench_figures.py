"""The fleet benchmark's own arithmetic: where a makespan's excess over the optimum went."""

from __future__ import annotations

import pytest

from bench.fleet import ProviderClock


def test_idle_parts_add_up_to_the_excess_over_the_optimum() -> None:
    # Cap 2: A and B start late (0.1 s, 0.3 s), C takes A's slot 0.1 s after A ends, and B's
    # slot idles from 1.3 s to the end at 2.0 s.
    clock = ProviderClock(
        started={"A": 0.1, "B": 0.3, "C": 1.2}, ended={"A": 1.1, "B": 1.3, "C": 2.0}
    )
    idle = clock.idle_s(cap=2, t0=0.0)
    assert idle == {
        "before_first_requests": pytest.approx(0.2),
        "between_requests": pytest.approx(0.05),
        "after_last_requests": pytest.approx(0.35),
    }
    optimum = clock.busy_s() / 2
    assert sum(idle.values()) == pytest.approx(2.0 - optimum)


def test_idle_parts_need_a_full_cap_of_requests() -> None:
    assert ProviderClock(started={"A": 0.1}, ended={"A": 1.0}).idle_s(cap=2, t0=0.0) == {}
