"""Several worker processes on one ledger with per-process limits: notice it and say so.

Without ``redis`` each process keeps its limiter state in memory, so every process enforces the
full configured limits on its own: four workers on one ledger may run up to four times a
resource's concurrency, and the provider answers with 429s (or bills a plan you did not mean
to use). floodway cannot stop that, but it can tell the operator, so :class:`LocalLimitsWatch`
looks for other live processes on the same ledger, through the store's own verbs (so it works
on SQLite files shared by processes and on PostgreSQL alike):

* **a lease** — every watching process tries to hold the leader lease ``local-limits``; one
  that finds it held by another process knows a peer with per-process limits is alive (idle
  or busy);
* **running tasks** — the holder cannot learn of peers from the lease, so each round also
  looks at the lease owners of running tasks whose lease is still live; an owner that is not a
  worker of this process is a peer.

Either way the process logs one warning (repeated at most every ``repeat_s`` while it lasts)
that names the limited resources and the fix: set ``redis`` on every process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection

from floodway.clock import stop_task
from floodway.core.owners import identity_of, owner_name
from floodway.core.states import Status
from floodway.limits.admission import LimitsAdmission
from floodway.limits.local import LocalLimiterBackend
from floodway.maintenance.leader import lead
from floodway.runtime import Runtime
from floodway.store.base import TaskQuery

log = logging.getLogger("floodway.fleet")

#: The leader lease every process with per-process limits tries to hold.
LEASE_NAME = "local-limits"


def per_process_limits(runtime: Runtime) -> bool:
    """True when some limit is configured and its state lives in this process only."""
    admission = runtime.admission
    return (
        isinstance(admission, LimitsAdmission)
        and admission.limited
        and isinstance(admission.backend, LocalLimiterBackend)
    )


class LocalLimitsWatch:
    """Warns when other processes share the ledger while limits are per process.

    :meth:`start` starts it (a no-op when limits are shared through Redis, or when nothing is
    limited); :meth:`stop` ends it."""

    def __init__(
        self,
        runtime: Runtime,
        owners: Collection[str] = (),
        *,
        every_s: float = 15.0,
        repeat_s: float = 600.0,
        identity: str | None = None,
    ) -> None:
        self.runtime = runtime
        self.identity = identity or runtime.store.identity
        #: the name this process holds the ``local-limits`` lease by
        self.owner = owner_name(self.identity, "fleet-watch")
        self.owners = set(owners)
        self.every_s = every_s
        self.repeat_s = repeat_s
        self.active = per_process_limits(runtime)
        self.peers: set[str] = set()  # what the last round found
        self.warnings = 0
        self._warned_at: float | None = None
        self._task: asyncio.Task[None] | None = None

    def ours(self, owner: str) -> bool:
        return owner in self.owners or identity_of(owner) == self.identity

    async def check_once(self) -> set[str]:
        """One round: the peers found (``"?"`` for a peer known only by the lease); warns if
        there are any and the last warning is older than ``repeat_s``."""
        if not self.active:
            return set()
        store, now = self.runtime.store, self.runtime.clock.now()
        peers: set[str] = set()
        # The lease outlives a few rounds, so a peer that misses one round stays visible.
        # A dead process's lease is taken over and its tasks' owners are not peers: a worker
        # restarted after a crash is alone, whatever its predecessor left in the ledger.
        if not await lead(store, LEASE_NAME, self.owner, now, 3 * self.every_s):
            peers.add("?")
        running = await store.list_tasks(TaskQuery(status=Status.RUNNING, limit=200))
        for task in running:
            owner = task.lease_owner
            live = task.lease_expires_at is not None and task.lease_expires_at > now
            if owner and live and not self.ours(owner):
                peers.add(owner)
        identities = {owner: identity_of(owner) for owner in peers - {"?"}}
        dead = await store.dead(sorted({i for i in identities.values() if i is not None}))
        peers -= {owner for owner, identity in identities.items() if identity in dead}
        if len(peers) > 1:
            peers.discard("?")  # named peers say more than the anonymous lease holder
        self.peers = peers
        if peers and (self._warned_at is None or now - self._warned_at >= self.repeat_s):
            self._warned_at = now
            self._warn(peers)
        return peers

    def _warn(self, peers: set[str]) -> None:
        self.warnings += 1
        admission = self.runtime.admission
        assert isinstance(admission, LimitsAdmission)
        limited = [f"resource {name}" for name in sorted(admission.plans)] or ["tenants"]
        named = sorted(p for p in peers if p != "?")
        who = f" (workers {', '.join(named)})" if named else ""
        log.warning(
            "other worker processes use this ledger%s, but limits are per process: no redis "
            "is configured, so each process enforces the full limits (%s) on its own and "
            'together they can exceed them. Set redis = "redis://..." (env FLOODWAY_REDIS) '
            "on every process to share one set of limits.",
            who,
            ", ".join(limited),
        )

    # -- running it --------------------------------------------------------------------------
    def start(self) -> None:
        if self.active and self._task is None:
            self._task = asyncio.create_task(self._run(), name="floodway-fleet-watch")

    async def _run(self) -> None:
        while True:
            try:
                await self.check_once()
            except Exception as exc:  # a hint, never a reason to stop a worker
                log.debug("fleet check failed: %s", exc)
            await self.runtime.clock.sleep(self.every_s)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)
        if not self.active:
            return
        # Hand the lease back (a lease that expired already is free to others): a process
        # started right after this one stops is not warned about a peer that is gone.
        with contextlib.suppress(Exception):
            now = self.runtime.clock.now()
            await self.runtime.store.try_lead(LEASE_NAME, self.owner, now, -1.0)
