"""The one place that knows which status may follow which.

Every status write in floodway goes through :func:`check_transition`, and the stores turn it
into a compare-and-set, so an illegal or stale transition raises instead of landing.
"""

from __future__ import annotations

from enum import StrEnum

from floodway.core.errors import IllegalTransition


class Status(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD = "dead"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    DEDUPED = "deduped"


S = Status

TRANSITIONS: dict[Status, frozenset[Status]] = {
    S.QUEUED: frozenset({S.RUNNING, S.CANCELLED, S.DEDUPED, S.TIMEOUT}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.RETRYING, S.FAILED, S.DEAD, S.TIMEOUT, S.CANCELLED}),
    S.RETRYING: frozenset({S.RUNNING, S.CANCELLED, S.TIMEOUT}),
    # The manual back-edge: a person (or API call) asks for another go.
    S.FAILED: frozenset({S.QUEUED}),
    S.DEAD: frozenset({S.QUEUED}),
    S.TIMEOUT: frozenset({S.QUEUED}),
    S.SUCCEEDED: frozenset(),
    S.CANCELLED: frozenset(),
    S.DEDUPED: frozenset(),
}

#: No automatic transition leaves these; only a manual retry leaves the first three.
TERMINAL: frozenset[Status] = frozenset(
    {S.SUCCEEDED, S.FAILED, S.DEAD, S.TIMEOUT, S.CANCELLED, S.DEDUPED}
)
#: States a worker may claim from.
CLAIMABLE: frozenset[Status] = frozenset({S.QUEUED, S.RETRYING})


def is_legal(frm: Status, to: Status) -> bool:
    return to in TRANSITIONS[frm]


def check_transition(frm: Status, to: Status, doing: str = "") -> None:
    """Raise :class:`IllegalTransition` unless ``frm -> to`` is in the table; ``doing`` (what a
    person asked for: "retry", "cancel") makes the message one they can act on."""
    if not is_legal(frm, to):
        if not doing:
            raise IllegalTransition(frm.value, to.value)
        origins = ", ".join(s.value for s in Status if to in TRANSITIONS[s])
        state = f"already {frm.value}" if frm in TERMINAL else f"{frm.value}"
        raise IllegalTransition(
            frm.value,
            to.value,
            f"the task is {state}: nothing to {doing} (only a task that is {origins} can be)",
        )
