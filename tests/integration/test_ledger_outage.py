"""A ledger outage longer than a lease while a worker holds an outcome it could not write.

The call was made (and billed); its worker keeps the outcome and writes it once the ledger
takes writes again. No lease could be renewed meanwhile, so a lease that ran out during the
outage says nothing about its worker: the task must not be recovered as if its worker had
died (ending ``interrupted``, or sent again). The outage is real: on SQLite a full disk (a
small tmpfs, filled: ``SQLITE_FULL``), on PostgreSQL a role whose transactions are read-only
(SQLSTATE 25006), as a full-disk runbook sets it. Time is a fake clock.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from floodway import Context, Floodway, Settings, Status
from floodway.config import WorkerConfig
from floodway.testing import FakeClock, settle
from harness.billing import BillingProvider
from harness.fleet import PG_URL
from harness.full_disk import DiskUnavailable, small_disk
from harness.pg import fresh_schema, postgres_unavailable, schema_url

LEASE_S = 6.0
CALL_S = 3.0
OUTAGE_S = 4 * LEASE_S


@dataclass
class Ledger:
    """A database URL, and how to take its writes away and give them back."""

    url: str
    out: Callable[[], Awaitable[None]]
    back: Callable[[], Awaitable[None]]


@asynccontextmanager
async def sqlite_on_a_small_disk(tmp_path: Path) -> AsyncIterator[Ledger]:
    try:
        with small_disk(tmp_path / "disk") as disk:

            async def out() -> None:
                disk.fill()

            async def back() -> None:
                disk.free()

            yield Ledger(f"sqlite:///{disk.path}/fw.db", out, back)
    except DiskUnavailable as exc:
        pytest.skip(f"no tmpfs here: {exc}")


async def _admin(*statements: sql.SQL | sql.Composed) -> None:
    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
        for statement in statements:
            await conn.execute(statement)


@asynccontextmanager
async def postgres_of_a_role(tmp_path: Path) -> AsyncIterator[Ledger]:
    """A schema owned by a role of its own, whose transactions can be made read-only: its
    pooled sessions are ended so that the next ones start read-only. Not the session that
    holds the process's liveness lock, which writes nothing: ending it would say the process
    died, which is another test's matter."""
    if (reason := postgres_unavailable()) is not None:
        pytest.skip(reason)
    role = f"fw_ro_{uuid.uuid4().hex[:12]}"
    name = sql.Identifier(role)
    kick = sql.SQL(
        "SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a WHERE a.usename = {} "
        "AND NOT EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid "
        "AND l.locktype = 'advisory' AND l.objsubid = 2)"
    ).format(sql.Literal(role))
    everyone = sql.SQL(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = {}"
    ).format(sql.Literal(role))
    database = sql.Identifier(urlsplit(PG_URL).path.lstrip("/") or "postgres")
    await _admin(
        sql.SQL("CREATE ROLE {} LOGIN").format(name),
        sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(database, name),
    )
    try:
        async with fresh_schema() as schema:
            owner = sql.SQL("ALTER SCHEMA {} OWNER TO {}")
            await _admin(owner.format(sql.Identifier(schema), name))
            parts = urlsplit(PG_URL)
            host = parts.netloc.rsplit("@", 1)[-1]
            url = schema_url(schema, urlunsplit(parts._replace(netloc=f"{role}@{host}")))

            async def out() -> None:
                read_only = sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on")
                await _admin(read_only.format(name), kick)

            async def back() -> None:
                reset = sql.SQL("ALTER ROLE {} RESET default_transaction_read_only")
                await _admin(reset.format(name), kick)

            yield Ledger(url, out, back)
    finally:
        revoke = sql.SQL("REVOKE ALL ON DATABASE {} FROM {}").format(database, name)
        await _admin(everyone, revoke, sql.SQL("DROP ROLE IF EXISTS {}").format(name))


@pytest.fixture(params=["sqlite", "postgres"])
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Ledger]:
    make = sqlite_on_a_small_disk if request.param == "sqlite" else postgres_of_a_role
    async with make(tmp_path) as made:
        yield made


async def run_for(clock: FakeClock, seconds: float, step: float = 0.5) -> None:
    for _ in range(int(seconds / step)):
        await clock.advance(step)
        await settle()


@pytest.mark.parametrize("provider_kind", ["neither", "keyed"])
async def test_an_outage_longer_than_a_lease_neither_interrupts_nor_resends(
    ledger: Ledger, clock: FakeClock, provider_kind: str
) -> None:
    """The call ends while the ledger takes no writes, which lasts four leases: the worker
    holds the outcome, and once writes land again the task ends with it, on its one attempt,
    not ``failed`` (interrupted) nor sent a second time (to a provider without keys that
    would pay twice; with keys it would still be a second send)."""
    keyed = provider_kind == "keyed"
    provider = BillingProvider(clock, call_s=CALL_S, price=0.125, honours_keys=keyed)
    settings = Settings(database=ledger.url, worker=WorkerConfig(lease=LEASE_S))
    fw = Floodway(settings=settings, clock=clock)

    async def handler(ctx: Context, value: Any) -> Any:
        return await provider.call(ctx)

    fw.kind("gen", timeout=10.0, idempotent=keyed, deadline=None)(handler)
    async with AsyncExitStack() as stack:
        stack.push_async_callback(fw.close)
        await stack.enter_async_context(fw.worker(grace_s=0))
        task = await fw.submit("gen", {"n": 1})
        await run_for(clock, 1)
        assert provider.in_flight == 1
        await ledger.out()
        await run_for(clock, OUTAGE_S)  # the call ended long ago; no write could land
        assert provider.in_flight == 0 and (await fw.get(task.id)).status is Status.RUNNING
        await ledger.back()
        await run_for(clock, 2 * LEASE_S)
        done = await fw.get(task.id)
    assert done.status is Status.SUCCEEDED, done.error
    assert done.attempts == 1 and done.lease_token is None
    assert sum(provider.calls.values()) == 1 and sum(provider.charges.values()) == 1
