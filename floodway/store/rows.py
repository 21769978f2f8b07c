"""Turning stored rows into :class:`~floodway.core.task.Task` (shared by the backends)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from floodway.core.jobs import Instance, Job, JobSpec, JobState, JobStatus
from floodway.core.outcome import Completion
from floodway.core.states import TERMINAL, Status
from floodway.core.task import Candidate, ErrorInfo, Lane, NewTask, Task
from floodway.core.tiers import ENDED_LINES
from floodway.store.base import ClaimParams, TaskQuery


def dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


#: a stored JSON text's types (a tuple: ``str | bytes`` would build a union at each call)
_TEXT = (str, bytes)


def loads(value: Any) -> Any:
    if value is None or not isinstance(value, _TEXT):
        return value
    return json.loads(value)


def task_from_row(row: Mapping[str, Any]) -> Task:
    return Task(
        id=row["id"],
        kind=row["kind"],
        status=Status(row["status"]),
        lane=Lane(row["lane"]),
        tenant=row["tenant"],
        input=loads(row["input"]),
        result=loads(row["result"]),
        error=ErrorInfo.from_json(loads(row["error"])),
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        request_key=row["idempotency_key"],
        fingerprint=row["fingerprint"],
        duplicate_of=row["duplicate_of"],
        waits_for=row["waits_for"],
        upstream_ref=row["upstream_ref"],
        upstream_request_id=row["upstream_request_id"],
        cost_estimated=row["cost_estimated"],
        cost_actual=row["cost_actual"],
        spend_hold=row["spend_hold"],
        over_estimate=row["over_estimate"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        deadline_at=row["deadline_at"],
        next_attempt_at=row["next_attempt_at"],
        metadata=loads(row["metadata"]) or {},
        callback_url=row["callback_url"],
        batch_id=row["batch_id"],
        tier=row["tier"],
        lease_owner=row["lease_owner"],
        lease_token=row["lease_token"],
        lease_expires_at=row["lease_expires_at"],
        attempt_at=row["attempt_at"],
        call_ends_by=row["call_ends_by"],
        invalid_outputs=row["invalid_outputs"],
        cancel_requested=bool(row["cancel_requested"]),
        poll_attempts=row["poll_attempts"],
        parked=bool(row["parked"]),
        callback_state=row["callback_state"],
        callback_attempts=row["callback_attempts"],
        seq=row["seq"],
    )


def job_from_row(row: Mapping[str, Any]) -> Job:
    return Job(
        id=row["id"],
        tenant=row["tenant"],
        status=JobStatus(row["status"]),
        lane=Lane(row["lane"]),
        spec=JobSpec.from_json(loads(row["spec"])),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        deadline_s=row["deadline_s"],
        deadline_at=row["deadline_at"],
        finished_at=row["finished_at"],
        metadata=loads(row["metadata"]) or {},
        callback_url=row["callback_url"],
        callback_state=row["callback_state"],
        callback_attempts=row["callback_attempts"],
        result=loads(row["result"]),
        error=loads(row["error"]),
        seq=row["seq"],
    )


def job_params(job: Job, now: float) -> dict[str, Any]:
    return {
        "id": job.id,
        "tenant": job.tenant,
        "lane": job.lane.value,
        "spec": dumps(job.spec.to_json()),
        "deadline_s": job.deadline_s,
        "deadline_at": job.deadline_at,
        "metadata": dumps(job.metadata),
        "callback_url": job.callback_url,
        "now": now,
    }


def instance_from_row(row: Mapping[str, Any]) -> Instance:
    return Instance(
        row["idx"],
        row["task_id"],
        Status(row["status"]),
        loads(row["result"]),
        ErrorInfo.from_json(loads(row["error"])),
    )


def job_state_from(
    sizes: Sequence[Mapping[str, Any]], tasks: Sequence[Mapping[str, Any]]
) -> JobState:
    """A job's state from its ``job_sizes`` and ``job_tasks`` rows."""
    found: dict[str, list[Instance]] = {}
    for r in tasks:
        found.setdefault(r["step"], []).append(instance_from_row(r))
    return JobState({r["step"]: r["size"] for r in sizes}, found)


def insert_params(task_id: str, new: NewTask, now: float) -> dict[str, Any]:
    return {
        "id": task_id,
        "kind": new.kind,
        "lane": new.lane.value,
        "lane_rank": new.lane.rank,
        "tenant": new.tenant,
        "input": dumps(new.input),
        "max_attempts": new.max_attempts,
        "idempotency_key": new.request_key,
        "fingerprint": new.fingerprint,
        "cost_estimated": new.cost_estimated,
        "spend_hold": new.spend_hold,
        "now": now,
        "rank_at": now if new.rank_at is None else new.rank_at,
        "deadline_at": None if new.deadline_s is None else now + new.deadline_s,
        "metadata": dumps(new.metadata or {}),
        "callback_url": new.callback_url,
        "batch_id": new.batch_id,
        "tier": new.tier,
    }


def candidate_from_row(row: Mapping[str, Any]) -> Candidate:
    return Candidate(
        row["id"],
        row["kind"],
        row["tenant"],
        Lane.of_rank(row["lane_rank"]),
        row["cost_estimated"],
        row["seq"],
        row["rank_at"],
        row["deadline_at"],
    )


def claim_args(params: ClaimParams) -> dict[str, Any]:
    """The lease half of a claim's parameters; the caller adds kinds/limit or ids in the
    shape its driver binds lists."""
    return {
        "owner": params.owner,
        "token": params.token,
        "expires_at": params.now + params.lease_s,
        "now": params.now,
    }


def completion_params(item: Completion, now: float) -> dict[str, Any]:
    """Parameters of the ``complete`` compare-and-set, identical for every backend."""
    return {
        "id": item.task_id,
        "expected": item.expected.value,
        "token": item.lease_token,
        "to": item.to.value,
        "result": dumps(item.result),
        "error": dumps(item.error.to_json()) if item.error else None,
        "next_attempt_at": item.next_attempt_at,
        "refund": 1 if item.refund_attempt else 0,
        "invalid": 1 if item.invalid_output else 0,
        "cost_actual": item.cost_actual,
        "terminal": item.to in TERMINAL,
        "now": now,
        "parked": item.parked,
        # The attempt: closed (lease cleared), kept (its worker's lease as it is), or left
        # open without a worker until ``orphan_until``.
        "keep_attempt": item.keep_attempt,
        "orphan_until": item.orphan_until,
        "upstream_request_id": item.upstream_request_id,
    }


def park_params(
    task_id: str, lease_token: str, ref: str, poll_at: float, now: float, polled: bool
) -> dict[str, Any]:
    return {
        "id": task_id,
        "token": lease_token,
        "ref": ref,
        "poll_at": poll_at,
        "now": now,
        "polled": 1 if polled else 0,
        "ended_lines": list(ENDED_LINES),
    }


def list_params(query: TaskQuery) -> dict[str, Any]:
    """Parameters of ``list_tasks`` and ``list_tasks_desc``: every filter is optional (NULL
    matches all)."""
    return {
        "tenant": query.tenant,
        "status": query.status.value if query.status else None,
        "kind": query.kind,
        "lane": query.lane.value if query.lane else None,
        "batch_id": query.batch_id,
        "after_seq": query.after_seq or 0,
        "before_seq": query.after_seq or 2**62,  # descending: every seq is below 2**62
        "limit": query.limit,
    }


def list_query(query: TaskQuery) -> str:
    """The name of the listing query for ``query``'s order."""
    return "list_tasks_desc" if query.descending else "list_tasks"
