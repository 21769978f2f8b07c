"""The store seam: what the rest of floodway asks of a ledger, named by domain verbs.

Every verb takes ``now`` from the caller's clock (never the database's), so a fake clock
reaches SQL. Every status write is a compare-and-set on (status, lease token) and checks the
states table first; result and status land in one transaction. The rules behind the verbs are
written once (:mod:`floodway.store.rules`); the two backends run them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from floodway.core.jobs import Job, Start
from floodway.core.outcome import Applied, Completion, Effect, Succeeded
from floodway.core.spend import Budget, Charge
from floodway.core.states import TERMINAL, Status
from floodway.core.task import Candidate, Lane, NewTask, Submitted, Task


@dataclass(frozen=True)
class BatchKey:
    """The request key of a whole batch: the same key with another list of tasks is a
    conflict, not a mix of old and new tasks."""

    key: str
    request_hash: str
    ttl_s: float


@dataclass(frozen=True)
class ClaimParams:
    owner: str
    token: str
    kinds: tuple[str, ...]
    limit: int
    now: float
    lease_s: float
    #: claim exactly these (chosen by admission control); None = the next ``limit`` ready tasks
    ids: tuple[str, ...] | None = None
    #: (kind, seconds): how long a call of the kind may run at the provider, at the longest;
    #: each attempt claimed is marked to have ended by then (a kind not named: by its timeout)
    bounds: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class ReadyQuery:
    """Up to ``limit`` ready tasks of each tenant that has some, in dispatch order."""

    kinds: tuple[str, ...]
    now: float
    limit: int


@dataclass(frozen=True)
class TaskQuery:
    tenant: str | None = None
    status: Status | None = None
    kind: str | None = None
    lane: Lane | None = None
    batch_id: str | None = None
    #: keyset pagination: the ``seq`` of the previous page's last task (in the listing's order)
    after_seq: int | None = None
    limit: int = 100
    #: newest first (``seq`` falling) instead of oldest first
    descending: bool = False


@dataclass(frozen=True)
class HeartbeatResult:
    lost: tuple[str, ...] = ()  # leases we no longer hold: stop writing for these
    cancel_requested: tuple[str, ...] = ()


@dataclass(frozen=True)
class Retention:
    now: float
    result_ttl_s: float
    row_ttl_s: float


@dataclass(frozen=True)
class Purged:
    results_cleared: int = 0
    rows_deleted: int = 0
    keys_expired: int = 0


@dataclass(frozen=True)
class TaskEvent:
    seq: int
    task_id: str
    status: Status
    at: float
    attempt: int
    detail: str = ""


@dataclass(frozen=True)
class StoreStats:
    by_status: dict[str, int] = field(default_factory=dict)
    by_kind_status: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskTiming:
    """A task as the recent-timings views read it: no input, result or metadata, which a look
    at hundreds of tasks every few seconds would parse for nothing."""

    id: str
    kind: str
    status: Status
    #: its error's type ("" when it has none)
    error_type: str
    attempts: int
    created_at: float
    started_at: float | None
    finished_at: float | None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class WorkerTask:
    """A task whose lease a worker holds."""

    task_id: str
    kind: str
    tenant: str
    attempt: int
    since: float | None  # when this attempt was claimed


@dataclass(frozen=True)
class WorkerInfo:
    """A worker as it last said (:meth:`Store.worker_beat`), with the tasks it holds."""

    owner: str  # the lease owner its tasks carry
    host: str
    pid: int
    concurrency: int
    kinds: tuple[str, ...]
    started_at: float
    heartbeat_at: float
    tasks: tuple[WorkerTask, ...] = ()


@dataclass(frozen=True)
class BatchCounts:
    batch_id: str
    created_at: float  # its first task's
    counts: dict[str, int]  # tasks per status


@dataclass(frozen=True)
class SpendQuery:
    """The spend ledger since ``since``: one tenant's (None: everyone's), one kind's (None:
    all), summed per tenant and kind, and per ``bucket_s`` of time (None: no series)."""

    since: float
    tenant: str | None = None
    kind: str | None = None
    bucket_s: float | None = None


@dataclass(frozen=True)
class SpendLine:
    tenant: str
    kind: str
    cost: float
    saved: float
    input_tokens: float
    output_tokens: float
    images: float
    calls: int  # billed calls
    deduped: int  # tasks that took another's result instead of a call
    over_estimate: float  # what calls billed above the holds their tasks were admitted at
    tier_saved: float = 0.0  # what the batch and flex tiers saved against the sync price


@dataclass(frozen=True)
class DueEffect:
    """An effect of a completion waiting in the outbox: ``seq`` names it to
    :meth:`Store.effect_done` and :meth:`Store.effect_retry`."""

    seq: int
    effect: Effect
    attempts: int  # deliveries tried before
    task: Task  # as it is now


@dataclass(frozen=True)
class SpendPoint:
    at: float  # the bucket's start
    tenant: str
    kind: str
    cost: float
    saved: float


@dataclass(frozen=True)
class SpendReport:
    lines: tuple[SpendLine, ...] = ()
    series: tuple[SpendPoint, ...] = ()


@dataclass(frozen=True)
class BudgetUse:
    """What a tenant spent since its period began, and what its unfinished tasks hold."""

    spent: float
    held: float


@dataclass(frozen=True)
class TaskChange:
    task_id: str
    status: Status
    tenant: str


@dataclass(frozen=True)
class Leader:
    owner: str
    expires_at: float


ChangeListener = Callable[[Sequence[TaskChange]], None]


class JobPlanner(Protocol):
    """What turns a job's next step into a task: the kind's defaults, cost and price (the
    runtime's: the ledger knows no kinds), and the time it is written at."""

    @property
    def max_items(self) -> int:
        """The most tasks one ``for_each`` step may fan out to."""
        ...

    def now(self) -> float: ...

    def task(self, job: Job, start: Start) -> NewTask:
        """The step's task; raises a FloodwayError for an input its kind refuses."""
        ...


class ChangeReader(Protocol):
    async def wait(self, timeout: float) -> bool:
        """True once another process may have written since this reader's last call."""
        ...


@dataclass(frozen=True)
class StoredFile:
    """A file of the OpenAI-compatible Batch API (its content is read apart)."""

    id: str
    tenant: str
    purpose: str
    filename: str
    bytes: int
    created_at: float


@dataclass(frozen=True)
class OpenAIBatch:
    """An OpenAI-compatible batch: a floodway batch of the same id, and what OpenAI's batch
    object says beyond its tasks' counts."""

    id: str
    tenant: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    total: int
    created_at: float
    expires_at: float
    metadata: dict[str, Any] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    cancelling_at: float | None = None
    ended_at: float | None = None


class Store(Protocol):
    """A durable ledger of tasks. Implementations: SQLite (embedded), PostgreSQL (fleet)."""

    url: str
    #: this process's identity on the ledger (:mod:`floodway.core.owners`); from open to close
    #: the store holds its liveness lock, which the operating system (SQLite) or the database
    #: server (PostgreSQL) frees when the process dies, whatever kills it
    identity: str

    async def open(self) -> None:
        """Connect and apply pending migrations."""
        ...

    async def close(self) -> None: ...

    def add_listener(self, listener: ChangeListener) -> None:
        """Called (in the event loop) after each committed write with the changes it made."""
        ...

    async def wait_for_change(self, timeout: float) -> bool:
        """Block until another process may have written (or ``timeout``); True on a change."""
        ...

    async def server_time(self) -> float | None:
        """The ledger server's clock, which the processes sharing the ledger keep to
        (:class:`floodway.clock.LedgerClock`); None: the ledger is on this host."""
        ...

    def subscribe(self) -> ChangeReader:
        """A reader of the ledger's changes with a place of its own: it hears every change
        whoever else reads them (the dispatcher's :meth:`wait_for_change` included)."""
        ...

    async def append_stream(
        self,
        task_id: str,
        tenant: str,
        first: int,
        events: Sequence[str],
        now: float,
        request_id: str | None = None,
    ) -> None:
        """Add a streamed call's next events (numbered from ``first``); the task's waiters here
        and in other processes hear of it. ``request_id``: the provider's id of the stream's
        answer, kept with the task from then on."""
        ...

    async def read_stream(self, task_id: str, after: int, limit: int) -> list[tuple[int, str]]:
        """The task's streamed events numbered above ``after``, in order: ``(seq, data)``."""
        ...

    async def forget_result(self, task_id: str, tenant: str) -> bool:
        """Drop an ended task's result and streamed events (an OpenAI response deleted);
        False when the tenant has no such ended task."""
        ...

    async def ended(self, task_ids: Sequence[str]) -> set[str]:
        """Which of ``task_ids`` are terminal (one read for a whole set of waiters); a job's id
        among them is there once the job ended."""
        ...

    # -- submit and read -------------------------------------------------------------------
    async def submit(
        self, new: Sequence[NewTask], now: float, *, batch_key: BatchKey | None = None
    ) -> list[Submitted]:
        """Insert tasks (one transaction). Applies the request key (same key -> same task,
        other body -> IdempotencyConflict), the work fingerprint (succeeded -> ``deduped``,
        in flight -> waits for it, lending it its urgency) and the per-tenant interactive
        depth limit."""
        ...

    async def get(self, task_id: str, tenant: str | None = None) -> Task | None: ...

    async def list_tasks(self, query: TaskQuery) -> list[Task]: ...

    async def recent_timings(self, tenant: str | None, limit: int) -> list[TaskTiming]:
        """The newest ``limit`` tasks (of ``tenant``, or everyone's), newest first."""
        ...

    async def events(self, task_id: str, after_seq: int = 0) -> list[TaskEvent]: ...

    async def stats(self, tenant: str | None = None) -> StoreStats:
        """Tasks per kind and status: one tenant's, or (None) everyone's."""
        ...

    async def batch_counts(self, batch_id: str, tenant: str | None) -> dict[str, int]:
        """Tasks of a batch per status (empty: no such batch for this tenant)."""
        ...

    async def batches(self, tenant: str, limit: int) -> list[BatchCounts]:
        """The tenant's ``limit`` newest batches (by their newest task), newest first."""
        ...

    async def spend(self, query: SpendQuery) -> SpendReport:
        """The spend ledger: what billed calls cost and what dedupe saved."""
        ...

    async def budget_use(self, tenant: str, since: float) -> BudgetUse: ...

    # -- the worker's hot path ----------------------------------------------------------
    async def ready(self, query: ReadyQuery) -> list[Candidate]:
        """Ready tasks, up to ``query.limit`` per tenant, in dispatch order (interactive first,
        then oldest), without claiming: admission control picks from these."""
        ...

    async def claim(self, params: ClaimParams) -> list[Task]:
        """queued/retrying -> running in one statement; counts the attempt; sets the lease."""
        ...

    async def complete(self, items: Sequence[Completion], now: float) -> list[Applied]:
        """Compare-and-set many status writes in one transaction. A running task's write that
        finds the task ended meanwhile with its attempt still open under the same lease closes
        that attempt (:attr:`Applied.closed`)."""
        ...

    async def heartbeat(
        self, leases: Sequence[tuple[str, str]], now: float, lease_s: float
    ) -> HeartbeatResult:
        """Extend the leases given as (task_id, lease_token); report the ones we lost."""
        ...

    async def worker_beat(self, worker: WorkerInfo, now: float, stale_s: float) -> None:
        """Record that ``worker`` lives at ``now`` (its row written the first time); forget
        the workers whose last beat is older than ``stale_s``."""
        ...

    async def worker_gone(self, owner: str) -> None:
        """The worker stopped: its row goes."""
        ...

    async def workers(self, since: float) -> list[WorkerInfo]:
        """The workers that beat at ``since`` or later, each with the tasks it holds."""
        ...

    async def set_upstream_ref(self, task_id: str, lease_token: str, ref: str, now: float) -> bool:
        """Record the upstream job id durably before waiting on it."""
        ...

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
        """Leave a running task waiting on upstream job ``ref`` without a worker or a lease
        (a durable timer): it is woken at ``poll_at`` by :meth:`claim_parked`, or completed
        by a webhook with ``Completion(parked=True)``."""
        ...

    async def claim_parked(self, params: ClaimParams) -> list[Task]:
        """Take the lease of parked tasks due for a poll (the attempt count is unchanged)."""
        ...

    async def hasten_parked(self, kind: str, older_than_s: float, now: float) -> int:
        """Make the next poll of each parked task of ``kind`` whose job is ``older_than_s`` or
        more due at ``now`` (the kind's first job seen finished took that long: any of them
        may have finished too); how many moved."""
        ...

    async def next_parked_at(self) -> float | None: ...

    async def find_upstream(self, kind: str, ref: str) -> Task | None: ...

    async def due_callbacks(self, now: float, limit: int) -> list[Task]:
        """Terminal tasks whose callback_url has not been delivered yet (the outbox)."""
        ...

    async def callback_result(self, task_id: str, state: str, next_at: float | None) -> None:
        """state: 'delivered', 'failed' (gave up) or 'pending' (try again at ``next_at``)."""
        ...

    async def due_effects(self, now: float, limit: int) -> list[DueEffect]:
        """Completions' effects due now (written by the completion, in its transaction)."""
        ...

    async def effect_done(self, seq: int) -> None:
        """Delivered (or given up): out of the outbox."""
        ...

    async def effect_retry(self, seq: int, due_at: float) -> None:
        """Not delivered: try again at ``due_at`` (one more attempt counted)."""
        ...

    # -- requests from people ---------------------------------------------------------------
    async def request_cancel(self, task_id: str, tenant: str | None, now: float) -> Task:
        """queued/retrying -> cancelled at once; running -> flag for its worker, or, when
        others wait for the same work, cancelled at once with the call going on for them.
        Terminal -> IllegalTransition."""
        ...

    async def manual_retry(
        self, task_id: str, tenant: str | None, now: float, budget: Budget | None = None
    ) -> Task:
        """failed/dead/timeout -> queued with a fresh attempt budget, then the work rule of a
        submit: its result if the work succeeded meanwhile (``deduped``), a wait if it is in
        flight. Refused (:class:`~floodway.core.errors.AttemptStillOpen`) while the task's
        last call may still be running at the provider. With ``budget`` (its tenant's), refused
        (:class:`~floodway.core.errors.BudgetExceeded`) when its estimate, held again, would
        pass it."""
        ...

    # -- recovery and maintenance -----------------------------------------------------------
    async def open_attempts(self, limit: int) -> list[Task]:
        """Tasks with an attempt still open (a call that may be running at the provider):
        running ones (parked on an upstream job included), and ended ones whose call goes on."""
        ...

    async def lease_owners(self) -> list[str]:
        """Who holds the open attempts' leases (one name per worker)."""
        ...

    async def expired_leases(self, now: float, limit: int) -> list[Task]:
        """Open attempts whose worker's lease expired: their worker is presumed dead."""
        ...

    async def attempts_of(self, owners: Sequence[str], limit: int) -> list[Task]:
        """Open attempts held by these lease owners."""
        ...

    async def orphan_attempt(
        self, task_id: str, lease_token: str, until: float, now: float
    ) -> bool:
        """An ended task's open attempt lost its worker: it stays open, without a worker,
        until ``until`` (when its call could have ended at the latest)."""
        ...

    async def ended_orphans(self, now: float, limit: int) -> list[Task]:
        """Attempts left open without a worker whose time is up."""
        ...

    async def close_attempt(
        self,
        task_id: str,
        lease_token: str,
        result: Succeeded | None,
        now: float,
        charge: Charge | None = None,
    ) -> bool:
        """Close an open attempt: a success (found by a lookup) becomes the work's result and
        its waiters' (the task's status stays what it is); otherwise the work passes on.
        ``charge``: what the call billed (the lookup's usage), written to the spend ledger."""
        ...

    async def past_deadline(self, now: float, limit: int) -> list[Task]: ...

    async def purge(self, retention: Retention) -> Purged: ...

    async def try_lead(self, name: str, owner: str, now: float, ttl_s: float) -> bool:
        """Become (or stay) the one leader for ``name`` until ``now + ttl_s``."""
        ...

    async def leader(self, name: str) -> Leader | None:
        """Who leads ``name`` now (possibly a dead process whose lease has not expired)."""
        ...

    async def take_lead(self, name: str, owner: str, dead: str, now: float, ttl_s: float) -> bool:
        """Take the lead of ``name`` from ``dead`` (known dead), if it still holds it."""
        ...

    async def server_key(self, name: str, new: str) -> str:
        """The deployment's key ``name``: the one stored, else ``new``, stored now (whichever
        process stores first, every process gets that one)."""
        ...

    async def probe_write(self, now: float) -> None:
        """A write the ledger must take (this process's own lease row, renewed): raises
        :class:`~floodway.core.errors.StoreError` while it takes none (a full disk, a
        read-only database), which a read alone does not show."""
        ...

    # -- liveness: a process's death is seen at once, not after its leases expire ----------
    async def dead(self, identities: Sequence[str]) -> set[str]:
        """Those of ``identities`` whose process is certainly dead (its liveness lock is free).
        A process that never held the lock here, or not since the server last restarted, is
        not judged (its leases still expire)."""
        ...

    async def forget(self, identity: str) -> None:
        """Drop what is kept about a dead process whose attempts have all been reconciled,
        its leader leases included."""
        ...
