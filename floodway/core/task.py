"""The task as floodway stores and reports it, plus the value objects around it."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from floodway.core.spend import Budget
from floodway.core.states import TERMINAL, Status

JSON = Any  # a value that json.dumps accepts


class Lane(StrEnum):
    INTERACTIVE = "interactive"
    BACKGROUND = "background"

    @property
    def rank(self) -> int:
        return 0 if self is Lane.INTERACTIVE else 1

    @classmethod
    def of_rank(cls, rank: int) -> Lane:
        return Lane.INTERACTIVE if rank == 0 else Lane.BACKGROUND


class ErrorClass(StrEnum):
    RETRYABLE = "retryable"
    FATAL = "fatal"
    POISON = "poison"
    INTERRUPTED = "interrupted"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    EXHAUSTED = "exhausted"


@dataclass(frozen=True)
class ErrorInfo:
    cls: ErrorClass
    type: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"class": self.cls.value, "type": self.type, "message": self.message}

    @classmethod
    def from_json(cls, data: dict[str, str] | None) -> ErrorInfo | None:
        if not data:
            return None
        return cls(ErrorClass(data["class"]), data["type"], data["message"])


@dataclass(frozen=True)
class Task:
    id: str
    kind: str
    status: Status
    lane: Lane
    tenant: str
    input: JSON
    result: JSON = None
    error: ErrorInfo | None = None
    attempts: int = 0
    max_attempts: int = 4
    request_key: str | None = None  # the caller's Idempotency-Key header (wire: idempotency_key)
    fingerprint: str | None = None  # the work key: same work -> same fingerprint
    duplicate_of: str | None = None
    waits_for: str | None = None  # in-flight task with the same fingerprint we wait on
    upstream_ref: str | None = None
    #: the provider's id of the answer to its last call (OpenAI's ``x-request-id``, Anthropic's
    #: ``request-id``); a deduped task's is the one of the call whose result it took
    upstream_request_id: str | None = None
    cost_estimated: float = 0.0
    cost_actual: float | None = None
    #: held against the tenant's budget until the task ends (its estimate, priced)
    spend_hold: float = 0.0
    #: what its calls billed above ``spend_hold`` (each call against the hold), summed
    over_estimate: float = 0.0
    created_at: float = 0.0
    updated_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    deadline_at: float | None = None
    next_attempt_at: float | None = None
    metadata: dict[str, JSON] = field(default_factory=dict)
    callback_url: str | None = None
    batch_id: str | None = None
    #: the provider tier its call goes on: pinned at submit, else the one chosen when it ran
    #: (None: not chosen yet; see core/tiers.py)
    tier: str | None = None
    lease_owner: str | None = None
    lease_token: str | None = None
    lease_expires_at: float | None = None
    attempt_at: float | None = None  # when the current (or last) attempt was claimed
    #: when the current (or last) attempt's call will have ended at the provider, at the
    #: latest, as bounded when it started (None: by the kind's timeout)
    call_ends_by: float | None = None
    invalid_outputs: int = 0
    cancel_requested: bool = False
    poll_attempts: int = 0
    parked: bool = False
    callback_state: str | None = None
    callback_attempts: int = 0
    seq: int = 0

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def work_key(self) -> str:
        """The key sent upstream as Idempotency-Key: stable across attempts and recovery."""
        return self.fingerprint or f"fw-{self.id}"


@dataclass(frozen=True)
class SubmitRequest:
    """What a caller asks for: the work and how to run it. Who asks (the tenant) and the batch
    it belongs to are given beside it, by whoever authenticated the caller."""

    kind: str
    input: JSON
    lane: Lane | str = Lane.BACKGROUND
    #: the caller's Idempotency-Key: the same key again returns the same task
    key: str | None = None
    max_attempts: int | None = None  # None: the kind's
    deadline_s: float | None = None  # None: the kind's
    metadata: dict[str, JSON] | None = None
    callback_url: str | None = None
    #: the provider tier to send it on (None: the cheapest that meets its deadline)
    tier: str | None = None
    #: may take the result of identical work that succeeded: None, as the kind says
    #: (KindSpec.replays); True for a client's retry of the very same request
    replay: bool | None = None


@dataclass(frozen=True)
class NewTask:
    """What a submit asks the store to create."""

    kind: str
    input: JSON
    tenant: str = "default"
    lane: Lane = Lane.BACKGROUND
    max_attempts: int = 4
    deadline_s: float | None = None
    request_key: str | None = None
    key_ttl_s: float = 24 * 3600
    fingerprint: str | None = None
    cost_estimated: float = 0.0
    #: what the task may cost at most (its estimate priced): held against the tenant's budget
    #: from admission until the task ends
    spend_hold: float = 0.0
    #: the tenant's budget, checked atomically with the insert (None: no budget)
    budget: Budget | None = None
    metadata: dict[str, JSON] = field(default_factory=dict)
    callback_url: str | None = None
    batch_id: str | None = None
    tier: str | None = None
    interactive_depth: int = 0  # 0 = unlimited; checked atomically with the insert
    #: past ``interactive_depth`` it goes in the background lane instead of being refused
    overflow: bool = False
    #: sha256 of the canonical request body, to tell a replay from a conflicting reuse of a key
    request_hash: str = ""
    #: may take the result of identical work that succeeded (False: it asks for a new sample,
    #: and runs anew; identical work in flight it joins either way)
    replay: bool = True
    #: its place in its lane's dispatch order, a time: None for the submit's own time; a job's
    #: step takes its job's, so a job submitted earlier is served before later work
    rank_at: float | None = None
    #: of a kind with the batch tier: a deadline before this leaves no room for a provider
    #: batch, so work this task joins is taken off the batch tier (None: no batch tier)
    batch_by: float | None = None


@dataclass(frozen=True)
class Submitted:
    task: Task
    reused: bool = False  # the request key matched an existing task


@dataclass(frozen=True)
class Candidate:
    """A ready task as admission control sees it (no input, no result: cheap to list)."""

    task_id: str
    kind: str
    tenant: str
    #: the lane it is dispatched in: its own, or the one a waiting duplicate lent it
    lane: Lane
    cost: float
    seq: int
    #: its place in its lane's dispatch order (its submit's time, or its job's): the earlier
    #: first, and its wait, for aging, counts from there
    rank_at: float
    deadline_at: float | None


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_id(now: float, prefix: str = "t") -> str:
    """A sortable id (48-bit milliseconds + 80 random bits, Crockford base32)."""
    value = (int(now * 1000) << 80) | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return prefix + "_" + "".join(reversed(chars))


def new_token() -> str:
    return os.urandom(12).hex()


def canonical_json(value: JSON) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


#: The fingerprint scope of kinds that share work across tenants (``share = "global"``); no
#: tenant name can collide with it, since tenant scopes are prefixed.
GLOBAL_SCOPE = "global"


def tenant_scope(tenant: str) -> str:
    return f"tenant:{tenant}"


def fingerprint(kind: str, version: str, value: JSON, scope: str) -> str:
    """sha256 of (kind, kind version, scope, canonical input): the same work has the same print.
    ``scope`` is the tenant (tenants never share work unless a kind says so: see
    :data:`GLOBAL_SCOPE`)."""
    digest = hashlib.sha256()
    digest.update(f"{kind}\x00{version}\x00{scope}\x00".encode())
    digest.update(canonical_json(value).encode())
    return digest.hexdigest()


def batch_hash(requests: Sequence[SubmitRequest]) -> str:
    """What a batch's request key promises to mean: the same list of the same requests."""
    digest = hashlib.sha256()
    for request in requests:
        digest.update(request_hash(request).encode())
    return digest.hexdigest()


def request_hash(request: SubmitRequest) -> str:
    """What a request key promises to mean: the same key with another body is a conflict."""
    r = request
    parts = [r.kind, r.input, r.lane, r.max_attempts, r.deadline_s, r.metadata, r.callback_url]
    return hashlib.sha256(canonical_json(parts).encode()).hexdigest()
