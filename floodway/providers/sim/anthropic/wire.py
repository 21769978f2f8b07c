"""Anthropic's answers as the simulator writes them: its error object, its Message."""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

from floodway.providers.sim.openai.wire import json_response, tokens_of
from floodway.providers.sim.window import RateWindow

#: the status of each error type Anthropic answers
STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}


def error(kind: str, message: str, headers: Mapping[str, str] | None = None) -> Response:
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return json_response(body, STATUS[kind], headers)


def text_of(content: Any) -> str:
    """A message's text: a string, or its text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(b.get("text", "")) for b in content if isinstance(b, dict) and "text" in b
        )
    return ""


def prompt_tokens(body: dict[str, Any]) -> int:
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    return tokens_of(text_of(body.get("system"))) + sum(
        tokens_of(text_of(m.get("content"))) for m in messages
    )


def check(body: Any) -> str | None:
    """Why Anthropic would refuse this Messages request (None: it would not)."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model: Field required"
    tokens = body.get("max_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        return "max_tokens: Field required (a whole number of at least 1)"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    if not all(isinstance(m, dict) and m.get("role") in ("user", "assistant") for m in messages):
        return "messages: each message needs a role of user or assistant"
    return None


def message(body: dict[str, Any], message_id: str) -> dict[str, Any]:
    """The answer to a (valid) Messages request: an echo of its last message, cut at
    ``max_tokens`` words."""
    last = text_of(body["messages"][-1].get("content"))
    words = ("echo: " + last).split(" ")
    cut = len(words) > body["max_tokens"]
    words = words[: body["max_tokens"]]
    usage = {"input_tokens": prompt_tokens(body), "output_tokens": len(words),
             "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}  # fmt: skip
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": [{"type": "text", "text": " ".join(words)}],
        "stop_reason": "max_tokens" if cut else "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }


def rfc3339(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat().replace("+00:00", "Z")


def rate_limit_headers(window: RateWindow, now: float) -> list[tuple[bytes, bytes]]:
    """The ``anthropic-ratelimit-*`` headers of the limited dimensions (their reset a time)."""
    out: list[tuple[bytes, bytes]] = []
    for name, limit, used, reset_s in window.quotas(now):
        head = f"anthropic-ratelimit-{name}-"
        out += [
            (f"{head}limit".encode(), str(limit).encode()),
            (f"{head}remaining".encode(), str(max(0, limit - used)).encode()),
            (f"{head}reset".encode(), rfc3339(time.time() + reset_s).encode()),
        ]
    return out
