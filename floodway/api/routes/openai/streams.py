"""A streamed OpenAI call (``stream: true``): a task like any other, its events read from the
ledger as the worker that holds its slot appends them, so the client may be served by any
API process, and every client of the same work (an identical request in flight, the same
Idempotency-Key, later a replay) gets the whole stream from its first event.

While the task waits its turn the client gets SSE comments (``: queued, position N``) every
``[api] stream_keepalive``, so no proxy's idle timeout cuts it; the answer's status is
committed only then, so a call refused before its first event (the provider refused it, the
work died) is an HTTP error as for any call. After the first event a failure ends the
stream with an error event: the client has part of the answer, so nothing continues it on
another attempt. A client that hangs up stops nothing: the worker reads the provider's
stream to its end and keeps it for the same request again.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi.responses import StreamingResponse

from floodway.api.routes.openai.calls import failure
from floodway.api.routes.openai.headers import task_headers
from floodway.api.state import ApiState
from floodway.clock import event_set_within
from floodway.core.errors import IllegalTransition, TaskNotFound
from floodway.core.states import Status
from floodway.core.task import Task
from floodway.wire.openai import STREAM_OBJECT, is_last_event, openai_error, task_failure

if TYPE_CHECKING:
    from floodway.runtime import Watch

#: events read from the ledger at once
READ_AT_ONCE = 1000
#: ready tasks looked through for a queue position
POSITION_HORIZON = 1000
QUEUE_HEADER = "x-floodway-queue-position"


@dataclass
class _Ended:
    """The stream's end: the events still to send, and an error event or ``None``."""

    error: str | None = None


#: an event as one client gets it: its SSE text, or None to leave it out
Render = Callable[[str], str | None]


@dataclass
class StreamReader:
    """One client's view of a streamed call: which task's events it reads, how many it has
    sent, and how it shows each one (``render``); ``named``: the events carry their type as
    the SSE event name (the Responses API's)."""

    state: ApiState
    task: Task
    render: Render
    named: bool = False
    #: the task whose events are read: the call's own, or the one it joined in flight
    source: str = ""
    sent: int = 0
    _watch: Watch | None = None

    def __post_init__(self) -> None:
        self.source = self.task.id

    async def first(self, patience_s: float) -> list[str] | _Ended:
        """The first events, the end (raised as the call's HTTP error when nothing was sent),
        or nothing yet after ``patience_s`` (the client gets comments from then on)."""
        clock = self.state.fw.clock
        give_up = clock.now() + patience_s
        try:
            while True:
                got = await self._pull()
                if isinstance(got, _Ended) and got.error is not None and self.sent == 0:
                    headers = task_headers(self.task.id, self.task.upstream_request_id)
                    raise failure(self.task, headers)
                if got:
                    return got
                left = give_up - clock.now()
                if left <= 0:
                    return []
                await self._wait(left)
        finally:
            # Let go of the watch: the body may never start (the client hung up first), and
            # only a started body lets go of what it holds. Its first read watches again.
            self._unwatch()

    async def rest(self, first: list[str] | _Ended) -> AsyncIterator[str]:
        """The SSE body: comments while waiting, the events as they come, then the end."""
        keepalive = self.state.settings.api.stream_keepalive
        got = first
        try:
            if not got:
                yield await self._comment()
            while True:
                if isinstance(got, _Ended):
                    if got.error is not None:
                        yield got.error
                    return
                for data in got:
                    shown = self.render(data)
                    if shown is not None:
                        yield shown
                if got and is_last_event(got[-1]):
                    return  # nothing follows the last event, not even a comment
                got = await self._pull()
                while not got:
                    if not await self._wait(keepalive):
                        yield await self._comment()
                    got = await self._pull()
        finally:
            self._unwatch()

    async def upstream_request_id(self) -> str | None:
        """The provider's id of its answer to the call these events come from (written with
        its first events): the task's own, or the one of the work it joined. The task is read
        before its events, so a snapshot without the id is read again once events came."""
        if self.task.upstream_request_id or (self.source == self.task.id and not self.sent):
            return self.task.upstream_request_id
        with contextlib.suppress(TaskNotFound):
            return (await self.state.fw.get(self.source)).upstream_request_id
        return None

    async def _pull(self) -> list[str] | _Ended:
        """What is new since the last look: events, the end, or nothing. Read under the
        watch, cleared first: whatever is written while it reads wakes the next wait."""
        fw = self.state.fw
        watch = self._watching()
        watch.clear()
        task = await fw.get(self.task.id, tenant=self.task.tenant)
        self.task = task
        if task.status in (Status.SUCCEEDED, Status.DEDUPED):
            # The whole stream is in the result, also when the work it joined has just
            # handed it over (the task no longer waits for that source).
            rows = await fw.stream_events(self.source, self.sent, READ_AT_ONCE)
            if rows:
                self.sent = rows[-1][0]
                return [data for _, data in rows]
            events = _events_of(task.result)
            rest, self.sent = events[self.sent :], len(events)
            return rest or _Ended()
        source = task.waits_for or task.id
        if source != self.source:
            if self.sent:  # the work it joined ended without a result: its part is all
                await self._cancel_own()
                return _Ended(self._error(409, "stream-lost", "the stream it joined failed"))
            self.source = source
            watch.add(source)  # before its events are read
        rows = await fw.stream_events(self.source, self.sent, READ_AT_ONCE)
        if rows:
            self.sent = rows[-1][0]
            return [data for _, data in rows]
        if not task.terminal:
            return []
        failed = task_failure(task)
        return _Ended(self._error(failed.status, failed.code or failed.slug, failed.message))

    def _error(self, status: int, code: str, message: str) -> str:
        """The error event that ends a stream (the SDKs raise it as ``APIError``)."""
        error = openai_error(status, code, message)
        body = {"type": "error", "code": code, "message": message, "error": error}
        text = json.dumps(body if self.named else {"error": error}, separators=(",", ":"))
        return f"event: error\ndata: {text}\n\n" if self.named else f"data: {text}\n\n"

    def _watching(self) -> Watch:
        """The watch of the task, its source and other processes' writes, from the first
        read on (until the stream ends)."""
        if self._watch is None:
            hub = self.state.fw.runtime.hub
            self._watch = hub.watch(self.task.id, self.source, remote=True)
            self.state.fw.follow_changes()
        return self._watch

    async def _wait(self, timeout: float) -> bool:
        """Until the task or its source changed since the last read began, another process
        wrote, or timeout."""
        return await event_set_within(self._watching().changed, timeout)

    def _unwatch(self) -> None:
        if self._watch is not None:
            self._watch.close()
        self._watch = None

    async def _comment(self) -> str:
        position = await queue_position(self.state, self.task, self.source)
        return ": queued\n\n" if position is None else f": queued, position {position}\n\n"

    async def _cancel_own(self) -> None:
        with contextlib.suppress(IllegalTransition):
            await self.state.fw.cancel(self.task.id, tenant=self.task.tenant)


def _events_of(result: Any) -> list[str]:
    if isinstance(result, dict) and result.get("object") == STREAM_OBJECT:
        events = result.get("events")
        if isinstance(events, list):
            return [str(e) for e in events]
    return []


def chat_render(wants_usage: bool) -> Render:
    """A chat stream's event: without the usage floodway always asks the provider for,
    unless the client asked too."""

    def render(data: str) -> str | None:
        if wants_usage or data == "[DONE]" or '"usage"' not in data:
            return f"data: {data}\n\n"
        try:
            chunk = json.loads(data)
        except ValueError:
            return f"data: {data}\n\n"
        if not isinstance(chunk, dict):
            return f"data: {data}\n\n"
        usage = chunk.pop("usage", None)
        if usage is not None and not chunk.get("choices"):
            return None  # the usage chunk itself
        return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"

    return render


async def queue_position(state: ApiState, task: Task, source: str) -> int | None:
    """Where the work stands in its kind's queue (1: next), None once it runs."""
    return await state.fw.queue_position(source, task.kind, POSITION_HORIZON)


async def stream_call(state: ApiState, task: Task, body: dict[str, Any]) -> StreamingResponse:
    """The SSE answer of a streamed chat call's task (submitted already)."""
    options = body.get("stream_options")
    wants_usage = isinstance(options, dict) and options.get("include_usage") is True
    return await stream_answer(StreamReader(state, task, chat_render(wants_usage)))


async def stream_answer(reader: StreamReader) -> StreamingResponse:
    """The SSE answer of ``reader``'s task: its status committed once the first events came,
    or once the task has waited a keep-alive interval."""
    state, task = reader.state, reader.task
    first = await reader.first(state.settings.api.stream_keepalive)
    headers = {**task_headers(task.id, await reader.upstream_request_id()),
               "Cache-Control": "no-cache"}  # fmt: skip
    if not first:
        position = await queue_position(state, reader.task, reader.source)
        if position is not None:
            headers[QUEUE_HEADER] = str(position)
    return StreamingResponse(reader.rest(first), media_type="text/event-stream", headers=headers)
