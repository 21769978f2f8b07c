"""The parts every worker, maintenance loop and API share, wired once per ``Floodway``."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from floodway.clock import Clock, stop_task, wait_event
from floodway.config import Settings
from floodway.context import Context
from floodway.core.errors import (
    AdmissionRefused,
    FloodwayError,
    InvalidInput,
    InvalidJob,
)
from floodway.core.hangup import CallTimes
from floodway.core.jobs import (
    JOB_PREFIX,
    Job,
    JobRequest,
    JobState,
    JobStatus,
    Start,
    next_moves,
    parse_job,
    work_key,
)
from floodway.core.outcome import Cancelled, Completion, Failed, Outcome
from floodway.core.retry import RetryPolicy
from floodway.core.spend import Charge, Usage
from floodway.core.states import TERMINAL, Status
from floodway.core.task import (
    Lane,
    NewTask,
    SubmitRequest,
    Submitted,
    Task,
    batch_hash,
    new_id,
    request_hash,
)
from floodway.core.tiers import RECENT, BatchLine
from floodway.core.validation import (
    check_attempts,
    check_callback_host,
    check_deadline,
    check_input,
    check_tier,
)
from floodway.kinds import KindRegistry
from floodway.limits.base import Admission
from floodway.limits.submit_rate import SubmitRateLimiter
from floodway.pricing import Pricing
from floodway.store.base import BatchKey, OpenAIBatch, Store, TaskChange
from floodway.store.jobs import JobRecords
from floodway.store.openai_records import OpenAIRecords
from floodway.store.tier_records import TierRecords

log = logging.getLogger("floodway")
#: the follower's look at the ledger when the feed says nothing this long (a lost notice)
FOLLOW_IDLE_S = 1.0

AlertHook = Callable[[Task], Awaitable[None] | None]


@dataclass(frozen=True)
class Gate:
    """What a submit from outside the process passes on top of every submit's checks: the
    hosts a callback may name (``api.callback_hosts``; none: any) and the tenant's submit rate,
    one token per request (a batch is one request)."""

    callback_hosts: Sequence[str] = ()
    rate: SubmitRateLimiter | None = None

    async def admit(self, tenant: str, rate: str) -> None:
        wait = None if self.rate is None else await self.rate.check(tenant)
        if wait is not None:
            raise AdmissionRefused(
                "submit_rate",
                f"too fast: tenant {tenant!r} is over its submit rate ({rate}); "
                f"try again in {wait:.1f}s",
                retry_after=wait,
            )


@dataclass(frozen=True)
class BatchOf:
    """The batch a submit's tasks belong to: its id, its request key (the same key with
    another list of tasks is a conflict), the OpenAI batch row written with them, and how a
    refusal of its ``i``-th request reaches the caller (an OpenAI batch names the line)."""

    id: str
    key: str | None = None
    openai: OpenAIBatch | None = None
    refuse_item: Callable[[int, FloodwayError], Exception] | None = None


class Watch:
    """A waiter's wake-up for some tasks' (or a job's) changes. The one way to wait for a
    change without missing it: watch first, then, in a loop, :meth:`clear`, read the state,
    and :meth:`wait` if it is not what is awaited. A change made while the read runs sets the
    watch again; a watch made after the read would miss it, and its waiter would sleep until
    its timeout.

    ``ends_only``: woken only by an end (a terminal status), as the change feed wakes it for
    other processes' writes: a waiter for a result does not read the task again when it is
    merely claimed."""

    def __init__(self, hub: ChangeHub, *, ends_only: bool = False) -> None:
        self.hub = hub
        self.ends_only = ends_only
        self.changed = asyncio.Event()
        self.ids: set[str] = set()

    def add(self, task_id: str) -> None:
        """Watch one more task: before reading it."""
        if task_id not in self.ids:
            self.ids.add(task_id)
            self.hub.add_watch(task_id, self)

    def clear(self) -> None:
        self.changed.clear()

    async def wait(self, clock: Clock, timeout: float | None) -> bool:
        """Until a watched change (True) or ``timeout`` seconds on ``clock`` (None: none)."""
        if timeout is None:
            await self.changed.wait()
            return True
        return await wait_event(clock, self.changed, timeout)

    def close(self) -> None:
        for task_id in self.ids:
            self.hub.drop_watch(task_id, self)
        self.ids.clear()
        self.hub.drop_remote(self)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class ChangeHub:
    """Fans the store's change notes out to whoever waits in this process: this process's
    own writes at once, other processes' through the store's change feed (:meth:`follow`)."""

    def __init__(self) -> None:
        self.work_available = asyncio.Event()
        self._task_waiters: dict[str, set[Watch]] = {}
        self._any: set[asyncio.Event] = set()
        self._remote: set[Watch] = set()
        self._follower: asyncio.Task[None] | None = None
        self._someone_waits = asyncio.Event()

    def on_changes(self, changes: Sequence[TaskChange]) -> None:
        for change in changes:
            if change.status in (Status.QUEUED, Status.RETRYING):
                self.work_available.set()
            ended = change.status in TERMINAL
            for watch in self._task_waiters.get(change.task_id, ()):
                if ended or not watch.ends_only:
                    watch.changed.set()
        for event in self._any:
            event.set()

    def watch(self, *task_ids: str, ends_only: bool = False, remote: bool = False) -> Watch:
        """A :class:`Watch` of ``task_ids`` (more may be added), registered now: before
        the caller reads them. ``remote``: also woken by every notice of another process's
        write (:meth:`follow` must run)."""
        watch = Watch(self, ends_only=ends_only)
        for task_id in task_ids:
            watch.add(task_id)
        if remote:
            self._remote.add(watch)
            self._someone_waits.set()
        return watch

    def add_watch(self, task_id: str, watch: Watch) -> None:
        self._task_waiters.setdefault(task_id, set()).add(watch)
        self._someone_waits.set()

    def drop_watch(self, task_id: str, watch: Watch) -> None:
        waiters = self._task_waiters.get(task_id)
        if waiters is not None:
            waiters.discard(watch)
            if not waiters:
                del self._task_waiters[task_id]

    def drop_remote(self, watch: Watch) -> None:
        self._remote.discard(watch)

    def watching(self) -> int:
        """How many watches are registered (each a waiter to wake), for tasks or remote."""
        return sum(len(w) for w in self._task_waiters.values()) + len(self._remote)

    def follow(self, store: Store) -> None:
        """Hear other processes' writes for this process's waiters, from now until
        :meth:`stop_following`: one loop per process reads, after each notice of the feed,
        which of the waited-for tasks ended (one read for all of them), and wakes theirs;
        an event stream's watchers (:meth:`watch_all`) wake on every notice."""
        if self._follower is None or self._follower.done():
            self._follower = asyncio.create_task(self._follow(store), name="floodway-follow")

    async def stop_following(self) -> None:
        follower, self._follower = self._follower, None
        await stop_task(follower)

    async def _follow(self, store: Store) -> None:
        feed = store.subscribe()
        while True:
            if not self._task_waiters and not self._any and not self._remote:
                self._someone_waits.clear()
                await self._someone_waits.wait()
            try:
                changed = await feed.wait(FOLLOW_IDLE_S)
                ids = list(self._task_waiters)
                ended = await store.ended(ids) if ids else set()
            except Exception as exc:  # the ledger is away: look again shortly
                log.warning("following the ledger's changes failed: %s", exc)
                await asyncio.sleep(FOLLOW_IDLE_S)
                continue
            for task_id in ended:
                for watch in self._task_waiters.get(task_id, ()):
                    watch.changed.set()
            if changed:
                for event in self._any:
                    event.set()
                for watch in self._remote:
                    watch.changed.set()

    def watch_all(self) -> asyncio.Event:
        event = asyncio.Event()
        self._any.add(event)
        self._someone_waits.set()
        return event

    def unwatch_all(self, event: asyncio.Event) -> None:
        self._any.discard(event)


@dataclass(frozen=True)
class StepPlanner:
    """The ledger's maker of a job's next tasks (:class:`~floodway.store.base.JobPlanner`)."""

    runtime: Runtime

    @property
    def max_items(self) -> int:
        return self.runtime.settings.jobs.max_items

    def now(self) -> float:
        return self.runtime.clock.now()

    def task(self, job: Job, start: Start) -> NewTask:
        return self.runtime.step_task(job, start)


@dataclass
class UpstreamCounts:
    """What this process saw of the providers: calls, 429s, 5xx, and polls that found
    the job unfinished. Per process, since start."""

    calls: int = 0
    throttled: int = 0
    server_errors: int = 0
    polls: int = 0
    idle_polls: int = 0

    def record(self, outcome: Outcome) -> None:
        if isinstance(outcome, Cancelled):
            return
        self.calls += 1
        if isinstance(outcome, Failed):
            status = outcome.upstream_status
            if outcome.throttled or status == 429:
                self.throttled += 1
            elif status is not None and status >= 500:
                self.server_errors += 1

    def record_poll(self, finished: bool) -> None:
        self.polls += 1
        self.idle_polls += not finished

    def as_dict(self) -> dict[str, float]:
        return {
            "calls": self.calls,
            "throttled": self.throttled,
            "server_errors": self.server_errors,
            "throttle_rate": self.throttled / self.calls if self.calls else 0.0,
            "server_error_rate": self.server_errors / self.calls if self.calls else 0.0,
            "polls": self.polls,
            "poll_idle_ratio": self.idle_polls / self.polls if self.polls else 0.0,
        }


@dataclass
class Runtime:
    """What one open :class:`~floodway.Floodway` shares with its workers, maintenance and API:
    the ledger, the kinds, the clock, the limits, the retry policy and the settings, plus this
    process's change hub and counters. It runs nothing itself."""

    store: Store
    #: the same ledger's records of the OpenAI-compatible Batch API
    openai_records: OpenAIRecords
    #: the same ledger's multi-step jobs
    jobs: JobRecords
    #: the same ledger's lines and provider batches of the batch tier
    tier_records: TierRecords
    kinds: KindRegistry
    clock: Clock
    admission: Admission
    settings: Settings
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    hub: ChangeHub = field(default_factory=ChangeHub)
    upstream_counts: UpstreamCounts = field(default_factory=UpstreamCounts)
    #: outbound callbacks this process delivered, retried or gave up on, since start
    callbacks_out: Counter[str] = field(default_factory=Counter)
    alert_hooks: list[AlertHook] = field(default_factory=list)
    #: how long each kind's recent calls took: the bound a new attempt is marked with
    call_times: CallTimes = field(default_factory=CallTimes)

    @property
    def pricing(self) -> Pricing:
        return Pricing(self.settings)

    def call_bounds(self) -> tuple[tuple[str, float], ...]:
        """(kind, seconds) for each kind: how long a call of it may run at the provider, at
        the longest, from what this process has seen (``core.hangup.call_bound_s``)."""
        return tuple(
            (s.name, self.call_times.bound_s(s.name, s.longest_call_s)) for s in self.kinds.specs()
        )

    async def learn_turnarounds(self) -> None:
        """Each batch-tier kind's recent provider batches, as the ledger kept their
        turnarounds: a process starts judging the batch tier from what was learned before
        it, not from the configured estimate."""
        learned = await self.tier_records.learned_turnarounds(RECENT)
        for spec in self.kinds.specs():
            if spec.tiers.batch is not None:
                for seconds in learned.get(spec.name, ()):
                    spec.tiers.times.observe("batch", seconds)

    async def submit(
        self,
        requests: Sequence[SubmitRequest],
        *,
        tenant: str = "default",
        gate: Gate | None = None,
        batch: BatchOf | None = None,
        overflow: bool = False,
    ) -> list[Submitted]:
        """The one way work enters the ledger, from the library and every route: each request
        checked and its cost estimated and priced, then the gate's submit-rate token (a refused
        request spends none), then one write of them all (all land or none do).

        ``overflow``: past the tenant's ``interactive_depth`` the tasks go in the background
        lane instead of being refused (their request key means the same in either lane),
        decided with each task's insert."""
        # A loop, not a comprehension: one would make these arguments cells of this frame,
        # objects the garbage collector walks for as long as the write is pending.
        news = []
        for i, r in enumerate(requests):
            news.append(self._new_task(i, r, tenant, gate, batch, overflow))
        if gate is not None:
            await gate.admit(tenant, self.settings.tenants.submit_rate)
        batch_key = None
        if batch is not None and batch.key is not None:
            batch_key = BatchKey(batch.key, batch_hash(requests), self.settings.retention.keys)
        return await self._write(news, batch, batch_key)

    async def submit_job(
        self, request: JobRequest, *, tenant: str = "default", gate: Gate | None = None
    ) -> tuple[Job, JobState]:
        """A job enters the ledger the way a task does: checked first (its definition, then
        each first step's task as a submit checks it), then the gate's one token, then one
        write of the job and its first steps' tasks under the tenant's budget."""
        settings = self.settings.jobs
        spec = parse_job(request.steps, self.kinds, settings.max_steps, settings.max_items)
        lane = checked_envelope(
            request.lane, request.deadline_s, request.metadata, request.callback_url, gate
        )
        now = self.clock.now()
        job = Job(
            id=new_id(now, prefix=JOB_PREFIX.removesuffix("_")),
            tenant=tenant,
            status=JobStatus.RUNNING,
            lane=lane,
            spec=spec,
            created_at=now,
            updated_at=now,
            deadline_s=request.deadline_s,
            deadline_at=None if request.deadline_s is None else now + request.deadline_s,
            metadata=dict(request.metadata or {}),
            callback_url=request.callback_url,
        )
        first = next_moves(spec, JobState(), now, job.deadline_at, settings.max_items)
        for start in first.start:
            try:
                self.step_task(job, start)
            except FloodwayError as exc:
                raise InvalidJob(start.step, str(exc)) from None
        if gate is not None:
            await gate.admit(tenant, self.settings.tenants.submit_rate)
        return await self.jobs.submit_job(job, self.pricing.budget_of(tenant))

    def step_task(self, job: Job, start: Start) -> NewTask:
        """A job's step as a task: checked as a submit is, in the job's lane, under the
        step's work key (the same for the same step of the job, whoever writes it)."""
        spec = job.spec.step(start.step)
        request = SubmitRequest(
            spec.kind,
            start.input,
            lane=job.lane,
            deadline_s=start.deadline_s,
            metadata={"job_id": job.id, "step": start.step, "index": start.index},
        )
        new = self._checked(request, job.tenant, None, None)
        # One request, the job: a later step is not refused for the tenant's depth, and it
        # ranks in its lane as of the job's submit, so the jobs submitted first end first.
        return dataclasses.replace(
            new,
            fingerprint=work_key(job.id, start.step, start.index),
            interactive_depth=0,
            replay=True,
            rank_at=job.created_at,
        )

    def _write(
        self, news: list[NewTask], batch: BatchOf | None, batch_key: BatchKey | None
    ) -> Awaitable[list[Submitted]]:
        """The store's write of ``news`` (not a coroutine of its own: one less object per
        pending submit)."""
        now = self.clock.now()
        if batch is not None and batch.openai is not None:
            return self.openai_records.submit_openai_batch(batch.openai, news, now)
        return self.store.submit(news, now, batch_key=batch_key)

    def _new_task(
        self,
        index: int,
        request: SubmitRequest,
        tenant: str,
        gate: Gate | None,
        batch: BatchOf | None,
        overflow: bool,
    ) -> NewTask:
        try:
            new = self._checked(request, tenant, gate, None if batch is None else batch.id)
        except FloodwayError as exc:
            if batch is None or batch.refuse_item is None:
                raise
            raise batch.refuse_item(index, exc) from None
        return dataclasses.replace(new, overflow=overflow) if overflow else new

    def _checked(
        self, request: SubmitRequest, tenant: str, gate: Gate | None, batch_id: str | None
    ) -> NewTask:
        """What the store inserts for ``request``; raises on bad input before anything is
        written or counted."""
        spec = self.kinds.get(request.kind)
        value = request.input
        check_input(value)
        lane = checked_envelope(
            request.lane, request.deadline_s, request.metadata, request.callback_url, gate
        )
        check_attempts(request.max_attempts)
        try:
            cost = spec.estimate(value)
        except Exception as exc:
            # A cost function is user code run on caller input (``len(inp["text"])``):
            # whatever it raises on input it does not expect is the caller's error.
            raise InvalidInput(
                f"kind {request.kind!r} cannot estimate the cost of this input: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        self.check_fits(spec.resource, cost)
        check_tier(
            request.tier, spec.tiers.offered, spec.name, interactive=lane is Lane.INTERACTIVE
        )
        key = request.key
        pricing = self.pricing
        return NewTask(
            kind=request.kind,
            input=value,
            tenant=tenant,
            lane=lane,
            max_attempts=spec.max_attempts
            if request.max_attempts is None
            else request.max_attempts,
            deadline_s=spec.deadline_s if request.deadline_s is None else request.deadline_s,
            request_key=key,
            key_ttl_s=self.settings.retention.keys,
            fingerprint=spec.work_print(value, tenant),
            cost_estimated=cost,
            spend_hold=pricing.hold(request.kind, spec.resource, cost),
            budget=pricing.budget_of(tenant),
            metadata=dict(request.metadata or {}),
            callback_url=request.callback_url,
            batch_id=batch_id,
            tier=request.tier,
            interactive_depth=self.settings.tenants.interactive_depth,
            # Compared only when a request key matches: a submit without one skips the hash.
            request_hash="" if key is None else request_hash(request),
            replay=spec.replays_result(value) if request.replay is None else request.replay,
            batch_by=None if spec.tiers.batch is None else spec.tiers.batch_by(self.clock.now()),
        )

    def decide(
        self,
        task: Task,
        outcome: Outcome,
        now: float,
        billed: Usage | None,
        rng: random.Random | None = None,
    ) -> Completion:
        """The retry policy's write for ``outcome``, with what the provider billed priced."""
        item = self.policy.decide(task, outcome, now, rng)
        charge = self.charge(task, billed)
        return item if charge is None else dataclasses.replace(item, charge=charge)

    def charge(self, task: Task, billed: Usage | None) -> Charge | None:
        """What a call of ``task`` that billed ``billed`` cost (None: it billed nothing)."""
        if billed is None:
            return None
        resource = self.kinds.get(task.kind).resource
        return self.pricing.charge(task.kind, resource, billed)

    def context(self, task: Task) -> Context:
        """The handler's view of one attempt of ``task`` (claimed: it holds the lease)."""
        token = task.lease_token

        async def record_ref(ref: str) -> bool:
            if token is None:
                return False
            return await self.store.set_upstream_ref(task.id, token, ref, self.clock.now())

        async def append_events(first: int, events: list[str], request_id: str | None) -> None:
            await self.store.append_stream(
                task.id, task.tenant, first, events, self.clock.now(), request_id
            )

        lines = None
        if self.kinds.get(task.kind).tiers.offered != ("sync",):
            lines = TaskLines(self.tier_records, task, self.clock)
        return Context(task, self.clock, record_ref, append_events, lines)

    def check_fits(self, resource: str | None, cost: float) -> None:
        self.admission.check_fits(resource, cost)


@dataclass(frozen=True)
class TaskLines:
    """A task's :class:`~floodway.context.LineBook`: its line in the ledger."""

    records: TierRecords
    task: Task
    clock: Clock

    async def get(self) -> BatchLine | None:
        return await self.records.get_line(self.task.id)

    async def add(self, model: str, body: dict[str, object], batch_by: float) -> BatchLine | None:
        task, now = self.task, self.clock.now()
        return await self.records.add_line(
            task.id, task.kind, model, body, task.deadline_at, now, batch_by
        )

    async def withdraw(self) -> None:
        await self.records.withdraw_queued([self.task.id], self.clock.now())

    async def requeue(self, batch_by: float) -> bool:
        return await self.records.requeue_line(self.task.id, self.clock.now(), batch_by)

    async def set_tier(self, tier: str) -> None:
        await self.records.set_tier(self.task.id, tier)


def checked_envelope(
    lane: str,
    deadline_s: float | None,
    metadata: object,
    callback_url: str | None,
    gate: Gate | None,
) -> Lane:
    """What a task's and a job's submit check alike: the lane (returned as a :class:`Lane`),
    the deadline, the metadata as JSON and, through an API's gate, the callback's host."""
    try:
        checked = Lane(lane)
    except ValueError:
        raise InvalidInput(f"lane must be 'interactive' or 'background', not {lane!r}") from None
    check_deadline(deadline_s)
    if metadata is not None:
        try:
            check_input(metadata)
        except InvalidInput as exc:
            raise InvalidInput(f"metadata: {exc}") from None
    if gate is not None and callback_url is not None:
        check_callback_host(callback_url, gate.callback_hosts)
    return checked
