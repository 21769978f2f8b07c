"""``SyncFloodway``: the library for synchronous code (a Django view, a Flask route, a script).

floodway is asyncio inside; this facade runs one :class:`~floodway.Floodway` on an event loop
of its own, in a daemon thread, and every call waits for its answer there. It is safe to call
from many threads at once (a WSGI server's). Workers usually run elsewhere (``floodway worker
--app myapp.tasks:fw``); :meth:`SyncFloodway.start_worker` runs them in this process too.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

from floodway.app import Floodway
from floodway.core.task import Task
from floodway.store.base import TaskQuery

T = TypeVar("T")


class SyncFloodway:
    """``SyncFloodway(fw)`` or ``SyncFloodway(database=..., config=...)`` (as Floodway takes
    them); declare kinds on :attr:`fw` before the first call."""

    def __init__(self, fw: Floodway | None = None, **floodway: Any) -> None:
        self.fw = fw if fw is not None else Floodway(**floodway)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="floodway-sync", daemon=True
        )
        self._thread.start()
        self._worker: contextlib.AbstractAsyncContextManager[Any] | None = None

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        if self._loop.is_closed():
            work.close()
            raise RuntimeError("this SyncFloodway is closed")
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def submit(self, kind: str, input: Any, **options: Any) -> Task:
        """:meth:`Floodway.submit`: queue a task and return it at once."""
        return self._run(self.fw.submit(kind, input, **options))

    def submit_many(self, kind: str, inputs: list[Any], **options: Any) -> list[Task]:
        return self._run(self.fw.submit_many(kind, inputs, **options))

    def get(self, task_id: str, *, tenant: str | None = None) -> Task:
        return self._run(self.fw.get(task_id, tenant=tenant))

    def wait(
        self, task_id: str, timeout: float | None = None, *, tenant: str | None = None
    ) -> Task:
        """Block this thread until the task ends (:class:`~floodway.WaitTimeout` after
        ``timeout`` seconds)."""
        return self._run(self.fw.wait(task_id, timeout, tenant=tenant))

    def cancel(self, task_id: str, *, tenant: str | None = None) -> Task:
        return self._run(self.fw.cancel(task_id, tenant=tenant))

    def retry(self, task_id: str, *, tenant: str | None = None) -> Task:
        return self._run(self.fw.retry(task_id, tenant=tenant))

    def list_tasks(self, query: TaskQuery | None = None) -> list[Task]:
        return self._run(self.fw.list_tasks(query))

    def start_worker(self, concurrency: int | None = None) -> None:
        """Run workers and maintenance on this facade's loop until :meth:`close`."""
        if self._worker is not None:
            return
        worker = self.fw.worker(concurrency)
        self._run(worker.__aenter__())
        self._worker = worker

    def close(self) -> None:
        """Stop the workers (if started), close the ledger, end the thread."""
        if self._loop.is_closed():
            return
        worker, self._worker = self._worker, None
        if worker is not None:
            self._run(worker.__aexit__(None, None, None))
        self._run(self.fw.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> SyncFloodway:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
