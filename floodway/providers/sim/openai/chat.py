"""``POST /v1/chat/completions``: an echo of the last message, whole or streamed as OpenAI
streams it (``chat.completion.chunk`` events, ``stream_options.include_usage``, ``[DONE]``)."""

from __future__ import annotations

from functools import partial
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
from floodway.providers.sim.openai.wire import json_response, sse, sse_response, tokens_of, words


def routes(sim: OpenAISimulator) -> list[Route]:
    return [Route("/v1/chat/completions", partial(create, sim), methods=["POST"])]


def text_of(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}  # fmt: skip


def _whole(head: dict[str, Any], reply: str, usage: dict[str, int]) -> dict[str, Any]:
    message = {"role": "assistant", "content": reply, "refusal": None}
    choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
    return {**head, "object": "chat.completion", "choices": [choice], "usage": usage}


def whole_completion(body: dict[str, Any], call_id: str) -> dict[str, Any]:
    """The answer to a (valid) chat request, not streamed: a batch line's."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    prompt = sum(tokens_of(text_of(m.get("content"))) for m in messages)
    reply = "echo: " + (text_of(messages[-1].get("content")) if messages else "")
    head = {"id": f"chatcmpl-{call_id}", "created": created(), "model": body.get("model"),
            "system_fingerprint": None}  # fmt: skip
    return _whole(head, reply, _usage(prompt, len(words(reply))))


async def create(sim: OpenAISimulator, request: Request) -> Response:
    try:
        body = await read_body(request)
        model = model_of(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages", "messages must be a non-empty array")
        if not all(isinstance(m, dict) for m in messages):
            raise BadRequest("messages", "each message must be an object")
    except BadRequest as exc:
        return exc.response()
    prompt = sum(tokens_of(text_of(m.get("content"))) for m in messages)
    reply = "echo: " + text_of(messages[-1].get("content"))
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True

    async def answer(job: Job) -> Response:
        pieces = words(reply)
        usage = _usage(prompt, len(pieces))
        head = {"id": f"chatcmpl-{job.id}", "created": created(), "model": model,
                "system_fingerprint": None}  # fmt: skip
        if body.get("stream") is not True:
            whole = _whole(head, reply, usage)
            sim.bill(job, usage["total_tokens"], whole)
            return json_response(whole)
        chunk = {**head, "object": "chat.completion.chunk"}
        if include_usage:
            chunk["usage"] = None

        def event(delta: dict[str, Any], finish: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return sse({**chunk, "choices": [choice]})

        events = [event({"role": "assistant", "content": "", "refusal": None})]
        events += [event({"content": piece}) for piece in pieces]
        events.append(event({}, "stop"))
        if include_usage:
            events.append(sse({**chunk, "choices": [], "usage": usage}))
        events.append(sse("[DONE]"))
        stream = sim.stream(job, usage["total_tokens"], events, cut=cut_requested(body))
        return sse_response(stream)

    return await sim.call(request.headers.get("idempotency-key"), body, prompt, answer)
