"""Kinds declared in configuration with ``adapter = "http" | "openai" | "simulated"``.

``build_provider_kind`` turns one ``[kinds.NAME]`` table into a :class:`KindSpec`:

- ``http``: ``url`` (required), ``poll_url`` (set -> async jobs), ``cancel_url``,
  ``lookup_url`` (``{key}`` = the idempotency key), ``headers`` with ``${ENV}`` expansion.
- ``simulated``: the http adapter pointed at a simulator (``url`` = its base URL or its
  ``/generate``); polling, cancel and lookup default to the simulator's routes.
- ``openai``: ``base_url``, ``api_key_env``, ``endpoint``, ``model``.

``options`` (all optional): ``poll_ratio`` (poll gap as a share of the job's age, default 0.13),
``poll_max_interval`` (duration, default 60s), ``callback_url`` (added to the request body as
``callback_field``, default ``"callback_url"``; ``{kind}`` is replaced by the kind's name),
``cancel_method`` (default DELETE), ``result_url`` (``{id}``: a separate result endpoint),
``usage_field`` (default ``"usage"``), ``idempotent`` (see below).

``idempotent`` (may floodway resubmit work whose worker died?) is True for http and simulated
kinds: they always send ``Idempotency-Key``, so a provider that honours it replays instead of
billing again. Set ``options.idempotent = false`` for a provider that ignores the header. It is
False for openai kinds (the OpenAI API does not promise to honour the key).

Every adapter holds one pooled HTTP client; close them with :func:`aclose_kinds` when the
``Floodway`` closes.
"""

from __future__ import annotations

import os
import re
from typing import Any

from floodway.config import KindConfig, Settings, parse_duration
from floodway.core.errors import ConfigError
from floodway.kinds import KindRegistry, KindSpec, Lookup
from floodway.providers.base import (
    Adapter,
    AdapterHandler,
    AsyncJobs,
    PollSchedule,
    UpstreamPoll,
    close_quietly,
)
from floodway.providers.cost import cost_rule, generic_tokens
from floodway.providers.http import HttpAdapter, HttpRoutes, JobFields
from floodway.providers.job_durations import JobDurations
from floodway.providers.openai import DEFAULT_COST, OpenAIAdapter

SIMULATOR_URL = "http://127.0.0.1:9000"
#: the first poll of a kind with no ``poll_after`` whose jobs have not finished yet
DEFAULT_POLL_AFTER_S = 1.0
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_OPTIONS = frozenset(
    {
        "poll_ratio",
        "poll_max_interval",
        "callback_url",
        "callback_field",
        "cancel_method",
        "result_url",
        "usage_field",
        "idempotent",
    }
)


def build_provider_kind(name: str, cfg: KindConfig, settings: Settings) -> KindSpec:
    """The :class:`KindSpec` of a config-declared provider kind (raises ConfigError)."""
    where = f"kinds.{name}"
    unknown = sorted(set(cfg.options) - _OPTIONS)
    if unknown:
        raise ConfigError(
            f"{where}.options: unknown option(s) {', '.join(unknown)}"
            f" (known: {', '.join(sorted(_OPTIONS))})"
        )
    headers = {k: expand_env(v, f"{where}.headers.{k}") for k, v in cfg.headers.items()}
    adapter: Adapter
    jobs: AsyncJobs | None = None
    lookup: Lookup | None = None
    if cfg.adapter == "openai":
        adapter = _openai(name, cfg, headers, where)
        idempotent = _flag(cfg.options.get("idempotent", False), f"{where}.options.idempotent")
    elif cfg.adapter in ("http", "simulated"):
        http = _http(name, cfg, headers, where)
        adapter = http
        jobs = http if http.is_async else None
        lookup = http.lookup if http.routes.lookup is not None else None
        idempotent = _flag(cfg.options.get("idempotent", True), f"{where}.options.idempotent")
    else:
        raise ConfigError(f"{where}.adapter: {cfg.adapter!r} is not a provider adapter")
    schedule = poll_schedule(cfg, where)
    return KindSpec(
        name=name,
        handler=AdapterHandler(adapter, jobs, schedule),
        resource=cfg.resource,
        max_attempts=cfg.max_attempts,
        deadline_s=cfg.deadline,
        timeout_s=cfg.timeout,
        cost=adapter.estimate,
        version=cfg.version,
        dedupe=cfg.dedupe,
        fallback=cfg.fallback,
        output_schema=cfg.output_schema,
        idempotent=idempotent,
        lookup=lookup,
        poll=None if jobs is None else UpstreamPoll(jobs, schedule),
        poll_after_s=schedule.first_s,
        poll_max_attempts=cfg.poll_max_attempts,
    )


async def aclose_kinds(kinds: KindRegistry) -> None:
    """Close every provider kind's pooled HTTP client (call it from ``Floodway.close``)."""
    for spec in kinds.specs():
        closer = getattr(spec.handler, "aclose", None)
        if closer is not None:
            await close_quietly(closer)


def poll_schedule(cfg: KindConfig, where: str) -> PollSchedule:
    """The kind's poll timing: the first poll after ``poll_after``, or after
    ``callback_grace`` when the provider calls back (``webhook_secret`` set). With neither, the
    kind learns its jobs' durations (``DEFAULT_POLL_AFTER_S`` until one has finished)."""
    learn = cfg.poll_after is None and not cfg.webhook_secret
    if cfg.webhook_secret:
        first = cfg.callback_grace
    else:
        first = DEFAULT_POLL_AFTER_S if cfg.poll_after is None else cfg.poll_after
    ratio = _number(cfg.options.get("poll_ratio", 0.13), f"{where}.options.poll_ratio")
    if not 0 < ratio <= 10:
        raise ConfigError(f"{where}.options.poll_ratio: must be in (0, 10], not {ratio}")
    try:
        max_gap = parse_duration(cfg.options.get("poll_max_interval", 60.0))
    except ValueError as exc:
        raise ConfigError(f"{where}.options.poll_max_interval: {exc}") from None
    if max_gap <= 0:
        raise ConfigError(f"{where}.options.poll_max_interval: must be positive")
    durations = JobDurations() if learn else None
    return PollSchedule(first_s=first, ratio=ratio, max_gap_s=max_gap, durations=durations)


def expand_env(text: str, where: str) -> str:
    """Replace ``${NAME}`` with the environment variable NAME (unset -> ConfigError)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        found = os.environ.get(name)
        if found is None:
            raise ConfigError(f"{where}: environment variable {name} is not set")
        return found

    return _ENV.sub(value, text)


def _http(name: str, cfg: KindConfig, headers: dict[str, str], where: str) -> HttpAdapter:
    options = cfg.options
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
            result=_text(options.get("result_url"), f"{where}.options.result_url"),
        )
    method = _text(options.get("cancel_method", "DELETE"), f"{where}.options.cancel_method")
    routes = HttpRoutes(
        routes.submit,
        routes.poll,
        routes.cancel,
        routes.lookup,
        routes.result,
        (method or "DELETE").upper(),
    )
    fields = JobFields(
        status=cfg.status_field,
        done=frozenset(cfg.done_values),
        failed=frozenset(cfg.failed_values),
        result=cfg.result_field,
        id=cfg.id_field,
        usage=_text(options.get("usage_field", "usage"), f"{where}.options.usage_field") or "usage",
    )
    callback = None
    callback_url = _text(options.get("callback_url"), f"{where}.options.callback_url")
    if callback_url:
        field = _text(options.get("callback_field", "callback_url"), f"{where}.options")
        callback = (field or "callback_url", callback_url.replace("{kind}", name))
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


def _text(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ConfigError(f"{where}: must be a string, not {value!r}")


def _flag(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{where}: must be true or false, not {value!r}")


def _number(value: Any, where: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ConfigError(f"{where}: must be a number, not {value!r}")
