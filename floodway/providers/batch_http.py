"""What the providers' batch APIs (openai_batch.py, anthropic_batch.py) share: their requests,
whose failures map to the retry policy's classes as the adapter's calls do, and the JSONL of
their results, one :class:`~floodway.core.tiers.LineResult` per request."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

from floodway.core.errors import FatalError, HandlerError, RetryableError
from floodway.core.tiers import LineResult
from floodway.providers.base import SharedClient
from floodway.providers.responses import error_for

ErrorMap = Callable[[httpx.Response, float, str], HandlerError]


class BatchHttp:
    """Requests to one provider's batch API under ``base_url``, with ``headers``."""

    def __init__(
        self, base_url: str, headers: dict[str, str], timeout_s: float,
        errors: ErrorMap = error_for,
    ) -> None:  # fmt: skip
        self.http = SharedClient(timeout_s)
        self.root = base_url.rstrip("/")
        self.headers = headers
        self._errors = errors

    async def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """``path`` under the base URL, or a whole URL the provider gave (a results URL)."""
        url = path if path.startswith(("http://", "https://")) else self.root + path
        what = f"{method} {url}"
        try:
            response = await self.http.client.request(method, url, headers=self.headers, **kwargs)
        except httpx.HTTPError as exc:
            raise RetryableError(f"{what}: {type(exc).__name__}", type="connection") from exc
        if not response.is_success:
            raise self._errors(response, 0.0, what)
        return response

    async def aclose(self) -> None:
        await self.http.aclose()


def read_jsonl(
    text: str, read_line: Callable[[Any], LineResult | None], where: str
) -> list[LineResult]:
    """The results in a JSONL answer (lines about no request are skipped)."""
    found: list[LineResult] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        try:
            result = read_line(json.loads(raw))
        except ValueError:
            raise FatalError(f"{where} is not JSONL") from None
        if result is not None:
            found.append(result)
    return found
