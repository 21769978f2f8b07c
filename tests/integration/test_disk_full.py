"""A full disk under the ledger (a real one: a small tmpfs, filled): the API answers 503
``store-unavailable`` with Retry-After and writes nothing, ``/readyz`` says 503 while writes
fail, and a worker holding an outcome it could not write keeps it, and its lease, until the
ledger takes it. Skipped where no tmpfs can be mounted (CI runs as root and can)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from floodway.core.errors import StoreError
from floodway.core.states import Status
from floodway.core.task import NewTask
from floodway.store.postgres import PostgresStore
from harness.fleet import PG_URL
from harness.full_disk import DiskUnavailable, SmallDisk, small_disk
from harness.pg import fresh_schema, postgres_unavailable
from tests.integration.conftest import StartApi, eventually
from tests.integration.test_api_problems import assert_problem

NOW = 1_700_000_000.0


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """Requested before ``start_api``: unmounted after the server on it has stopped."""
    try:
        with small_disk(tmp_path / "disk") as mounted:
            yield mounted
    except DiskUnavailable as exc:
        pytest.skip(f"no tmpfs here: {exc}")


async def test_a_full_disk_is_a_503_that_writes_nothing_and_readyz_says_so(
    disk: SmallDisk, start_api: StartApi
) -> None:
    server = await start_api(database=f"sqlite:///{disk.path}/fw.db", run_workers=False)
    http = await server.client()
    assert (await http.get("/readyz")).status_code == 200
    first = await http.post("/v1/tasks", json={"kind": "sim", "input": {"n": 0}})
    assert first.status_code == 202, first.text
    disk.fill()
    for n in range(1, 21):
        body = {"kind": "sim", "input": {"n": n, "pad": "x" * 2000}}
        refused = await http.post("/v1/tasks", json=body)
        assert_problem(refused, 503, "store-unavailable")
        assert int(refused.headers["retry-after"]) >= 1
    ready = assert_problem(await http.get("/readyz"), 503, "dependency-unavailable")
    assert ready["checks"]["ledger"]["status"] == "down"
    assert "full" in ready["checks"]["ledger"]["detail"]
    with pytest.raises(StoreError):
        await server.fw.submit("sim", {"n": "library"})
    disk.free()
    assert (await http.get("/readyz")).status_code == 200
    after = await http.post("/v1/tasks", json={"kind": "sim", "input": {"n": "after"}})
    assert after.status_code == 202, after.text
    assert sum((await server.fw.stats()).by_status.values()) == 2


async def test_an_outcome_the_ledger_cannot_take_is_held_until_it_can(
    disk: SmallDisk, start_api: StartApi, caplog: pytest.LogCaptureFixture
) -> None:
    """The call was made (and billed): its outcome is retried, never dropped to let the lease
    expire into ``interrupted``; the task's worker slot and lease stay its own meanwhile."""
    release = asyncio.Event()
    calls: list[Any] = []

    async def slow(_ctx: Any, value: Any) -> Any:
        calls.append(value)
        await release.wait()
        return {"done": value}

    server = await start_api(
        database=f"sqlite:///{disk.path}/fw.db", handlers={"slow": slow}, run_workers=True
    )
    fw = server.fw
    tasks = [(await fw.submit("slow", {"n": n})).id for n in range(3)]

    async def all_called() -> bool:
        return len(calls) == 3

    await eventually(all_called)
    disk.fill()
    caplog.set_level(logging.WARNING, logger="floodway.worker")
    release.set()

    async def held() -> bool:
        return any("takes no outcome" in r.getMessage() for r in caplog.records)

    await eventually(held)
    await asyncio.sleep(0.3)  # some retries fail meanwhile
    assert {(await fw.get(t)).status for t in tasks} == {Status.RUNNING}
    disk.free()

    async def ended() -> bool:
        return {(await fw.get(t)).status for t in tasks} == {Status.SUCCEEDED}

    await eventually(ended)
    done = [await fw.get(t) for t in tasks]
    assert [(t.result, t.attempts) for t in done] == [({"done": {"n": n}}, 1) for n in range(3)]
    assert len(calls) == 3
    warned = [r.getMessage() for r in caplog.records if "takes no outcome" in r.getMessage()]
    assert len(warned) == 1, warned


async def test_a_read_only_postgresql_is_unavailable_not_a_500() -> None:
    """SQLSTATE 25006 (a read-only transaction: a standby, or ``default_transaction_read_only``
    as a full-disk runbook sets it) is the ledger unavailable, and writes land again after."""
    reason = postgres_unavailable()
    if reason:
        pytest.skip(reason)
    role = f"fw_ro_{uuid.uuid4().hex[:12]}"

    async def admin(*statements: sql.SQL | sql.Composed) -> None:
        async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
            for statement in statements:
                await conn.execute(statement)

    name = sql.Identifier(role)
    kick = sql.SQL(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = {}"
    ).format(sql.Literal(role))
    database = sql.Identifier(str(conninfo_to_dict(PG_URL).get("dbname") or "postgres"))
    grant = sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(database, name)
    await admin(sql.SQL("CREATE ROLE {} LOGIN").format(name), grant)
    try:
        async with fresh_schema() as schema:
            await admin(sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(sql.Identifier(schema), name))
            store = PostgresStore(make_conninfo(PG_URL, user=role), schema=schema)
            await store.open()
            try:
                await store.submit([NewTask(kind="echo", input={"n": 0})], NOW)
                read_only = sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on")
                await admin(read_only.format(name), kick)
                refused: list[str] = []

                async def says_read_only() -> bool:
                    try:
                        await store.submit([NewTask(kind="echo", input={"n": 1})], NOW)
                    except StoreError as exc:
                        refused.append(str(exc))
                    return any("read-only transaction" in r for r in refused)

                await eventually(says_read_only)
                await admin(
                    sql.SQL("ALTER ROLE {} RESET default_transaction_read_only").format(name), kick
                )

                async def writes_again() -> bool:
                    try:
                        await store.submit([NewTask(kind="echo", input={"n": 2})], NOW)
                    except StoreError:
                        return False
                    return True

                await eventually(writes_again)
                assert sum((await store.stats()).by_status.values()) == 2
            finally:
                await store.close()
    finally:
        revoke = sql.SQL("REVOKE ALL ON DATABASE {} FROM {}").format(database, name)
        await admin(kick, revoke, sql.SQL("DROP ROLE IF EXISTS {}").format(name))
