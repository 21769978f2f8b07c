"""Kinds declared in configuration with ``adapter = "http" | "openai" | "anthropic" |
"simulated"``.

``build_provider_kind`` turns one ``[kinds.NAME]`` table into a :class:`KindSpec`:

- ``http``: ``url`` (required), ``poll_url`` (set -> async jobs), ``cancel_url``,
  ``lookup_url`` (``{key}`` = the idempotency key), ``headers`` with ``${ENV}`` expansion.
- ``simulated``: the http adapter pointed at a simulator (``url`` = its base URL or its
  ``/generate``); polling, cancel and lookup default to the simulator's routes.
- ``openai``: ``base_url``, ``api_key_env``, ``endpoint``, ``model``.
- ``anthropic``: ``base_url``, ``api_key_env``, ``model``, ``max_output_tokens`` (the
  ``max_tokens`` a request without one is sent with).

``options``: :class:`floodway.config.KindOptions` (docs/configuration.md lists them).

``idempotent`` (does the provider honour the ``Idempotency-Key`` every adapter sends, so that
resubmitting the work of a worker that died mid-call replays it instead of billing it again?)
defaults to True only for ``simulated`` kinds, whose simulator does: a provider floodway knows
nothing of is not trusted with a resubmission. Set ``options.idempotent = true`` for one that
honours the key. An ``anthropic`` kind never is: Anthropic takes no key and has no look-up,
so it declares neither (a call floodway hung up on is not sent again).

Every adapter holds one pooled HTTP client; close them with :func:`aclose_kinds` when the
``Floodway`` closes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable

from pydantic import ValidationError

from floodway.config import KindConfig, KindOptions, format_validation_error
from floodway.core.errors import ConfigError
from floodway.core.task import JSON
from floodway.core.tiers import turnarounds
from floodway.core.upstream import PollSchedule, first_poll_after
from floodway.kinds import Handler, JobPoller, KindRegistry, KindSpec, Lookup, TierPlan
from floodway.providers.anthropic import BASE_URL, AnthropicAdapter, anthropic_estimate
from floodway.providers.anthropic_batch import AnthropicBatchApi
from floodway.providers.base import (
    Adapter,
    AdapterHandler,
    AsyncJobs,
    UpstreamPoll,
    close_quietly,
)
from floodway.providers.cost import cost_rule, generic_tokens, openai_estimate
from floodway.providers.http import HttpAdapter, HttpRoutes, JobFields
from floodway.providers.openai import OpenAIAdapter, deterministic, replays_when
from floodway.providers.openai_batch import OpenAIBatchApi
from floodway.providers.tiers import LinePoller, TieredHandler, line_schedule
from floodway.wire.openai import ENDPOINT_PATHS

SIMULATOR_URL = "http://127.0.0.1:9000"
#: polls of a task parked on its batch line before it is given up (each reads the ledger)
LINE_POLLS = 10_000
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def build_provider_kind(name: str, cfg: KindConfig) -> KindSpec:
    """The :class:`KindSpec` of a config-declared provider kind (raises ConfigError)."""
    where = f"kinds.{name}"
    options = kind_options(cfg, where)
    headers = {k: expand_env(v, f"{where}.headers.{k}") for k, v in cfg.headers.items()}
    adapter: Adapter
    jobs: AsyncJobs | None = None
    lookup: Lookup | None = None
    replays: Callable[[JSON], bool] | None = None
    if cfg.adapter == "openai":
        adapter = _openai(name, cfg, headers, where)
        idempotent = bool(options.idempotent)
        replays = None if cfg.dedupe == "always" else replays_when(cfg.endpoint)
    elif cfg.adapter == "anthropic":
        adapter = _anthropic(name, cfg, headers, where)
        idempotent = False
        replays = None if cfg.dedupe == "always" else deterministic
    elif cfg.adapter in ("http", "simulated"):
        http = _http(name, cfg, options, headers, where)
        adapter = http
        jobs = http if http.is_async else None
        lookup = http.lookup if http.routes.lookup is not None else None
        trusted = cfg.adapter == "simulated"  # a simulator floodway knows honours the key
        idempotent = trusted if options.idempotent is None else options.idempotent
    else:
        raise ConfigError(f"{where}.adapter: {cfg.adapter!r} is not a provider adapter")
    schedule = poll_schedule(cfg, options)
    handler: Handler = AdapterHandler(adapter, jobs, schedule)
    poll: JobPoller | None = None if jobs is None else UpstreamPoll(jobs, schedule)
    plan = TierPlan()
    close: Callable[[], Awaitable[None]] = adapter.aclose
    poll_max_attempts = cfg.poll_max_attempts
    if isinstance(adapter, OpenAIAdapter | AnthropicAdapter) and cfg.tiers != ["sync"]:
        batch = _batches(name, cfg, adapter) if "batch" in cfg.tiers else None
        plan = TierPlan(
            offered=tuple(cfg.tiers),
            times=turnarounds(cfg.timeout, cfg.turnaround),
            batch=batch,
            max_lines=cfg.batch_max_lines,
            max_age_s=cfg.batch_max_age,
            queue_limit=cfg.batch_queue_limit,
        )
        handler = TieredHandler(adapter, plan)
        if batch is not None:
            poll = LinePoller(line_schedule(plan))
            # A line's poll reads the ledger, not the provider: the deadline bounds them.
            poll_max_attempts = LINE_POLLS
            close = _closing(adapter.aclose, batch.aclose)
    return KindSpec(
        name=name,
        handler=handler,
        resource=cfg.resource,
        max_attempts=cfg.max_attempts,
        deadline_s=cfg.deadline,
        timeout_s=cfg.timeout,
        cost=adapter.estimate,
        version=cfg.version,
        dedupe=bool(cfg.dedupe),
        share=cfg.share,
        fallback=cfg.fallback,
        output_schema=cfg.output_schema,
        idempotent=idempotent,
        lookup=lookup,
        retry_timeouts=cfg.retry_timeouts,
        poll=poll,
        poll_max_attempts=poll_max_attempts,
        close=close,
        replays=replays,
        tiers=plan,
    )


def _batches(
    name: str, cfg: KindConfig, adapter: OpenAIAdapter | AnthropicAdapter
) -> OpenAIBatchApi | AnthropicBatchApi:
    if isinstance(adapter, AnthropicAdapter):
        return AnthropicBatchApi(name, adapter.root, adapter.api_headers, cfg.timeout)
    headers = dict(adapter.headers)
    if adapter.api_key:
        headers["Authorization"] = f"Bearer {adapter.api_key}"
    return OpenAIBatchApi(
        name, adapter.base_url, "/v1" + ENDPOINT_PATHS[cfg.endpoint], headers, cfg.timeout
    )


def _closing(*closers: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    async def close() -> None:
        for closer in closers:
            await close_quietly(closer)

    return close


async def aclose_kinds(kinds: KindRegistry) -> None:
    """Close every provider kind's pooled HTTP client (call it from ``Floodway.close``)."""
    for spec in kinds.specs():
        if spec.close is not None:
            await close_quietly(spec.close)


def kind_options(cfg: KindConfig, where: str) -> KindOptions:
    """``cfg.options`` checked against :class:`KindOptions` (raises ConfigError)."""
    try:
        return KindOptions.model_validate(cfg.options)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, f"{where}.options")) from None


def poll_schedule(cfg: KindConfig, options: KindOptions) -> PollSchedule:
    """The kind's poll timing: the first poll after ``poll_after`` (learned when unset), or
    after ``callback_grace`` when the provider calls back (``webhook_secret`` set)."""
    if cfg.webhook_secret:
        return PollSchedule(
            first_s=cfg.callback_grace,
            ratio=options.poll_ratio,
            max_gap_s=options.poll_max_interval,
        )
    return first_poll_after(
        cfg.poll_after, ratio=options.poll_ratio, max_gap_s=options.poll_max_interval
    )


def expand_env(text: str, where: str) -> str:
    """Replace ``${NAME}`` with the environment variable NAME (unset -> ConfigError)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        found = os.environ.get(name)
        if found is None:
            raise ConfigError(f"{where}: environment variable {name} is not set")
        return found

    return _ENV.sub(value, text)


def _http(
    name: str, cfg: KindConfig, options: KindOptions, headers: dict[str, str], where: str
) -> HttpAdapter:
    if cfg.adapter == "simulated":
        routes = _simulator_routes(cfg)
    else:
        if not cfg.url:
            raise ConfigError(f"{where}.url: required for adapter http")
        routes = HttpRoutes(
            submit=cfg.url,
            poll=cfg.poll_url,
            cancel=cfg.cancel_url,
            lookup=cfg.lookup_url,
            result=options.result_url,
        )
    routes = HttpRoutes(
        routes.submit,
        routes.poll,
        routes.cancel,
        routes.lookup,
        routes.result,
        options.cancel_method.upper(),
    )
    fields = JobFields(
        status=cfg.status_field,
        done=frozenset(cfg.done_values),
        failed=frozenset(cfg.failed_values),
        result=cfg.result_field,
        id=cfg.id_field,
        usage=options.usage_field,
    )
    callback = None
    if options.callback_url:
        callback = (options.callback_field, options.callback_url.replace("{kind}", name))
    default_cost = generic_tokens if cfg.adapter == "simulated" else None
    return HttpAdapter(
        name=name,
        routes=routes,
        fields=fields,
        headers=headers,
        timeout_s=cfg.timeout,
        cost=cost_rule(cfg.cost, default_cost, f"{where}.cost"),
        callback=callback,
    )


def _simulator_routes(cfg: KindConfig) -> HttpRoutes:
    url = (cfg.url or SIMULATOR_URL).rstrip("/")
    base = url.removesuffix("/generate")
    return HttpRoutes(
        submit=f"{base}/generate",
        poll=cfg.poll_url or f"{base}/jobs/{{id}}",
        cancel=cfg.cancel_url or f"{base}/jobs/{{id}}",
        lookup=cfg.lookup_url or f"{base}/jobs?idempotency_key={{key}}",
        result=None,
    )


def _openai(name: str, cfg: KindConfig, headers: dict[str, str], where: str) -> OpenAIAdapter:
    key = _api_key(cfg, where)
    worst_case = openai_estimate(cfg.endpoint, cfg.model, cfg.max_output_tokens)
    return OpenAIAdapter(
        name=name,
        base_url=cfg.base_url or "https://api.openai.com/v1",
        endpoint=cfg.endpoint,
        api_key=key,
        model=cfg.model,
        headers=headers,
        timeout_s=cfg.timeout,
        cost=cost_rule(cfg.cost, worst_case, f"{where}.cost"),
    )


def _api_key(cfg: KindConfig, where: str) -> str | None:
    if not cfg.api_key_env:
        return None
    key = os.environ.get(cfg.api_key_env)
    if not key:
        raise ConfigError(
            f"{where}.api_key_env: environment variable {cfg.api_key_env} is unset (the "
            "provider's key, read from the environment floodway runs in; any value for a "
            "simulator)"
        )
    return key


def _anthropic(name: str, cfg: KindConfig, headers: dict[str, str], where: str) -> AnthropicAdapter:
    default = anthropic_estimate(cfg.max_output_tokens)
    return AnthropicAdapter(
        name=name,
        base_url=cfg.base_url or BASE_URL,
        api_key=_api_key(cfg, where),
        model=cfg.model,
        max_tokens=cfg.max_output_tokens,
        headers=headers,
        timeout_s=cfg.timeout,
        cost=cost_rule(cfg.cost, default, f"{where}.cost"),
    )
