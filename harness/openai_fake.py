"""An OpenAI-compatible fake provider: chat completions, embeddings and image generation,
with a ledger of what it billed and a 429 storm on demand.

Every answered call is billed (its usage and Idempotency-Key recorded in
:attr:`FakeOpenAI.billed`), whether or not the client still waits for the answer; a 429 or a
5xx bills nothing, as at OpenAI. ``storm(n)`` answers the next ``n`` calls 429 with
``retry-after-ms``, the way OpenAI throttles; ``latency_s`` delays every answer. A chat whose
last message starts with "refuse" is refused (400 ``content_policy_violation``), and a body
OpenAI could not read is a 400 ``invalid_request_error`` naming the field. With ``longest``
set, the model writes all it may: each of a chat's ``n`` answers is as long as the request's
output bound, else ``longest`` tokens, and bills so (a budget's worst case).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


@dataclass(frozen=True)
class Bill:
    """One billed call: the endpoint, the model, the usage it was charged for, and the
    Idempotency-Key it came with (floodway's work key)."""

    endpoint: str
    model: str
    tokens: int
    images: int = 0
    key: str | None = None


@dataclass
class FakeOpenAI:
    latency_s: float = 0.0
    retry_after_ms: int = 50
    #: set: the output tokens of an answer whose request bounds none (answers are that long)
    longest: int | None = None
    billed: list[Bill] = field(default_factory=list)
    throttled: int = 0
    #: the Authorization header of every request (the server's provider key, never a tenant's)
    authorizations: list[str] = field(default_factory=list)
    in_flight: int = 0
    peak_in_flight: int = 0
    _storm: int = 0
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def storm(self, calls: int) -> None:
        """Answer the next ``calls`` requests 429 (nothing billed)."""
        self._storm += calls

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/embeddings", self._embeddings, methods=["POST"]),
                Route("/v1/images/generations", self._images, methods=["POST"]),
            ]
        )

    async def _answer(self, request: Request, endpoint: str) -> tuple[dict[str, Any], Any]:
        self.authorizations.append(request.headers.get("authorization", ""))
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            body = await request.json()
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
        finally:
            self.in_flight -= 1
        if self._storm > 0:
            self._storm -= 1
            self.throttled += 1
            raise _Throttled(self.retry_after_ms)
        return body, next(self._ids)

    async def _chat(self, request: Request) -> JSONResponse:
        try:
            body, n = await self._answer(request, "chat")
        except _Throttled as exc:
            return exc.response()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
            return _invalid("messages", "messages must be a non-empty list of messages")
        if not isinstance(body.get("max_tokens", 0), int):
            return _invalid("max_tokens", "max_tokens must be an integer")
        text = str(messages[-1].get("content", ""))
        if text.startswith("refuse"):
            error = {
                "message": "Your request was rejected by the safety system",
                "type": "invalid_request_error",
                "param": None,
                "code": "content_policy_violation",
            }
            return JSONResponse({"error": error}, status_code=400)
        prompt, completion = len(text) // 4 + 1, self._completion(body)
        self.billed.append(Bill("chat", body["model"], prompt + completion, key=_key(request)))
        return JSONResponse(
            {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "created": 1_700_000_000,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": f"echo: {text}"},
                        "finish_reason": "stop",
                        "logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            }
        )

    def _completion(self, body: dict[str, Any]) -> int:
        """The output tokens billed: 3, or with ``longest`` all ``n`` answers at their bound."""
        if self.longest is None:
            return 3
        bound = body.get("max_completion_tokens", body.get("max_tokens", self.longest))
        return int(body.get("n", 1)) * int(bound)

    async def _embeddings(self, request: Request) -> JSONResponse:
        try:
            body, _ = await self._answer(request, "embeddings")
        except _Throttled as exc:
            return exc.response()
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            return _invalid("input", "input must be a string or a list of strings")
        tokens = sum(len(str(t)) // 4 + 1 for t in texts)
        self.billed.append(Bill("embeddings", body["model"], tokens, key=_key(request)))
        data = [
            {"object": "embedding", "index": i, "embedding": _vector(str(t))}
            for i, t in enumerate(texts)
        ]
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": body["model"],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def _images(self, request: Request) -> JSONResponse:
        try:
            body, n = await self._answer(request, "images")
        except _Throttled as exc:
            return exc.response()
        count = body.get("n", 1)
        if not isinstance(count, int) or count < 1:
            return _invalid("n", "n must be a positive integer")
        self.billed.append(
            Bill("images", body.get("model", ""), 0, images=count, key=_key(request))
        )
        data = [{"url": f"https://images.example/{n}-{i}.png"} for i in range(count)]
        return JSONResponse({"created": 1_700_000_000, "data": data})


class _Throttled(Exception):
    def __init__(self, retry_after_ms: int) -> None:
        self.retry_after_ms = retry_after_ms

    def response(self) -> JSONResponse:
        error = {
            "message": "Rate limit reached for requests",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
        return JSONResponse(
            {"error": error}, status_code=429, headers={"retry-after-ms": str(self.retry_after_ms)}
        )


def _key(request: Request) -> str | None:
    return request.headers.get("idempotency-key")


def _invalid(param: str, message: str) -> JSONResponse:
    """OpenAI's answer to a request it cannot read (nothing billed)."""
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    return JSONResponse({"error": error}, status_code=400)


def _vector(text: str) -> list[float]:
    """Four numbers that depend on the text only (so equal inputs embed equally)."""
    digest = hashlib.sha256(json.dumps(text).encode()).digest()
    return [b / 255 for b in digest[:4]]
