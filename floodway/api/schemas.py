"""Wire schemas: what crosses HTTP, kept apart from the domain dataclasses so the public
contract (the OpenAPI document clients are built from) changes only on purpose."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from floodway.core.states import Status
from floodway.core.task import Lane, SubmitRequest
from floodway.core.validation import MAX_ATTEMPTS, MAX_DEADLINE_S
from floodway.wire.tasks import TaskOut, valid_unicode

MAX_BATCH = 1000
_HEX = "[0-9A-Fa-f]{1,4}"
#: an IPv6 address in its written forms (no zone, no embedded IPv4)
_IPV6 = (
    rf"(?:(?:{_HEX}:){{7}}{_HEX}|(?:{_HEX}:){{1,7}}:|(?:{_HEX}:){{1,6}}:{_HEX}"
    rf"|(?:{_HEX}:){{1,5}}(?::{_HEX}){{1,2}}|(?:{_HEX}:){{1,4}}(?::{_HEX}){{1,3}}"
    rf"|(?:{_HEX}:){{1,3}}(?::{_HEX}){{1,4}}|(?:{_HEX}:){{1,2}}(?::{_HEX}){{1,5}}"
    rf"|{_HEX}:(?::{_HEX}){{1,6}}|:(?:(?::{_HEX}){{1,7}}|:))"
)
_PORT = "(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
#: an absolute http(s) URL the outbox can deliver to: a host name or IPv4, or a bracketed IPv6
#: address, an optional port (1-65535) and path. Exact, so that what the schema admits is
#: what the API accepts.
CALLBACK_URL_PATTERN = (
    r"^https?://([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
    rf"|\[{_IPV6}\])(:{_PORT})?([/?#][\x21-\x7e]*)?$"
)


class _In(BaseModel):
    # A misspelt field is an error, not silently ignored.
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data: Any) -> Any:
        # JSON may escape a lone surrogate ("\ud800"), which no UTF-8 text can hold: refused
        # here, before it reaches a fingerprint, a database or an answer that would echo it.
        if not valid_unicode(data):
            raise ValueError("the body holds a lone surrogate escape: not valid Unicode text")
        return data


class SubmitIn(_In):
    kind: str = Field(min_length=1, max_length=200)
    input: dict[str, Any] = Field(description="the task input: a JSON object")
    lane: Lane = Lane.BACKGROUND
    max_attempts: int | None = Field(None, ge=1, le=MAX_ATTEMPTS)
    deadline_s: float | None = Field(None, gt=0, le=MAX_DEADLINE_S, allow_inf_nan=False)
    # Kept verbatim, not normalised: it is part of the Idempotency-Key request hash.
    callback_url: str | None = Field(
        None,
        max_length=2048,
        pattern=CALLBACK_URL_PATTERN,
        description="an absolute http(s) URL, POSTed (signed) when the task ends",
    )
    metadata: dict[str, Any] | None = None
    tier: Literal["sync", "flex", "batch"] | None = Field(
        None,
        description="the provider tier to send it on; unset: the cheapest that meets "
        "its deadline among the kind's tiers",
    )

    @model_validator(mode="before")
    @classmethod
    def _json_numbers(cls, data: Any) -> Any:
        # JSON numbers only: `true` is not 1 attempt and "60" is not sixty seconds (pydantic's
        # lax mode would take both), while 3.0 is the integer 3, as JSON Schema has it.
        if isinstance(data, dict):
            for name in ("max_attempts", "deadline_s"):
                if isinstance(data.get(name), bool | str | bytes):
                    raise ValueError(f"{name} must be a JSON number")
        return data

    def request(self, key: str | None) -> SubmitRequest:
        """The library's request for this body, with the caller's request key."""
        return SubmitRequest(
            self.kind,
            self.input,
            lane=self.lane,
            key=key,
            max_attempts=self.max_attempts,
            deadline_s=self.deadline_s,
            metadata=self.metadata,
            callback_url=self.callback_url,
            tier=self.tier,
        )


class BatchIn(_In):
    tasks: list[SubmitIn] = Field(min_length=1, max_length=MAX_BATCH)


class SubmitOut(TaskOut):
    reused: bool = Field(description="true when the Idempotency-Key matched an earlier task")


class TaskPage(BaseModel):
    items: list[TaskOut]
    next: str | None = Field(description="opaque cursor for the next page (pass as ?after=)")


class BatchOut(BaseModel):
    id: str
    task_ids: list[str]
    reused: bool = False


class BatchStatus(BaseModel):
    id: str
    total: int
    counts: dict[str, int]
    done: bool


class BatchSummary(BatchStatus):
    created_at: datetime | None = Field(description="when its first task was submitted")


class BatchList(BaseModel):
    items: list[BatchSummary] = Field(description="newest first")


class TimingOut(BaseModel):
    count: int
    mean_s: float | None
    p50_s: float | None
    p95_s: float | None


class SpendTotalOut(BaseModel):
    cost: float = 0.0
    saved: float = 0.0
    by_kind: dict[str, dict[str, float]] = Field(default_factory=dict)


class CapOut(BaseModel):
    limit: float
    use: float | None = Field(None, description="the tenant's use, where the ledger knows it")
    unit: str


class StatsOut(BaseModel):
    tenant: str | None = Field(
        None,
        description="the tenant this view is of; null: every tenant's (an operator's view, "
        "the only one that shows the shared resources' limits and the providers' state)",
    )
    tasks: dict[str, int] = Field(
        description="tasks per status: the caller's tenant's (every tenant's for an operator)"
    )
    by_kind: dict[str, dict[str, int]]
    window: int = Field(description="how many of the newest tasks the timings cover")
    queue_wait: TimingOut
    completion: TimingOut
    retries: int = Field(description="attempts beyond the first, over the window")
    retrying: int
    dead_letters: int
    resources: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="per resource: `limits` (each dimension's limit in force: value, source "
        "configured | header | learned, and the configured, published and learned figures; "
        "rates per minute), `concurrency` (the in-flight limit in force, 0 = none), "
        "`in_flight`, `paused_for`, and `held_back_by`: what held candidates back in the last "
        "admission pass (concurrency, requests, tokens, pause, tenant cap, recovering). An "
        "operator's view: every resource, `in_flight` and `held_back_by` over every tenant "
        "(`held_back_by_tenant` split by tenant), `sending_per_min`, 429s split into "
        "`throttles_limit` and `throttles_noise`, `pauses`, the buckets. A tenant's view: "
        "the resources its kinds use (`kinds`), `in_flight` and `held_back_by` of its own "
        "tasks only, nothing summed over other tenants'",
    )
    caps: dict[str, CapOut] = Field(
        default_factory=dict,
        description="a tenant's view: its caps that are set (`concurrency`: its tasks in "
        "flight; `interactive_depth`; `submit_rate`, per second), each with `limit` and, "
        "where known, its `use`; the budget is at /v1/spend",
    )
    upstream: dict[str, float] = Field(
        default_factory=dict,
        description="this process's provider calls (operators only): calls, throttled (429), "
        "server_errors (5xx), their rates, polls and poll_idle_ratio",
    )
    spend: SpendTotalOut = Field(
        default_factory=lambda: SpendTotalOut(),
        description="what billed calls cost and dedupe saved (all the ledger keeps), per kind: "
        "the caller's tenant's, every tenant's for an operator; details at /v1/spend",
    )


class WorkerTaskOut(BaseModel):
    id: str
    kind: str
    tenant: str
    attempt: int
    since: datetime | None = Field(description="when this attempt was claimed")


class WorkerOut(BaseModel):
    id: str = Field(description="the lease owner its tasks carry")
    host: str
    pid: int
    concurrency: int = Field(description="handlers it runs at once")
    kinds: list[str]
    started_at: datetime
    heartbeat_at: datetime = Field(description="when it last said it lives")
    heartbeat_age_s: float
    silent: bool = Field(
        description="no heartbeat for three beats: the worker has likely died (its row goes "
        "after a day)"
    )
    tasks: list[WorkerTaskOut] = Field(description="the tasks whose lease it holds")


class WorkersOut(BaseModel):
    now: datetime
    workers: list[WorkerOut] = Field(description="those heard from lately, by host and pid")


class StatsSample(BaseModel):
    at: datetime
    stats: StatsOut


class StatsHistoryOut(BaseModel):
    now: datetime = Field(description="the server's clock when it answered")
    interval_s: float = Field(description="seconds between samples")
    samples: list[StatsSample] = Field(description="oldest first")


class HealthOut(BaseModel):
    status: Literal["ok"]
    version: str
    checks: dict[str, dict[str, Any]] | None = Field(
        None, description="with ?verbose=1: each dependency, as /readyz reports it"
    )


class WebhookAck(BaseModel):
    status: Literal["applied", "ignored"]
    task_id: str
    task_status: Status


class SpendLineOut(BaseModel):
    tenant: str
    kind: str
    cost: float = Field(description="what billed calls cost, at the configured prices")
    saved: float = Field(description="what dedupe saved: the cost of the work deduped tasks took")
    input_tokens: float
    output_tokens: float
    images: float
    calls: int = Field(description="billed calls")
    deduped: int = Field(description="tasks that took another task's result instead of a call")
    over_estimate: float = Field(
        description="what calls billed above the estimate their tasks were admitted at "
        "(a budget admits by the estimate)"
    )
    tier_saved: float = Field(
        0.0, description="what calls on the batch and flex tiers saved against the sync price"
    )


class SpendPointOut(BaseModel):
    at: datetime = Field(description="the start of the bucket")
    tenant: str
    kind: str
    cost: float
    saved: float


class BudgetOut(BaseModel):
    tenant: str
    amount: float
    period_s: float
    period_start: datetime
    resets_at: datetime
    spent: float = Field(description="billed this period")
    held: float = Field(description="what the tenant's unfinished tasks may still cost")
    left: float = Field(description="what a new submission may still be estimated at")


class SpendOut(BaseModel):
    since: datetime | None = Field(description="the start of the view (null: everything kept)")
    cost: float = Field(description="the total over the lines")
    saved: float = Field(description="the total dedupe saved over the lines")
    tier_saved: float = Field(
        0.0, description="the total the batch and flex tiers saved over the lines, against sync"
    )
    lines: list[SpendLineOut] = Field(description="per tenant and kind")
    bucket_s: float
    series: list[SpendPointOut] = Field(description="per bucket of time, tenant and kind")
    budgets: list[BudgetOut] = Field(description="the budgets of the tenants in view")
