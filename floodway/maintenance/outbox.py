"""Outbound callbacks: a task (or a job) with a ``callback_url`` is POSTed to it once it ends.

The outbox is durable: the terminal write itself marks the callback ``pending`` in the same
transaction, so a crash between "task ended" and "callback sent" loses nothing. This service
reads due callbacks (``Store.due_callbacks``), delivers them with its own HTTP client and a
per-request timeout (never on a worker's time), and records each result; failures are retried
with the one full-jitter backoff (``[callbacks]`` in the configuration) up to ``max_attempts``,
then marked ``failed``. It runs wherever maintenance runs, one deliverer per ledger (leader
lease ``webhooks-out``, taken over at once from a dead process).

Each delivery is signed the Standard Webhooks way (:mod:`floodway.wire.signing`) with the tenant's
API key as the secret (``"floodway"`` when the API is open). The body is
``{"type": "task.<status>", "timestamp": ..., "data": <Task JSON>}`` (a job's:
``"job.<status>"`` and the job as ``GET /v1/jobs/{id}`` shows it); ``webhook-id`` is the
same for every attempt at one terminal state, so receivers can drop duplicates: delivery is
at-least-once.

The same deliverer carries out the other effects of a completion, which its write put in the
outbox (``Store.due_effects``) in its own transaction: a poison task's fallback is submitted
(under the request key ``fallback:<task>``, so a delivery repeated after a crash is the same
submit), and a dead task's alert goes to the ``on_dead`` hooks and is POSTed to
``alert_url``, retried as callbacks are. A crash between the completion and its effects loses
none, and a slow alert endpoint never holds a worker's slot.

Where it POSTs is held to :mod:`floodway.core.addresses`: a host not in ``api.callback_hosts``
is resolved here, refused if any of its addresses is not public, and called at the address that
was checked (the URL's name still in ``Host`` and in TLS's server name), so a DNS answer that
changes between the check and the connection cannot move the call inside. Redirects are not
followed.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import random
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from floodway.clock import event_set_within, stop_task
from floodway.core.addresses import literal_address, refusal
from floodway.core.backoff import Backoff
from floodway.core.errors import FloodwayError, Unavailable
from floodway.core.jobs import Job
from floodway.core.owners import owner_name
from floodway.core.task import SubmitRequest, Task
from floodway.core.validation import host_listed
from floodway.maintenance.leader import lead
from floodway.runtime import Runtime
from floodway.store.base import DueEffect, Store
from floodway.store.jobs import JobRecords
from floodway.version import __version__
from floodway.wire.jobs import job_json
from floodway.wire.signing import signed_headers
from floodway.wire.tasks import task_json

log = logging.getLogger("floodway.webhooks")

LEADER_NAME = "webhooks-out"
#: the outbound-webhook signing secret when no API keys are configured
OPEN_SIGNING_SECRET = "floodway"


def signing_secret(keys: Mapping[str, str], tenant: str) -> str:
    """The secret that signs a tenant's outbound webhooks: its API key (the first in sorted
    order when it has several), or ``"floodway"`` when the API is open."""
    own = sorted(key for key, owner in keys.items() if owner == tenant)
    return own[0] if own else OPEN_SIGNING_SECRET


class Refused(Exception):
    """The callback's host is, or resolves to, an address floodway does not call."""


#: where one delivery connects: the URL, the headers to add and the request's extensions
Pinned = tuple[httpx.URL, dict[str, str], dict[str, str]]


async def pinned_request(url: str, allowed: Sequence[str]) -> Pinned:
    """(the URL to connect to, headers, request extensions) for a POST to ``url``: as it is
    for a listed host, else at the public address its host resolves to."""
    target = httpx.URL(url)
    host = target.host
    if host_listed(host, allowed):
        return target, {}, {}
    literal = literal_address(host)
    if literal is not None:
        addresses = [literal]
    else:
        port = target.port or (443 if target.scheme == "https" else 80)
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [a for a in (literal_address(str(info[4][0])) for info in infos) if a]
    for address in addresses:
        why = refusal(address)
        if why is not None:
            raise Refused(
                f"{host} is {why} ({address}); api.callback_hosts lists the hosts "
                "that may be internal"
            )
    if not addresses:
        raise Refused(f"{host} resolves to no address")
    if literal is not None:
        return target, {}, {}
    pinned = target.copy_with(host=str(addresses[0]))
    return pinned, {"host": target.netloc.decode("ascii")}, {"sni_hostname": host}


class Outbox:
    """Delivers callbacks between :meth:`start` and :meth:`stop`."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        client: httpx.AsyncClient | None = None,
        rng: random.Random | None = None,
        idle_s: float = 2.0,
        batch: int = 64,
        concurrency: int = 16,
        leader_ttl_s: float = 15.0,
        min_gap_s: float = 0.05,
    ) -> None:
        self.runtime = runtime
        self.config = config = runtime.settings.callbacks
        self.backoff = Backoff(base_s=config.backoff, cap_s=config.max_backoff)
        self.owner = owner_name(runtime.store.identity, "outbox")
        #: re-check for due callbacks at least this often (other processes' writes, retries)
        self.idle_s = idle_s
        self.batch, self.concurrency, self.leader_ttl_s = batch, concurrency, leader_ttl_s
        #: at least this long between passes, so a burst of task ends is one query, not hundreds
        self.min_gap_s = min_gap_s
        self._client = client
        self._own_client = client is None
        self._rng = rng
        self._task: asyncio.Task[None] | None = None
        self._next_due: float | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="floodway-outbox")

    @property
    def client(self) -> httpx.AsyncClient:
        """Built on the first delivery, not at start: a client's TLS context takes tens of
        milliseconds of the event loop, which a starting worker's first claims would wait out
        (and most workers never deliver a callback)."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.config.timeout, follow_redirects=False)
        return self._client

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- delivering ---------------------------------------------------------------------------
    async def run_once(self) -> int:
        """Deliver what is due now (if this process leads); the number of attempts made."""
        store, now = self.runtime.store, self.runtime.clock.now()
        if not await lead(store, LEADER_NAME, self.owner, now, self.leader_ttl_s):
            return 0
        due = [_of_task(t, store) for t in await store.due_callbacks(now, self.batch)]
        jobs = self.runtime.jobs
        due += [_of_job(j, jobs) for j in await jobs.due_job_callbacks(now, self.batch)]
        effects = await store.due_effects(now, self.batch)
        if not due and not effects:
            return 0
        gate = asyncio.Semaphore(self.concurrency)

        async def one(delivery: Awaitable[None]) -> None:
            async with gate:
                await delivery

        await asyncio.gather(
            *(one(self._deliver(c)) for c in due), *(one(self._effect(e)) for e in effects)
        )
        return max(len(due), len(effects))

    async def _loop(self) -> None:
        hub = self.runtime.hub
        changed = hub.watch_all()
        try:
            while True:
                changed.clear()
                try:
                    made = await self.run_once()
                except Exception:
                    log.exception("outbound webhook pass failed")
                    made = 0
                if made >= self.batch:
                    continue  # maybe more due: go again at once
                wait = self.idle_s
                if self._next_due is not None:
                    wait = max(0.0, min(wait, self._next_due - self.runtime.clock.now()))
                    self._next_due = None
                # Woken at once by a status write in this process (a task may just have
                # ended); the timeout covers retries and other processes' writes.
                await event_set_within(changed, wait)
                await asyncio.sleep(self.min_gap_s)
        finally:
            hub.unwatch_all(changed)

    async def _deliver(self, callback: Callback) -> None:
        now = self.runtime.clock.now()
        msg_id = f"msg_{callback.id}_{int(callback.finished * 1000)}"
        body = json.dumps(
            {
                "type": callback.type,
                "timestamp": datetime.fromtimestamp(now, UTC).isoformat().replace("+00:00", "Z"),
                "data": await callback.data(),
            },
            separators=(",", ":"),
        ).encode()
        secret = signing_secret(self.runtime.settings.api.keys, callback.tenant)
        headers = {
            "content-type": "application/json",
            "user-agent": f"floodway/{__version__}",
            **signed_headers(secret, msg_id, int(now), body),
        }
        url = callback.url
        try:
            target, pinned, extensions = await pinned_request(
                url, self.runtime.settings.api.callback_hosts
            )
            request = self.client.build_request(
                "POST", target, content=body, headers={**headers, **pinned}, extensions=extensions
            )
            # Streamed and never read: a receiver cannot make us buffer a large answer.
            resp = await self.client.send(request, stream=True)
            ok, why = resp.is_success, f"answered {resp.status_code}"
            await resp.aclose()
        except Exception as exc:  # any failure to deliver is the receiver's, never ours to raise
            ok, why = False, f"{type(exc).__name__}: {exc}"
        attempts = callback.attempts + 1
        counts = self.runtime.callbacks_out
        if ok:
            await callback.record("delivered", None)
            counts["delivered"] += 1
            return
        if attempts >= self.config.max_attempts:
            log.warning(
                "callback for %s to %s given up after %d: %s", callback.id, url, attempts, why
            )
            await callback.record("failed", None)
            counts["failed"] += 1
            return
        next_at = now + self.backoff.delay(attempts, self._rng)
        log.info("callback for %s to %s failed (%s); retry %d", callback.id, url, why, attempts)
        await callback.record("pending", next_at)
        self._next_due = next_at if self._next_due is None else min(self._next_due, next_at)
        counts["retry"] += 1

    # -- a completion's effects ---------------------------------------------------------------
    async def _effect(self, due: DueEffect) -> None:
        store, now = self.runtime.store, self.runtime.clock.now()
        try:
            if due.effect == "fallback":
                done, why = await self._fallback(due.task)
            else:
                done, why = await self._alert(due)
        except Unavailable as exc:  # the ledger or the limiter: the next pass tries again
            done, why = False, f"{type(exc).__name__}: {exc}"
        attempts = due.attempts + 1
        if done:
            await store.effect_done(due.seq)
        elif attempts >= self.config.max_attempts:
            log.warning("%s of %s given up after %d: %s", due.effect, due.task.id, attempts, why)
            await store.effect_done(due.seq)
        else:
            next_at = now + self.backoff.delay(attempts, self._rng)
            log.info("%s of %s failed (%s); retry %d", due.effect, due.task.id, why, attempts)
            await store.effect_retry(due.seq, next_at)
            self._next_due = next_at if self._next_due is None else min(self._next_due, next_at)

    async def _fallback(self, task: Task) -> tuple[bool, str]:
        """Submit the kind's fallback for a poison task (done: submitted, or nothing to do)."""
        runtime = self.runtime
        if task.kind not in runtime.kinds:
            return False, f"kind {task.kind!r} has no handler in this process"
        fallback = runtime.kinds.get(task.kind).fallback
        if fallback is None:
            return True, ""
        request = SubmitRequest(
            fallback,
            task.input,
            lane=task.lane,
            key=f"fallback:{task.id}",
            metadata={**task.metadata, "fallback_of": task.id},
        )
        try:
            await runtime.submit([request], tenant=task.tenant)
        except Unavailable:
            raise
        except FloodwayError as exc:  # a new submission: it may not fit the budget, say
            log.warning("fallback of %s not submitted: %s", task.id, exc)
        return True, ""

    async def _alert(self, due: DueEffect) -> tuple[bool, str]:
        """The dead task to the ``on_dead`` hooks (on the first delivery) and ``alert_url``."""
        task = due.task
        if due.attempts == 0:
            for hook in self.runtime.alert_hooks:
                try:
                    result = hook(task)
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception("alert hook failed for task %s", task.id)
        url = self.runtime.settings.alert_url
        if not url:
            return True, ""
        body = {
            "event": "task.dead",
            "task_id": task.id,
            "kind": task.kind,
            "tenant": task.tenant,
            "error": task.error.to_json() if task.error else None,
        }
        try:
            async with self.client.stream("POST", url, json=body) as resp:
                return resp.is_success, f"answered {resp.status_code}"
        except Exception as exc:  # the receiver's failure, never ours to raise
            return False, f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Callback:
    """One due delivery: a task's end or a job's, as the outbox sends and records it."""

    id: str
    tenant: str
    url: str
    type: str
    #: when what it reports ended (a retried task or job ends again: another webhook-id)
    finished: float
    attempts: int
    data: Callable[[], Awaitable[dict[str, Any]]]
    record: Callable[[str, float | None], Awaitable[None]]


def _of_task(task: Task, store: Store) -> Callback:
    async def data() -> dict[str, Any]:
        return task_json(task)

    async def record(state: str, next_at: float | None) -> None:
        await store.callback_result(task.id, state, next_at)

    finished = task.finished_at if task.finished_at is not None else task.updated_at
    return Callback(
        task.id,
        task.tenant,
        task.callback_url or "",
        f"task.{task.status.value}",
        finished,
        task.callback_attempts,
        data,
        record,
    )


def _of_job(job: Job, jobs: JobRecords) -> Callback:
    async def data() -> dict[str, Any]:
        found = await jobs.get_job(job.id, job.tenant)
        assert found is not None  # a job is purged only long after its callback's end
        return job_json(*found)

    async def record(state: str, next_at: float | None) -> None:
        await jobs.job_callback_result(job.id, state, next_at)

    finished = job.finished_at if job.finished_at is not None else job.updated_at
    return Callback(
        job.id,
        job.tenant,
        job.callback_url or "",
        f"job.{job.status.value}",
        finished,
        job.callback_attempts,
        data,
        record,
    )
