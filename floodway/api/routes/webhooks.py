"""``POST /v1/webhooks/{kind}``: a provider says an upstream job ended.

Authenticated by the Standard Webhooks signature with the kind's ``webhook_secret`` (not by an
API key: providers have none). Checking the signature and applying the callback are the
providers' seam (:mod:`floodway.providers.webhook_in`): the kind's adapter reads the body the
way its poll reads a job, and the write is the same compare-and-set a poll makes, so a webhook
racing a poll, or delivered three times, lands once; the others are answered 200 and change
nothing.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from floodway.api.openapi import problems
from floodway.api.problems import ApiProblem
from floodway.api.schemas import WebhookAck
from floodway.api.state import ApiState, api_state
from floodway.core.errors import UnknownKind
from floodway.wire.signing import WebhookSignatureError, verify
from floodway.wire.tasks import valid_unicode
from floodway.worker.callbacks import apply_callback

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])


@router.post(
    "/{kind}",
    response_model=WebhookAck,
    summary="Inbound provider callback (Standard Webhooks signature)",
    responses=problems(401, 404, 422),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        "parameters": [
            {"name": h, "in": "header", "required": False, "schema": {"type": "string"}}
            for h in ("webhook-id", "webhook-timestamp", "webhook-signature")
        ],
    },
)
async def inbound_webhook(
    kind: str, request: Request, state: Annotated[ApiState, Depends(api_state)]
) -> WebhookAck:
    fw = state.fw
    cfg = fw.settings.kinds.get(kind)
    secret = cfg.webhook_secret if cfg is not None else None
    if cfg is None or not secret or kind not in fw.kinds:
        state.metrics.webhooks_in.labels("unknown_kind").inc()
        raise ApiProblem(404, "unknown-webhook", f"no kind {kind[:200]!r} takes webhooks")
    body = await request.body()
    try:
        verify(secret, request.headers, body, fw.clock.now())
    except WebhookSignatureError as exc:
        state.metrics.webhooks_in.labels("bad_signature").inc()
        raise ApiProblem(401, "invalid-signature", str(exc)) from None
    payload = _payload(body)
    try:
        result = await apply_callback(fw.runtime, kind, payload)
    except UnknownKind:
        raise ApiProblem(404, "unknown-webhook", f"no kind {kind[:200]!r} takes webhooks") from None
    except ValueError as exc:
        raise ApiProblem(422, "invalid-webhook", str(exc)) from None
    if result.task is None:
        # Possibly a callback that beat the durable write of the job id by more than the
        # wait above: a non-2xx makes the provider deliver it again later.
        state.metrics.webhooks_in.labels("unknown_job").inc()
        raise ApiProblem(404, "unknown-upstream-job", "no task waits on the job it names")
    outcome = "applied" if result.applied else "ignored"
    state.metrics.webhooks_in.labels(outcome).inc()
    task = await fw.get(result.task.id)
    return WebhookAck(status=outcome, task_id=task.id, task_status=task.status)


def _payload(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        raise ApiProblem(400, "malformed-json", "the webhook body is not valid JSON") from None
    if not isinstance(payload, dict) or not valid_unicode(payload):
        raise ApiProblem(422, "invalid-webhook", "the webhook body must be a JSON object")
    return payload
