"""Routes that take a JSON body answer 415 to a body sent as anything else.

A body posted as a form (what ``curl -d`` sends unless told otherwise) used to fail
validation with "Input should be a valid dictionary", which says nothing about the header
that is missing. Taking any body as JSON whatever its Content-Type would be friendlier still,
but it would let any web page the user visits submit billed work to a local, open API: a
browser sends a form or ``text/plain`` POST to another origin without asking first, while
``application/json`` needs the server's CORS consent, which floodway never gives.
"""

from __future__ import annotations

import email.message
import json
from typing import Any

import orjson
from fastapi import Depends, Request
from fastapi.responses import Response

from floodway.api.problems import ApiProblem


def is_json_media_type(content_type: str | None) -> bool:
    """``application/json`` or ``application/<anything>+json`` (parameters ignored)."""
    if not content_type:
        return False
    if content_type == "application/json":  # what nearly every client sends: no parsing
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


async def require_json(request: Request) -> None:
    """A non-empty body must say it is JSON; an empty one is left to the body's validation."""
    content_type = request.headers.get("content-type")
    if is_json_media_type(content_type) or not await request.body():
        return
    sent = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
    raise ApiProblem(
        415,
        "unsupported-media-type",
        f"the body must be JSON, sent with the header 'Content-Type: application/json' "
        f"(this request had {sent}; with curl: -H 'Content-Type: application/json')",
        headers={"Accept-Post": "application/json"},
    )


JSON_BODY = Depends(require_json)


def json_response(body: Any, status_code: int = 200) -> Response:
    """``body`` as JSON, encoded by orjson (several times faster than the standard library on
    a task's answer). An integer beyond 64 bits, which orjson refuses and a client may have
    sent in an input, takes the standard library's way."""
    try:
        content = orjson.dumps(body)
    except orjson.JSONEncodeError:
        content = json.dumps(body, ensure_ascii=False, allow_nan=False).encode()
    return Response(content, status_code=status_code, media_type="application/json")
