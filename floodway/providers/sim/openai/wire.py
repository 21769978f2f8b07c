"""OpenAI's answers, as the simulator writes them: JSON and SSE bodies serialised by hand (the
simulator keeps up with 1,000+ requests/s), OpenAI's error object, and the usage figures."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.responses import Response, StreamingResponse

from floodway.providers.sim.state import Rejection


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def json_response(
    body: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(dumps(body), status_code=status, media_type="application/json", headers=headers)


def sse_response(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else dumps(data)}\n\n"


def error(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return json_response(body, status, headers)


def rejection(refused: Rejection) -> Response:
    """The simulator's refusal (its limits, a key in progress) as OpenAI answers it."""
    headers = {}
    if refused.retry_after is not None:
        headers["retry-after"] = str(refused.retry_after)
        headers["retry-after-ms"] = str(refused.retry_after_ms or 1000 * refused.retry_after)
    if refused.status == 429:
        return error(
            429,
            f"Rate limit reached: {refused.message}",
            "requests",
            "rate_limit_exceeded",
            headers=headers,
        )
    return error(refused.status, refused.message, code=refused.type, headers=headers)


def tokens_of(text: str) -> int:
    """OpenAI's rule of thumb: about four characters a token."""
    return len(text) // 4 + 1


def words(text: str) -> list[str]:
    """The pieces a stream sends: each word with the space before it."""
    parts = text.split(" ")
    return [parts[0], *(" " + p for p in parts[1:])]
