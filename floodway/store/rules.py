"""The ledger's rules, written once for every backend.

Each rule is a generator of :mod:`steps <floodway.store.steps>`: it decides, the backend runs
the named statements (SQLite in its writer thread, PostgreSQL on a pooled connection) inside
the transaction of a commit group (:mod:`floodway.store.group`). Concurrency differs (SQLite
has one writer, PostgreSQL many), so every read a decision rests on either locks what it reads
(``lock_*`` statements: ``FOR UPDATE`` on PostgreSQL, plain reads on SQLite) or is an
``INSERT ... ON CONFLICT`` that waits for a concurrent inserter. Writers that end a task lock
its row, then its fingerprint's, then its waiters'; a submitter locks only the fingerprint's
(its own new row is invisible to others); so the usual paths queue instead of deadlocking.

The rules, in the order a task meets them:

- **submit**: the request key (the same key returns the same task; another body is a
  conflict), the interactive depth, the insert, then the **work rule**: own the work's
  fingerprint, or take the result of the same work that succeeded (``deduped``), or wait for the
  same work in flight, lending it this task's urgency (its lane) so that waiting is never
  slower than running alone.
- **complete**: a compare-and-set of the status; when the task ends, its work passes on: a
  success resolves every waiter with the result, any other end promotes the first waiter to run
  the work. Unless the task's call may still be running at the provider (the attempt stays
  open): then the work waits for the call, and its last write closes the attempt.
- **cancel**, **manual retry**: the same compare-and-sets, and a retry follows the work rule of
  a submit (a retried task never pays for work the ledger holds as done).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from floodway.core.changes import ended_for_waiters
from floodway.core.errors import (
    AdmissionRefused,
    AttemptStillOpen,
    BudgetExceeded,
    FloodwayError,
    IdempotencyConflict,
    IllegalTransition,
    InvalidJob,
    JobNotFound,
    TaskNotFound,
)
from floodway.core.jobs import (
    STEP_PREFIX,
    End,
    Instance,
    Job,
    JobState,
    JobStatus,
    Start,
    next_moves,
    planning_failed,
)
from floodway.core.outcome import Applied, Completion, Succeeded
from floodway.core.spend import Budget, Charge, possibly_billed
from floodway.core.states import CLAIMABLE, TERMINAL, Status, check_transition
from floodway.core.task import ErrorClass, ErrorInfo, Lane, NewTask, Submitted, Task, new_id
from floodway.core.tiers import BATCH_ENDED, BY_PRICE, ENDED_LINES
from floodway.store.base import (
    BatchKey,
    ClaimParams,
    HeartbeatResult,
    JobPlanner,
    Purged,
    Retention,
    TaskChange,
    WorkerInfo,
)
from floodway.store.rows import (
    claim_args,
    completion_params,
    dumps,
    insert_params,
    job_from_row,
    job_params,
    job_state_from,
    task_from_row,
)
from floodway.store.steps import Ask, Row, Rule, all_rows, ask, count, each, one

for _state in CLAIMABLE:  # a claim moves these to running: keep them in the table
    check_transition(_state, Status.RUNNING)


@dataclass(frozen=True)
class Submission:
    """One submit: its tasks, when, and the request key of the whole batch (if any)."""

    tasks: Sequence[NewTask]
    now: float
    batch_key: BatchKey | None = None


class _Key(Enum):
    RESERVED = "reserved"  # the key was free: it now names the new task
    EXPIRED = "expired"  # the key had expired: ours (locked) to point at the new task


# -- reading within a rule ------------------------------------------------------------------


def load(task_id: str, *, lock: bool = False) -> Rule[Task]:
    row = yield from one("lock_task" if lock else "get_task", id=task_id)
    if row is None:
        raise TaskNotFound(task_id)
    return task_from_row(row)


def event(task_id: str, status: Status, now: float, attempt: int, detail: str = "") -> Rule[None]:
    yield from count("insert_event", **event_row(task_id, status, now, attempt, detail))


def event_row(
    task_id: str, status: Status, now: float, attempt: int, detail: str = ""
) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "status": status.value,
        "at": now,
        "attempt": attempt,
        "detail": detail,
    }


def events(rows: list[dict[str, Any]]) -> Rule[None]:
    """Many events (:func:`event_row`) in one step."""
    if rows:
        yield from each("insert_event", rows)


def deduped_detail(source: str | None) -> str:
    """The event of a task that took the result of ``source``'s work; None: another
    tenant's, whose task id stays private."""
    return f"result of {source or 'shared work'}"


# -- submit ---------------------------------------------------------------------------------


def submit(
    submissions: Sequence[Submission], changes: list[TaskChange]
) -> Rule[list[list[Submitted]]]:
    """Several submits as one: their tasks share one statement (request keys reserved,
    tasks inserted, queued events logged, free fingerprints owned), their interactive
    depths counted once per tenant; a task whose request key is taken already (a replay, a
    conflict, an expired key) or whose work is owned already goes on alone."""
    for s in submissions:
        if s.batch_key is not None and s.tasks:
            yield from _batch_key(s.tasks[0], s.batch_key, s.now)
    news = [(n, s.now) for s in submissions for n in s.tasks]
    placed = yield from _within_depths([n for n, _ in news])
    fast = [(n, now, new_id(now)) for n, (_, now) in zip(placed, news, strict=True)]
    inserted: dict[str, Row] = {}
    if fast:
        given = [_insert_row(task_id, n, now) for n, now, task_id in fast]
        for got in (yield from insert_tasks(given)):
            inserted[got["id"]] = got
    ids = iter(fast)
    results: list[list[Submitted]] = []
    for s in submissions:
        done: list[Submitted] = []
        for n in s.tasks:
            row = inserted.get(next(ids)[2])
            if row is None:  # its key was taken: it goes alone
                done.append((yield from submit_one(n, s.now, changes)))
                continue
            task = task_from_row(row)
            if n.fingerprint is not None and not row["owns_work"]:
                task = yield from claim_work(
                    task, n.fingerprint, s.now, changes, replay=n.replay, batch_by=n.batch_by
                )
            changes.append(TaskChange(task.id, task.status, task.tenant))
            done.append(Submitted(task))
        results.append(done)
    yield from _check_budgets(submissions, results)
    return results


def _insert_row(task_id: str, new: NewTask, now: float) -> dict[str, Any]:
    params = insert_params(task_id, new, now)
    if new.request_key is not None:
        params.update(request_hash=new.request_hash, key_expires_at=now + new.key_ttl_s)
    return params


def submit_one(
    new: NewTask, now: float, changes: list[TaskChange], prefix: str = "t"
) -> Rule[Submitted]:
    task_id = new_id(now, prefix=prefix)
    expired = False
    if new.request_key is not None:
        found = yield from _reserve_key(
            new.tenant, new.request_key, new.request_hash, task_id, now + new.key_ttl_s, now
        )
        if isinstance(found, str):  # a replay: the task the key names
            return Submitted((yield from load(found)), reused=True)
        expired = found is _Key.EXPIRED
    (new,) = yield from _within_depths([new])
    row = yield from one("insert_task", **insert_params(task_id, new, now))
    assert row is not None  # INSERT ... RETURNING always returns the row
    yield from event(task_id, Status.QUEUED, now, 0)
    task = task_from_row(row)
    if new.fingerprint is not None:
        task = yield from claim_work(
            task, new.fingerprint, now, changes, replay=new.replay, batch_by=new.batch_by
        )
    if expired:  # we hold the expired key's row: point it at the new task
        yield from count(
            "put_request_key",
            tenant=new.tenant,
            key=new.request_key,
            task_id=task.id,
            request_hash=new.request_hash,
            expires_at=now + new.key_ttl_s,
        )
    changes.append(TaskChange(task.id, task.status, task.tenant))
    return Submitted(task)


def _reserve_key(
    tenant: str, key: str, request_hash: str, task_id: str, expires_at: float, now: float
) -> Rule[str | _Key]:
    """Reserve the request key for ``task_id``, or find it expired (locked, ours to reuse),
    or find it live: the id it names, or IdempotencyConflict for another body."""
    while True:
        reserved = yield from count(
            "reserve_request_key",
            tenant=tenant,
            key=key,
            task_id=task_id,
            request_hash=request_hash,
            expires_at=expires_at,
        )
        if reserved:
            return _Key.RESERVED
        hit = yield from one("lock_request_key", tenant=tenant, key=key)
        if hit is not None:
            break
        # Purged between the two statements: try to reserve it again.
    if hit["expires_at"] < now:
        return _Key.EXPIRED
    if hit["request_hash"] != request_hash:
        raise IdempotencyConflict(key, hit["task_id"])
    task: str = hit["task_id"]
    return task


def _batch_key(first: NewTask, batch: BatchKey, now: float) -> Rule[None]:
    """A batch's own key: a replay of the same batch goes on (each task finds its own key);
    the same key with another list of tasks is a conflict (reported with the batch's id)."""
    batch_id = first.batch_id or new_id(now, prefix="b")
    found = yield from _reserve_key(
        first.tenant, batch.key, batch.request_hash, batch_id, now + batch.ttl_s, now
    )
    if found is _Key.EXPIRED:
        yield from count(
            "put_request_key",
            tenant=first.tenant,
            key=batch.key,
            task_id=batch_id,
            request_hash=batch.request_hash,
            expires_at=now + batch.ttl_s,
        )


def _checks_depth(new: NewTask) -> bool:
    return new.lane is Lane.INTERACTIVE and new.interactive_depth > 0


def _within_depths(news: Sequence[NewTask]) -> Rule[list[NewTask]]:
    """Each task as it may go in: an interactive one as it is while its tenant has room in
    the lane (the tasks before it here counted in), else in the background lane when it
    ``overflows`` (decided here, in the transaction that inserts it: a refusal rolls back
    the whole commit group), else refused. Each tenant's depth is counted once, under its
    lock (taken in tenant order), so concurrent submitters cannot both see room for one
    more; the lock ends with the transaction."""
    depths: dict[str, int] = {}
    for tenant in sorted({n.tenant for n in news if _checks_depth(n)}):
        yield from one("lock_tenant_depth", tenant=tenant)
        row = yield from one("count_interactive", tenant=tenant)
        depths[tenant] = int(row["depth"]) if row else 0
    placed = []
    for new in news:
        if _checks_depth(new):
            new = _placed(new, depths[new.tenant])
            depths[new.tenant] += new.lane is Lane.INTERACTIVE
        placed.append(new)
    return placed


def _placed(new: NewTask, depth: int) -> NewTask:
    if depth < new.interactive_depth:
        return new
    if new.overflow:
        return dataclasses.replace(new, lane=Lane.BACKGROUND)
    raise AdmissionRefused(
        "interactive_depth",
        f"too fast: tenant {new.tenant!r} already has {depth} interactive tasks in "
        f"flight (limit {new.interactive_depth}); wait for one to finish",
        retry_after=1.0,
    )


def _check_budgets(
    submissions: Sequence[Submission], results: Sequence[Sequence[Submitted]]
) -> Rule[None]:
    """Refuse the submits (their transaction rolls back) when their new tasks' holds would
    pass what a tenant has left this period: once per tenant, for every submit of the group
    (the group then runs again, each submit alone, so only the one that does not fit is
    refused). Checked after the inserts, under a per-tenant lock taken in tenant order: the
    holds read are every committed submit's and these, and the tenant's next submitter waits
    for this transaction."""
    asked: dict[str, tuple[Budget, float, float]] = {}  # tenant -> (budget, now, needed)
    for submission, done in zip(submissions, results, strict=True):
        first = submission.tasks[0] if submission.tasks else None
        if first is None or first.budget is None:
            continue
        needed = sum(s.task.spend_hold for s in done if not s.reused and not s.task.terminal)
        if needed > 0:
            _, now, before = asked.get(first.tenant, (first.budget, 0.0, 0.0))
            asked[first.tenant] = (first.budget, max(now, submission.now), before + needed)
    for tenant in sorted(asked):
        yield from _check_budget(tenant, *asked[tenant])


def _check_budget(tenant: str, budget: Budget, now: float, needed: float) -> Rule[None]:
    """Raise BudgetExceeded if ``tenant`` now uses more than ``budget``, ``needed`` of it
    held by the tasks this transaction wrote."""
    yield from one("lock_tenant_budget", tenant=tenant)
    row = yield from one("budget_used", tenant=tenant, since=budget.period_start(now))
    used = float(row["spent"]) + float(row["held"]) if row else 0.0
    if used > budget.amount:  # what these tasks hold is in ``held``
        left = max(0.0, budget.amount - (used - needed))
        raise BudgetExceeded(tenant, budget.amount, left, needed, budget.resets_at(now), now)


# -- spend ------------------------------------------------------------------------------------


def record_spend(charges: Sequence[tuple[str, Charge | None]], now: float) -> Rule[None]:
    """(task, what its call billed): in the ledger, in the transaction of the write that
    reports the call's end."""
    rows = [
        {
            "task_id": task_id,
            "cost": charge.cost,
            "input_tokens": charge.usage.input_tokens,
            "output_tokens": charge.usage.output_tokens,
            "images": charge.usage.images,
            "tier": charge.tier,
            "tier_saved": charge.tier_saved,
            "possibly": charge.possibly,
        }
        for task_id, charge in charges
        if charge is not None
    ]
    if rows:
        yield from count("insert_spend", rows=rows, at=now)
        yield from count("note_over_estimate", rows=rows)


def record_saved(pairs: Sequence[tuple[str, str]], now: float) -> Rule[None]:
    """(deduped task, the task whose work it took): what each saved."""
    if pairs:
        rows = [{"task_id": task_id, "source": source} for task_id, source in pairs]
        yield from count("insert_saved", rows=rows, at=now)


def record_effects(landed: Sequence[Completion], now: float) -> Rule[None]:
    """The effects of the completions that landed, in the outbox, in their transaction."""
    rows = [{"task_id": i.task_id, "effect": effect} for i in landed for effect in i.effects]
    if rows:
        yield from count("insert_effects", rows=rows, now=now)


# -- the work rule --------------------------------------------------------------------------


def claim_work(
    task: Task,
    fp: str,
    now: float,
    changes: list[TaskChange],
    *,
    before: Task | None = None,
    replay: bool = True,
    batch_by: float | None = None,
) -> Rule[Task]:
    """A queued task and its work: own the fingerprint, or take the result of the same work
    that succeeded, or wait for the same work in flight and lend it this task's lane (and,
    when it cannot wait for a provider batch, take the work off the batch tier:
    :func:`_take_off_batch`).

    ``before``: a retried task as it was before its retry (its row no longer holds the result
    of its last call, which may be the work's success: a late one, kept after it ended).
    ``replay`` False: a request that asks for a new sample (OpenAI's ``temperature > 0``)
    takes no finished result; it runs the work anew (and joins the work in flight).
    ``batch_by``: of a kind with the batch tier, the deadline before which a task cannot
    wait for a provider batch (:meth:`~floodway.kinds.TierPlan.batch_by`)."""
    while True:
        if (yield from count("claim_fingerprint", fingerprint=fp, task_id=task.id, now=now)):
            return task
        # Locked: an owner that is completing right now finishes first, and one that ends
        # after us finds our task among its waiters.
        owner = yield from one("lock_fingerprint", fingerprint=fp)
        if owner is not None:
            break
        # The owner ended without heirs and dropped the row meanwhile: claim it again.
    own = owner["task_id"] == task.id
    same_tenant = owner["tenant"] == task.tenant and not own
    if owner["state"] == "succeeded" and not replay and not own:
        yield from count("fingerprint_resample", fingerprint=fp, task_id=task.id, now=now)
        return task
    if owner["state"] == "succeeded":
        if own and before is not None:
            source = before
        else:
            source = yield from load(owner["task_id"])
        check_transition(Status.QUEUED, Status.DEDUPED)
        yield from count(
            "mark_deduped",
            id=task.id,
            duplicate_of=source.id if same_tenant else None,
            result=dumps(source.result),
            upstream_request_id=source.upstream_request_id,
            now=now,
        )
        detail = (
            "result of its own last call"
            if own
            else deduped_detail(source.id if same_tenant else None)
        )
        yield from event(task.id, Status.DEDUPED, now, 0, detail)
        yield from record_saved([(task.id, source.id)], now)
    elif own:  # the work is this task's already: it runs it
        return task
    else:
        primary = owner["task_id"]
        yield from count(
            "wait_for", id=task.id, waits_for=primary, duplicate_of=primary if same_tenant else None
        )
        if batch_by is not None:
            yield from _take_off_batch(primary, batch_by, now, changes)
        yield from count("lend_urgency", id=primary, lane_rank=task.lane.rank)
    return (yield from load(task.id))


#: the tiers that answer sooner than a provider batch: a task pinned to one cannot wait for it
FASTER = list(BY_PRICE[BY_PRICE.index("batch") + 1 :])


def work_needed_sooner(task_id: str, batch_by: float) -> Rule[bool]:
    """Whether a task waits for ``task_id``'s work that would not go on the batch tier
    itself (``batch_by``: :meth:`~floodway.kinds.TierPlan.batch_by`). The caller holds the
    work's fingerprint, so no task joins it meanwhile."""
    needs = yield from one("waiter_needs_sooner", id=task_id, batch_by=batch_by, faster=FASTER)
    return needs is not None


def _take_off_batch(
    primary: str, batch_by: float, now: float, changes: list[TaskChange]
) -> Rule[None]:
    """A task that cannot wait for a provider batch joined work whose line waits to be packed
    (not sent: nothing was asked of the provider): the line is taken out and the work goes
    back to the queue at once, on the sync tier, for every task that waits for it. A line
    in a sent batch stays (its answer is the work's: never a second call)."""
    line = yield from one("lock_line", task_id=primary)
    if line is None or line["state"] != "queued":
        return
    if not (yield from work_needed_sooner(primary, batch_by)):
        return
    check_transition(Status.RUNNING, Status.RETRYING)
    moved = yield from one("take_off_batch", id=primary, now=now, sync="sync")
    if moved is None:  # it ended meanwhile (a deadline, a cancel): its line is its own
        return
    yield from count(
        "withdraw_queued", ids=[primary], withdrawn="withdrawn", queued="queued", now=now
    )
    detail = "taken out of its provider batch: a task waiting for the same work needs it now"
    yield from event(primary, Status.RETRYING, now, moved["attempts"], detail)
    changes.append(TaskChange(primary, Status.RETRYING, moved["tenant"]))


def release_work(
    task_id: str, fp: str | None, to: Status, result: Any, now: float, changes: list[TaskChange]
) -> Rule[tuple[str, ...]]:
    """A task that owned a fingerprint ended its work: a success resolves its waiters with the
    result, any other end hands the work to the first waiter. Returns the waiters released."""
    if fp is None or to not in TERMINAL:
        return ()
    if to is Status.SUCCEEDED:
        return (yield from _work_succeeded(task_id, fp, result, now, changes))
    return (yield from _hand_over(task_id, fp, now, changes))


def _work_succeeded(
    task_id: str, fp: str, result: Any, now: float, changes: list[TaskChange]
) -> Rule[tuple[str, ...]]:
    # This UPDATE takes the fingerprint's lock before the waiters are read.
    if not (yield from count("fingerprint_succeeded", fingerprint=fp, task_id=task_id, now=now)):
        return ()
    rows = yield from resolve_waiters_of([(task_id, result)], now)
    for r in rows:
        changes.append(TaskChange(r["id"], Status.DEDUPED, r["tenant"]))
    yield from record_saved([(r["id"], task_id) for r in rows], now)
    return tuple(r["id"] for r in rows)


def _hand_over(
    task_id: str, fp: str, now: float, changes: list[TaskChange]
) -> Rule[tuple[str, ...]]:
    owner = yield from one("lock_fingerprint", fingerprint=fp)
    if owner is None or owner["task_id"] != task_id:
        return ()
    heir = yield from one("first_waiter", waits_for=task_id)
    if heir is None:
        yield from count("fingerprint_drop", fingerprint=fp, task_id=task_id)
        return ()
    heir_id = heir["id"]
    yield from count(
        "fingerprint_handover", fingerprint=fp, task_id=task_id, new_task_id=heir_id, now=now
    )
    yield from count("promote_waiter", id=heir_id, now=now)
    yield from count("repoint_waiters", waits_for=task_id, new_task_id=heir_id)
    # The heir carries the work now: it runs as urgently as the most urgent task waiting.
    yield from count("inherit_urgency", id=heir_id)
    changes.append(TaskChange(heir_id, Status.QUEUED, heir["tenant"]))
    return (heir_id,)


# -- status writes --------------------------------------------------------------------------


def complete(
    items: Sequence[Completion], now: float, changes: list[TaskChange]
) -> Rule[list[Applied]]:
    """Each item's compare-and-set, in a few statements instead of a few per item when no
    item's write can change what another's sees (distinct tasks, none of them queued:
    releasing a fingerprint touches queued waiters only); otherwise item by item."""
    ids = [i.task_id for i in items]
    if (
        len(items) < 2
        or len(set(ids)) < len(ids)
        or any(i.expected is Status.QUEUED for i in items)
    ):
        one_by_one = []
        for item in items:
            one_by_one.append((yield from complete_one(item, now, changes)))
        return one_by_one
    given = [{**completion_params(i, now), "detail": _detail(i)} for i in items]
    moved = {r["id"]: r for r in (yield from complete_many(given, now))}
    # Before the work is released: a deduped waiter's saving is the cost written here.
    yield from record_spend([(i.task_id, i.charge) for i in items if i.task_id in moved], now)
    yield from record_effects([i for i in items if i.task_id in moved], now)
    missed = [i for i in items if i.task_id not in moved]
    found: dict[str, Row] = {}
    if missed:
        rows = yield from all_rows("attempts_of_ids", ids=[i.task_id for i in missed])
        found = {r["id"]: r for r in rows}
    released = yield from _release_succeeded(items, moved, now, changes)
    applied: list[Applied] = []
    for item in items:
        row = moved.get(item.task_id)
        if row is None:
            applied.append((yield from _not_moved(item, found.get(item.task_id), now, changes)))
            continue
        changes.append(TaskChange(item.task_id, item.to, row["tenant"]))
        if item.task_id in released:
            freed = released[item.task_id]
        elif item.closes_attempt:
            freed = yield from release_work(
                item.task_id, row["fingerprint"], item.to, item.result, now, changes
            )
        else:
            freed = ()
        applied.append(Applied(item.task_id, True, item.to, freed))
    return applied


def complete_one(item: Completion, now: float, changes: list[TaskChange]) -> Rule[Applied]:
    row = yield from one("complete", **completion_params(item, now))
    if row is None:
        current = yield from one("attempt_of", id=item.task_id)
        return (yield from _not_moved(item, current, now, changes))
    yield from event(item.task_id, item.to, now, row["attempts"], _detail(item))
    changes.append(TaskChange(item.task_id, item.to, row["tenant"]))
    yield from record_spend([(item.task_id, item.charge)], now)
    yield from record_effects([item], now)
    freed: tuple[str, ...] = ()
    if item.closes_attempt:
        freed = yield from release_work(
            item.task_id, row["fingerprint"], item.to, item.result, now, changes
        )
    return Applied(item.task_id, True, item.to, freed)


def _detail(item: Completion) -> str:
    return item.error.message if item.error else ""


def _release_succeeded(
    items: Sequence[Completion], moved: dict[str, Row], now: float, changes: list[TaskChange]
) -> Rule[dict[str, tuple[str, ...]]]:
    """:func:`release_work` for every item that succeeded with a fingerprint, at once: the
    waiters each one resolved, by owner (empty: owned nothing, freed none)."""
    done = [
        (i, moved[i.task_id]["fingerprint"])
        for i in items
        if i.to is Status.SUCCEEDED
        and i.closes_attempt
        and i.task_id in moved
        and moved[i.task_id]["fingerprint"]
    ]
    if not done:
        return {}
    released: dict[str, list[str]] = {i.task_id: [] for i, _ in done}
    marked = [{"fingerprint": fp, "task_id": i.task_id} for i, fp in done]
    owners = {
        r["task_id"] for r in (yield from all_rows("fingerprints_succeeded", rows=marked, now=now))
    }
    if owners:
        owned = [(i.task_id, i.result) for i, _ in done if i.task_id in owners]
        resolved = yield from resolve_waiters_of(owned, now)
        for r in resolved:
            released[r["owner"]].append(r["id"])
            changes.append(TaskChange(r["id"], Status.DEDUPED, r["tenant"]))
        yield from record_saved([(r["id"], r["owner"]) for r in resolved], now)
    return {owner: tuple(ids) for owner, ids in released.items()}


def _not_moved(
    item: Completion, current: Row | None, now: float, changes: list[TaskChange]
) -> Rule[Applied]:
    """The compare-and-set found the task elsewhere. If it is a running task's last write and
    the task ended meanwhile with this very attempt still open (a deadline passed mid-call, or
    a cancel while others wait for the work), the write closes the attempt instead."""
    if current is None:
        return Applied(item.task_id, False)
    status = Status(current["status"])
    ours = (
        item.expected is Status.RUNNING
        and item.lease_token is not None
        and current["lease_token"] == item.lease_token
        and status in TERMINAL
    )
    if not ours:
        return Applied(item.task_id, False, status)
    assert item.lease_token is not None
    if item.hung_up_until is not None:  # hung up on: the call may go on without its worker
        yield from orphan_attempt(item.task_id, item.lease_token, item.hung_up_until, now)
        return Applied(item.task_id, False, status)
    result = Succeeded(item.result) if item.to is Status.SUCCEEDED else None
    freed = yield from close_attempt(
        item.task_id, item.lease_token, result, now, changes, item.charge,
        request_id=item.upstream_request_id,
    )  # fmt: skip
    return Applied(item.task_id, False, status, freed or (), closed=freed is not None)


def close_attempt(
    task_id: str,
    token: str,
    result: Succeeded | None,
    now: float,
    changes: list[TaskChange],
    charge: Charge | None = None,
    *,
    request_id: str | None = None,
) -> Rule[tuple[str, ...] | None]:
    """Close an ended task's open attempt: the waiters its work freed, or None when it was not
    open under ``token``. A success is kept: on the task's row (its status unchanged) and for
    the work's waiters. ``charge``: what the call billed, spent now (before a waiter's saving
    is counted); ``request_id``: the provider's id of its answer."""
    row = yield from one(
        "close_attempt",
        id=task_id,
        token=token,
        succeeded=result is not None,
        result=dumps(None if result is None else result.result),
        upstream_request_id=request_id,
        now=now,
    )
    if row is None:
        return None
    status = Status(row["status"])
    changes.append(TaskChange(task_id, status, row["tenant"]))
    yield from record_spend([(task_id, charge)], now)
    to = Status.SUCCEEDED if result is not None else status
    value = None if result is None else result.result
    return (yield from release_work(task_id, row["fingerprint"], to, value, now, changes))


# -- jobs -------------------------------------------------------------------------------------
# A job's next steps are written in the transaction that ends the task they wait for: every
# write ends with advance_jobs over the tasks it ended (the ledger runs it after each rule).


_STEP = STEP_PREFIX.removesuffix("_")


def submit_job(
    job: Job, planner: JobPlanner, budget: Budget | None, changes: list[TaskChange]
) -> Rule[tuple[Job, JobState]]:
    """A job and its first steps' tasks, or nothing: a step whose input its kind refuses is
    InvalidJob naming it, and the tasks' holds must fit the tenant's budget."""
    now = planner.now()
    yield from count("insert_job", **job_params(job, now))
    created = yield from advance_job(job.id, planner, changes, strict=True)
    needed = sum(t.spend_hold for t in created if not t.terminal)
    if budget is not None and needed > 0:
        yield from _check_budget(job.tenant, budget, now, needed)
    return (yield from load_job(job.id)), (yield from job_state(job.id))


def load_job(job_id: str, tenant: str | None = None, *, lock: bool = False) -> Rule[Job]:
    row = yield from one("lock_job" if lock else "get_job", id=job_id)
    if row is None or (tenant is not None and row["tenant"] != tenant):
        raise JobNotFound(job_id)
    return job_from_row(row)


def job_state(job_id: str) -> Rule[JobState]:
    sizes = yield from all_rows("job_sizes", job_id=job_id)
    return job_state_from(sizes, (yield from all_rows("job_tasks", job_id=job_id)))


def advance_jobs(planner: JobPlanner, changes: list[TaskChange]) -> Rule[None]:
    """Each job a task of ``changes`` ended belongs to takes its next steps."""
    ended = [
        c.task_id for c in changes if c.status in TERMINAL and c.task_id.startswith(STEP_PREFIX)
    ]
    if not ended:
        return
    for row in (yield from all_rows("jobs_of_tasks", ids=ended)):
        yield from advance_job(row["job_id"], planner, changes)


def advance_job(
    job_id: str, planner: JobPlanner, changes: list[TaskChange], *, strict: bool = False
) -> Rule[list[Task]]:
    """A running job's next moves (core/jobs.py: next_moves), written: the steps that may
    start now, each task under the step's work key; or the job's end. ``strict`` (a submit):
    a step that cannot start raises InvalidJob instead of failing the job. The tasks written."""
    job = yield from load_job(job_id, lock=True)
    if job.ended:
        return []
    state = yield from job_state(job_id)
    now = planner.now()
    created: list[Task] = []
    while True:
        moves = next_moves(job.spec, state, now, job.deadline_at, planner.max_items)
        end = moves.end
        news: list[tuple[Start, NewTask]] = []
        for start in () if end is not None else moves.start:
            try:
                news.append((start, planner.task(job, start)))
            except FloodwayError as exc:  # its kind refuses the input the step was given
                end = planning_failed(start.step, str(exc))
                break
        if end is not None:
            if strict and end.error is not None and "reason" in end.error:
                raise InvalidJob(str(end.error["step"]), str(end.error["reason"]))
            yield from _end_job(job, end, now, changes)
            return created
        if not moves.expand:
            return created
        sizes = dict(state.sizes)
        tasks = {s.name: list(state.tasks.get(s.name, ())) for s in job.spec.steps}
        for name, size in moves.expand:
            yield from count("insert_job_step", job_id=job_id, step=name, size=size, now=now)
            sizes[name] = size
        for start, new in news:
            task = (yield from submit_one(new, now, changes, _STEP)).task
            yield from count(
                "insert_job_task", task_id=task.id, job_id=job_id, step=start.step, idx=start.index
            )
            tasks[start.step].append(
                Instance(start.index, task.id, task.status, task.result, task.error)
            )
            created.append(task)
        state = JobState(sizes, tasks)


def _end_job(job: Job, end: End, now: float, changes: list[TaskChange]) -> Rule[None]:
    ended = yield from count(
        "end_job",
        id=job.id,
        status=end.status.value,
        result=dumps(end.result),
        error=dumps(end.error),
        now=now,
    )
    if ended:  # who waits for the job hears of its end as of a task's (its statuses are theirs)
        changes.append(TaskChange(job.id, Status(end.status.value), job.tenant))


def cancel_job(
    job_id: str, tenant: str | None, now: float, changes: list[TaskChange]
) -> Rule[list[str]]:
    """End a running job as cancelled, then cancel its tasks that have not ended (under the
    rules for calls in flight: :func:`cancel`). The ids of the tasks asked to stop."""
    job = yield from load_job(job_id, tenant, lock=True)
    if job.ended:
        raise IllegalTransition(job.status.value, "cancelled", "the job has ended already")
    end = End(JobStatus.CANCELLED, error={"step": None, "message": "cancelled by request"})
    yield from _end_job(job, end, now, changes)
    asked = []
    for row in (yield from all_rows("job_tasks", job_id=job_id)):
        if Status(row["status"]) in TERMINAL:
            continue
        try:
            yield from cancel(row["task_id"], None, now, changes)
        except IllegalTransition:  # it ended meanwhile
            continue
        asked.append(row["task_id"])
    return asked


def retry_job(
    job_id: str,
    tenant: str | None,
    planner: JobPlanner,
    budget: Budget | None,
    changes: list[TaskChange],
) -> Rule[Job]:
    """A failed job runs again from where it failed: its failed, dead, timed-out and
    cancelled tasks run again under the same work keys (:func:`manual_retry`: a call that
    succeeded late is taken, not paid twice), and then the steps that wait for them; what
    succeeded stays. Its deadline starts again."""
    job = yield from load_job(job_id, tenant, lock=True)
    if job.status is not JobStatus.FAILED:
        raise IllegalTransition(job.status.value, "running", "only a failed job is retried")
    now = planner.now()
    yield from count("reopen_job", id=job_id, now=now)
    job = yield from load_job(job_id)
    for row in (yield from all_rows("job_tasks", job_id=job_id)):
        status = Status(row["status"])
        if status is Status.CANCELLED:  # no way back from cancelled: a new task, same work
            old = yield from load(row["task_id"])
            start = Start(row["step"], row["idx"], old.input, _share(job, row["step"], now))
            task = (yield from submit_one(planner.task(job, start), now, changes, _STEP)).task
            yield from count("replace_job_task", task_id=old.id, new_task_id=task.id)
        elif status in (Status.FAILED, Status.DEAD, Status.TIMEOUT):
            yield from manual_retry(row["task_id"], None, now, changes, budget)
    yield from advance_job(job_id, planner, changes)
    return (yield from load_job(job_id))


def _share(job: Job, step: str, now: float) -> float | None:
    if job.deadline_at is None:
        return None
    return max(job.deadline_at - now, 0.0) / job.spec.chain_length(step) or None


def orphan_attempt(task_id: str, token: str, until: float, now: float) -> Rule[bool]:
    return bool((yield from count("orphan_attempt", id=task_id, token=token, until=until, now=now)))


def heartbeat(
    leases: Sequence[tuple[str, str]], now: float, lease_s: float
) -> Rule[HeartbeatResult]:
    given = [{"id": task_id, "token": token} for task_id, token in leases]
    rows = yield from all_rows("heartbeat", rows=given, now=now, expires_at=now + lease_s)
    held = {r["id"]: bool(r["cancel_requested"]) for r in rows}
    lost = tuple(task_id for task_id, _ in leases if task_id not in held)
    cancel = tuple(task_id for task_id, _ in leases if held.get(task_id))
    return HeartbeatResult(lost, cancel)


def worker_beat(worker: WorkerInfo, now: float, stale_s: float) -> Rule[None]:
    """A worker's row written (its heartbeat, the rest the first time); the rows of workers
    silent for ``stale_s`` (they died without saying so) dropped."""
    yield from count(
        "worker_beat",
        owner=worker.owner,
        host=worker.host,
        pid=worker.pid,
        concurrency=worker.concurrency,
        kinds=dumps(list(worker.kinds)),
        started_at=worker.started_at,
        now=now,
    )
    yield from count("drop_stale_workers", stale=now - stale_s)


# -- dispatch and retention ------------------------------------------------------------------


def claim(params: ClaimParams, changes: list[TaskChange]) -> Rule[list[Task]]:
    """Lease ready tasks: the next ones in dispatch order (up to ``params.limit``), or those of
    ``params.ids`` that are still ready. Each moves to running with its attempt counted."""
    args = {**claim_args(params), "bounds": dumps(dict(params.bounds))}
    if params.ids is None:
        name = "claim_next"
        args.update(kinds=params.kinds, limit=params.limit)
    else:
        name = "claim_ids"
        args.update(ids=params.ids)
    rows = sorted(
        (yield from all_rows(name, **args)), key=lambda r: (r["lane_rank"], r["rank_at"], r["seq"])
    )
    if not (yield from ask(Ask.MULTI_TABLE)):  # else the claim logged them itself
        running = Status.RUNNING
        yield from events(
            [event_row(r["id"], running, params.now, r["attempts"], params.owner) for r in rows]
        )
    tasks = [task_from_row(r) for r in rows]
    changes.extend(TaskChange(t.id, t.status, t.tenant) for t in tasks)
    return tasks


def purge(retention: Retention) -> Rule[Purged]:
    """Results past their TTL cleared (and their fingerprints, so the work runs again), then
    rows past theirs deleted with their events and spend, and expired request keys."""
    results_before = retention.now - retention.result_ttl_s
    rows_before = retention.now - retention.row_ttl_s
    cleared = yield from count("purge_results", before=results_before)
    yield from count("purge_fingerprints", before=results_before)
    deleted = yield from count("purge_rows", before=rows_before)
    yield from count("purge_events", before=rows_before)
    keys = yield from count("purge_keys", now=retention.now)
    yield from count("purge_spend", before=rows_before)
    yield from count("purge_streams", before=results_before)
    for jobs in ("purge_job_tasks", "purge_job_steps", "purge_jobs"):  # a job, as its tasks
        yield from count(jobs, before=rows_before)
    yield from count("purge_lines", before=results_before, ended_states=list(ENDED_LINES))
    yield from count("purge_upstream_batches", before=rows_before, ended=BATCH_ENDED)
    return Purged(cleared, deleted, keys)


def append_stream(
    task_id: str,
    tenant: str,
    first: int,
    events: Sequence[str],
    now: float,
    changes: list[TaskChange],
    request_id: str | None = None,
) -> Rule[int]:
    """A streamed call's next events, numbered from ``first`` (a number written already is
    left as it is: a resubmitted call replays the same stream). ``request_id``: the provider's
    id of the stream's answer, on the task before its end, so the stream's answer names it."""
    changes.append(TaskChange(task_id, Status.RUNNING, tenant))  # its readers here wake
    if request_id is not None:
        yield from count("note_request_id", id=task_id, upstream_request_id=request_id)
    return (yield from count("append_stream", task_id=task_id, first=first,
                             events=list(events), now=now))  # fmt: skip


# -- writes on many rows ----------------------------------------------------------------------
# Where one statement may write several tables (Ask.MULTI_TABLE), each of these is one
# statement; elsewhere the same steps a row at a time.


def insert_tasks(rows: list[dict[str, Any]]) -> Rule[list[Row]]:
    """Many submits' tasks in the given order, their queued events, and the fingerprints
    nobody holds yet. A task with a request key goes in only if its key is reserved here
    (the caller takes the others one by one); ``owns_work`` is false for a task whose
    fingerprint someone else (or an earlier task of these) holds."""
    if (yield from ask(Ask.MULTI_TABLE)):
        return (yield from all_rows("insert_tasks", rows=rows))
    inserted: list[Row] = []
    for row in rows:
        key = row["idempotency_key"]
        if key is not None and not (
            yield from count(
                "reserve_request_key",
                tenant=row["tenant"],
                key=key,
                task_id=row["id"],
                request_hash=row["request_hash"],
                expires_at=row["key_expires_at"],
            )
        ):
            continue
        task = yield from one("insert_task", **row)
        assert task is not None  # INSERT ... RETURNING always returns the row
        fp = row["fingerprint"]
        owns = fp is not None and bool(
            (
                yield from count(
                    "claim_fingerprint", fingerprint=fp, task_id=row["id"], now=row["now"]
                )
            )
        )
        inserted.append({**task, "owns_work": owns})
    yield from events([event_row(t["id"], Status.QUEUED, t["created_at"], 0) for t in inserted])
    return inserted


def complete_many(rows: list[dict[str, Any]], now: float) -> Rule[list[Row]]:
    """The ``complete`` compare-and-set of many distinct tasks (its parameters and the event's
    ``detail``), with their events: the rows moved (the others did not match)."""
    if (yield from ask(Ask.MULTI_TABLE)):
        return (yield from all_rows("complete_many", rows=rows, now=now))
    moved: list[Row] = []
    for row in rows:
        params = {k: v for k, v in row.items() if k != "detail"}
        done = yield from one("complete", **params)
        if done is not None:
            moved.append(done)
    to = {r["id"]: r for r in rows}
    yield from events(
        [
            event_row(m["id"], Status(to[m["id"]]["to"]), now, m["attempts"], to[m["id"]]["detail"])
            for m in moved
        ]
    )
    return moved


def resolve_waiters_of(owners: Sequence[tuple[str, Any]], now: float) -> Rule[list[Row]]:
    """(owner, result): every queued waiter of each owner's work takes its result, deduped,
    with its event (the waiters of another tenant are not told whose task it was). Returns
    each waiter's id, tenant and owner."""
    given: list[dict[str, Any]] = [
        {"owner": owner, "result": dumps(result), "detail": deduped_detail(owner)}
        for owner, result in owners
    ]
    if (yield from ask(Ask.MULTI_TABLE)):
        return (
            yield from all_rows(
                "resolve_waiters_of", rows=given, shared=deduped_detail(None), now=now
            )
        )
    resolved: list[Row] = []
    logged = []
    for g in given:
        args = {"owner": g["owner"], "result": g["result"], "now": now}
        for waiter in (yield from all_rows("resolve_waiters", **args)):
            detail = g["detail"] if waiter["duplicate_of"] is not None else deduped_detail(None)
            logged.append(event_row(waiter["id"], Status.DEDUPED, now, 0, detail))
            resolved.append({"id": waiter["id"], "tenant": waiter["tenant"], "owner": g["owner"]})
    yield from events(logged)
    return resolved


# -- requests from people -------------------------------------------------------------------


def cancel(task_id: str, tenant: str | None, now: float, changes: list[TaskChange]) -> Rule[Task]:
    task = yield from load(task_id, lock=True)
    if tenant is not None and task.tenant != tenant:
        raise TaskNotFound(task_id)
    check_transition(task.status, Status.CANCELLED, "cancel")
    error = ErrorInfo(ErrorClass.CANCELLED, "cancelled", "cancelled by request")
    if task.status is Status.RUNNING:
        if task.parked or task.lease_token is None:
            # Its upstream job runs without a worker: the poller asks the provider to stop it.
            yield from count("request_cancel_running", id=task_id, now=now)
            return (yield from load(task_id))
        # The task ends now; its call, sent already, is read to its end by its worker (the
        # provider bills it all the same): the answer is recorded, billed and kept for the
        # work, and the provider slot is given back only then (core/hangup.py).
        item = ended_for_waiters(task, Status.CANCELLED, error)
        if not (yield from complete_one(item, now, changes)).applied:
            raise IllegalTransition(task.status, Status.CANCELLED, "the task changed meanwhile")
        return (yield from load(task_id))
    written = yield from one(
        "cancel_now", id=task_id, expected=task.status.value, now=now, error=dumps(error.to_json())
    )
    if written is None:
        raise IllegalTransition(task.status, Status.CANCELLED, "the task changed meanwhile")
    yield from event(task_id, Status.CANCELLED, now, task.attempts, "cancelled by request")
    changes.append(TaskChange(task_id, Status.CANCELLED, task.tenant))
    if task.waits_for is None:
        yield from release_work(task_id, task.fingerprint, Status.CANCELLED, None, now, changes)
    return (yield from load(task_id))


def manual_retry(
    task_id: str,
    tenant: str | None,
    now: float,
    changes: list[TaskChange],
    budget: Budget | None = None,
) -> Rule[Task]:
    task = yield from load(task_id, lock=True)
    if tenant is not None and task.tenant != tenant:
        raise TaskNotFound(task_id)
    check_transition(task.status, Status.QUEUED, "retry")
    if task.lease_token is not None:
        # Its last call goes on (under a live worker), or may (its worker died): until it has
        # surely ended, starting the work again could pay for it twice.
        until = task.lease_expires_at or now
        if task.lease_owner is not None or until > now:
            raise AttemptStillOpen(task_id, task.status.value, until, now)
        # Nobody saw that call end: recorded as possibly billed.
        possibly = possibly_billed(task.spend_hold)
        yield from close_attempt(task_id, task.lease_token, None, now, changes, possibly)
    written = yield from one("manual_retry", id=task_id, expected=task.status.value, now=now)
    if written is None:
        raise IllegalTransition(task.status, Status.QUEUED, "the task changed meanwhile")
    yield from event(task_id, Status.QUEUED, now, 0, "manual retry")
    retried = yield from load(task_id)
    if task.fingerprint is not None:
        retried = yield from claim_work(retried, task.fingerprint, now, changes, before=task)
    if budget is not None and retried.spend_hold > 0 and not retried.terminal:
        # Queued again, the task holds its estimate again: as a new submission would.
        yield from _check_budget(task.tenant, budget, now, retried.spend_hold)
    changes.append(TaskChange(task_id, retried.status, task.tenant))
    return retried
