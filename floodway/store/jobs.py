"""Multi-step jobs in the ledger (docs/jobs.md): :class:`JobRecords` is what the runtime, the
jobs routes and the outbox use, apart from the core :class:`~floodway.store.base.Store`; every
ledger keeps them (:class:`LedgerJobs`), over the same primitives as the task verbs. The
decisions are rules of :mod:`floodway.store.rules` (``submit_job``, ``advance_job``,
``cancel_job``, ``retry_job``)."""

from __future__ import annotations

from typing import Protocol

from floodway.core.jobs import Job, JobState, JobStatus
from floodway.core.spend import Budget
from floodway.store import rules
from floodway.store.access import LedgerAccess
from floodway.store.base import JobPlanner
from floodway.store.rows import job_from_row, job_state_from
from floodway.store.steps import count


class JobRecords(Protocol):
    def plan_jobs(self, planner: JobPlanner) -> None:
        """Have every write of this ledger take the next steps of the jobs whose tasks it
        ended, in its own transaction (the planner makes their tasks)."""
        ...

    async def submit_job(self, job: Job, budget: Budget | None) -> tuple[Job, JobState]:
        """The job and its first steps' tasks in one transaction, or nothing; the job as
        written."""
        ...

    async def get_job(self, job_id: str, tenant: str | None) -> tuple[Job, JobState] | None: ...

    async def list_jobs(
        self,
        tenant: str,
        status: JobStatus | None,
        after_seq: int | None,
        limit: int,
        descending: bool = False,
    ) -> list[Job]: ...

    async def cancel_job(self, job_id: str, tenant: str | None, now: float) -> list[str]:
        """The job cancelled and its unfinished tasks with it: the ids of those asked to stop."""
        ...

    async def retry_job(self, job_id: str, tenant: str | None, budget: Budget | None) -> Job: ...

    async def due_job_callbacks(self, now: float, limit: int) -> list[Job]: ...

    async def job_callback_result(self, job_id: str, state: str, next_at: float | None) -> None: ...


class LedgerJobs(LedgerAccess):
    """:class:`JobRecords` over a ledger's reads and writes."""

    _planner: JobPlanner | None = None

    def plan_jobs(self, planner: JobPlanner) -> None:
        self._planner = planner

    @property
    def planner(self) -> JobPlanner:
        if self._planner is None:
            raise RuntimeError("this ledger has no job planner (Floodway.open sets it)")
        return self._planner

    async def submit_job(self, job: Job, budget: Budget | None) -> tuple[Job, JobState]:
        planner = self.planner
        return await self._write(lambda changes: rules.submit_job(job, planner, budget, changes))

    async def get_job(self, job_id: str, tenant: str | None) -> tuple[Job, JobState] | None:
        row = await self._one("get_job", id=job_id)
        if row is None or (tenant is not None and row["tenant"] != tenant):
            return None
        sizes = await self._all("job_sizes", job_id=job_id)
        return job_from_row(row), job_state_from(sizes, await self._all("job_tasks", job_id=job_id))

    async def list_jobs(
        self,
        tenant: str,
        status: JobStatus | None,
        after_seq: int | None,
        limit: int,
        descending: bool = False,
    ) -> list[Job]:
        rows = await self._all(
            "list_jobs_desc" if descending else "list_jobs",
            tenant=tenant,
            status=None if status is None else status.value,
            after=after_seq,
            limit=limit,
        )
        return [job_from_row(r) for r in rows]

    async def cancel_job(self, job_id: str, tenant: str | None, now: float) -> list[str]:
        return await self._write(
            lambda changes: rules.cancel_job(job_id, tenant, now, changes), wake=True
        )

    async def retry_job(self, job_id: str, tenant: str | None, budget: Budget | None) -> Job:
        planner = self.planner
        return await self._write(
            lambda changes: rules.retry_job(job_id, tenant, planner, budget, changes)
        )

    async def due_job_callbacks(self, now: float, limit: int) -> list[Job]:
        return [job_from_row(r) for r in await self._all("due_job_callbacks", now=now, limit=limit)]

    async def job_callback_result(self, job_id: str, state: str, next_at: float | None) -> None:
        params = {"id": job_id, "state": state, "next_at": next_at}
        await self._write(lambda _: count("job_callback_result", **params))
