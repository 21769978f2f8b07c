"""SyncFloodway: the library from synchronous code, as a Flask or Django view would use it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from floodway import Context, Status, SyncFloodway, TaskNotFound


def test_a_synchronous_caller_submits_waits_and_reads(tmp_path: Path) -> None:
    with SyncFloodway(database=f"sqlite:///{tmp_path}/sync.db") as fw:

        @fw.fw.kind("double")
        async def double(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
            return {"n": value["n"] * 2}

        fw.start_worker(concurrency=4)
        with ThreadPoolExecutor(8) as pool:  # a threaded WSGI server's requests
            tasks = list(pool.map(lambda n: fw.submit("double", {"n": n}), range(20)))
            done = list(pool.map(lambda t: fw.wait(t.id, timeout=30), tasks))
        assert [t.result for t in done] == [{"n": 2 * n} for n in range(20)]
        assert all(t.status is Status.SUCCEEDED for t in done)
        assert fw.get(tasks[0].id).result == {"n": 0}
        with pytest.raises(TaskNotFound):
            fw.get("t_nope")
    with pytest.raises(RuntimeError, match="closed"):
        fw.get(tasks[0].id)
