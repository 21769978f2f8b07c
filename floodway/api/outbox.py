"""Outbound webhooks: a task with a ``callback_url`` is POSTed to it once it ends.

The outbox is durable: the terminal write itself marks the callback ``pending`` in the same
transaction, so a crash between "task ended" and "callback sent" loses nothing. This loop reads
due callbacks (``Store.due_callbacks``), delivers them with its own HTTP client and a
per-request timeout (never on a worker's time), and records each result; failures are retried
with the one full-jitter backoff (:class:`floodway.retry.Backoff`) up to ``max_attempts``, then
marked ``failed``. One process delivers at a time (leader lease ``webhooks-out``).

Each delivery is signed the Standard Webhooks way (see :mod:`floodway.api.signing`) with the
tenant's API key as the secret (``"floodway"`` when the API is open). The body is
``{"type": "task.<status>", "timestamp": ..., "data": <Task JSON>}``; ``webhook-id`` is the
same for every attempt at one terminal state, so receivers can drop duplicates: delivery is
at-least-once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType

import httpx

import floodway
from floodway.api.auth import signing_secret
from floodway.app import Floodway
from floodway.core.backoff import Backoff
from floodway.core.task import Task, new_token
from floodway.signing import signed_headers
from floodway.wire import task_json

log = logging.getLogger("floodway.webhooks")

LEADER_NAME = "webhooks-out"


@dataclass(frozen=True)
class OutboxOptions:
    max_attempts: int = 8
    backoff: Backoff = field(default_factory=lambda: Backoff(base_s=2.0, cap_s=600.0))
    timeout_s: float = 10.0  # per request
    #: re-check for due callbacks at least this often (writes by other processes, retries)
    idle_s: float = 2.0
    batch: int = 64
    concurrency: int = 16
    leader_ttl_s: float = 15.0
    #: at least this long between passes, so a burst of task ends is one query, not hundreds
    min_gap_s: float = 0.05


class Outbox:
    """``async with Outbox(fw): ...`` delivers callbacks while the block runs."""

    def __init__(
        self,
        fw: Floodway,
        options: OutboxOptions | None = None,
        *,
        client: httpx.AsyncClient | None = None,
        rng: random.Random | None = None,
        on_result: Callable[[str], None] | None = None,
    ) -> None:
        self.fw = fw
        self.options = options or OutboxOptions()
        self.owner = f"outbox-{new_token()[:8]}"
        self._client = client
        self._own_client = client is None
        self._rng = rng
        self._on_result = on_result
        self._task: asyncio.Task[None] | None = None
        self._next_due: float | None = None
        self.delivered = 0
        self.failed = 0

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is not None:
            return
        await self.fw.open()
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.options.timeout_s, follow_redirects=False)
        self._task = asyncio.create_task(self._loop(), name="floodway-outbox")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    async def __aenter__(self) -> Outbox:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- delivering ---------------------------------------------------------------------------
    async def run_once(self) -> int:
        """Deliver what is due now (if this process leads); the number of attempts made."""
        fw = self.fw
        store = fw.store
        now = fw.clock.now()
        if not await store.try_lead(LEADER_NAME, self.owner, now, self.options.leader_ttl_s):
            return 0
        due = await store.due_callbacks(now, self.options.batch)
        if not due:
            return 0
        gate = asyncio.Semaphore(self.options.concurrency)

        async def one(task: Task) -> None:
            async with gate:
                await self._deliver(task)

        await asyncio.gather(*(one(t) for t in due))
        return len(due)

    async def _loop(self) -> None:
        hub = self.fw.runtime.hub
        changed = hub.watch_all()
        try:
            while True:
                changed.clear()
                try:
                    made = await self.run_once()
                except Exception:
                    log.exception("outbound webhook pass failed")
                    made = 0
                if made >= self.options.batch:
                    continue  # maybe more due: go again at once
                wait = self.options.idle_s
                if self._next_due is not None:
                    wait = max(0.0, min(wait, self._next_due - self.fw.clock.now()))
                    self._next_due = None
                # Woken at once by a status write in this process (a task may just have
                # ended); the timeout covers retries and other processes' writes.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), wait)
                await asyncio.sleep(self.options.min_gap_s)
        finally:
            hub.unwatch_all(changed)

    async def _deliver(self, task: Task) -> None:
        assert self._client is not None
        fw = self.fw
        now = fw.clock.now()
        finished = task.finished_at if task.finished_at is not None else task.updated_at
        msg_id = f"msg_{task.id}_{int(finished * 1000)}"
        body = json.dumps(
            {
                "type": f"task.{task.status.value}",
                "timestamp": datetime.fromtimestamp(now, UTC).isoformat().replace("+00:00", "Z"),
                "data": task_json(task),
            },
            separators=(",", ":"),
        ).encode()
        headers = {
            "content-type": "application/json",
            "user-agent": f"floodway/{floodway.__version__}",
            **signed_headers(signing_secret(fw.settings, task.tenant), msg_id, int(now), body),
        }
        url = task.callback_url or ""
        try:
            # Streamed and never read: a receiver cannot make us buffer a large answer.
            async with self._client.stream("POST", url, content=body, headers=headers) as resp:
                ok, why = resp.is_success, f"answered {resp.status_code}"
        except Exception as exc:  # any failure to deliver is the receiver's, never ours to raise
            ok, why = False, f"{type(exc).__name__}: {exc}"
        attempts = task.callback_attempts + 1
        if ok:
            await fw.store.callback_result(task.id, "delivered", None)
            self.delivered += 1
            self._report("delivered")
            return
        if attempts >= self.options.max_attempts:
            log.warning("callback for %s to %s given up after %d: %s", task.id, url, attempts, why)
            await fw.store.callback_result(task.id, "failed", None)
            self.failed += 1
            self._report("failed")
            return
        next_at = now + self.options.backoff.delay(attempts, self._rng)
        log.info("callback for %s to %s failed (%s); retry %d", task.id, url, why, attempts)
        await fw.store.callback_result(task.id, "pending", next_at)
        self._next_due = next_at if self._next_due is None else min(self._next_due, next_at)
        self._report("retry")

    def _report(self, result: str) -> None:
        if self._on_result is not None:
            self._on_result(result)
