"""Random operation sequences against the real store never leave the states table."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from floodway.core.errors import FloodwayError, IllegalTransition
from floodway.core.outcome import Completion
from floodway.core.states import Status, is_legal
from floodway.core.task import Lane, NewTask
from floodway.store.base import ClaimParams, Retention
from floodway.store.sqlite import SqliteStore

OPS = st.lists(
    st.tuples(
        st.sampled_from(["submit", "claim", "complete", "cancel", "retry", "tick", "purge"]),
        st.integers(0, 7),
        st.sampled_from(list(Status)),
        st.booleans(),
    ),
    min_size=1,
    max_size=40,
)


async def run_ops(ops: list[tuple[str, int, Status, bool]]) -> None:
    store = SqliteStore("sqlite://:memory:")
    await store.open()
    now = 1000.0
    tokens: dict[str, str] = {}
    ids: list[str] = []
    try:
        for name, n, to, flag in ops:
            target = ids[n % len(ids)] if ids else None
            if name == "submit":
                new = NewTask(
                    kind="k",
                    input={"v": n % 3},
                    lane=Lane.INTERACTIVE if flag else Lane.BACKGROUND,
                    fingerprint=f"fp{n % 3}" if flag else None,
                )
                ids.extend(s.task.id for s in await store.submit([new], now))
            elif name == "claim":
                token = f"tok{len(tokens)}"
                for t in await store.claim(ClaimParams("w", token, ("k",), n + 1, now, 30)):
                    tokens[t.id] = token
            elif name == "complete" and target is not None:
                before = await store.get(target)
                if before is None:  # purged by retention
                    continue
                token = tokens.get(target) if before.status is Status.RUNNING else None
                if before.status is Status.RUNNING and token is None:
                    continue
                item = Completion(
                    target,
                    to,
                    before.status,
                    token,
                    result={"r": 1} if to is Status.SUCCEEDED else None,
                    next_attempt_at=now,
                )
                try:
                    await store.complete([item], now)
                except IllegalTransition:
                    assert not is_legal(before.status, to)
                    after = await store.get(target)
                    assert after is not None and after.status is before.status
            elif name == "cancel" and target is not None:
                with contextlib.suppress(FloodwayError):
                    await store.request_cancel(target, None, now)
            elif name == "retry" and target is not None:
                with contextlib.suppress(FloodwayError):
                    await store.manual_retry(target, None, now)
            elif name == "tick":
                now += n * 10
            elif name == "purge":
                await store.purge(Retention(now, 5, 50))
        for task_id in ids:
            events = await store.events(task_id)
            path = [e.status for e in events]
            for a, b in itertools.pairwise(path):
                assert is_legal(a, b), f"{task_id}: illegal {a} -> {b} in {path}"
            task = await store.get(task_id)
            if task is not None and path:
                assert task.status is path[-1]
                if task.status is Status.SUCCEEDED:
                    assert task.result is not None or task.finished_at is not None
    finally:
        await store.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_random_operations_follow_the_table(ops: list[Any]) -> None:
    asyncio.run(run_ops(ops))
