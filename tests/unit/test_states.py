"""The states table: every legal edge is accepted, every other one raises."""

from __future__ import annotations

import itertools

import pytest

from floodway.core.errors import IllegalTransition
from floodway.core.states import TERMINAL, TRANSITIONS, Status, check_transition, is_legal

LEGAL = {
    ("queued", "running"),
    ("queued", "cancelled"),
    ("queued", "deduped"),
    ("queued", "timeout"),
    ("running", "succeeded"),
    ("running", "retrying"),
    ("running", "failed"),
    ("running", "dead"),
    ("running", "timeout"),
    ("running", "cancelled"),
    ("retrying", "running"),
    ("retrying", "cancelled"),
    ("retrying", "timeout"),
    ("failed", "queued"),
    ("dead", "queued"),
    ("timeout", "queued"),
}


def test_table_is_exactly_the_design() -> None:
    table = {(a.value, b.value) for a, tos in TRANSITIONS.items() for b in tos}
    assert table == LEGAL


@pytest.mark.parametrize(("frm", "to"), sorted(LEGAL))
def test_every_legal_edge_passes(frm: str, to: str) -> None:
    check_transition(Status(frm), Status(to))


ILLEGAL = sorted(
    (a.value, b.value)
    for a, b in itertools.product(Status, Status)
    if (a.value, b.value) not in LEGAL
)


@pytest.mark.parametrize(("frm", "to"), ILLEGAL)
def test_every_illegal_edge_raises(frm: str, to: str) -> None:
    with pytest.raises(IllegalTransition, match=f"{frm} -> {to}"):
        check_transition(Status(frm), Status(to))


def test_only_back_edge_is_manual_retry_to_queued() -> None:
    into_queued = {a for a in Status if is_legal(a, Status.QUEUED)}
    assert into_queued == {Status.FAILED, Status.DEAD, Status.TIMEOUT}
    # automatic retries never pass through queued: running goes to retrying, not queued
    assert not is_legal(Status.RUNNING, Status.QUEUED)


def test_terminal_states_leave_only_by_hand() -> None:
    for state in TERMINAL:
        assert TRANSITIONS[state] <= {Status.QUEUED}


def test_a_refused_retry_or_cancel_says_what_it_takes() -> None:
    with pytest.raises(
        IllegalTransition,
        match=r"the task is already succeeded: nothing to retry "
        r"\(only a task that is failed, dead, timeout can be\)",
    ):
        check_transition(Status.SUCCEEDED, Status.QUEUED, "retry")
    with pytest.raises(
        IllegalTransition,
        match=r"the task is already deduped: nothing to cancel "
        r"\(only a task that is queued, running, retrying can be\)",
    ):
        check_transition(Status.DEDUPED, Status.CANCELLED, "cancel")
