"""What the simulator works on: a parsed submission, the outcome drawn for it, and the job that
records it (sync requests are jobs too, so they can be looked up by id or idempotency key)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import httpx


class Fate(StrEnum):
    """What the simulator decided will happen to one request. The values are what ``"fail"``
    forces."""

    OK = "ok"
    RATE_LIMITED = "429"
    REFUSAL = "refusal"
    SERVER_ERROR = "5xx"
    TIMEOUT = "timeout"
    MALFORMED = "malformed"


FORCEABLE = {o.value: o for o in Fate if o is not Fate.OK}

# The error body of a job that failed with each outcome, and the status a sync request gets.
FAILURES: dict[Fate, tuple[int, str, str]] = {
    Fate.REFUSAL: (400, "content_policy", "the request was refused by the content policy"),
    Fate.SERVER_ERROR: (503, "server_error", "the provider failed to process the request"),
    Fate.TIMEOUT: (504, "timeout", "the provider did not answer in time"),
}


class InvalidSubmission(ValueError):
    """A /generate body the provider cannot accept (answered 400 invalid_request)."""


@dataclass(frozen=True, slots=True)
class Submission:
    input: dict[str, Any]
    tokens: int
    key: str | None
    forced: Fate | None
    callback_url: str | None


def parse_submission(body: bytes, key: str | None) -> Submission:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise InvalidSubmission("body is not valid JSON") from exc
    if not isinstance(data, dict):
        raise InvalidSubmission("body must be a JSON object")
    return Submission(
        input=data,
        tokens=_tokens(data),
        key=key or None,
        forced=_forced(data.get("fail")),
        callback_url=_callback_url(data.get("callback_url")),
    )


def _tokens(data: dict[str, Any]) -> int:
    tokens = data.get("tokens")
    if tokens is None:
        # A rough "4 characters per token", on a canonical form so formatting does not count.
        return len(json.dumps(data, separators=(",", ":"), ensure_ascii=False)) // 4
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise InvalidSubmission("tokens must be a non-negative integer")
    return tokens


def _forced(fail: Any) -> Fate | None:
    if fail is None:
        return None
    if not isinstance(fail, str) or fail not in FORCEABLE:
        raise InvalidSubmission(f"fail must be one of {sorted(FORCEABLE)}")
    return FORCEABLE[fail]


def _callback_url(url: Any) -> str | None:
    if url is None:
        return None
    if not isinstance(url, str):
        raise InvalidSubmission("callback_url must be a string")
    try:
        scheme = httpx.URL(url).scheme
    except httpx.InvalidURL as exc:
        raise InvalidSubmission(f"callback_url is not a URL: {exc}") from exc
    if scheme not in ("http", "https"):
        raise InvalidSubmission("callback_url must be an http(s) URL")
    return url


@dataclass(slots=True)
class Job:
    id: str
    key: str | None
    input: dict[str, Any]
    tokens: int
    callback_url: str | None
    generation: int
    status: str = "running"
    result: Any = None
    usage: dict[str, int] | None = None
    garbage: str | None = None
    error: dict[str, str] | None = None
    outcome: Fate | None = None
    charged_as: str | None = None
    task: asyncio.Task[None] | None = None

    def settle(self, outcome: Fate) -> None:
        """Write the job's final fields for ``outcome``."""
        self.outcome = outcome
        if outcome in FAILURES:
            _status, kind, message = FAILURES[outcome]
            self.status = "failed"
            self.error = {"type": kind, "message": message}
            return
        self.status = "succeeded"
        self.usage = {"tokens": self.tokens}
        if outcome is Fate.MALFORMED:
            self.garbage = "<html>502 bad gateway</html>"
        else:
            self.result = {"url": f"https://sim.invalid/img/{self.id}.png", "echo": self.input}

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "status": self.status,
            "result": self.result,
            "usage": self.usage,
        }
        if self.garbage is not None:
            out["garbage"] = self.garbage
        if self.error is not None:
            out["error"] = self.error
        return out

    def failure_status(self) -> int:
        """The HTTP status a sync request that ended in this job's failure gets."""
        assert self.outcome in FAILURES, "only a failed job has a failure status"
        return FAILURES[self.outcome][0]
