"""Reading providers' HTTP answers into the retry policy's classes (shared by every adapter).

- 429 -> :class:`RetryableError` with ``throttled=True`` (the resource slows down; the task's
  retry budget is not spent), ``Retry-After`` honoured as seconds or an HTTP date, and
  ``retry-after-ms`` preferred when present. A 429 that says the account is out of quota or
  billing (``insufficient_quota``...) is :class:`FatalError`: waiting will not fix it. A 503
  that says "too many concurrent requests" is a throttle too: the provider's in-flight cap,
  answered with the status some providers use for it.
- 408, 425 and 5xx -> retryable. 409 -> retryable without spending an attempt
  (``in_progress``): providers that honour ``Idempotency-Key`` answer it while the same key is
  still being worked on (a call whose worker died, say), and asking again later replays the
  finished work.
- any other 4xx -> fatal, with the provider's own message and error type/code.
- timeouts and connection failures -> retryable.
"""

from __future__ import annotations

import email.utils
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import httpx

from floodway.core.errors import FatalError, HandlerError, InvalidOutput, RetryableError

if TYPE_CHECKING:
    from floodway.context import Context

#: error types/codes on a 429 that no amount of waiting fixes
FATAL_THROTTLE_TYPES = frozenset(
    {
        "insufficient_quota",
        "billing_hard_limit_reached",
        "billing_not_active",
        "billing_limit_reached",
        "quota_exceeded",
        "access_terminated",
        "account_deactivated",
    }
)
RETRYABLE_STATUSES = frozenset({408, 425})
_KEPT_HEADERS = ("retry-after", "retry-after-ms")
#: where a provider names its answer: OpenAI (and most compatible APIs), Anthropic
REQUEST_ID_HEADERS = ("x-request-id", "request-id")
#: the rate-limit header families the limiter reads (OpenAI's, Anthropic's, the IETF draft's)
_KEPT_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "ratelimit")
_MESSAGE_CHARS = 500


def retry_after_s(headers: Mapping[str, str], now: float) -> float | None:
    """``retry-after-ms`` (milliseconds), else ``Retry-After`` as seconds or an HTTP date
    (seconds from ``now``); None when absent or unreadable."""
    lower = {k.lower(): v for k, v in headers.items()}
    millis = lower.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = lower.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; be lenient with ones that omit it
        return None
    return max(0.0, when.timestamp() - now)


def provider_error(response: httpx.Response) -> tuple[str | None, str]:
    """(error type or code, message) from an error body: ``{"error": {"type"|"code",
    "message"}}`` (OpenAI and most others), ``{"error": "text"}``, ``{"message": ...}``, or the
    start of the raw text."""
    try:
        body = response.json()
    except ValueError:
        return None, response.text[:_MESSAGE_CHARS] or response.reason_phrase
    return error_of(body, response.reason_phrase)


def error_of(body: Any, default: str = "") -> tuple[str | None, str]:
    """(type or code, message) from a JSON error body or job description."""
    if not isinstance(body, dict):
        return None, default
    err = body.get("error", body)
    if isinstance(err, str):
        return None, err[:_MESSAGE_CHARS]
    if not isinstance(err, dict):
        return None, default
    # The code is the specific reason ("context_length_exceeded") when the type is generic
    # ("invalid_request_error"), so it wins.
    kind = err.get("code") or err.get("type")
    message = err.get("message") or err.get("detail") or default
    return (str(kind) if kind else None), str(message)[:_MESSAGE_CHARS]


def error_for(response: httpx.Response, now: float, what: str) -> HandlerError:
    """The exception a non-2xx answer to ``what`` (e.g. ``"POST /generate"``) maps to."""
    status = response.status_code
    kind, message = provider_error(response)
    text = f"{what}: HTTP {status}" + (f" {kind}" if kind else "") + f": {message}"
    wait = retry_after_s(response.headers, now)
    if status == 429 or (status == 503 and _too_many_concurrent(kind, message)):
        if kind in FATAL_THROTTLE_TYPES:
            return FatalError(text, type=kind, status=status)
        return RetryableError(
            text, retry_after=wait, throttled=True, type=kind or "rate_limited", status=status
        )
    if status == 409:
        return RetryableError(
            text, retry_after=wait, in_progress=True, type=kind or "in_progress", status=status
        )
    if status in RETRYABLE_STATUSES or status >= 500:
        return RetryableError(text, retry_after=wait, type=kind or f"http_{status}", status=status)
    return FatalError(text, type=kind or f"http_{status}", status=status)


def _too_many_concurrent(kind: str | None, message: str) -> bool:
    text = f"{kind or ''} {message}".lower().replace("_", " ")
    return "concurren" in text and ("too many" in text or "limit" in text)


def keep_headers(ctx: Context, response: httpx.Response) -> None:
    """Copy the rate-limit headers into ``ctx.response_headers`` so the limiter resyncs, and
    the provider's request id into ``ctx.upstream_request_id`` (an error's too: it is what the
    provider's support asks for)."""
    for key, value in response.headers.items():
        low = key.lower()
        if low.startswith(_KEPT_PREFIXES) or low in _KEPT_HEADERS:
            ctx.response_headers[low] = value
    for name in REQUEST_ID_HEADERS:
        request_id = response.headers.get(name)
        if request_id:
            ctx.upstream_request_id = request_id
            return


async def send(
    ctx: Context,
    call: Callable[[], Awaitable[httpx.Response]],
    what: str,
) -> httpx.Response:
    """Make one request; transport failures become retryable errors, headers are kept."""
    try:
        response = await call()
    except httpx.TimeoutException as exc:
        raise RetryableError(f"{what}: timed out ({type(exc).__name__})", type="timeout") from exc
    except httpx.TransportError as exc:
        raise RetryableError(f"{what}: {type(exc).__name__}: {exc}", type="connection") from exc
    keep_headers(ctx, response)
    return response


def json_body(response: httpx.Response, what: str) -> Any:
    """The JSON of a 2xx answer; a 2xx that is not JSON is unusable output (poison)."""
    try:
        return response.json()
    except (ValueError, json.JSONDecodeError) as exc:
        head = response.text[:120]
        raise InvalidOutput(f"{what}: the 2xx answer is not JSON: {head!r}") from exc


def usage_of(body: Any, field: str = "usage") -> float | None:
    """The metered amount a provider reports: a number, or ``total_tokens`` / ``tokens`` (or
    input + output tokens) in a usage object."""
    if not isinstance(body, dict):
        return None
    usage = body.get(field)
    if isinstance(usage, bool):
        return None
    if isinstance(usage, int | float):
        return float(usage)
    if not isinstance(usage, dict):
        return None
    for name in ("total_tokens", "tokens"):
        value = usage.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    parts = [
        usage.get(name)
        for name in ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")
    ]
    numbers = [float(p) for p in parts if isinstance(p, int | float) and not isinstance(p, bool)]
    return sum(numbers) if numbers else None


def token_split(body: Any, field: str = "usage") -> tuple[float, float] | None:
    """(input, output) tokens from a usage object that splits them (OpenAI's
    ``prompt_tokens``/``completion_tokens``, or ``input_tokens``/``output_tokens``)."""
    usage = body.get(field) if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None
    for names in (("prompt_tokens", "completion_tokens"), ("input_tokens", "output_tokens")):
        found = [_number(usage.get(n)) for n in names]
        if found != [None, None]:
            return found[0] or 0.0, found[1] or 0.0
    return None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def report_usage(ctx: Context, body: Any, field: str = "usage") -> None:
    """Tell ``ctx`` what the answer says was billed (split into input and output tokens when
    the provider splits it)."""
    amount = usage_of(body, field)
    if amount is None:
        return
    split = token_split(body, field)
    if split is None:
        ctx.report_usage(amount)
    else:
        ctx.report_usage(amount, input_tokens=split[0], output_tokens=split[1])
