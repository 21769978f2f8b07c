"""Kinds declared in configuration with ``adapter = "http" | "openai" | "simulated"``.

``build_provider_kind`` turns one ``[kinds.NAME]`` table into a :class:`KindSpec`:

- ``http``: ``url`` (required), ``poll_url`` (set -> async jobs), ``cancel_url``,
  ``lookup_url`` (``{key}`` = the idempotency key), ``headers`` with ``${ENV}`` expansion.
- ``simulated``: the http adapter pointed at a simulator (``url`` = its base URL or its
  ``/generate``); polling, cancel and lookup default to the simulator's routes.
- ``openai``: ``base_url``, ``api_key_env``, ``endpoint``, ``model``.

``options``: :class:`floodway.config.KindOptions` (docs/configuration.md lists them).

``idempotent`` (does the provider honour the ``Idempotency-Key`` every adapter sends, so that
resubmitting the work of a worker that died mid-call replays it instead of billing it again?)
defaults to True only for ``simulated`` kinds, whose simulator does: a provider floodway knows
nothing of is not trusted with a resubmission. Set ``options.idempotent = true`` for one that
honours the key.

Every adapter holds one pooled HTTP client; close them with :func:`aclose_kinds` when the
``Floodway`` closes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from pydantic import ValidationError

from floodway.config import KindConfig, KindOptions, format_validation_error
from floodway.core.errors import ConfigError
from floodway.core.task import JSON
from floodway.core.upstream import PollSchedule, first_poll_after
from floodway.kinds import KindRegistry, KindSpec, Lookup
from floodway.providers.base import (
    Adapter,
    AdapterHandler,
    AsyncJobs,
    UpstreamPoll,
    close_quietly,
)
from floodway.providers.cost import cost_rule, generic_tokens
from floodway.providers.http import HttpAdapter, HttpRoutes, JobFields
from floodway.providers.openai import DEFAULT_COST, OpenAIAdapter, replays_when

SIMULATOR_URL = "http://127.0.0.1:9000"
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
    return KindSpec(
        name=name,
        handler=AdapterHandler(adapter, jobs, schedule),
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
        poll=None if jobs is None else UpstreamPoll(jobs, schedule),
        poll_max_attempts=cfg.poll_max_attempts,
        close=adapter.aclose,
        replays=replays,
    )


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
    key = None
    if cfg.api_key_env:
        key = os.environ.get(cfg.api_key_env)
        if not key:
            raise ConfigError(
                f"{where}.api_key_env: environment variable {cfg.api_key_env} is unset"
            )
    return OpenAIAdapter(
        name=name,
        base_url=cfg.base_url or "https://api.openai.com/v1",
        endpoint=cfg.endpoint,
        api_key=key,
        model=cfg.model,
        headers=headers,
        timeout_s=cfg.timeout,
        cost=cost_rule(cfg.cost, DEFAULT_COST[cfg.endpoint], f"{where}.cost"),
    )
