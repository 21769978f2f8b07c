"""Outbound callbacks: a task with a ``callback_url`` is POSTed to it once it ends.

The outbox is durable: the terminal write itself marks the callback ``pending`` in the same
transaction, so a crash between "task ended" and "callback sent" loses nothing. This service
reads due callbacks (``Store.due_callbacks``), delivers them with its own HTTP client and a
per-request timeout (never on a worker's time), and records each result; failures are retried
with the one full-jitter backoff (``[callbacks]`` in the configuration) up to ``max_attempts``,
then marked ``failed``. It runs wherever maintenance runs, one deliverer per ledger (leader
lease ``webhooks-out``, taken over at once from a dead process).

Each delivery is signed the Standard Webhooks way (:mod:`floodway.wire.signing`) with the tenant's
API key as the secret (``"floodway"`` when the API is open). The body is
``{"type": "task.<status>", "timestamp": ..., "data": <Task JSON>}``; ``webhook-id`` is the
same for every attempt at one terminal state, so receivers can drop duplicates: delivery is
at-least-once.

Where it POSTs is held to :mod:`floodway.core.addresses`: a host not in ``api.callback_hosts``
is resolved here, refused if any of its addresses is not public, and called at the address that
was checked (the URL's name still in ``Host`` and in TLS's server name), so a DNS answer that
changes between the check and the connection cannot move the call inside. Redirects are not
followed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import httpx

from floodway.clock import event_set_within, stop_task
from floodway.core.addresses import literal_address, refusal
from floodway.core.backoff import Backoff
from floodway.core.owners import owner_name
from floodway.core.task import Task
from floodway.core.validation import host_listed
from floodway.maintenance.leader import lead
from floodway.runtime import Runtime
from floodway.version import __version__
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
        if self._task is not None:
            return
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.config.timeout, follow_redirects=False)
        self._task = asyncio.create_task(self._loop(), name="floodway-outbox")

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
        due = await store.due_callbacks(now, self.batch)
        if not due:
            return 0
        gate = asyncio.Semaphore(self.concurrency)

        async def one(task: Task) -> None:
            async with gate:
                await self._deliver(task)

        await asyncio.gather(*(one(t) for t in due))
        return len(due)

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

    async def _deliver(self, task: Task) -> None:
        assert self._client is not None
        store = self.runtime.store
        now = self.runtime.clock.now()
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
        secret = signing_secret(self.runtime.settings.api.keys, task.tenant)
        headers = {
            "content-type": "application/json",
            "user-agent": f"floodway/{__version__}",
            **signed_headers(secret, msg_id, int(now), body),
        }
        url = task.callback_url or ""
        try:
            target, pinned, extensions = await pinned_request(
                url, self.runtime.settings.api.callback_hosts
            )
            request = self._client.build_request(
                "POST", target, content=body, headers={**headers, **pinned}, extensions=extensions
            )
            # Streamed and never read: a receiver cannot make us buffer a large answer.
            resp = await self._client.send(request, stream=True)
            ok, why = resp.is_success, f"answered {resp.status_code}"
            await resp.aclose()
        except Exception as exc:  # any failure to deliver is the receiver's, never ours to raise
            ok, why = False, f"{type(exc).__name__}: {exc}"
        attempts = task.callback_attempts + 1
        counts = self.runtime.callbacks_out
        if ok:
            await store.callback_result(task.id, "delivered", None)
            counts["delivered"] += 1
            return
        if attempts >= self.config.max_attempts:
            log.warning("callback for %s to %s given up after %d: %s", task.id, url, attempts, why)
            await store.callback_result(task.id, "failed", None)
            counts["failed"] += 1
            return
        next_at = now + self.backoff.delay(attempts, self._rng)
        log.info("callback for %s to %s failed (%s); retry %d", task.id, url, why, attempts)
        await store.callback_result(task.id, "pending", next_at)
        self._next_due = next_at if self._next_due is None else min(self._next_due, next_at)
        counts["retry"] += 1
