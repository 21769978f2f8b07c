"""One leader per ledger for each maintenance service, taken over at once from a dead one.

A leader holds a lease row (``Store.try_lead``) that it renews every round. A process that
dies leaves its lease behind until it expires; since the ledger can tell a dead process
(:meth:`floodway.store.base.Store.dead`), a candidate takes a dead leader's place at once
instead of waiting the lease out.
"""

from __future__ import annotations

from floodway.core.owners import identity_of
from floodway.store.base import Store


async def lead(store: Store, name: str, owner: str, now: float, ttl_s: float) -> bool:
    """Become or stay the leader of ``name`` until ``now + ttl_s``; True if we lead."""
    if await store.try_lead(name, owner, now, ttl_s):
        return True
    current = await store.leader(name)
    if current is None:
        return False
    identity = identity_of(current.owner)
    if identity is None or not await store.dead([identity]):
        return False
    return await store.take_lead(name, owner, current.owner, now, ttl_s)
