"""The ``http`` adapter: any JSON-over-HTTP provider, from configuration alone.

The request body is the task input; ``Idempotency-Key: ctx.work_key`` is always sent, so
a provider that honours it never bills the same work twice across retries and crash recovery.
Without ``poll_url`` the call is synchronous: a 2xx answer is the result (its ``result_field``
when the body has one, else the whole body). With ``poll_url`` the provider may answer with an
async job: ``status_field`` in ``done_values`` / ``failed_values`` says finished or failed, any
other status (or a 202 without one) is a running job whose id is ``id_field``.

Errors map as :mod:`floodway.providers.responses` says. A 2xx whose result fails the kind's
``output_schema`` is left to the executor (or the upstream poller), which counts it toward
poison exactly once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from floodway.core.errors import FatalError, HandlerError, RetryableError
from floodway.core.task import JSON
from floodway.core.upstream import JobView
from floodway.kinds import CostFn
from floodway.providers.base import Accepted, Finished, SharedClient, Submission
from floodway.providers.responses import (
    error_for,
    error_of,
    json_body,
    report_usage,
    send,
    usage_of,
)

if TYPE_CHECKING:
    from floodway.context import Context

log = logging.getLogger("floodway.providers")

#: a failed job with one of these error types fails the same way when resubmitted
FATAL_JOB_ERRORS = frozenset(
    {
        "content_policy",
        "content_policy_violation",
        "content_filter",
        "invalid_request",
        "invalid_request_error",
        "context_length_exceeded",
        "request_too_large",
        "insufficient_quota",
    }
)


@dataclass(frozen=True)
class HttpRoutes:
    """Where the provider's verbs live. ``{id}`` in a URL is the job id, ``{key}`` the
    idempotency key (both URL-quoted)."""

    submit: str
    poll: str | None = None
    cancel: str | None = None
    lookup: str | None = None
    result: str | None = None  # a separate result endpoint, when polling gives only a status
    cancel_method: str = "DELETE"


@dataclass(frozen=True)
class JobFields:
    """How to read a job description."""

    status: str = "status"
    done: frozenset[str] = frozenset({"succeeded", "completed", "done"})
    failed: frozenset[str] = frozenset({"failed", "error", "cancelled"})
    result: str = "result"
    id: str = "id"
    usage: str = "usage"


@dataclass
class HttpAdapter:
    name: str
    routes: HttpRoutes
    fields: JobFields = field(default_factory=JobFields)
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 60.0
    cost: CostFn | None = None
    #: added to the body so the provider calls back (``callback_url`` in ``options``)
    callback: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        self.http = SharedClient(self.timeout_s)

    @property
    def is_async(self) -> bool:
        return self.routes.poll is not None

    def estimate(self, value: JSON) -> float:
        return 0.0 if self.cost is None else float(self.cost(value))

    async def aclose(self) -> None:
        await self.http.aclose()

    # -- submit ---------------------------------------------------------------------------------
    async def submit(self, ctx: Context, value: JSON) -> Submission:
        body = value
        if self.callback is not None and isinstance(value, dict):
            name, url = self.callback
            body = {**value, name: url}
        url = self.routes.submit
        what = f"POST {url}"
        headers = {**self.headers, "Idempotency-Key": ctx.work_key}
        client = self.http.client
        response = await send(ctx, lambda: client.post(url, json=body, headers=headers), what)
        if not response.is_success:
            raise error_for(response, ctx.now(), what)
        data = json_body(response, what)
        if not self.is_async:
            self._report_usage(ctx, data)
            return Finished(self._result(data))
        view = self.interpret(data)
        if (
            isinstance(data, dict)
            and self.fields.status not in data
            and response.status_code == 202
        ):
            view = JobView("running")
        if view.state == "done":
            self._report_usage(ctx, data)
            return Finished(view.result)
        if view.state == "failed":
            raise self._failure(view, what)
        ref = data.get(self.fields.id) if isinstance(data, dict) else None
        if not isinstance(ref, str | int) or isinstance(ref, bool) or ref == "":
            raise FatalError(f"{what}: an async job answer without a job id ({self.fields.id!r})")
        return Accepted(str(ref))

    # -- async jobs -----------------------------------------------------------------------------
    async def poll(self, ctx: Context, ref: str) -> tuple[str, JSON]:
        assert self.routes.poll is not None
        url = _fill(self.routes.poll, id=ref)
        what = f"GET {url}"
        client = self.http.client
        response = await send(ctx, lambda: client.get(url, headers=self.headers), what)
        if response.status_code in (404, 410):
            return ("failed", f"the provider does not know job {ref} (HTTP {response.status_code})")
        if not response.is_success:
            raise error_for(response, ctx.now(), what)
        data = json_body(response, what)
        view = self.interpret(data)
        if view.state == "done":
            self._report_usage(ctx, data)
            result = view.result
            if self.routes.result is not None:
                result = await self.fetch_result(ctx, ref)
            return ("done", result)
        if view.state == "failed":
            error = self._failure(view, what)
            if isinstance(error, FatalError):
                raise error
            return ("failed", view.message)
        return ("running", None)

    async def fetch_result(self, ctx: Context, ref: str) -> JSON:
        template = self.routes.result or self.routes.poll
        assert template is not None
        url = _fill(template, id=ref)
        what = f"GET {url}"
        client = self.http.client
        response = await send(ctx, lambda: client.get(url, headers=self.headers), what)
        if not response.is_success:
            raise error_for(response, ctx.now(), what)
        return self._result(json_body(response, what))

    async def cancel(self, ctx: Context, ref: str) -> bool:
        if self.routes.cancel is None:
            return False
        url = _fill(self.routes.cancel, id=ref)
        method = self.routes.cancel_method
        client = self.http.client
        try:
            response = await send(
                ctx, lambda: client.request(method, url, headers=self.headers), f"{method} {url}"
            )
        except HandlerError as exc:
            log.info("%s: cancelling upstream job %s failed: %s", self.name, ref, exc)
            return False
        return response.is_success

    async def lookup(self, ctx: Context) -> JSON | None:
        """The result of finished work with this idempotency key, else None (crash recovery:
        take the result instead of resubmitting)."""
        if self.routes.lookup is None:
            return None
        url = _fill(self.routes.lookup, key=ctx.work_key)
        what = f"GET {url}"
        client = self.http.client
        response = await send(ctx, lambda: client.get(url, headers=self.headers), what)
        if response.status_code == 404:
            return None
        if not response.is_success:
            raise error_for(response, ctx.now(), what)
        data = json_body(response, what)
        view = self.interpret(data)
        if view.state != "done":
            return None
        self._report_usage(ctx, data)
        return view.result

    def interpret(self, body: JSON) -> JobView:
        f = self.fields
        if not isinstance(body, dict):
            return JobView("done", body)
        status = body.get(f.status)
        if status is None:
            return JobView("done", self._result(body)) if f.result in body else JobView("running")
        if str(status) in f.done:
            return JobView("done", self._result(body), usage=usage_of(body, f.usage))
        if str(status) in f.failed:
            kind, message = error_of(body, f"the job ended {status}")
            fatal = kind in FATAL_JOB_ERRORS
            return JobView("failed", message=message, error_type=kind, fatal=fatal)
        return JobView("running")

    def job_id(self, body: JSON) -> str | None:
        ref = body.get(self.fields.id) if isinstance(body, dict) else None
        if ref is None or ref == "" or isinstance(ref, bool | dict | list):
            return None
        return str(ref)

    # -- helpers --------------------------------------------------------------------------------
    def _result(self, data: JSON) -> JSON:
        if isinstance(data, dict) and self.fields.result in data:
            return data[self.fields.result]
        return data

    def _report_usage(self, ctx: Context, data: Any) -> None:
        report_usage(ctx, data, self.fields.usage)

    def _failure(self, view: JobView, what: str) -> HandlerError:
        text = f"{what}: upstream job failed" + (f" ({view.error_type})" if view.error_type else "")
        text += f": {view.message}"
        if view.fatal:
            return FatalError(text, type=view.error_type)
        return RetryableError(text, type=view.error_type or "upstream_failed")


def _fill(template: str, **values: str) -> str:
    for name, value in values.items():
        template = template.replace("{" + name + "}", quote(value, safe=""))
    return template
