"""Waiting on another process's writes through the ledger's change feed, on both backends:
the follower of a process's :class:`~floodway.runtime.ChangeHub` wakes the waiters of tasks
another process ended, and each reader of the feed keeps its own place in it."""

from __future__ import annotations

import asyncio

import pytest

from floodway.core.outcome import Completion
from floodway.core.states import Status
from floodway.core.task import NewTask
from floodway.runtime import ChangeHub
from floodway.store.base import ClaimParams

from .conftest import Backend

NOW = 1_700_000_000.0


async def test_a_task_another_process_ends_wakes_its_waiter_here(backend: Backend) -> None:
    async with backend.opened() as here, backend.opened() as there:
        first, second = [
            s.task for s in await here.submit([NewTask("echo", {"n": n}) for n in (1, 2)], NOW)
        ]
        hub = ChangeHub()  # this process's: it hears none of the other store's writes itself
        hub.follow(here)
        try:
            ended, other = hub.watch(first.id), hub.watch(second.id)
            (claimed,) = await there.claim(ClaimParams("w", "tok", ("echo",), 1, NOW, 30.0))
            assert claimed.id == first.id
            await there.complete(
                [Completion(first.id, Status.SUCCEEDED, lease_token="tok", result=1)], NOW
            )
            await asyncio.wait_for(ended.changed.wait(), timeout=10)
            assert not other.changed.is_set()  # its task did not end: its waiter sleeps on
        finally:
            await hub.stop_following()


async def test_every_reader_of_the_feed_hears_a_notice(backend: Backend) -> None:
    """A process's dispatcher (``wait_for_change``) and its follower (a reader of its own)
    read the same feed: the one that looks later still hears the notice the other took."""
    async with backend.opened() as here, backend.opened() as there:
        readers = [here.subscribe(), here.subscribe()]
        for reader in readers:
            assert not await reader.wait(0.01)  # each takes its place: nothing since
        await here.wait_for_change(0.01)
        await there.submit([NewTask("echo", {"n": 1})], NOW)
        assert await here.wait_for_change(10.0)  # the dispatcher hears it first
        assert [await reader.wait(10.0) for reader in readers] == [True, True]


async def test_a_stores_own_writes_are_no_change_from_elsewhere(backend: Backend) -> None:
    """This process hears of its own writes from its listeners at once: the feed, which says
    what other processes wrote, stays quiet (a dispatcher woken by its own claims and outcomes
    tried one more claim for nothing after each). PostgreSQL's notices do not say which
    process sent them yet: there a process still hears its own."""
    if backend.name == "postgres":
        pytest.skip("PostgreSQL's feed hears this process's own notices too")
    async with backend.opened() as here, backend.opened() as there:
        reader = here.subscribe()
        assert not await reader.wait(0.01)  # takes its place
        await here.wait_for_change(0.01)
        await here.submit([NewTask("echo", {"n": 1})], NOW)
        (claimed,) = await here.claim(ClaimParams("w", "tok", ("echo",), 1, NOW, 30.0))
        await here.complete(
            [Completion(claimed.id, Status.SUCCEEDED, lease_token="tok", result=1)], NOW
        )
        assert not await here.wait_for_change(0.2)
        assert not await reader.wait(0.2)
        await there.submit([NewTask("echo", {"n": 2})], NOW)
        assert await here.wait_for_change(10.0) and await reader.wait(10.0)
