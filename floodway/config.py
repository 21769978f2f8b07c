"""Validated settings from a TOML file and ``FLOODWAY_...`` environment variables.

An unknown key, a wrong type or an impossible value stops start-up with a
:class:`~floodway.core.errors.ConfigError` that names the key and the file.
Environment variables win over the file; nested keys use ``__``
(``FLOODWAY_RESOURCES__LLM__CONCURRENCY=8``).
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
import typing
from collections.abc import Iterable, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.exceptions import SettingsError

from floodway.core.errors import ConfigError
from floodway.core.tiers import Tier

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(value: Any) -> float:
    """``"90s"``, ``"15m"``, ``"24h"``, ``"7d"``, ``"250ms"`` or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '15m'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    else:
        raise ValueError(f"{value!r} is not a duration (use e.g. '500ms', '60s', '15m', '24h')")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


def parse_rate(value: str) -> tuple[float, float]:
    """``"1/10s"`` -> (1 request, per 10 seconds). Empty -> (0, 0) = no limit."""
    if not value:
        return (0.0, 0.0)
    count, _, per = value.partition("/")
    try:
        n = float(count)
        seconds = parse_duration(per if per[:1].isdigit() else f"1{per}")
    except (ValueError, IndexError) as exc:
        raise ValueError(f"{value!r} is not a rate (use e.g. '1/10s', '30/m')") from exc
    if n <= 0 or seconds <= 0:
        raise ValueError(f"{value!r}: a rate needs a positive count and period")
    return (n, seconds)


def check_rate(value: str) -> str:
    parse_rate(value)
    return value


Rate = Annotated[str, BeforeValidator(check_rate)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


#: which adapters read a kind key (the reference in docs/configuration.md says so per key)
HTTP_LIKE = ("http", "simulated")


def _for(*adapters: str) -> dict[str, Any]:
    return {"adapters": list(adapters)}


class PriceConfig(_Strict):
    """``price = {...}`` on a kind or a resource (the kind's wins): what a billed call costs,
    in your currency. Every settled call's usage is priced with it in the spend ledger
    (docs/spend.md)."""

    input_per_1m: float = Field(0.0, ge=0, description="per million input tokens")
    output_per_1m: float = Field(0.0, ge=0, description="per million output tokens")
    per_request: float = Field(0.0, ge=0, description="per billed request")
    per_image: float = Field(0.0, ge=0, description="per image generated")
    batch_discount: float = Field(
        0.5,
        ge=0,
        le=1,
        description="the share of the price a call on the batch or flex tier costs (OpenAI and "
        "Anthropic bill those at half price)",
    )
    batch_input_per_1m: float | None = Field(
        None,
        ge=0,
        description="per million input tokens on the batch and flex tiers; unset: "
        "input_per_1m x batch_discount",
    )
    batch_output_per_1m: float | None = Field(
        None,
        ge=0,
        description="per million output tokens on the batch and flex tiers; unset: "
        "output_per_1m x batch_discount",
    )


class BudgetConfig(_Strict):
    """``budget = {...}`` in ``[tenants]`` (every tenant's) or ``[tenants.NAME]``: what a
    tenant may spend per period. A submission whose estimated cost would pass what is left
    is refused with a 402 (docs/spend.md)."""

    amount: float = Field(ge=0, description="what a tenant may spend per period")
    period: Duration = Field(
        86400.0,
        gt=0,
        description='the period, aligned on the Unix epoch ("1d" resets at 00:00 UTC)',
    )


class ResourceConfig(_Strict):
    """One provider quota pool. Limits are the provider's published ones; floodway applies
    ``headroom`` of them. 0 means no limit on that dimension."""

    concurrency: int = Field(0, ge=0, description="requests in flight at once; 0 = no cap")
    requests_per_minute: float = Field(0, ge=0, description="requests per minute; 0 = no limit")
    tokens_per_minute: float = Field(
        0,
        ge=0,
        description='"tokens" (any metered unit: the kind\'s cost estimate) per minute; '
        "0 = no limit",
    )
    headroom: float = Field(
        1.0, gt=0, le=1, description="the share of each published limit floodway uses (0.8: 80 %)"
    )
    adaptive: bool = Field(
        False,
        description="read the provider's rate-limit headers and learn what is neither configured "
        "nor published from its 429s (docs/limits.md); headers and learning only ever lower a "
        "configured limit",
    )
    burst: Duration = Field(
        0.0,
        description="a bucket's capacity as seconds of refill; 0 = the largest that keeps a "
        "sliding minute within the limit",
    )
    price: PriceConfig | None = Field(
        None, description="what a call of this resource's kinds costs (a kind's price wins)"
    )


class NamedTenantConfig(_Strict):
    """``[tenants.NAME]``: one tenant's own settings (NAME is the tenant an API key maps to)."""

    budget: BudgetConfig | None = Field(None, description="this tenant's budget (wins)")


class TenantConfig(_Strict):
    """Defaults for every tenant (what ``[api] keys`` maps each key to; "default" when the
    API is open). A sub-table ``[tenants.NAME]`` holds one tenant's own settings."""

    concurrency: int = Field(
        0,
        ge=0,
        description="a tenant's tasks in flight (enforced at dispatch); 0 = no cap. Below the "
        "resources' caps it keeps one tenant from taking all of them",
    )
    submit_rate: Rate = Field(
        "",
        description='API submits per tenant, e.g. "20/s", "600/m" (429 + Retry-After beyond); '
        "empty = no limit. Needs redis to hold across API processes",
    )
    interactive_depth: int = Field(
        5,
        ge=0,
        description="a tenant's interactive tasks queued or running at once (429 beyond)",
    )
    budget: BudgetConfig | None = Field(
        None,
        description='every tenant\'s budget, e.g. { amount = 50.0, period = "1d" }; unset: '
        "no budget",
    )
    named: dict[str, NamedTenantConfig] = Field(
        default_factory=dict,
        exclude=True,
        description="the [tenants.NAME] sub-tables, gathered here from the [tenants] table",
    )

    @model_validator(mode="before")
    @classmethod
    def _gather_named(cls, data: Any) -> Any:
        # A table under [tenants] that is not one of its keys is a tenant's own section.
        if not isinstance(data, dict):
            return data
        fields = set(cls.model_fields)
        named = {k: v for k, v in data.items() if k not in fields and isinstance(v, dict)}
        if not named:
            return data
        kept = {k: v for k, v in data.items() if k not in named}
        return {**kept, "named": {**kept.get("named", {}), **named}}

    def budget_of(self, tenant: str) -> BudgetConfig | None:
        own = self.named.get(tenant)
        if own is not None and own.budget is not None:
            return own.budget
        return self.budget


class ApiConfig(_Strict):
    keys: dict[str, str] = Field(
        default_factory=dict,
        description="API key -> tenant; clients send a key as `Authorization: Bearer <key>` "
        "or `X-API-Key: <key>`. No keys: the API is open, and binds to loopback only",
    )
    admin_keys: dict[str, str] = Field(
        default_factory=dict,
        description="operator keys (key -> tenant): they act as their tenant for tasks and see "
        "every tenant in /v1/stats and /metrics",
    )
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="also serve /metrics, without a key, on this port of metrics_host (for a "
        "Prometheus on a private network); unset: only on the API's port, operators only",
    )
    metrics_host: str = Field("127.0.0.1", description="the address metrics_port listens on")
    max_body_bytes: int = Field(1_048_576, gt=0, description="largest request body (413 beyond)")
    max_json_depth: int = Field(32, gt=0, description="deepest JSON nesting of a body (400)")
    #: a client that sent its headers has this long to send the whole body (408 after), so
    #: connections that never send one cannot pile up; 1 MiB at 1 Mbit/s takes about 8 s
    body_timeout: Duration = Field(
        10.0, gt=0, description="time to receive a whole request body (408 and closed after)"
    )
    #: a streamed /openai/v1 call that waits its turn sends an SSE comment this often, so no
    #: proxy's idle timeout cuts it (their defaults: 60 s and up)
    stream_keepalive: Duration = Field(
        10.0, gt=0, description="a waiting OpenAI stream's keep-alive comments, this often"
    )
    #: the outbox POSTs from inside your network: a host not listed here is called only at a
    #: public address (floodway.core.addresses), so list internal receivers by name or address
    callback_hosts: list[str] = Field(
        default_factory=list,
        description='hosts a callback_url may name ("hooks.example.com", "*.example.com", '
        '"10.0.0.7"), at any address; empty = any host at a public address',
    )
    max_file_bytes: int = Field(
        16 * 1_048_576,
        gt=0,
        description="largest file uploaded to POST /openai/v1/files (413 beyond); other "
        "bodies keep max_body_bytes",
    )


class RetentionConfig(_Strict):
    results: Duration = Field(7 * 86400, description="results and errors are dropped after this")
    rows: Duration = Field(30 * 86400, description="finished tasks are deleted after this")
    keys: Duration = Field(24 * 3600, description="Idempotency-Keys expire after this")


class KindOptions(_Strict):
    """``[kinds.NAME] options``: adapter-specific extras (every one optional)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    poll_ratio: float = Field(
        0.13,
        gt=0,
        le=10,
        description="the gap before the next poll, as a share of the job's age",
        json_schema_extra=_for(*HTTP_LIKE),
    )
    poll_max_interval: Duration = Field(
        60.0, gt=0, description="longest gap between two polls", json_schema_extra=_for(*HTTP_LIKE)
    )
    callback_url: str | None = Field(
        None,
        description="sent in the request body (as callback_field) so the provider calls back; "
        "{kind} is replaced by the kind's name",
        json_schema_extra=_for(*HTTP_LIKE),
    )
    callback_field: str = Field(
        "callback_url",
        description="the body field that carries callback_url",
        json_schema_extra=_for(*HTTP_LIKE),
    )
    cancel_method: str = Field(
        "DELETE", description="HTTP method of cancel_url", json_schema_extra=_for(*HTTP_LIKE)
    )
    result_url: str | None = Field(
        None,
        description="a separate result endpoint ({id}: the job id), when a poll gives only "
        "a status",
        json_schema_extra=_for("http"),
    )
    usage_field: str = Field(
        "usage",
        description="the answer's field with the usage that settles the cost estimate",
        json_schema_extra=_for(*HTTP_LIKE),
    )
    idempotent: bool | None = Field(
        None,
        description="does the provider honour Idempotency-Key (a resubmission replays the "
        "work instead of billing it again)? Then the work of a worker that died mid-call is "
        "resubmitted at once; otherwise it fails as interrupted. Default: true for simulated "
        "(the simulator honours it), false for http and openai (not every provider does); an "
        "anthropic kind is never idempotent (Anthropic takes no key)",
        json_schema_extra=_for("http", "simulated", "openai"),
    )


class KindConfig(_Strict):
    """``[kinds.NAME]``: a kind declared in the config, run by an adapter."""

    adapter: Literal["http", "openai", "anthropic", "simulated", "python"] = Field(
        "python", description="what runs the task: http | openai | anthropic | simulated | python"
    )
    resource: str | None = Field(
        None, description="the [resources.NAME] whose limits it counts against"
    )
    handler: str | None = Field(
        None,
        description='"module:function": an async def handler(ctx, input)',
        json_schema_extra=_for("python"),
    )
    url: str | None = Field(
        None,
        description="http: where to POST the input (required); simulated: the simulator's "
        "base URL (default http://127.0.0.1:9000)",
        json_schema_extra=_for(*HTTP_LIKE),
    )
    poll_url: str | None = Field(
        None,
        description="set: the provider answers with a job to poll ({id}: the job id)",
        json_schema_extra=_for(*HTTP_LIKE),
    )
    cancel_url: str | None = Field(
        None,
        description="called (cancel_method) to stop an upstream job ({id})",
        json_schema_extra=_for(*HTTP_LIKE),
    )
    lookup_url: str | None = Field(
        None,
        description="finds finished work by idempotency key ({key}) after a crash",
        json_schema_extra=_for(*HTTP_LIKE),
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="extra request headers; ${ENV} is replaced by that environment variable",
        json_schema_extra=_for("http", "simulated", "openai", "anthropic"),
    )
    status_field: str = Field(
        "status", description="a job's status field", json_schema_extra=_for(*HTTP_LIKE)
    )
    done_values: list[str] = Field(
        default_factory=lambda: ["succeeded", "completed", "done"],
        description="statuses of a finished job",
        json_schema_extra=_for(*HTTP_LIKE),
    )
    failed_values: list[str] = Field(
        default_factory=lambda: ["failed", "error", "cancelled"],
        description="statuses of a failed job",
        json_schema_extra=_for(*HTTP_LIKE),
    )
    result_field: str = Field(
        "result",
        description="the answer's result field (the whole answer when it has none)",
        json_schema_extra=_for(*HTTP_LIKE),
    )
    id_field: str = Field("id", description="a job's id field", json_schema_extra=_for(*HTTP_LIKE))
    webhook_secret: str | None = Field(
        None,
        description="takes signed provider callbacks at POST /v1/webhooks/NAME; polling then "
        "waits callback_grace first",
        json_schema_extra=_for(*HTTP_LIKE),
    )
    base_url: str | None = Field(
        None,
        description="the API's base URL (default: openai https://api.openai.com/v1, "
        "anthropic https://api.anthropic.com)",
        json_schema_extra=_for("openai", "anthropic"),
    )
    api_key_env: str | None = Field(
        None,
        description="the environment variable that holds the API key",
        json_schema_extra=_for("openai", "anthropic"),
    )
    endpoint: Literal["chat", "embeddings", "images", "responses"] = Field(
        "chat",
        description="chat | embeddings | images | responses (the Responses API)",
        json_schema_extra=_for("openai"),
    )
    model: str | None = Field(
        None,
        description="the model, when the input names none",
        json_schema_extra=_for("openai", "anthropic"),
    )
    models: list[str] = Field(
        default_factory=list,
        description="the model names this kind serves on /openai/v1 (a request's model picks "
        "the kind); empty: model, if set",
        json_schema_extra=_for("openai"),
    )
    max_output_tokens: int | None = Field(
        None,
        ge=1,
        description="the output tokens a request that bounds none (max_tokens, "
        "max_completion_tokens, max_output_tokens) is estimated at, per answer; unset: its "
        "model's published limit (docs/spend.md). anthropic: the max_tokens a request that "
        "sets none is sent with (the API requires one); unset, such a request is refused",
        json_schema_extra=_for("openai", "anthropic"),
    )
    cost: str | None = Field(
        None,
        description='the cost estimate: "tokens", "chars" or "fixed:N"; unset: the '
        "adapter's own (openai: by endpoint; anthropic: prompt + max_tokens; simulated: tokens; "
        "http: none)",
        json_schema_extra=_for("http", "simulated", "openai", "anthropic"),
    )
    price: PriceConfig | None = Field(
        None,
        description="what a call costs, e.g. { input_per_1m = 2.5, output_per_1m = 10.0 }; "
        "unset: the resource's price, else free",
    )
    output_schema: dict[str, Any] | None = Field(
        None, description="JSON Schema a result must pass (a failing 2xx counts toward poison)"
    )
    fallback: str | None = Field(None, description="a kind submitted when a task turns poison")
    max_attempts: int = Field(4, ge=1, description="attempts before a task is dead")
    timeout: Duration = Field(60.0, description="one attempt's time limit")
    retry_timeouts: bool = Field(
        False,
        description="send a call that timed out again, to a provider that neither honours "
        "Idempotency-Key nor has a look-up (it may bill both); unset, such a task ends timeout",
    )
    deadline: Duration = Field(15 * 60.0, description="a task's time limit, attempts included")
    dedupe: bool | Literal["always"] = Field(
        True,
        description="the same input again joins the same work in flight (fingerprint) and "
        "takes its result once done; on an openai kind a finished result is taken only by a "
        'deterministic request (temperature 0, or a seed): "always" takes it for any',
    )
    share: Literal["tenant", "global"] = Field(
        "tenant",
        description='who shares results: "tenant" (each its own) or "global" (every tenant: '
        "saves money when tenants ask for the same work, and tells one what another asked)",
    )
    version: str = Field(
        "1", description="part of the fingerprint: bump it when the same input should run anew"
    )
    poll_after: Duration | None = Field(
        None,
        description="the first poll of a job; unset: learned from the kind's recent jobs "
        "(1 s until one has finished)",
        json_schema_extra=_for(*HTTP_LIKE),
    )
    poll_max_attempts: int = Field(
        30, ge=1, description="polls before a job is given up", json_schema_extra=_for(*HTTP_LIKE)
    )
    callback_grace: Duration = Field(
        180.0,
        description="with webhook_secret: how long to wait for the callback before polling",
        json_schema_extra=_for(*HTTP_LIKE),
    )
    tiers: list[Tier] = Field(
        default_factory=lambda: list[Tier](["sync"]),
        description='the provider tiers its tasks may be sent on: "sync", "flex" (OpenAI\'s '
        'service_tier), "batch" (the provider\'s batch API); each task takes the cheapest that '
        "meets its deadline (docs/spend.md)",
        json_schema_extra=_for("openai", "anthropic"),
    )
    turnaround: dict[Tier, Duration] = Field(
        default_factory=dict,
        description="how long a call on each tier is expected to take, until floodway has "
        'measured it (defaults: sync = timeout, flex = "10m", batch = "1h")',
        json_schema_extra=_for("openai", "anthropic"),
    )
    batch_max_lines: int = Field(
        50_000,
        ge=1,
        le=50_000,
        description="most tasks in one provider batch (OpenAI takes 50,000 a file, Anthropic "
        "100,000 a batch)",
        json_schema_extra=_for("openai", "anthropic"),
    )
    batch_max_age: Duration = Field(
        60.0,
        gt=0,
        description="a provider batch is sent once its oldest task waited this long (or it is "
        "full)",
        json_schema_extra=_for("openai", "anthropic"),
    )
    batch_queue_limit: int | None = Field(
        None,
        ge=1,
        description="most of its tasks enqueued at the provider at once, in provider batches "
        "not ended yet (the provider's batch queue limit); the rest wait for room, their "
        "deadlines kept; unset: no limit",
        json_schema_extra=_for("openai", "anthropic"),
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="adapter-specific extras: see [kinds.NAME.options]"
    )

    @model_validator(mode="after")
    def _tiers(self) -> KindConfig:
        if "sync" not in self.tiers:
            raise ValueError('tiers must include "sync": interactive tasks and close deadlines')
        if self.tiers != ["sync"] and self.adapter not in ("openai", "anthropic"):
            raise ValueError(
                f"tiers: flex and batch need the openai or anthropic adapter, not {self.adapter!r}"
            )
        if "flex" in self.tiers and self.adapter == "anthropic":
            raise ValueError('tiers: Anthropic has no flex tier (use "sync" and "batch")')
        if "batch" in self.tiers and self.endpoint == "images":
            raise ValueError("tiers: the Batch API does not run image generation")
        return self

    @property
    def served_models(self) -> list[str]:
        """The model names /openai/v1 routes to this kind (only an openai kind serves any)."""
        if self.adapter != "openai":
            return []
        return self.models or ([self.model] if self.model else [])


class CallbacksConfig(_Strict):
    """Outbound callbacks: a task's ``callback_url`` is POSTed when the task ends."""

    max_attempts: int = Field(8, ge=1, description="deliveries tried before giving up")
    backoff: Duration = Field(2.0, description="first gap between attempts (full jitter, x2)")
    max_backoff: Duration = Field(600.0, description="longest gap between attempts")
    timeout: Duration = Field(10.0, description="one delivery's time limit")


class JobsConfig(_Strict):
    """Multi-step jobs (docs/jobs.md): how large one job may be."""

    max_steps: int = Field(50, ge=1, description="steps one job may have")
    max_items: int = Field(1000, ge=1, description="tasks one for_each step may fan out to")


class WorkerConfig(_Strict):
    concurrency: int = Field(20, ge=1, description="tasks one process runs at once")
    lease: Duration = Field(
        30.0, description="a worker silent this long is presumed dead; its tasks are recovered"
    )
    grace: Duration = Field(10.0, description="on SIGTERM: time for running tasks to finish")
    claim_batch: int = Field(
        64,
        ge=1,
        description="most tasks claimed in one statement",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FLOODWAY_", env_nested_delimiter="__", extra="forbid"
    )

    database: str = Field(
        "sqlite:///floodway.db",
        description="the ledger: sqlite:///path/file.db or postgresql://user@host/db",
    )
    redis: str = Field(
        "",
        description="redis://host:6379/0 (rediss:// for TLS): limits shared by every process; "
        "empty = limits per process",
    )
    #: one deployment's keys in a shared Redis: ``floodway:{<redis_prefix>}:...``
    redis_prefix: str = Field(
        "default",
        pattern=r"^[A-Za-z0-9_.\-]{1,64}$",
        description="the key space of one deployment in a shared Redis",
    )
    alert_url: str = Field("", description="gets a POST for every dead letter")
    api: ApiConfig = Field(default_factory=ApiConfig)
    worker: WorkerConfig = Field(default_factory=WorkerConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    callbacks: CallbacksConfig = Field(default_factory=CallbacksConfig)
    jobs: JobsConfig = Field(default_factory=JobsConfig)
    tenants: TenantConfig = Field(default_factory=TenantConfig)
    resources: dict[str, ResourceConfig] = Field(default_factory=dict)
    kinds: dict[str, KindConfig] = Field(default_factory=dict)

    @field_validator("redis")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        if value and value.split("://", 1)[0].lower() not in ("redis", "rediss", "unix"):
            raise ValueError(
                f"{value!r} is not a Redis URL: use redis://host:6379/0, rediss://... for "
                "TLS, unix:///path/to/redis.sock, or leave it empty for limits per process"
            )
        return value

    @model_validator(mode="after")
    def _kinds_name_known_resources(self) -> Settings:
        for name, kind in self.kinds.items():
            if kind.resource and kind.resource not in self.resources:
                known = ", ".join(sorted(self.resources)) or "none configured"
                raise ValueError(
                    f"kinds.{name}.resource names unknown resource {kind.resource!r}"
                    f" (known: {known})"
                )
            if kind.fallback and kind.fallback not in self.kinds:
                raise ValueError(f"kinds.{name}.fallback names unknown kind {kind.fallback!r}")
        served: dict[tuple[str, str], str] = {}
        for name, kind in self.kinds.items():
            for model in kind.served_models:
                other = served.setdefault((kind.endpoint, model), name)
                if other != name:
                    raise ValueError(
                        f"kinds.{name} and kinds.{other} both serve model {model!r} on "
                        f"{kind.endpoint}: a request's model must pick one kind"
                    )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Explicit arguments (CLI flags) > environment > file (passed in as init values).
        return (_NamedEnvSource(settings_cls), init_settings)


#: the tables of names a variable may override, and what the file being loaded declares there
_NAMED_TABLES = ("resources", "kinds")
_FILE_DECLARES: ContextVar[Mapping[str, Any] | None] = ContextVar(
    "floodway_file_declares", default=None
)


def declared_as(name: str, declared: Iterable[str]) -> str | None:
    """The declared name that a variable's (lower-case) ``name`` stands for: itself, or the one
    it spells with ``_`` where the name has ``-`` (a variable cannot hold a ``-``)."""
    names = list(declared)
    if name in names:
        return name
    return next((d for d in names if d.lower().replace("-", "_") == name), None)


class _NamedEnvSource(EnvSettingsSource):
    """The environment, with a variable's resource or kind name read as the file's own:
    ``FLOODWAY_RESOURCES__IMAGE_API__CONCURRENCY`` overrides ``[resources.image-api]``."""

    def __call__(self) -> dict[str, Any]:
        values = super().__call__()
        declares = _FILE_DECLARES.get() or {}
        for table in _NAMED_TABLES:
            given, declared = values.get(table), declares.get(table)
            if isinstance(given, dict) and isinstance(declared, Mapping):
                values[table] = {declared_as(n, declared) or n: v for n, v in given.items()}
        return values


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Read ``path`` (TOML) if given, apply env and non-None ``overrides``, validate."""
    data: dict[str, Any] = {}
    where = str(path) if path else "environment"
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(f"{path}: cannot read the config file: {why}") from None
    check_environment(data if path is not None else None, os.environ, where)
    data.update({k: v for k, v in overrides.items() if v is not None})
    declares = _FILE_DECLARES.set(data)
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, where, environ=os.environ)) from None
    except SettingsError as exc:
        raise ConfigError(_unparsed_variable(exc, os.environ)) from None
    finally:
        _FILE_DECLARES.reset(declares)
    # Env values would otherwise beat explicit overrides; the caller's flags win.
    return settings.model_copy(update={k: v for k, v in overrides.items() if v is not None})


def _unparsed_variable(exc: SettingsError, environ: Mapping[str, str]) -> str:
    """A FLOODWAY_ variable whose value could not be parsed, named, with the rule it broke."""
    field = re.search(r'field "(\w+)"', str(exc))
    prefix = f"FLOODWAY_{field.group(1).upper()}" if field else "FLOODWAY_"
    names = sorted(k for k in environ if k.upper().startswith(prefix)) or [prefix]
    return (
        f"{', '.join(names)}: cannot parse the value; a table or list set from the "
        """environment is JSON, e.g. FLOODWAY_API__KEYS='{"key-a": "tenant-a"}'"""
    )


_RESOURCES: TypeAdapter[dict[str, ResourceConfig]] = TypeAdapter(dict[str, ResourceConfig])


def with_resources(
    settings: Settings, resources: Mapping[str, ResourceConfig | Mapping[str, Any]]
) -> Settings:
    """``settings`` with ``resources`` declared from Python as well (``Floodway(resources=...)``,
    each a :class:`ResourceConfig` or a dict of its keys)."""
    try:
        declared = _RESOURCES.validate_python(dict(resources))
    except ValidationError as exc:
        raise ConfigError(
            format_validation_error(exc, "Floodway(resources=...)", prefix=("resources",))
        ) from None
    twice = sorted(set(declared) & set(settings.resources))
    if twice:
        raise ConfigError(
            f"resource {twice[0]!r} is declared in the configuration and in "
            "Floodway(resources=...): declare it once"
        )
    return settings.model_copy(update={"resources": {**settings.resources, **declared}})


def format_validation_error(
    exc: ValidationError,
    where: str,
    prefix: tuple[str, ...] = (),
    environ: Mapping[str, str] | None = None,
) -> str:
    """One line per error, naming the key (and the variable, for a value that came from the
    environment); an unknown key gets the nearest known one."""
    lines = [f"invalid configuration in {where}:"]
    variables = {k.upper(): k for k in environ or {}}
    for err in exc.errors():
        loc = [*prefix, *err["loc"]]
        if loc[:2] == ["tenants", "named"]:  # [tenants.NAME] is written without the field
            del loc[1]
        key = ".".join(str(p) for p in loc) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key" + did_you_mean(str(loc[-1]), _keys_at(loc[:-1]))
        elif err["type"] == "value_error" and "error" in err.get("ctx", {}):
            msg = str(err["ctx"]["error"])  # our own words, without pydantic's "Value error, "
        variable = ENV_PREFIX + "__".join(str(p) for p in loc).upper()
        if variable in variables:
            msg += f" (the value of {variables[variable]})"
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


ENV_PREFIX = "FLOODWAY_"


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the nearest of ``known``, or nothing."""
    near = difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=1)
    by_lower = {k.lower(): k for k in known}
    return f" (did you mean {by_lower[near[0]]!r}?)" if near else ""


def _section(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """("model", M) for a field holding a model M (or M | None), ("names", M) for a table of
    them (``dict[str, M]``); None for a value."""
    if typing.get_origin(annotation) is dict:
        value = typing.get_args(annotation)[1]
        if isinstance(value, type) and issubclass(value, BaseModel):
            return "names", value
        return None
    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return "model", arg
    return None


def _keys_at(loc: Sequence[Any]) -> list[str]:
    """The keys the model at ``loc`` (a path of keys and names) takes."""
    model: type[BaseModel] = Settings
    rest = [str(p) for p in loc]
    while rest:
        field = model.model_fields.get(rest.pop(0))
        section = None if field is None else _section(field.annotation)
        if section is None:
            return []
        kind, model = section
        if kind == "names" and rest:
            rest.pop(0)
    return list(model.model_fields)


def check_environment(
    data: Mapping[str, Any] | None, environ: Mapping[str, str], where: str
) -> None:
    """An environment variable overrides a key: one that names no key, or a resource, kind or
    tenant that the file ``data`` does not declare, is refused naming the variable (pydantic
    would make a new entry of it, or report it as if the file held it). Without a file
    (``data`` None) the environment is the whole configuration, and may declare them."""
    problems = []
    for variable in sorted(environ):
        if not variable.upper().startswith(ENV_PREFIX):
            continue
        parts = variable[len(ENV_PREFIX) :].lower().split("__")
        if len(parts) == 1 and parts[0] not in Settings.model_fields:
            continue  # FLOODWAY_URL, FLOODWAY_API_KEY...: the CLI's, not a setting
        problem = _env_problem(parts, Settings, data or {}, where, file=data is not None)
        if problem is not None:
            problems.append(f"  {variable}: {problem}")
    if problems:
        raise ConfigError("\n".join(["invalid override in the environment:", *problems]))


def _env_problem(
    parts: list[str], model: type[BaseModel], data: Any, where: str, path: str = "", *, file: bool
) -> str | None:
    part, rest = parts[0], parts[1:]
    values = data if isinstance(data, Mapping) else {}
    field = model.model_fields.get(part)
    if field is None and model is TenantConfig and part:  # [tenants.NAME]
        field, rest, values = model.model_fields["named"], parts, {"named": values}
        part = "named"
    if field is None:
        return f"{path}{part} is not a setting{did_you_mean(part, model.model_fields)}"
    section = _section(field.annotation)
    if section is None or not rest:
        return None
    kind, sub = section
    inner = values.get(part, {})
    if kind == "model":
        return _env_problem(rest, sub, inner, where, f"{path}{part}.", file=file)
    name, rest = rest[0], rest[1:]
    declared = list(inner) if isinstance(inner, Mapping) else []
    spelled = (
        declared_as(name, declared)
        if part in _NAMED_TABLES
        else (name if name in declared else None)
    )
    if file and spelled is None:
        what = {"resources": "resource", "kinds": "kind", "named": "tenant"}.get(part, part)
        as_variables = [d.lower().replace("-", "_") for d in declared]
        hint = did_you_mean(name, as_variables if part in _NAMED_TABLES else declared)
        return (
            f"names {what} {name!r}, which {where} does not declare{hint}; a variable "
            "overrides what the configuration declares, never adds to it (it spells a name "
            "in lower case, with '_' for '-')"
        )
    own = inner.get(spelled) if isinstance(inner, Mapping) and spelled else None
    if not rest:
        return None
    return _env_problem(rest, sub, own, where, f"{path}{part}.{name}.", file=file)
