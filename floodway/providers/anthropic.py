"""The ``anthropic`` adapter: Anthropic's Messages API (``POST {base_url}/v1/messages``).

The task input is the request body (``model`` and ``max_tokens`` filled in from the kind when
the input has none); the result is the Message Anthropic answers. The key comes from the
environment variable named by ``api_key_env`` and goes in ``x-api-key``, with
``anthropic-version: 2023-06-01``.

Anthropic takes no idempotency key and has no look-up of finished work: a call floodway hung
up on may have been billed, and only its own answer says so (the kind declares neither, so
the hang-up rule of core/hangup.py ends such a task instead of sending it twice).

Cost: estimated before the call as the prompt's characters / 4 plus ``max_tokens``, which the
API requires, so the estimate is the call's worst case; settled after it from ``usage``,
whose cache tokens are counted as input tokens at Anthropic's cache rates
(:func:`billed_tokens`). Errors: a 429 ``rate_limit_error`` throttles the resource
(``retry-after`` honoured), a 529 ``overloaded_error`` too (the provider is short of capacity:
not the task's fault), a 500 or 503 is retried, a 400 ``invalid_request_error``, 401, 403 or
404 is fatal with Anthropic's message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from floodway.core.errors import FatalError, HandlerError, InvalidInput, RetryableError
from floodway.core.task import JSON
from floodway.kinds import CostFn
from floodway.providers.base import Finished, Submission
from floodway.providers.cost import CHARS_PER_TOKEN, count_field, text_of
from floodway.providers.openai import JSON_CONTENT, encode
from floodway.providers.responses import error_for, json_body
from floodway.providers.transport import AioSession

if TYPE_CHECKING:
    import httpx

    from floodway.context import Context

BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
OVERLOADED = 529
#: what a cache token costs against an input token (Anthropic's published rates): a write to
#: the 5-minute cache, to the 1-hour one, and a read
CACHE_WRITE_5M, CACHE_WRITE_1H, CACHE_READ = 1.25, 2.0, 0.1


def _count(usage: dict[str, Any], name: str) -> float:
    value = usage.get(name)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def billed_tokens(message: Any) -> tuple[float, float] | None:
    """(input, output) tokens a Message's ``usage`` bills, its cache tokens counted as input
    tokens at their rate (so the kind's input price prices them); None without usage."""
    usage = message.get("usage") if isinstance(message, dict) else None
    if not isinstance(usage, dict):
        return None
    written = usage.get("cache_creation")
    if isinstance(written, dict):  # the split by cache lifetime, when the API gives it
        writes = CACHE_WRITE_5M * _count(written, "ephemeral_5m_input_tokens")
        writes += CACHE_WRITE_1H * _count(written, "ephemeral_1h_input_tokens")
    else:
        writes = CACHE_WRITE_5M * _count(usage, "cache_creation_input_tokens")
    reads = CACHE_READ * _count(usage, "cache_read_input_tokens")
    return _count(usage, "input_tokens") + writes + reads, _count(usage, "output_tokens")


def anthropic_estimate(max_output: int | None) -> CostFn:
    """A Messages request's worst case: its prompt (``system`` and ``messages``) plus its
    ``max_tokens``, else the kind's ``max_output``; a request bounding neither is refused
    (the API would refuse it)."""

    def estimate(value: Any) -> float:
        if not isinstance(value, dict):
            raise InvalidInput("the input must be a JSON object (a Messages request body)")
        output = count_field(value, "max_tokens") or max_output
        if output is None:
            raise InvalidInput("max_tokens is required (or set the kind's max_output_tokens)")
        messages = value.get("messages")
        chars = len(text_of(value.get("system")))
        if isinstance(messages, list):
            chars += sum(
                len(text_of(m.get("content"))) + len(str(m.get("role", "")))
                for m in messages
                if isinstance(m, dict)
            )
        return float(chars // CHARS_PER_TOKEN + output)

    return estimate


def anthropic_error(response: httpx.Response, now: float, what: str) -> HandlerError:
    """A non-2xx answer as the retry policy reads it: the shared mapping, and a 529 a
    throttle."""
    error = error_for(response, now, what)
    if response.status_code == OVERLOADED and isinstance(error, RetryableError):
        return RetryableError(
            str(error), retry_after=error.retry_after, throttled=True,
            type=error.error_type, status=OVERLOADED,
        )  # fmt: skip
    return error


def report_message_usage(ctx: Context, message: Any, tier: str = "sync") -> None:
    split = billed_tokens(message)
    if split is not None:
        ctx.report_usage(split[0] + split[1], input_tokens=split[0], output_tokens=split[1],
                         tier=tier)  # fmt: skip


@dataclass
class AnthropicAdapter:
    name: str
    base_url: str = BASE_URL
    api_key: str | None = None
    model: str | None = None
    #: the ``max_tokens`` of a request that sets none
    max_tokens: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 60.0
    #: unset: :func:`anthropic_estimate`
    cost: CostFn | None = None

    def __post_init__(self) -> None:
        self.http = AioSession(self.timeout_s)
        self.root = self.base_url.rstrip("/")
        self.url = self.root + "/v1/messages"
        self._estimate = self.cost or anthropic_estimate(self.max_tokens)

    @property
    def api_headers(self) -> dict[str, str]:
        """The headers of every call to the API (its key, its version)."""
        headers = {"anthropic-version": API_VERSION, **self.headers}
        if self.api_key:
            headers["x-api-key"] = self.api_key
        return headers

    def estimate(self, value: JSON) -> float:
        return float(self._estimate(value))

    async def aclose(self) -> None:
        await self.http.aclose()

    def request_body(self, value: JSON) -> dict[str, Any]:
        """The request a task's input asks for: the input, with the kind's model and
        ``max_tokens`` when it names none."""
        if not isinstance(value, dict):
            raise FatalError(f"{self.name}: the input must be a JSON object (the request body)")
        body = dict(value)
        if self.model and "model" not in body:
            body["model"] = self.model
        if self.max_tokens is not None and "max_tokens" not in body:
            body["max_tokens"] = self.max_tokens
        return body

    async def submit(self, ctx: Context, value: JSON) -> Submission:
        body = self.request_body(value)
        if body.get("stream") is True:
            raise FatalError(f"{self.name}: streaming is not supported; send stream = false")
        what = f"POST {self.url}"
        headers = {**self.api_headers, **JSON_CONTENT}
        response = await self.http.post(ctx, self.url, encode(body), headers, what)
        if not response.is_success:
            raise anthropic_error(response, ctx.now(), what)
        message = json_body(response, what)
        report_message_usage(ctx, message)
        return Finished(message)
