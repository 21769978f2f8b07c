"""Anthropic's Message Batches API for the batch tier (core/tiers.py): a batch created with its
requests inline (``{custom_id, params}``, the custom_id a task id), retrieved, cancelled,
listed, and its results (JSONL at its ``results_url``) read back into one
:class:`~floodway.core.tiers.LineResult` per ``custom_id``.

Its ``processing_status`` is read in OpenAI's words, as the batcher reads every provider's:
``in_progress``; ``canceling`` -> ``cancelling``; ``ended`` -> ``cancelled`` when a cancel was
asked for, ``expired`` when lines expired, else ``completed``.

An Anthropic batch has no metadata: after a crash between its creation and its record it is
found among the account's batches, listed newest first, as one of the row's size (its
``request_counts`` add up to the row's lines) created since the row was packed (less
:data:`CLOCK_SKEW_S`: the provider's clock is another host's). The batcher takes the oldest
such batch no row of the ledger recorded; while a row waits to be mended it creates no other
batch (floodway/maintenance/tier_batches.py), so that batch is the row's own as long as
floodway's ledger is the only one creating batches with the key (give it a workspace of its
own). A result line whose custom_id is no line of the row is ignored, so a batch wrongly
taken answers none of its lines: they go on a faster tier.

A line ``succeeded`` is a result (billed, at the batch price); ``errored`` with an
``invalid_request_error`` is fatal (the same request fails again), with any other error
retryable. A ``canceled`` or ``expired`` line is one the batch ended without, as an OpenAI
batch's missing line is: withdrawn, its task sent on a faster tier (neither is billed).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from floodway.core.errors import RetryableError
from floodway.core.task import JSON
from floodway.core.tiers import CANCELLING, LineResult, SoughtBatch, UpstreamView
from floodway.providers.anthropic import anthropic_error, billed_tokens
from floodway.providers.batch_http import BatchHttp, read_jsonl

PATH = "/v1/messages/batches"
#: how much earlier than its row the provider's clock may date the batch the row made
CLOCK_SKEW_S = 300.0
#: pages of the provider's batch list read to find a batch (newest first, 100 a page)
FIND_PAGES = 10
FATAL_LINE_ERRORS = frozenset({"invalid_request_error"})


def _epoch(value: Any) -> float | None:
    """An RFC 3339 time as Unix seconds (None: absent or unreadable)."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _counts(body: dict[str, Any]) -> dict[str, int]:
    counts = body.get("request_counts")
    if not isinstance(counts, dict):
        return {}
    return {k: v for k, v in counts.items() if isinstance(v, int) and not isinstance(v, bool)}


def _status(body: dict[str, Any]) -> str:
    status = body.get("processing_status")
    if status == "canceling":
        return CANCELLING
    if status != "ended":
        return str(status or "")
    if body.get("cancel_initiated_at"):
        return "cancelled"
    return "expired" if _counts(body).get("expired") else "completed"


def read_batch(body: Any) -> UpstreamView:
    """A Message Batch as the batcher reads it."""
    if not isinstance(body, dict) or not isinstance(body.get("id"), str):
        raise RetryableError("the provider answered a batch without an id", type="bad_batch")
    results = body.get("results_url")
    return UpstreamView(
        ref=body["id"],
        status=_status(body),
        output_file=results if isinstance(results, str) else None,
    )


def read_line(line: Any) -> LineResult | None:
    """One line of a batch's results (None: not a line about a request, or one the batch
    ended without answering)."""
    if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str):
        return None
    custom_id = line["custom_id"]
    given = line.get("result")
    result: dict[str, Any] = given if isinstance(given, dict) else {}
    kind = result.get("type")
    if kind == "succeeded":
        message = result.get("message")
        split = billed_tokens(message) or (0.0, 0.0)
        return LineResult(custom_id, True, message, split[0], split[1])
    if kind == "errored":
        outer = result.get("error")
        # {"type": "error", "error": {"type": ..., "message": ...}}, the API's error object
        inner = outer.get("error", outer) if isinstance(outer, dict) else None
        error_type = inner.get("type") if isinstance(inner, dict) else None
        message = inner.get("message") if isinstance(inner, dict) else None
        return LineResult(
            custom_id, False, error=str(message or "the batch line errored"),
            error_type=str(error_type or "batch_line_errored"),
            fatal=error_type in FATAL_LINE_ERRORS,
        )  # fmt: skip
    return None  # canceled or expired: one the batch ended without


@dataclass
class AnthropicBatchApi:
    """The Message Batches API under ``base_url``."""

    name: str
    base_url: str
    headers: dict[str, str]
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        self.http = BatchHttp(self.base_url, self.headers, self.timeout_s, anthropic_error)

    def line(self, custom_id: str, body: dict[str, object]) -> JSON:
        return {"custom_id": custom_id, "params": body}

    async def create(self, lines: list[JSON], tag: str) -> UpstreamView:
        """The batch created (``tag`` has no place in it: :meth:`find` says how it is found)."""
        return read_batch((await self.http.send("POST", PATH, json={"requests": lines})).json())

    async def find(self, sought: SoughtBatch) -> list[UpstreamView]:
        """The batches of the sought size created since it was packed, oldest first."""
        found: list[UpstreamView] = []
        since = sought.packed_at - CLOCK_SKEW_S
        after: str | None = None
        for _ in range(FIND_PAGES):
            params: dict[str, Any] = {"limit": 100}
            if after is not None:
                params["after_id"] = after
            page = (await self.http.send("GET", PATH, params=params)).json()
            data = page.get("data") if isinstance(page, dict) else None
            if not isinstance(data, list) or not data:
                break
            for item in data:
                view = read_batch(item)
                created = _epoch(item.get("created_at"))
                if created is not None and created < since:
                    return found[::-1]  # the list is newest first: the rest is older
                if sum(_counts(item).values()) == sought.lines:
                    found.append(view)
            if not page.get("has_more"):
                break
            after = read_batch(data[-1]).ref
        return found[::-1]

    async def retrieve(self, ref: str) -> UpstreamView:
        return read_batch((await self.http.send("GET", f"{PATH}/{ref}")).json())

    async def cancel(self, ref: str) -> UpstreamView:
        return read_batch((await self.http.send("POST", f"{PATH}/{ref}/cancel")).json())

    async def results(self, view: UpstreamView) -> list[LineResult]:
        # The results URL the batch names, if it is under the base URL: the key goes nowhere else.
        url = view.output_file or ""
        if not url.startswith(self.http.root + "/"):
            url = f"{PATH}/{view.ref}/results"
        text = (await self.http.send("GET", url)).text
        return read_jsonl(text, read_line, f"{self.name}: the results of batch {view.ref}")

    async def aclose(self) -> None:
        await self.http.aclose()
