"""CLI commands that talk to a running floodway server through :class:`floodway.Client`."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from floodway.client import ApiError, Client
from floodway.core.errors import FloodwayError
from floodway.core.states import TERMINAL
from floodway.core.task import SubmitRequest, Task
from floodway.wire import task_json

T = TypeVar("T")
out = Console()
err = Console(stderr=True)

UrlOpt = Annotated[str, typer.Option("--url", envvar="FLOODWAY_URL", help="server URL")]
KeyOpt = Annotated[str | None, typer.Option("--api-key", envvar="FLOODWAY_API_KEY", help="API key")]
DEFAULT_URL = "http://127.0.0.1:8000"


def call(url: str, api_key: str | None, work: Callable[[Client], Awaitable[T]]) -> T:
    """Run ``work`` with a client; turn every failure into one clear line and exit code."""

    async def go() -> T:
        async with Client(url, api_key=api_key) as client:
            return await work(client)

    try:
        return asyncio.run(go())
    except httpx.ConnectError:
        err.print(
            f"[bold red]error:[/] cannot reach a floodway server at {url} "
            "(start one with `floodway serve`, or set --url / FLOODWAY_URL)"
        )
    except ApiError as exc:
        if exc.status == 401:
            err.print(
                f"[bold red]error:[/] {url} refused the API key: {exc.detail or exc.title}"
                " (set --api-key or FLOODWAY_API_KEY)"
            )
        else:
            err.print(f"[bold red]error:[/] HTTP {exc.status}: {exc.detail or exc.title}")
    except FloodwayError as exc:
        err.print(f"[bold red]error:[/] {exc}")
    except httpx.HTTPError as exc:
        err.print(f"[bold red]error:[/] talking to {url}: {exc}")
    raise typer.Exit(1)


def show(task: Task, **extra: Any) -> None:
    out.print_json(json.dumps(task_json(task, **extra)))


def register(app: typer.Typer) -> None:
    @app.command()
    def submit(
        kind: Annotated[str, typer.Argument(help="the task's kind")],
        input: Annotated[str, typer.Option("--input", help="the input, a JSON object")],
        lane: Annotated[str, typer.Option(help="interactive | background")] = "background",
        key: Annotated[str | None, typer.Option("--key", help="Idempotency-Key")] = None,
        wait: Annotated[bool, typer.Option("--wait", help="wait until it ends")] = False,
        url: UrlOpt = DEFAULT_URL,
        api_key: KeyOpt = None,
    ) -> None:
        """Submit a task; prints it (with "reused": true when the key matched)."""
        try:
            value = json.loads(input)
        except json.JSONDecodeError as exc:
            err.print(f"[bold red]error:[/] --input is not JSON: {exc}")
            raise typer.Exit(2) from None

        async def work(c: Client) -> tuple[Task, bool]:
            sub = await c.submit_request(SubmitRequest(kind, value, lane=lane, key=key))
            task = await c.wait(sub.task.id) if wait else sub.task
            return task, sub.reused

        task, reused = call(url, api_key, work)
        show(task, reused=reused)
        if wait and task.status.value != "succeeded":
            raise typer.Exit(1)

    @app.command()
    def get(task_id: str, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None) -> None:
        """Show a task."""
        show(call(url, api_key, lambda c: c.get(task_id)))

    @app.command()
    def cancel(task_id: str, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None) -> None:
        """Cancel a task (running ones get the abort signal)."""
        show(call(url, api_key, lambda c: c.cancel(task_id)))

    @app.command()
    def retry(task_id: str, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None) -> None:
        """Send a failed, dead or timed-out task back to the queue."""
        show(call(url, api_key, lambda c: c.retry(task_id)))

    @app.command("list")
    def list_tasks(
        status: Annotated[str | None, typer.Option(help="only this status")] = None,
        kind: Annotated[str | None, typer.Option(help="only this kind")] = None,
        limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
        url: UrlOpt = DEFAULT_URL,
        api_key: KeyOpt = None,
    ) -> None:
        """List tasks, oldest first."""
        page = call(url, api_key, lambda c: c.list_tasks(status=status, kind=kind, limit=limit))
        out.print(task_table(page.items, "tasks"))
        if page.next:
            out.print(f"more: --after {page.next}")

    @app.command()
    def stats(url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None) -> None:
        """Tasks per state, timings, limiter usage (JSON)."""
        out.print_json(json.dumps(call(url, api_key, lambda c: c.stats())))

    @app.command()
    def batch(
        file: Annotated[Path, typer.Argument(help="JSONL: one input object per line")],
        kind: Annotated[str, typer.Option("--kind", help="the tasks' kind")],
        wait: Annotated[bool, typer.Option("--wait", help="follow until all end")] = False,
        url: UrlOpt = DEFAULT_URL,
        api_key: KeyOpt = None,
    ) -> None:
        """Submit a JSONL file as one batch; with --wait, a live progress bar and a summary."""
        inputs = read_jsonl(file)
        call(url, api_key, lambda c: run_batch(c, kind, inputs, wait))

    @app.command()
    def dlq(
        action: Annotated[str, typer.Argument(help="list | retry")] = "list",
        task_id: Annotated[str | None, typer.Argument(help="the task to retry")] = None,
        all_: Annotated[bool, typer.Option("--all", help="retry every dead letter")] = False,
        url: UrlOpt = DEFAULT_URL,
        api_key: KeyOpt = None,
    ) -> None:
        """Dead letters: `dlq list`, `dlq retry ID`, `dlq retry --all`."""
        if action == "list":
            dead = call(url, api_key, lambda c: collect(c, "dead"))
            out.print(task_table(dead, f"dead letters ({len(dead)})"))
        elif action == "retry" and (task_id or all_):
            retried = call(url, api_key, lambda c: retry_dead(c, task_id))
            out.print(f"sent {retried} dead letter(s) back to the queue")
        else:
            err.print("[bold red]error:[/] use `dlq list`, `dlq retry ID` or `dlq retry --all`")
            raise typer.Exit(2)


def read_jsonl(file: Path) -> list[dict[str, Any]]:
    inputs: list[dict[str, Any]] = []
    try:
        lines = file.read_text().splitlines()
    except OSError as exc:
        err.print(f"[bold red]error:[/] cannot read {file}: {exc.strerror}")
        raise typer.Exit(2) from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            err.print(f"[bold red]error:[/] {file}:{number}: not JSON: {exc.msg}")
            raise typer.Exit(2) from None
        if not isinstance(value, dict):
            err.print(f"[bold red]error:[/] {file}:{number}: each line must be a JSON object")
            raise typer.Exit(2)
        inputs.append(value)
    if not inputs:
        err.print(f"[bold red]error:[/] {file} holds no tasks")
        raise typer.Exit(2)
    return inputs


async def run_batch(c: Client, kind: str, inputs: list[dict[str, Any]], wait: bool) -> None:
    submitted = await c.batch(kind=kind, inputs=inputs)
    out.print(f"batch {submitted.id}: {len(submitted.task_ids)} tasks submitted")
    if not wait:
        return
    started = time.monotonic()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=out,
    ) as bar:
        line = bar.add_task("running", total=len(submitted.task_ids))
        while True:
            progress = await c.batch_status(submitted.id)
            finished = sum(n for s, n in progress.counts.items() if s in TERMINAL)
            summary = ", ".join(f"{s} {n}" for s, n in sorted(progress.counts.items()) if n)
            bar.update(line, completed=finished, description=summary or "queued")
            if progress.done:
                break
            await asyncio.sleep(0.5)
    table = Table(title=f"batch {submitted.id} in {time.monotonic() - started:.1f}s")
    table.add_column("status")
    table.add_column("tasks", justify="right")
    for status, n in sorted(progress.counts.items()):
        if n:
            table.add_row(status, str(n))
    out.print(table)


async def retry_dead(c: Client, task_id: str | None) -> int:
    """Retry one task, or (no id) every dead letter, in one session."""
    ids = [task_id] if task_id else [t.id for t in await collect(c, "dead")]
    for one in ids:
        await c.retry(one)
    return len(ids)


async def collect(c: Client, status: str) -> list[Task]:
    return [t async for t in c.iter_tasks(status=status)]


def task_table(tasks: list[Task], title: str) -> Table:
    table = Table(title=title)
    for column in ("id", "kind", "status", "lane", "attempts", "error"):
        table.add_column(column)
    for t in tasks:
        error = f"{t.error.cls.value}: {t.error.message}"[:60] if t.error else ""
        table.add_row(t.id, t.kind, t.status.value, t.lane.value, str(t.attempts), error)
    return table
