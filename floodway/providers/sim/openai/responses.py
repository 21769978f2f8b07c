"""The Responses API: ``POST /v1/responses`` (whole, ``stream``, ``background``), ``GET``,
``DELETE``, ``POST .../cancel`` and ``GET .../input_items`` of a stored response. The answer
echoes the last input text; a stream sends OpenAI's events, numbered by ``sequence_number``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from floodway.providers.sim.model import Job
from floodway.providers.sim.openai.calls import (
    BadRequest,
    OpenAISimulator,
    created,
    cut_requested,
    model_of,
    read_body,
)
from floodway.providers.sim.openai.chat import text_of
from floodway.providers.sim.openai.wire import (
    error,
    json_response,
    sse,
    sse_response,
    tokens_of,
    words,
)


@dataclass
class Stored:
    response: dict[str, Any]
    items: list[dict[str, Any]]
    events: list[str] = field(default_factory=list)


class Responses:
    """The responses this simulator keeps (``store`` is true unless the request says not)."""

    def __init__(self, sim: OpenAISimulator) -> None:
        self.sim = sim
        self.kept: dict[str, Stored] = {}

    def routes(self) -> list[Route]:
        return [
            Route("/v1/responses", self.create, methods=["POST"]),
            Route("/v1/responses/{rid}", self.get, methods=["GET"]),
            Route("/v1/responses/{rid}", self.delete, methods=["DELETE"]),
            Route("/v1/responses/{rid}/cancel", self.cancel, methods=["POST"]),
            Route("/v1/responses/{rid}/input_items", self.input_items, methods=["GET"]),
        ]

    async def create(self, request: Request) -> Response:
        try:
            body = await read_body(request)
            model = model_of(body)
            items = input_items(body.get("input"))
        except BadRequest as exc:
            return exc.response()
        instructions = body.get("instructions")
        prompt = sum(tokens_of(text_of(i.get("content"))) for i in items)
        prompt += tokens_of(instructions) if isinstance(instructions, str) else 0
        reply = "echo: " + text_of(items[-1].get("content"))
        rid = self.sim.new_id("resp")
        key = request.headers.get("idempotency-key")
        stored = Stored(shell(rid, model, body, "queued"), items)
        if body.get("store", True) is not False:
            self.kept[rid] = stored

        async def answer(job: Job) -> Response:
            pieces = words(reply)
            total = prompt + len(pieces)
            usage: dict[str, Any] = {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": len(pieces),
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": total,
            }
            done = {**stored.response, "status": "completed", "usage": usage,
                    "output": [message(self.sim.new_id("msg"), reply)]}  # fmt: skip
            stored.response = done
            if body.get("stream") is not True:
                self.sim.bill(job, total, done)
                return json_response(done)
            stored.events = stream_events(done, pieces)
            stream = self.sim.stream(
                job, usage["total_tokens"], stored.events, cut=cut_requested(body)
            )
            return sse_response(stream)

        if body.get("background") is True:

            async def later() -> None:
                stored.response = {**stored.response, "status": "in_progress"}
                answered = await self.sim.call(key, {**body, "stream": False}, prompt, answer)
                if answered.status_code != 200 and stored.response["status"] != "cancelled":
                    stored.response = {**stored.response, "status": "failed"}

            self.sim.spawn(later())
            return json_response(stored.response)
        return await self.sim.call(key, body, prompt, answer)

    def _found(self, request: Request) -> Stored | Response:
        rid = request.path_params["rid"]
        stored = self.kept.get(rid)
        if stored is None:
            return error(404, f"Response with id '{rid}' not found.", param="response_id")
        return stored

    async def get(self, request: Request) -> Response:
        stored = self._found(request)
        return stored if isinstance(stored, Response) else json_response(stored.response)

    async def delete(self, request: Request) -> Response:
        stored = self._found(request)
        if isinstance(stored, Response):
            return stored
        rid = stored.response["id"]
        del self.kept[rid]
        return json_response({"id": rid, "object": "response", "deleted": True})

    async def cancel(self, request: Request) -> Response:
        stored = self._found(request)
        if isinstance(stored, Response):
            return stored
        if not stored.response.get("background"):
            return error(400, "Only background responses can be cancelled.")
        if stored.response["status"] in ("queued", "in_progress"):
            stored.response = {**stored.response, "status": "cancelled"}
        return json_response(stored.response)

    async def input_items(self, request: Request) -> Response:
        stored = self._found(request)
        if isinstance(stored, Response):
            return stored
        data = list(reversed(stored.items))  # newest first, as OpenAI lists them
        return json_response({"object": "list", "data": data, "first_id": data[0]["id"],
                              "last_id": data[-1]["id"], "has_more": False})  # fmt: skip


def routes(sim: OpenAISimulator) -> list[Route]:
    return Responses(sim).routes()


def input_items(given: Any) -> list[dict[str, Any]]:
    """The input as message items: a string is one user message."""
    if isinstance(given, str) and given:
        given = [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given or not all(isinstance(i, dict) for i in given):
        raise BadRequest("input", "input must be a non-empty string or array of input items")
    items = []
    for item in given:
        content = item.get("content")
        parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
        role = item.get("role", "user")
        items.append({"id": OpenAISimulator.new_id("msg"), "type": "message", "role": role,
                      "content": parts, "status": "completed"})  # fmt: skip
    return items


def shell(rid: str, model: str, body: dict[str, Any], status: str) -> dict[str, Any]:
    """A response object before its output."""
    return {
        "id": rid,
        "object": "response",
        "created_at": created(),
        "status": status,
        "background": body.get("background") is True,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": [],
        "parallel_tool_calls": True,
        "previous_response_id": body.get("previous_response_id"),
        "store": body.get("store", True) is not False,
        "temperature": body.get("temperature", 1.0),
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": None,
        "metadata": body.get("metadata") or {},
    }


def message(mid: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {"id": mid, "type": "message", "status": status, "role": "assistant",
            "content": [part] if text or status == "completed" else []}  # fmt: skip


def stream_events(done: dict[str, Any], pieces: list[str]) -> list[str]:
    """OpenAI's events for ``done`` streamed a word at a time, numbered from 0."""
    item = done["output"][0]
    text = item["content"][0]["text"]
    started = {**done, "status": "in_progress", "output": [], "usage": None}
    where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
    empty = {"type": "output_text", "text": "", "annotations": []}
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": started}),
        ("response.in_progress", {"response": started}),
        (
            "response.output_item.added",
            {"output_index": 0, "item": {**message(item["id"], "", "in_progress")}},
        ),
        ("response.content_part.added", {**where, "part": empty}),
        *(("response.output_text.delta", {**where, "delta": p, "logprobs": []}) for p in pieces),
        ("response.output_text.done", {**where, "text": text, "logprobs": []}),
        ("response.content_part.done", {**where, "part": item["content"][0]}),
        ("response.output_item.done", {"output_index": 0, "item": item}),
        ("response.completed", {"response": done}),
    ]
    return [
        sse({"type": kind, "sequence_number": n, **data}, kind)
        for n, (kind, data) in enumerate(events)
    ]
