"""The ``openai`` adapter: OpenAI-compatible APIs (OpenAI, Azure-style gateways, vLLM, Ollama...).

``endpoint`` picks chat completions, embeddings or image generation under ``base_url``; the task
input is the request body (``model`` filled in from the kind when the input has none) and the
result is the provider's JSON answer. The key comes from the environment variable named by
``api_key_env``.

Cost: estimated before the call (prompt characters / 4 + ``max_tokens`` for chat, input / 4 for
embeddings, ``n`` images), settled after it from ``usage`` (``ctx.report_usage``). Errors:
``insufficient_quota`` and billing errors are fatal even on a 429 (waiting will not refill the
account), a plain 429 is retryable and throttles the resource (``retry-after-ms`` or
``Retry-After`` honoured), content-policy refusals and ``context_length_exceeded`` are fatal and
say so. A completion that stopped on the content filter, or carries a ``refusal``, is fatal too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import aiohttp
import orjson

from floodway.core.errors import FatalError, RetryableError
from floodway.core.task import JSON
from floodway.kinds import CostFn
from floodway.providers.base import Finished, Submission
from floodway.providers.cost import openai_estimate
from floodway.providers.responses import error_for, json_body, keep_headers, report_usage
from floodway.providers.transport import AioSession, as_httpx
from floodway.wire.openai import ENDPOINT_PATHS, STREAM_OBJECT, is_last_event

if TYPE_CHECKING:
    from floodway.context import Context

Endpoint = Literal["chat", "embeddings", "images", "responses"]
#: how often a stream's events are handed on, and the most of one floodway keeps
STREAM_FLUSH_S = 0.05
MAX_STREAM_BYTES = 16 * 2**20
JSON_CONTENT = {"Content-Type": "application/json"}


def _usage_event(events: list[str]) -> Any:
    """The stream's usage: a chat stream's usage chunk, or the response a Responses stream
    ended with (the last event that carries usage), parsed."""
    for data in reversed(events):
        if '"usage"' in data and data != "[DONE]":
            try:
                chunk = json.loads(data)
            except ValueError:
                continue
            if isinstance(chunk, dict) and (chunk.get("usage") or chunk.get("response")):
                return chunk
    return None


def encode(body: JSON) -> bytes:
    """The request body as JSON (orjson's, unless it holds an integer past 64 bits)."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body).encode()


def replays_when(endpoint: str) -> Callable[[JSON], bool] | None:
    """Which finished results a new identical request takes: only a deterministic request's
    (a "regenerate" at a temperature asks for a new sample). Embeddings are deterministic;
    an image is a sample; a chat or a response is deterministic at temperature 0 or, for
    chat, with a seed."""
    if endpoint == "embeddings":
        return None
    if endpoint == "images":
        return _never
    return deterministic


def _never(_: JSON) -> bool:
    return False


def deterministic(body: JSON) -> bool:
    """A request whose answer a new identical one may take (temperature 0, or a seed)."""
    if not isinstance(body, dict):
        return False
    return body.get("temperature") == 0 or body.get("seed") is not None


@dataclass
class OpenAIAdapter:
    name: str
    base_url: str
    endpoint: Endpoint = "chat"
    api_key: str | None = None
    model: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 60.0
    #: unset: the endpoint's worst case (:func:`~floodway.providers.cost.openai_estimate`)
    cost: CostFn | None = None

    def __post_init__(self) -> None:
        self.http = AioSession(self.timeout_s)
        self.url = self.base_url.rstrip("/") + ENDPOINT_PATHS[self.endpoint]
        self._estimate = self.cost or openai_estimate(self.endpoint, self.model, None)

    def estimate(self, value: JSON) -> float:
        return float(self._estimate(value))

    async def aclose(self) -> None:
        await self.http.aclose()

    def request_body(self, value: JSON) -> dict[str, Any]:
        """The request a task's input asks for: the input, with the kind's model when it
        names none."""
        if not isinstance(value, dict):
            raise FatalError(f"{self.name}: the input must be a JSON object (the request body)")
        body = dict(value)
        if self.model and "model" not in body:
            body["model"] = self.model
        return body

    async def submit(self, ctx: Context, value: JSON) -> Submission:
        body = self.request_body(value)
        # Most OpenAI-compatible servers ignore it; gateways that honour it avoid double billing.
        headers = {**self.headers, "Idempotency-Key": ctx.work_key, **JSON_CONTENT}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        what = f"POST {self.url}"
        if self.endpoint == "chat" and body.get("stream") is True:
            # Usage always: the task's cost and spend settle from it (the API passes it on
            # only to a client that asked).
            options = body.get("stream_options")
            body["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                      "include_usage": True}  # fmt: skip
            return Finished(await self._stream(ctx, body, headers, what))
        if self.endpoint == "responses" and (body.get("stream") is True or body.get("background")):
            # A background response is floodway's task: streamed here, so that its events are
            # kept (a client resumes them by number) while the provider runs it in the
            # foreground.
            body.pop("background", None)
            body["stream"] = True
            return Finished(await self._stream(ctx, body, headers, what))
        response = await self.http.post(ctx, self.url, encode(body), headers, what)
        if not response.is_success:
            raise error_for(response, ctx.now(), what)
        data = json_body(response, what)
        self._report(ctx, data)
        if self.endpoint == "chat":
            _refuse_refusals(data, what)
        return Finished(data)

    async def _stream(
        self, ctx: Context, body: dict[str, Any], headers: dict[str, str], what: str
    ) -> JSON:
        """Read the provider's stream to its end, handing its events on as they come
        (``ctx.stream``, a flush every 50 ms). A failure before the first event is any call's
        (retried); after it, the stream ends for good: the client has part of it."""
        events: list[str] = []
        pending: list[str] = []
        size, flushed, ended = 0, ctx.now(), False
        async with self.http.open(self.url, encode(body), headers, what) as answer:
            if answer.status != 200:
                response = as_httpx(answer, await answer.read())
                keep_headers(ctx, response)
                raise error_for(response, ctx.now(), what)
            keep_headers(ctx, as_httpx(answer, b""))
            try:
                async for line in answer.content:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip().decode("utf-8", "replace")
                    events.append(data)
                    pending.append(data)
                    size += len(data)
                    if size > MAX_STREAM_BYTES:
                        raise FatalError(
                            f"{what}: the stream passed {MAX_STREAM_BYTES} bytes, more than "
                            "floodway keeps of one",
                            type="stream_too_long",
                        )
                    ended = is_last_event(data)
                    if ended or ctx.now() - flushed >= STREAM_FLUSH_S:
                        await ctx.stream(pending)
                        pending, flushed = [], ctx.now()
            except (aiohttp.ClientError, TimeoutError) as exc:
                if not events:
                    raise RetryableError(
                        f"{what}: {type(exc).__name__}", type="connection"
                    ) from exc
        await ctx.stream(pending)
        if not ended:
            if not events:
                raise RetryableError(f"{what}: the stream ended before its first event")
            raise FatalError(
                f"{what}: the provider's stream broke after {len(events)} events",
                type="stream_interrupted",
            )
        usage = _usage_event(events)
        report_usage(ctx, usage.get("response", usage) if isinstance(usage, dict) else None)
        return {"object": STREAM_OBJECT, "events": events}

    def _report(self, ctx: Context, data: Any) -> None:
        if self.endpoint == "images" and isinstance(data, dict):
            images = data.get("data")
            if isinstance(images, list):
                ctx.report_usage(float(len(images)), images=float(len(images)))
                return
        report_usage(ctx, data)


def _refuse_refusals(data: Any, what: str) -> None:
    """A 200 can still be a refusal: the content filter stopped it, or the model declined."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list):
        return
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        refusal = message.get("refusal") if isinstance(message, dict) else None
        if refusal:
            raise FatalError(f"{what}: the model refused: {refusal}", type="refusal")
        if choice.get("finish_reason") == "content_filter":
            raise FatalError(
                f"{what}: the completion was stopped by the content filter", type="content_filter"
            )
