"""A waiter watches before it reads (floodway.runtime.Watch): a write landing while it reads
wakes its next wait, instead of leaving it asleep until its timeout."""

from __future__ import annotations

import pytest

from floodway import Context, Floodway, Status
from floodway.api.routes.openai.streams import StreamReader
from floodway.api.state import ApiState
from floodway.runtime import ChangeHub
from floodway.store.base import TaskChange

EVENT = '{"n":1}'


async def test_a_stream_hears_the_events_written_while_it_looked_for_them(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fw = Floodway(database=db_url)

    @fw.kind("k")
    async def handler(ctx: Context, value: object) -> None:
        return None

    async with fw:
        task = await fw.submit("k", {"n": 1})
        read = fw.stream_events

        async def read_then_the_worker_writes(
            task_id: str, after: int = 0, limit: int = 1000
        ) -> list[tuple[int, str]]:
            rows = await read(task_id, after, limit)
            if not rows:  # the worker's first events land just after this read
                now = fw.clock.now()
                await fw.runtime.store.append_stream(task.id, task.tenant, 1, [EVENT], now)
            return rows

        monkeypatch.setattr(fw, "stream_events", read_then_the_worker_writes)
        reader = StreamReader(ApiState(fw), task, lambda data: f"data: {data}\n\n")
        # Watched after its read, the stream slept through its whole patience and had none.
        assert await reader.first(patience_s=600) == [EVENT]


async def test_a_stream_names_the_providers_answer_when_its_first_events_land_after_its_task_read(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fw = Floodway(database=db_url)
    fw.kind("k")(lambda ctx, value: None)
    async with fw:  # no worker: the test writes what the worker would
        task = await fw.submit("k", {"n": 1})
        read = fw.stream_events

        async def the_worker_writes_then_read(
            task_id: str, after: int = 0, limit: int = 1000
        ) -> list[tuple[int, str]]:
            if after == 0:  # the task was read already, without the provider's id
                now = fw.clock.now()
                await fw.runtime.store.append_stream(task.id, task.tenant, 1, [EVENT], now, "req_9")
            return await read(task_id, after, limit)

        monkeypatch.setattr(fw, "stream_events", the_worker_writes_then_read)
        reader = StreamReader(ApiState(fw), task, lambda data: f"data: {data}\n\n")
        assert await reader.first(patience_s=600) == [EVENT]
        assert reader.task.upstream_request_id is None
        assert await reader.upstream_request_id() == "req_9"


async def test_a_stream_lets_go_of_its_watch_before_its_body_starts(db_url: str) -> None:
    """A client may hang up before the body starts; only a started body lets go of what it
    holds, so the first events are looked for under a watch of their own."""
    fw = Floodway(database=db_url)
    fw.kind("k")(lambda ctx, value: None)
    async with fw:  # no worker: the task waits
        task = await fw.submit("k", {"n": 1})
        reader = StreamReader(ApiState(fw), task, lambda data: f"data: {data}\n\n")
        assert await reader.first(patience_s=0.01) == []
        assert fw.runtime.hub.watching() == 0


def test_a_waiter_for_an_end_is_not_woken_by_a_claim() -> None:
    hub = ChangeHub()
    with hub.watch("t_1", ends_only=True) as result, hub.watch("t_1") as stream:
        hub.on_changes([TaskChange("t_1", Status.RUNNING, "acme")])
        assert stream.changed.is_set() and not result.changed.is_set()
        hub.on_changes([TaskChange("t_1", Status.SUCCEEDED, "acme")])
        assert result.changed.is_set()
