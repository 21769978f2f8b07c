"""Dispatch order among ready candidates: lanes, shortest first with aging, tenants in turn.

Pure functions and small classes, no I/O: :mod:`floodway.limits.admission` walks this order and
asks the backend about each candidate.

* **Lanes**: every interactive candidate is offered before any background one.
* **Shortest first, with aging**: within a tenant, the cheapest candidate first, so one large
  task does not hold back thirty small ones. A candidate's effective cost falls linearly with its
  wait, reaching zero after ``aging_s``: an old large task eventually sorts first, and the
  admission reserves quota for it (see :func:`aged`). Equal costs go earliest ``rank_at`` first.
  A wait counts from ``rank_at``: a job's step ranks as of its job's submit, so the steps of the
  jobs submitted first go ahead and every resource of a chain is fed from the start.
* **Tenants in turn**: one admission per tenant per round, starting with the tenant served least
  recently (remembered across calls), so tenant B's ten tasks are not stuck behind A's 500.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence

from floodway.core.task import Candidate, Lane


def effective_cost(candidate: Candidate, now: float, aging_s: float) -> float:
    if aging_s <= 0:
        return candidate.cost
    waited = max(0.0, now - candidate.rank_at)
    return candidate.cost * max(0.0, 1.0 - waited / aging_s)


def aged(candidate: Candidate, now: float, aging_s: float) -> bool:
    """Waited long enough that quota is held back for it rather than handed to smaller ones."""
    return aging_s > 0 and now - candidate.rank_at >= aging_s


def _sort_key(candidate: Candidate, now: float, aging_s: float) -> tuple[float, float, int]:
    return (effective_cost(candidate, now, aging_s), candidate.rank_at, candidate.seq)


class Rotation:
    """Which tenant goes first: the one served least recently. Bounded memory: past
    ``max_tenants`` the least recently served are forgotten, which only moves them forward."""

    def __init__(self, max_tenants: int = 4096) -> None:
        self._served: dict[str, int] = {}
        self._tick = 0
        self._max = max_tenants

    def order(
        self, tenants: Iterable[str], tiebreak: dict[str, tuple[float, float, int]]
    ) -> list[str]:
        return sorted(tenants, key=lambda t: (self._served.get(t, -1), tiebreak[t]))

    def served(self, tenant: str) -> None:
        self._tick += 1
        self._served.pop(tenant, None)
        self._served[tenant] = self._tick  # dict order = service order, oldest first
        if len(self._served) > self._max:
            for old in list(self._served)[: len(self._served) - self._max // 2]:
                del self._served[old]


class TenantRounds:
    """Iterate candidates one tenant at a time. On its turn a tenant offers its candidates in
    order until one is admitted (the caller says so with :meth:`admitted`) or it has none left;
    then the next tenant's turn begins."""

    def __init__(self, queues: dict[str, list[Candidate]], tenant_order: Sequence[str]) -> None:
        self._queues = {t: deque(queues[t]) for t in tenant_order}
        self._ring = deque(tenant_order)
        self._current: str | None = None
        self._turn_over = False

    def __iter__(self) -> Iterator[Candidate]:
        return self

    def __next__(self) -> Candidate:
        current = self._current
        if current is not None and (self._turn_over or not self._queues[current]):
            if self._queues[current]:
                self._ring.append(current)
            current = self._current = None
        if current is None:
            if not self._ring:
                raise StopIteration
            current = self._current = self._ring.popleft()
            self._turn_over = False
        return self._queues[current].popleft()

    def admitted(self) -> None:
        self._turn_over = True


def lane_rounds(
    candidates: Sequence[Candidate], lane: Lane, now: float, aging_s: float, rotation: Rotation
) -> TenantRounds:
    """The candidates of one lane, shortest first within each tenant, tenants in turn."""
    queues: dict[str, list[Candidate]] = {}
    for c in candidates:
        if c.lane == lane:  # == not is: a store may hand back the plain string
            queues.setdefault(c.tenant, []).append(c)
    best: dict[str, tuple[float, float, int]] = {}
    for tenant, queue in queues.items():
        queue.sort(key=lambda c: _sort_key(c, now, aging_s))
        best[tenant] = _sort_key(queue[0], now, aging_s)
    return TenantRounds(queues, rotation.order(queues, best))
