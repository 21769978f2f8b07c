"""Group commit, written once: the writes waiting when a transaction starts share it.

Under load this turns hundreds of small transactions (each a commit, an fsync on SQLite, a
round trip on PostgreSQL) into a few large ones; the submits of a group also share one INSERT.
Each write still runs as if alone: a write that fails does not undo the others. Optimistic
first, without savepoints (two statements less per write); a failing write rolls the group
back and the group runs again, each write in a savepoint. A write alone in its group needs
neither: the rollback undid just that write. Rules only touch the database, so running one
again after a rollback is safe (each run builds its rule anew, with an empty change list).

:func:`commit_group` is a rule like the others (its steps are :class:`~floodway.store.steps.Tx`
and the writes' own statements); each backend drives it on one connection.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from floodway.core.states import Status
from floodway.store import rules
from floodway.store.base import JobPlanner, TaskChange
from floodway.store.steps import Rule, Tx


@dataclass
class Write:
    """One caller's write: its rule, built anew for each run with a fresh change list."""

    rule: Callable[[list[TaskChange]], Rule[Any]]
    #: tell the other processes even when the write changes no task (a cancel request, a park)
    wake: bool = False
    #: a submit whose tasks may share the group's one INSERT (``rule`` writes the same alone)
    merge: rules.Submission | None = None
    #: after ``rule``, in its transaction, the jobs whose tasks it ended take their next
    #: steps (a field, not a wrapping closure: fewer objects per pending write)
    planner: JobPlanner | None = None
    #: ahead of the other writes waiting with it, in a transaction of its own where the
    #: backend has one writer (a claim: the provider slot it fills idles until it lands)
    first: bool = False


@dataclass
class Written:
    value: Any = None
    error: Exception | None = None
    changes: list[TaskChange] = field(default_factory=list)


def commit_group(writes: Sequence[Write]) -> Rule[list[Written]]:
    """Run ``writes`` in one transaction; each one's value or error, and the changes it made."""
    done = yield from _attempt(writes, isolate=False)
    if done is None:
        done = yield from _attempt(writes, isolate=True)
        assert done is not None  # an isolated run always has them
    return done


def wakes(changes: Sequence[TaskChange]) -> bool:
    """Whether other processes' dispatchers should hear of these changes. A task that became
    running (a claim, a park) brings them no work and frees no provider slot; every other
    change may: new or requeued work, or an ended task's slot."""
    return any(c.status is not Status.RUNNING for c in changes)


def _attempt(writes: Sequence[Write], *, isolate: bool) -> Rule[list[Written] | None]:
    yield Tx.BEGIN
    done: dict[int, Written] = {}
    merging = [] if isolate else [(i, w.merge) for i, w in enumerate(writes) if w.merge]
    if merging:
        try:
            merged = yield from _submit_merged([m for _, m in merging])
        except Exception as exc:
            yield Tx.ROLLBACK
            return [Written(error=exc)] if len(writes) == 1 else None
        done.update({i: w for (i, _), w in zip(merging, merged, strict=True)})
    for i, write in enumerate(writes):
        if i in done:
            continue
        changes: list[TaskChange] = []
        if isolate:
            yield Tx.SAVEPOINT
        try:
            value = yield from write.rule(changes)
            if write.planner is not None:
                yield from rules.advance_jobs(write.planner, changes)
        except Exception as exc:
            if not isolate:
                yield Tx.ROLLBACK
                return [Written(error=exc)] if len(writes) == 1 else None
            yield Tx.ROLLBACK_TO
            yield Tx.RELEASE
            done[i] = Written(error=exc)
            continue
        if isolate:
            yield Tx.RELEASE
        done[i] = Written(value, None, changes)
    outcomes = [done[i] for i in range(len(writes))]
    notify = any(
        wakes(w.changes) or (w.error is None and write.wake)
        for w, write in zip(outcomes, writes, strict=True)
    )
    yield Tx.COMMIT_NOTIFY if notify else Tx.COMMIT
    return outcomes


def _submit_merged(submissions: list[rules.Submission]) -> Rule[list[Written]]:
    """The merged submits' outcomes, in their order: one rule, one INSERT."""
    changes: list[TaskChange] = []
    results = yield from rules.submit(submissions, changes)
    by_task = {c.task_id: c for c in changes}
    return [
        Written(submitted, None, [by_task[s.task.id] for s in submitted if s.task.id in by_task])
        for submitted in results
    ]
