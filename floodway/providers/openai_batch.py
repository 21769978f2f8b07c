"""OpenAI's Batch API for the batch tier (core/tiers.py): a JSONL file of requests uploaded
(``purpose = "batch"``), a batch of it created with floodway's id in its ``metadata``,
retrieved, cancelled, found again by that id after a crash, and its output and error files
read back into one :class:`~floodway.core.tiers.LineResult` per ``custom_id`` (a task id).

A line answered 200 is a result (billed, at the batch price); a line that failed is fatal
when the same request would fail again (4xx other than 408, 409 and 429), retryable
otherwise (a 5xx, an expired or cancelled line).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from floodway.core.errors import RetryableError
from floodway.core.task import JSON
from floodway.core.tiers import LineResult, SoughtBatch, UpstreamView
from floodway.providers.batch_http import BatchHttp, read_jsonl
from floodway.providers.responses import token_split

#: the metadata key that carries floodway's id of a provider batch
TAG = "floodway_batch"
#: pages of the provider's batch list read to find a batch by its tag (newest first)
FIND_PAGES = 10
_RETRYABLE_4XX = frozenset({408, 409, 429})


def _view(body: Any) -> UpstreamView:
    if not isinstance(body, dict) or not isinstance(body.get("id"), str):
        raise RetryableError("the provider answered a batch without an id", type="bad_batch")
    metadata = body.get("metadata")
    tag = metadata.get(TAG) if isinstance(metadata, dict) else None
    return UpstreamView(
        ref=body["id"],
        status=str(body.get("status", "")),
        output_file=body.get("output_file_id"),
        error_file=body.get("error_file_id"),
        tag=tag if isinstance(tag, str) else None,
    )


def read_line(line: Any) -> LineResult | None:
    """One line of an output or error file (None: not a line about a request)."""
    if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str):
        return None
    custom_id = line["custom_id"]
    response = line.get("response")
    error = line.get("error")
    if isinstance(response, dict):
        status = response.get("status_code")
        body = response.get("body")
        if status == 200:
            split = token_split(body) or (0.0, 0.0)
            return LineResult(custom_id, True, body, split[0], split[1])
        detail = body.get("error") if isinstance(body, dict) else None
        message = detail.get("message") if isinstance(detail, dict) else None
        code = detail.get("code") if isinstance(detail, dict) else None
        fatal = isinstance(status, int) and 400 <= status < 500 and status not in _RETRYABLE_4XX
        return LineResult(
            custom_id,
            False,
            error=str(message or f"the batch line answered {status}"),
            error_type=str(code or f"http_{status}"),
            fatal=fatal,
        )
    message = error.get("message") if isinstance(error, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return LineResult(
        custom_id,
        False,
        error=str(message or "the batch line failed"),
        error_type=str(code or "batch_line_failed"),
    )


@dataclass
class OpenAIBatchApi:
    """The Batch API under ``base_url`` for one kind's endpoint (``path``: /v1/chat/completions,
    /v1/embeddings, /v1/responses)."""

    name: str
    base_url: str
    path: str
    headers: dict[str, str]
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        self.http = BatchHttp(self.base_url, self.headers, self.timeout_s)

    def line(self, custom_id: str, body: dict[str, object]) -> JSON:
        return {"custom_id": custom_id, "method": "POST", "url": self.path, "body": body}

    async def _upload(self, lines: list[JSON]) -> str:
        content = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
        files = {"file": ("floodway-batch.jsonl", content.encode(), "application/jsonl")}
        response = await self.http.send("POST", "/files", data={"purpose": "batch"}, files=files)
        file_id = response.json().get("id")
        if not isinstance(file_id, str):
            raise RetryableError("the provider answered a file without an id", type="bad_file")
        return file_id

    async def create(self, lines: list[JSON], tag: str) -> UpstreamView:
        """The lines uploaded as a file, and a batch of it created with ``tag`` in its
        metadata."""
        file_id = await self._upload(lines)
        body = {
            "input_file_id": file_id,
            "endpoint": self.path,
            "completion_window": "24h",
            "metadata": {TAG: tag},
        }
        return _view((await self.http.send("POST", "/batches", json=body)).json())

    async def find(self, sought: SoughtBatch) -> list[UpstreamView]:
        """The batch whose metadata carries the sought tag (none or one)."""
        after: str | None = None
        for _ in range(FIND_PAGES):
            params: dict[str, Any] = {"limit": 100}
            if after is not None:
                params["after"] = after
            page = (await self.http.send("GET", "/batches", params=params)).json()
            data = page.get("data") if isinstance(page, dict) else None
            if not isinstance(data, list) or not data:
                return []
            for item in data:
                view = _view(item)
                if view.tag == sought.tag:
                    return [view]
            if not page.get("has_more"):
                return []
            after = _view(data[-1]).ref
        return []

    async def retrieve(self, ref: str) -> UpstreamView:
        return _view((await self.http.send("GET", f"/batches/{ref}")).json())

    async def cancel(self, ref: str) -> UpstreamView:
        return _view((await self.http.send("POST", f"/batches/{ref}/cancel")).json())

    async def results(self, view: UpstreamView) -> list[LineResult]:
        found: list[LineResult] = []
        for file_id in (view.output_file, view.error_file):
            if file_id:
                text = (await self.http.send("GET", f"/files/{file_id}/content")).text
                found += read_jsonl(text, read_line, f"{self.name}: file {file_id}")
        return found

    async def aclose(self) -> None:
        await self.http.aclose()
