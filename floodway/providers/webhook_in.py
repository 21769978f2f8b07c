"""Inbound provider callbacks: check the signature, then finish the task waiting on the job.

The API's ``POST /v1/webhooks/{kind}`` calls :func:`verify_signature` with the kind's
``webhook_secret`` and the raw body, then :func:`apply_callback` with the parsed JSON.
Signatures follow Standard Webhooks (``webhook-id``, ``webhook-timestamp``,
``webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``), as the simulator
and many providers send them.

A callback and a poll may race: both are compare-and-set writes on the task, the first one wins
and the other changes nothing, so a late, duplicated or replayed callback is harmless.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from floodway.core.errors import FloodwayError
from floodway.core.outcome import Failed, Outcome
from floodway.core.states import Status
from floodway.core.task import ErrorClass, ErrorInfo
from floodway.kinds import KindSpec
from floodway.providers.base import JobView
from floodway.providers.http import FATAL_JOB_ERRORS
from floodway.runtime import Runtime
from floodway.worker.upstream import finish_upstream, job_outcome

#: a parked task is waited for this long when a callback arrives before it is parked
SETTLE_WAIT_S = 2.0
_RECHECK_S = 0.05


class WebhookSignatureError(FloodwayError):
    """The callback is not provably from the provider (answer it 401, do not apply it)."""


def verify_signature(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    tolerance_s: float = 300,
) -> None:
    """Raise :class:`WebhookSignatureError` unless ``body`` is signed with ``secret`` and its
    timestamp is within ``tolerance_s`` of ``now`` (replays of old messages are refused).

    ``secret`` is used as UTF-8 bytes, or base64-decoded when it has the ``whsec_`` prefix."""
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id = lower.get("webhook-id")
    stamp = lower.get("webhook-timestamp")
    signatures = lower.get("webhook-signature")
    if not msg_id or not stamp or not signatures:
        raise WebhookSignatureError(
            "missing webhook-id, webhook-timestamp or webhook-signature header"
        )
    try:
        sent_at = int(stamp)
    except ValueError:
        raise WebhookSignatureError(f"webhook-timestamp {stamp!r} is not a number") from None
    if abs(now - sent_at) > tolerance_s:
        raise WebhookSignatureError(
            f"webhook-timestamp is {now - sent_at:+.0f}s from now (tolerance {tolerance_s:g}s)"
        )
    key = _secret_bytes(secret)
    signed = f"{msg_id}.{sent_at}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    for candidate in signatures.split():
        version, _, value = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(value, expected):
            return
    raise WebhookSignatureError("no webhook-signature matches the body")


def _secret_bytes(secret: str) -> bytes:
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        except binascii.Error:
            raise WebhookSignatureError("the whsec_ secret is not valid base64") from None
    return secret.encode()


async def apply_callback(
    fw_runtime: Runtime, kind: str, payload: Any, *, settle_wait_s: float = SETTLE_WAIT_S
) -> bool:
    """Finish the task of ``kind`` waiting on the job ``payload`` describes. True if this
    callback wrote the task's new status; False when there was nothing to do (the job is still
    running, no task waits on it, the task already ended, or a poll got there first).

    Raises :class:`~floodway.core.errors.UnknownKind` for a kind nobody declared and
    ``ValueError`` for a payload without a job id (answer 4xx)."""
    runtime = fw_runtime
    spec = runtime.kinds.get(kind)
    view, ref = _read(spec.poll, payload)
    if view.state == "running":
        return False
    # A callback can outrun the handler that submitted the job: give it a moment to record
    # the job id and park, and give a poll in progress a moment to finish.
    give_up = runtime.clock.now() + settle_wait_s
    while True:
        task = await runtime.store.find_upstream(kind, ref)
        if task is not None and task.status is not Status.RUNNING:
            return False
        if task is not None and task.parked:
            outcome = _outcome(spec, runtime, view)
            decided = runtime.policy.decide(task, outcome, runtime.clock.now())
            item = dataclasses.replace(decided, lease_token=None, parked=True)
            if await finish_upstream(runtime, task, item, usage=view.usage):
                return True
        if runtime.clock.now() >= give_up:
            return False
        await runtime.clock.sleep(_RECHECK_S)


def _read(poll: Any, payload: Any) -> tuple[JobView, str]:
    interpret = getattr(poll, "interpret", None)
    fields = getattr(getattr(poll, "jobs", None), "fields", None)
    id_field = getattr(fields, "id", "id")
    if not isinstance(payload, dict) or payload.get(id_field) in (None, ""):
        raise ValueError(f"the callback has no job id ({id_field!r})")
    ref = str(payload[id_field])
    if interpret is not None:
        view = interpret(payload)
        if isinstance(view, JobView):
            return view, ref
    return _default_view(payload), ref


def _default_view(payload: dict[str, Any]) -> JobView:
    """Read a callback for a kind without an adapter (a python kind with its own poll)."""
    status = str(payload.get("status", ""))
    if status in ("succeeded", "completed", "done"):
        return JobView("done", payload.get("result", payload))
    if status in ("failed", "error", "cancelled"):
        error = payload.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        return JobView("failed", message=str(message or f"the job ended {status}"))
    return JobView("running")


def _outcome(spec: KindSpec, runtime: Runtime, view: JobView) -> Outcome:
    if view.state == "failed" and view.error_type in FATAL_JOB_ERRORS:
        # Resubmitting would fail the same way (a refusal, a bad request): as the poll does.
        error = ErrorInfo(ErrorClass.FATAL, view.error_type or "upstream_failed", view.message)
        return Failed(error, usage=view.usage)
    value = view.result if view.state == "done" else view.message
    return job_outcome(spec, runtime.policy, view.state, value, view.usage)
