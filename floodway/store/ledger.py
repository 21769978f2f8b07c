"""What both stores share: every verb of :class:`~floodway.store.base.Store`, written once over
two primitives each backend provides (a template method, as saq's queue base does):

- ``_fetch(query)``: run one named read outside any write transaction;
- ``_commit(write)``: run one write's rule in a commit group (:mod:`floodway.store.group`);
  its value (or its error) and the task changes it made.

The verbs here build parameters and rows; the decisions are the rules'
(:mod:`floodway.store.rules`); connections and SQL are the backends'.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from floodway.core.errors import IllegalTransition
from floodway.core.jobs import JOB_PREFIX
from floodway.core.outcome import Applied, Completion, Succeeded
from floodway.core.owners import new_identity
from floodway.core.spend import Budget, Charge
from floodway.core.states import TERMINAL, Status, check_transition
from floodway.core.task import Candidate, NewTask, Submitted, Task
from floodway.store import rules
from floodway.store.base import (
    BatchCounts,
    BatchKey,
    BudgetUse,
    ChangeListener,
    ClaimParams,
    DueEffect,
    HeartbeatResult,
    Leader,
    Purged,
    ReadyQuery,
    Retention,
    SpendLine,
    SpendPoint,
    SpendQuery,
    SpendReport,
    StoreStats,
    TaskChange,
    TaskEvent,
    TaskQuery,
    TaskTiming,
    WorkerInfo,
    WorkerTask,
)
from floodway.store.group import Write, Written
from floodway.store.jobs import LedgerJobs
from floodway.store.openai_records import LedgerOpenAIRecords
from floodway.store.rows import (
    candidate_from_row,
    claim_args,
    list_params,
    list_query,
    park_params,
    task_from_row,
)
from floodway.store.steps import Query, Row, Rule, all_rows, count, one
from floodway.store.tier_records import LedgerTierRecords

T = TypeVar("T")
#: how long the row of :meth:`Ledger.probe_write` outlives its last write
PROBE_TTL_S = 300.0


class Ledger(LedgerOpenAIRecords, LedgerJobs, LedgerTierRecords, ABC):
    url: str

    def __init__(self, url: str) -> None:
        self.url = url
        self.identity = new_identity()
        self._listeners: list[ChangeListener] = []

    # -- what a backend provides ----------------------------------------------------------
    @abstractmethod
    async def _fetch(self, query: Query) -> Any:
        """The result of one read, in the query's shape."""

    @abstractmethod
    async def _commit(self, write: Write) -> Written:
        """Run ``write`` in a commit group; what it wrote (its error included)."""

    # -- plumbing ---------------------------------------------------------------------------
    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    async def _write(
        self,
        rule: Callable[[list[TaskChange]], Rule[T]],
        *,
        wake: bool = False,
        merge: rules.Submission | None = None,
        first: bool = False,
    ) -> T:
        """Run a write, then the next steps of the jobs whose tasks it ended; this process's
        listeners hear of its changes after the commit."""
        done = await self._commit(Write(rule, wake, merge, self._planner, first))
        if done.error is not None:
            raise done.error
        if done.changes:
            for listener in self._listeners:
                listener(done.changes)
        value: T = done.value
        return value

    async def _one(self, query: str, /, **params: Any) -> Row | None:
        row: Row | None = await self._fetch(Query(query, params, "one"))
        return row

    async def _all(self, query: str, /, **params: Any) -> list[Row]:
        rows: list[Row] = await self._fetch(Query(query, params, "all"))
        return rows

    async def _tasks(self, query: str, /, **params: Any) -> list[Task]:
        return [task_from_row(r) for r in await self._all(query, **params)]

    # -- submit and read -------------------------------------------------------------------
    async def submit(
        self, new: Sequence[NewTask], now: float, *, batch_key: BatchKey | None = None
    ) -> list[Submitted]:
        submission = rules.Submission(new, now, batch_key)

        def rule(changes: list[TaskChange]) -> Rule[list[Submitted]]:
            return (yield from rules.submit([submission], changes))[0]

        return await self._write(rule, merge=submission)

    async def get(self, task_id: str, tenant: str | None = None) -> Task | None:
        row = await self._one("get_task", id=task_id)
        if row is None or (tenant is not None and row["tenant"] != tenant):
            return None
        return task_from_row(row)

    async def append_stream(
        self,
        task_id: str,
        tenant: str,
        first: int,
        events: Sequence[str],
        now: float,
        request_id: str | None = None,
    ) -> None:
        await self._write(
            lambda changes: rules.append_stream(
                task_id, tenant, first, events, now, changes, request_id
            ),
            wake=True,  # the other processes' readers of the stream hear of it
        )

    async def read_stream(self, task_id: str, after: int, limit: int) -> list[tuple[int, str]]:
        rows = await self._all("read_stream", task_id=task_id, after=after, limit=limit)
        return [(r["seq"], r["data"]) for r in rows]

    async def forget_result(self, task_id: str, tenant: str) -> bool:
        def rule(_: list[TaskChange]) -> Rule[int]:
            forgotten = yield from count("forget_result", id=task_id, tenant=tenant)
            if forgotten:
                yield from count("forget_stream", id=task_id)
            return forgotten

        return bool(await self._write(rule))

    async def ended(self, task_ids: Sequence[str]) -> set[str]:
        jobs = [i for i in task_ids if i.startswith(JOB_PREFIX)]  # a job's waiters' too
        rows = await self._all("attempts_of_ids", ids=[i for i in task_ids if i not in jobs])
        found = {r["id"] for r in rows if Status(r["status"]) in TERMINAL}
        if jobs:
            found.update(r["id"] for r in await self._all("jobs_ended", ids=jobs))
        return found

    async def list_tasks(self, query: TaskQuery) -> list[Task]:
        return await self._tasks(list_query(query), **list_params(query))

    async def recent_timings(self, tenant: str | None, limit: int) -> list[TaskTiming]:
        rows = await self._all("recent_timings", tenant=tenant, limit=limit)
        return [
            TaskTiming(
                r["id"],
                r["kind"],
                Status(r["status"]),
                r["error_type"] or "",
                r["attempts"],
                r["created_at"],
                r["started_at"],
                r["finished_at"],
            )
            for r in rows
        ]

    async def events(self, task_id: str, after_seq: int = 0) -> list[TaskEvent]:
        rows = await self._all("list_events", task_id=task_id, after_seq=after_seq)
        return [
            TaskEvent(
                r["seq"], r["task_id"], Status(r["status"]), r["at"], r["attempt"], r["detail"]
            )
            for r in rows
        ]

    async def stats(self, tenant: str | None = None) -> StoreStats:
        by_status: dict[str, int] = {s.value: 0 for s in Status}
        by_kind: dict[str, dict[str, int]] = {}
        for r in await self._all("stats", tenant=tenant):
            by_status[r["status"]] += r["count"]
            by_kind.setdefault(r["kind"], {})[r["status"]] = r["count"]
        return StoreStats(by_status, by_kind)

    async def batch_counts(self, batch_id: str, tenant: str | None) -> dict[str, int]:
        rows = await self._all("batch_counts", batch_id=batch_id, tenant=tenant)
        return {r["status"]: r["count"] for r in rows}

    async def worker_beat(self, worker: WorkerInfo, now: float, stale_s: float) -> None:
        await self._write(lambda _: rules.worker_beat(worker, now, stale_s))

    async def worker_gone(self, owner: str) -> None:
        await self._write(lambda _: count("worker_gone", owner=owner))

    async def workers(self, since: float) -> list[WorkerInfo]:
        held: dict[str, list[WorkerTask]] = {}
        for r in await self._all("worker_tasks", since=since):
            task = WorkerTask(r["id"], r["kind"], r["tenant"], int(r["attempts"]), r["attempt_at"])
            held.setdefault(r["lease_owner"], []).append(task)
        return [
            WorkerInfo(
                owner=r["owner"],
                host=r["host"],
                pid=int(r["pid"]),
                concurrency=int(r["concurrency"]),
                kinds=tuple(json.loads(r["kinds"])),
                started_at=float(r["started_at"]),
                heartbeat_at=float(r["heartbeat_at"]),
                tasks=tuple(held.get(r["owner"], ())),
            )
            for r in await self._all("list_workers", since=since)
        ]

    async def batches(self, tenant: str, limit: int) -> list[BatchCounts]:
        found: dict[str, BatchCounts] = {}
        for r in await self._all("list_batches", tenant=tenant, limit=limit):
            batch = found.setdefault(
                r["batch_id"], BatchCounts(r["batch_id"], float(r["created_at"]), {})
            )
            batch.counts[r["status"]] = int(r["count"])
        return list(found.values())

    async def spend(self, query: SpendQuery) -> SpendReport:
        params = {"tenant": query.tenant, "kind": query.kind, "since": query.since}
        lines = tuple(
            SpendLine(
                r["tenant"],
                r["kind"],
                float(r["cost"]),
                float(r["saved"]),
                float(r["input_tokens"]),
                float(r["output_tokens"]),
                float(r["images"]),
                int(r["calls"]),
                int(r["deduped"]),
                float(r["over_estimate"]),
                float(r["tier_saved"]),
            )
            for r in await self._all("spend_totals", **params)
        )
        if query.bucket_s is None:
            return SpendReport(lines)
        series = tuple(
            SpendPoint(float(r["at"]), r["tenant"], r["kind"], float(r["cost"]), float(r["saved"]))
            for r in await self._all("spend_series", bucket=query.bucket_s, **params)
        )
        return SpendReport(lines, series)

    async def budget_use(self, tenant: str, since: float) -> BudgetUse:
        row = await self._one("budget_used", tenant=tenant, since=since)
        return BudgetUse(0.0, 0.0) if row is None else BudgetUse(row["spent"], row["held"])

    # -- the worker's hot path -------------------------------------------------------------
    async def ready(self, query: ReadyQuery) -> list[Candidate]:
        rows = await self._all("ready", kinds=query.kinds, now=query.now, limit=query.limit)
        return [candidate_from_row(r) for r in rows]

    async def claim(self, params: ClaimParams) -> list[Task]:
        return await self._write(lambda changes: rules.claim(params, changes), first=True)

    async def complete(self, items: Sequence[Completion], now: float) -> list[Applied]:
        for item in items:
            check_transition(item.expected, item.to)
            if item.expected is Status.RUNNING and item.lease_token is None and not item.parked:
                raise IllegalTransition(item.expected, item.to, "a running task needs its lease")
        return await self._write(lambda changes: rules.complete(items, now, changes))

    async def heartbeat(
        self, leases: Sequence[tuple[str, str]], now: float, lease_s: float
    ) -> HeartbeatResult:
        if not leases:
            return HeartbeatResult()
        return await self._write(lambda _: rules.heartbeat(leases, now, lease_s))

    async def set_upstream_ref(self, task_id: str, lease_token: str, ref: str, now: float) -> bool:
        params = {"id": task_id, "token": lease_token, "ref": ref, "now": now}
        return bool(await self._write(lambda _: count("set_upstream_ref", **params)))

    async def park(
        self,
        task_id: str,
        lease_token: str,
        ref: str,
        poll_at: float,
        now: float,
        *,
        polled: bool = False,
    ) -> bool:
        params = park_params(task_id, lease_token, ref, poll_at, now, polled)
        # Woken: a process that sleeps until the next parked poll may need to come earlier.
        return bool(await self._write(lambda _: count("park", **params), wake=True))

    async def claim_parked(self, params: ClaimParams) -> list[Task]:
        args = {**claim_args(params), "kinds": params.kinds, "limit": params.limit}
        rows = await self._write(lambda _: all_rows("claim_parked", **args))
        return [task_from_row(r) for r in rows]

    async def hasten_parked(self, kind: str, older_than_s: float, now: float) -> int:
        params = {"kind": kind, "older_than": older_than_s, "now": now}
        return await self._write(lambda _: count("hasten_parked", **params))

    async def next_parked_at(self) -> float | None:
        row = await self._one("next_parked_at")
        return None if row is None else row["at"]

    async def find_upstream(self, kind: str, ref: str) -> Task | None:
        row = await self._one("find_upstream", kind=kind, ref=ref)
        return None if row is None else task_from_row(row)

    async def due_callbacks(self, now: float, limit: int) -> list[Task]:
        return await self._tasks("due_callbacks", now=now, limit=limit)

    async def callback_result(self, task_id: str, state: str, next_at: float | None) -> None:
        params = {"id": task_id, "state": state, "next_at": next_at}
        await self._write(lambda _: count("callback_result", **params))

    async def due_effects(self, now: float, limit: int) -> list[DueEffect]:
        rows = await self._all("due_effects", now=now, limit=limit)
        return [
            DueEffect(r["effect_seq"], r["effect"], r["effect_attempts"], task_from_row(r))
            for r in rows
        ]

    async def effect_done(self, seq: int) -> None:
        await self._write(lambda _: count("effect_done", seq=seq))

    async def effect_retry(self, seq: int, due_at: float) -> None:
        await self._write(lambda _: count("effect_retry", seq=seq, due_at=due_at))

    # -- requests from people ------------------------------------------------------------
    async def request_cancel(self, task_id: str, tenant: str | None, now: float) -> Task:
        # Woken even for a running task: its worker may be in another process.
        return await self._write(
            lambda changes: rules.cancel(task_id, tenant, now, changes), wake=True
        )

    async def manual_retry(
        self, task_id: str, tenant: str | None, now: float, budget: Budget | None = None
    ) -> Task:
        return await self._write(
            lambda changes: rules.manual_retry(task_id, tenant, now, changes, budget)
        )

    # -- recovery and maintenance --------------------------------------------------------
    async def open_attempts(self, limit: int) -> list[Task]:
        return await self._tasks("open_attempts", limit=limit)

    async def lease_owners(self) -> list[str]:
        return [r["lease_owner"] for r in await self._all("lease_owners")]

    async def expired_leases(self, now: float, limit: int) -> list[Task]:
        return await self._tasks("expired_leases", now=now, limit=limit)

    async def attempts_of(self, owners: Sequence[str], limit: int) -> list[Task]:
        if not owners:
            return []
        return await self._tasks("attempts_of", owners=tuple(owners), limit=limit)

    async def orphan_attempt(
        self, task_id: str, lease_token: str, until: float, now: float
    ) -> bool:
        return await self._write(lambda _: rules.orphan_attempt(task_id, lease_token, until, now))

    async def ended_orphans(self, now: float, limit: int) -> list[Task]:
        return await self._tasks("ended_orphans", now=now, limit=limit)

    async def close_attempt(
        self,
        task_id: str,
        lease_token: str,
        result: Succeeded | None,
        now: float,
        charge: Charge | None = None,
    ) -> bool:
        freed = await self._write(
            lambda changes: rules.close_attempt(task_id, lease_token, result, now, changes, charge)
        )
        return freed is not None

    async def past_deadline(self, now: float, limit: int) -> list[Task]:
        return await self._tasks("past_deadline", now=now, limit=limit)

    async def purge(self, retention: Retention) -> Purged:
        return await self._write(lambda _: rules.purge(retention))

    async def try_lead(self, name: str, owner: str, now: float, ttl_s: float) -> bool:
        params = {"name": name, "owner": owner, "now": now, "expires_at": now + ttl_s}
        return await self._write(lambda _: one("try_lead", **params)) is not None

    async def probe_write(self, now: float) -> None:
        # Owned as ``identity:role`` like the leader leases, so it goes with the process.
        await self.try_lead(f"probe:{self.identity}", f"{self.identity}:probe", now, PROBE_TTL_S)

    async def leader(self, name: str) -> Leader | None:
        row = await self._one("leader", name=name)
        return None if row is None else Leader(row["owner"], row["expires_at"])

    async def take_lead(self, name: str, owner: str, dead: str, now: float, ttl_s: float) -> bool:
        params = {"name": name, "owner": owner, "dead": dead, "expires_at": now + ttl_s}
        return bool(await self._write(lambda _: count("take_lead", **params)))

    async def server_key(self, name: str, new: str) -> str:
        await self._write(lambda _: count("keep_server_key", name=name, value=new))
        row = await self._one("server_key", name=name)
        assert row is not None  # written above, and never deleted
        return str(row["value"])

    async def _drop_leases(self, identity: str) -> None:
        """Free the leader leases of a dead process (its owners are ``identity:role``)."""
        await self._write(lambda _: count("drop_leases", prefix=f"{identity}:"))
