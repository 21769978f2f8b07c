"""``Floodway``: the library entry point."""

from __future__ import annotations

import asyncio
import importlib
import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from floodway.clock import Clock, LedgerClock
from floodway.config import (
    KindConfig,
    ResourceConfig,
    Settings,
    load_settings,
    parse_duration,
    with_resources,
)
from floodway.core.errors import ConfigError, JobNotFound, TaskNotFound, WaitTimeout
from floodway.core.jobs import Job, JobRequest, JobStatus
from floodway.core.retry import RetryPolicy
from floodway.core.task import SubmitRequest, Submitted, Task
from floodway.core.upstream import first_poll_after
from floodway.kinds import (
    DEFAULTS,
    CostFn,
    FunctionPoller,
    Handler,
    KindRegistry,
    KindSpec,
    Lookup,
    Poll,
    Share,
    check_resource,
)
from floodway.limits.base import Admission
from floodway.maintenance.loop import Maintenance
from floodway.maintenance.sweeper import Sweeper
from floodway.providers.registry import aclose_kinds
from floodway.runtime import AlertHook, Runtime, StepPlanner
from floodway.store.base import (
    BatchCounts,
    BudgetUse,
    ReadyQuery,
    SpendQuery,
    SpendReport,
    Store,
    StoreStats,
    TaskEvent,
    TaskQuery,
    TaskTiming,
    WorkerInfo,
)
from floodway.store.factory import open_store
from floodway.store.openai_records import OpenAIRecords
from floodway.wire.jobs import job_json
from floodway.worker.worker import Worker, WorkerOptions


def _seconds(value: float | str | None) -> float | None:
    """A duration as the config writes it (``900``, ``"15m"``), in seconds."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ConfigError(f"{value!r} is not a duration: {exc}") from None


class Floodway:
    """One ledger, its kinds and limits. Submit, wait, cancel, retry; run workers.

    ``Floodway(database="sqlite:///floodway.db")`` or ``Floodway(config="floodway.toml")``.
    """

    def __init__(
        self,
        database: str | None = None,
        *,
        config: str | Path | None = None,
        settings: Settings | None = None,
        clock: Clock | None = None,
        policy: RetryPolicy | None = None,
        admission: Admission | None = None,
        on_dead: AlertHook | None = None,
        resources: Mapping[str, ResourceConfig | Mapping[str, Any]] | None = None,
    ) -> None:
        if settings is None:
            settings = load_settings(config, database=database)
        elif database is not None:
            settings = settings.model_copy(update={"database": database})
        if resources:
            settings = with_resources(settings, resources)
        self.settings = settings
        #: by default the ledger's time (a fleet shares it), read through this host's clock
        self.clock: Clock = clock or LedgerClock()
        self.kinds = KindRegistry()
        self._policy = policy or RetryPolicy()
        self._admission = admission
        self._alert_hooks: list[AlertHook] = [on_dead] if on_dead else []
        self._runtime: Runtime | None = None
        self._open_lock: asyncio.Lock | None = None
        self._workers: list[Worker] = []

    # -- declaring kinds -------------------------------------------------------------------------
    def kind(
        self,
        name: str,
        *,
        resource: str | None = None,
        max_attempts: int = DEFAULTS.max_attempts,
        deadline: float | str | None = DEFAULTS.deadline,
        timeout: float | str | None = DEFAULTS.timeout,
        cost: CostFn | None = None,
        version: str = DEFAULTS.version,
        dedupe: bool = bool(DEFAULTS.dedupe),
        share: Share = DEFAULTS.share,
        fallback: str | None = None,
        output_schema: dict[str, Any] | None = None,
        idempotent: bool = False,
        lookup: Lookup | None = None,
        retry_timeouts: bool = DEFAULTS.retry_timeouts,
        poll: Poll | None = None,
        poll_after: float | str | None = DEFAULTS.poll_after,
        poll_max_attempts: int = DEFAULTS.poll_max_attempts,
    ) -> Callable[[Handler], Handler]:
        """Declare a kind whose tasks run the decorated ``async def handler(ctx, input)``.

        The keywords are the keys of a ``[kinds.NAME]`` table (docs/configuration.md), and
        durations are written as there: seconds, or ``"15m"``, ``"500ms"``. A Python kind's
        calls are priced by its resource's ``price``.

        ``poll``: for a handler that starts upstream jobs and returns
        :class:`~floodway.core.outcome.Parked`, the function that looks at one job;
        the first look comes ``poll_after`` after the job started (None: after a low
        quantile of the kind's recent jobs' durations)."""

        def register(handler: Handler) -> Handler:
            check_resource(name, resource, self.settings.resources)
            self.kinds.add(
                KindSpec(
                    name=name,
                    handler=handler,
                    resource=resource,
                    max_attempts=max_attempts,
                    deadline_s=_seconds(deadline),
                    timeout_s=_seconds(timeout),
                    cost=cost,
                    version=version,
                    dedupe=dedupe,
                    share=share,
                    fallback=fallback,
                    output_schema=output_schema,
                    idempotent=idempotent,
                    lookup=lookup,
                    retry_timeouts=retry_timeouts,
                    poll=None
                    if poll is None
                    else FunctionPoller(poll, first_poll_after(_seconds(poll_after))),
                    poll_max_attempts=poll_max_attempts,
                )
            )
            return handler

        return register

    def on_dead(self, hook: AlertHook) -> AlertHook:
        """Register a callable run when a task becomes a dead letter: from the outbox, after
        the dead task's write, in the process that delivers the outbox (one per ledger, where
        maintenance runs: give every such process the same hooks)."""
        self._alert_hooks.append(hook)
        if self._runtime is not None:
            self._runtime.alert_hooks.append(hook)
        return hook

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            raise RuntimeError("Floodway is not open: use 'async with fw' or await fw.open()")
        return self._runtime

    @property
    def store(self) -> Store:
        return self.runtime.store

    @property
    def openai_records(self) -> OpenAIRecords:
        """The files and batches of the OpenAI-compatible Batch API."""
        return self.runtime.openai_records

    async def open(self) -> Floodway:
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._runtime is not None:
                return self
            self._load_config_kinds()
            self.kinds.check_resources(self.settings.resources)
            self.kinds.check_fallbacks()
            store = open_store(self.settings.database)
            await store.open()
            if isinstance(self.clock, LedgerClock):
                try:
                    await self.clock.follow(store.server_time)
                except BaseException:  # not opened after all: let go of the ledger
                    await store.close()
                    raise
            runtime = Runtime(
                store=store,
                openai_records=store,
                jobs=store,
                tier_records=store,
                kinds=self.kinds,
                clock=self.clock,
                admission=self._admission or self._build_admission(),
                policy=self._policy,
                alert_hooks=list(self._alert_hooks),
                settings=self.settings,
            )
            store.add_listener(runtime.hub.on_changes)
            store.plan_jobs(StepPlanner(runtime))
            try:
                await runtime.learn_turnarounds()
            except BaseException:  # not opened after all: let go of the ledger
                await store.close()
                raise
            self._runtime = runtime
        return self

    async def close(self) -> None:
        for worker in list(self._workers):
            await worker.stop(0)
        if self._runtime is not None:
            await self._runtime.hub.stop_following()
            await aclose_kinds(self.kinds)  # the adapters' pooled HTTP clients
            await self._runtime.admission.aclose()
            await self._runtime.store.close()
            self._runtime = None
        if isinstance(self.clock, LedgerClock):
            await self.clock.unfollow()

    async def __aenter__(self) -> Floodway:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _load_config_kinds(self) -> None:
        for name, cfg in self.settings.kinds.items():
            if name not in self.kinds:
                self.kinds.add(build_kind(name, cfg))

    def _build_admission(self) -> Admission:
        from floodway.limits.factory import build_admission

        return build_admission(self.settings, self.kinds, self.clock)

    # -- tasks -------------------------------------------------------------------------------
    async def submit(
        self,
        kind: str,
        input: Any,
        *,
        lane: str = "background",
        key: str | None = None,
        tenant: str = "default",
        max_attempts: int | None = None,
        deadline_s: float | None = None,
        metadata: dict[str, Any] | None = None,
        callback_url: str | None = None,
        tier: str | None = None,
    ) -> Task:
        """Queue a task and return it at once (``deduped`` if the same work already ran)."""
        request = SubmitRequest(
            kind,
            input,
            lane=lane,
            key=key,
            max_attempts=max_attempts,
            deadline_s=deadline_s,
            metadata=metadata,
            callback_url=callback_url,
            tier=tier,
        )
        return (await self.submit_request(request, tenant=tenant)).task

    async def submit_request(self, request: SubmitRequest, *, tenant: str = "default") -> Submitted:
        """Like :meth:`submit`, and says whether the request key matched an earlier task
        (``Submitted.reused``)."""
        await self.open()
        return (await self.runtime.submit([request], tenant=tenant))[0]

    async def submit_many(
        self,
        kind: str,
        inputs: list[Any],
        *,
        lane: str = "background",
        tenant: str = "default",
        max_attempts: int | None = None,
        deadline_s: float | None = None,
    ) -> list[Task]:
        """Queue many tasks of one kind in one transaction."""
        await self.open()
        requests = [
            SubmitRequest(kind, value, lane=lane, max_attempts=max_attempts, deadline_s=deadline_s)
            for value in inputs
        ]
        return [s.task for s in await self.runtime.submit(requests, tenant=tenant)]

    async def get(self, task_id: str, *, tenant: str | None = None) -> Task:
        await self.open()
        task = await self.runtime.store.get(task_id, tenant)
        if task is None:
            raise TaskNotFound(task_id)
        return task

    async def server_key(self, name: str, size: int) -> bytes:
        """The deployment's random key ``name`` (``size`` bytes), made on first use and the
        same for every process of the ledger."""
        return bytes.fromhex(await self.store.server_key(name, secrets.token_hex(size)))

    async def list_tasks(self, query: TaskQuery | None = None) -> list[Task]:
        await self.open()
        return await self.runtime.store.list_tasks(query or TaskQuery())

    async def events(self, task_id: str, after_seq: int = 0) -> list[TaskEvent]:
        """A task's status changes after ``after_seq``, oldest first."""
        await self.open()
        return await self.runtime.store.events(task_id, after_seq)

    async def stream_events(
        self, task_id: str, after: int = 0, limit: int = 1000
    ) -> list[tuple[int, str]]:
        """A streamed call's events numbered above ``after``, as they were kept: (seq, data)."""
        await self.open()
        return await self.runtime.store.read_stream(task_id, after, limit)

    async def queue_position(self, task_id: str, kind: str, horizon: int = 1000) -> int | None:
        """Where a ready task stands in its kind's dispatch order (1: next); None when it is
        not ready (running, ended, waiting on other work) or past ``horizon``."""
        await self.open()
        query = ReadyQuery((kind,), self.clock.now(), horizon)
        ids = [c.task_id for c in await self.runtime.store.ready(query)]
        return ids.index(task_id) + 1 if task_id in ids else None

    async def forget_result(self, task_id: str, *, tenant: str) -> bool:
        """Drop an ended task's result and streamed events (an OpenAI response deleted)."""
        await self.open()
        return await self.runtime.store.forget_result(task_id, tenant)

    def follow_changes(self) -> None:
        """Have this process hear other processes' writes for its waiters (the change feed)."""
        self.runtime.hub.follow(self.runtime.store)

    async def batch_counts(self, batch_id: str, *, tenant: str | None = None) -> dict[str, int]:
        """How many of a batch's tasks are in each status (no batch: none)."""
        await self.open()
        return await self.runtime.store.batch_counts(batch_id, tenant)

    async def workers(self, since: float) -> list[WorkerInfo]:
        """Every process's workers that said they live at ``since`` or later, with the tasks
        each holds (every tenant's: an operator's view)."""
        await self.open()
        return await self.runtime.store.workers(since)

    async def batches(self, *, tenant: str, limit: int = 50) -> list[BatchCounts]:
        """The tenant's newest batches, newest first, each one's tasks per status."""
        await self.open()
        return await self.runtime.store.batches(tenant, limit)

    async def stats(self, *, tenant: str | None = None) -> StoreStats:
        """Tasks per status and per kind: one tenant's, or (None) everyone's."""
        await self.open()
        return await self.runtime.store.stats(tenant)

    async def recent_timings(
        self, *, tenant: str | None = None, limit: int = 500
    ) -> list[TaskTiming]:
        """The newest ``limit`` tasks' timings (one tenant's, or everyone's), newest first."""
        await self.open()
        return await self.runtime.store.recent_timings(tenant, limit)

    async def spend(self, query: SpendQuery) -> SpendReport:
        """What was spent and saved per tenant and kind, in total and over time."""
        await self.open()
        return await self.runtime.store.spend(query)

    async def budget_use(self, tenant: str, since: float) -> BudgetUse:
        """A tenant's spend and holds since ``since`` (the start of its budget's period)."""
        await self.open()
        return await self.runtime.store.budget_use(tenant, since)

    async def wait(
        self, task_id: str, timeout: float | None = None, *, tenant: str | None = None
    ) -> Task:
        """Wait until the task is terminal. Woken by changes in this process at once, and by
        other processes' through the ledger's change feed (PostgreSQL's LISTEN, SQLite's
        data version): the task is read again only when it may have ended."""
        await self.open()
        give_up = None if timeout is None else self.clock.now() + timeout
        with self.runtime.hub.watch(task_id, ends_only=True) as watch:
            self.follow_changes()
            while True:
                watch.clear()
                task = await self.get(task_id, tenant=tenant)
                if task.terminal:
                    return task
                left = None if give_up is None else give_up - self.clock.now()
                if left is not None and left <= 0:
                    raise WaitTimeout(f"task {task_id} still {task.status.value} after {timeout}s")
                await watch.wait(self.clock, left)

    async def cancel(self, task_id: str, *, tenant: str | None = None) -> Task:
        """Cancel at once; a running task's call, sent already, is read to its end, recorded
        and billed, its slot held until then (the handler sees ``ctx.cancelled``)."""
        await self.open()
        task = await self.runtime.store.request_cancel(task_id, tenant, self.clock.now())
        for worker in self._workers:
            worker.cancel_local(task_id)
        return task

    async def retry(self, task_id: str, *, tenant: str | None = None) -> Task:
        """The manual back-edge: failed/dead/timeout -> queued with a fresh attempt budget."""
        await self.open()
        task = await self.get(task_id, tenant=tenant)  # its tenant's budget applies
        budget = self.runtime.pricing.budget_of(task.tenant)
        return await self.runtime.store.manual_retry(task_id, tenant, self.clock.now(), budget)

    # -- jobs --------------------------------------------------------------------------------
    async def submit_job(
        self,
        steps: list[dict[str, Any]],
        *,
        lane: str = "background",
        tenant: str = "default",
        deadline_s: float | None = None,
        metadata: dict[str, Any] | None = None,
        callback_url: str | None = None,
    ) -> dict[str, Any]:
        """Queue a multi-step job (docs/jobs.md) and return it at once, as
        ``GET /v1/jobs/{id}`` shows it: its first steps' tasks are queued with it."""
        await self.open()
        request = JobRequest(steps, lane, deadline_s, metadata, callback_url)
        return job_json(*await self.runtime.submit_job(request, tenant=tenant))

    async def get_job(self, job_id: str, *, tenant: str | None = None) -> dict[str, Any]:
        """A job: its status, each step's tasks and statuses, progress, result or error."""
        await self.open()
        found = await self.runtime.jobs.get_job(job_id, tenant)
        if found is None:
            raise JobNotFound(job_id)
        return job_json(*found)

    async def list_jobs(
        self,
        *,
        tenant: str,
        status: JobStatus | None = None,
        after_seq: int | None = None,
        limit: int = 100,
        descending: bool = False,
    ) -> list[Job]:
        """A tenant's jobs, oldest (or newest) first, after ``after_seq`` (a job's ``seq``)."""
        await self.open()
        return await self.runtime.jobs.list_jobs(tenant, status, after_seq, limit, descending)

    async def cancel_job(self, job_id: str, *, tenant: str | None = None) -> dict[str, Any]:
        """End a running job: what has not been sent is cancelled, a call in flight is read
        to its end and billed (as :meth:`cancel`), and no further step starts."""
        await self.open()
        asked = await self.runtime.jobs.cancel_job(job_id, tenant, self.clock.now())
        for worker in self._workers:
            for task_id in asked:
                worker.cancel_local(task_id)
        return await self.get_job(job_id, tenant=tenant)

    async def retry_job(self, job_id: str, *, tenant: str | None = None) -> dict[str, Any]:
        """Run a failed job again from where it failed: only its failed steps' tasks and what
        depends on them run; what succeeded is kept (and never billed again)."""
        await self.open()
        job = await self.get_job(job_id, tenant=tenant)
        budget = self.runtime.pricing.budget_of(job["tenant"])
        await self.runtime.jobs.retry_job(job_id, tenant, budget)
        return await self.get_job(job_id, tenant=tenant)

    async def wait_job(
        self, job_id: str, timeout: float | None = None, *, tenant: str | None = None
    ) -> dict[str, Any]:
        """Wait until the job has ended: woken by its end as :meth:`wait` is by a task's."""
        await self.open()
        give_up = None if timeout is None else self.clock.now() + timeout
        with self.runtime.hub.watch(job_id) as watch:
            self.follow_changes()
            while True:
                watch.clear()
                job = await self.get_job(job_id, tenant=tenant)
                if job["status"] != JobStatus.RUNNING:
                    return job
                left = None if give_up is None else give_up - self.clock.now()
                if left is not None and left <= 0:
                    raise WaitTimeout(f"job {job_id} still running after {timeout}s")
                await watch.wait(self.clock, left)

    # -- running -----------------------------------------------------------------------------
    @asynccontextmanager
    async def worker(
        self,
        concurrency: int | None = None,
        *,
        maintenance: bool = True,
        grace_s: float | None = None,
    ) -> AsyncIterator[Worker]:
        """Run workers (and the maintenance loop) in this process while the block runs."""
        await self.open()
        cfg = self.settings.worker
        worker = Worker(
            self.runtime,
            WorkerOptions.from_config(
                cfg,
                concurrency=concurrency or cfg.concurrency,
                grace_s=cfg.grace if grace_s is None else grace_s,
            ),
        )
        maint = Maintenance(self.runtime, workers=(worker.owner,)) if maintenance else None
        # A restarted process reconciles what dead processes left at once, not at the next
        # sweep of whoever leads.
        await Sweeper(self.runtime).recover()
        await worker.start()
        self._workers.append(worker)
        if maint is not None:
            maint.start()
        try:
            yield worker
        finally:
            if maint is not None:
                await maint.stop()
            await worker.stop(grace_s)
            self._workers.remove(worker)


def build_kind(name: str, cfg: KindConfig) -> KindSpec:
    """A kind declared in the config file."""
    if cfg.adapter == "python":
        if not cfg.handler or ":" not in cfg.handler:
            raise ConfigError(f"kinds.{name}.handler: give 'module:function' for adapter python")
        module_name, _, attr = cfg.handler.partition(":")
        try:
            handler = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"kinds.{name}.handler: cannot load {cfg.handler!r}: {exc}") from None
        return KindSpec(
            name=name,
            handler=handler,
            resource=cfg.resource,
            max_attempts=cfg.max_attempts,
            deadline_s=cfg.deadline,
            timeout_s=cfg.timeout,
            retry_timeouts=cfg.retry_timeouts,
            version=cfg.version,
            dedupe=bool(cfg.dedupe),
            share=cfg.share,
            fallback=cfg.fallback,
            output_schema=cfg.output_schema,
        )
    from floodway.providers.registry import build_provider_kind

    return build_provider_kind(name, cfg)
