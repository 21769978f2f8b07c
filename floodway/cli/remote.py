"""CLI commands that talk to a running floodway server through :class:`floodway.Client`."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from floodway.client import DEFAULT_URL, ApiError, Client
from floodway.core.errors import FloodwayError
from floodway.core.task import SubmitRequest, Task
from floodway.wire.tasks import task_json

T = TypeVar("T")
out = Console()
err = Console(stderr=True)

UrlOpt = Annotated[str, typer.Option("--url", envvar="FLOODWAY_URL", help="server URL")]
KeyOpt = Annotated[str | None, typer.Option("--api-key", envvar="FLOODWAY_API_KEY", help="API key")]


def say_error(message: str) -> None:
    """``error: ...`` on stderr, on one line however narrow the terminal (so it can be
    grepped and copied), and never read as Rich markup (messages quote ``[api] keys``)."""
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True, highlight=False)


def exit_with_error(message: str, code: int = 2) -> NoReturn:
    say_error(message)
    raise typer.Exit(code)


def call(url: str, api_key: str | None, work: Callable[[Client], Awaitable[T]]) -> T:
    """Run ``work`` with a client; turn every failure into one clear line and exit code."""

    async def go() -> T:
        async with Client(url, api_key=api_key) as client:
            return await work(client)

    try:
        return asyncio.run(go())
    except httpx.ConnectError:
        say_error(
            f"cannot reach a floodway server at {url} "
            "(start one with `floodway serve`, or set --url / FLOODWAY_URL)"
        )
    except ApiError as exc:
        if exc.status == 401:
            say_error(
                f"{url} refused the API key: {exc.detail or exc.title}"
                " (set --api-key or FLOODWAY_API_KEY)"
            )
        else:
            say_error(f"HTTP {exc.status}: {exc.detail or exc.title}")
    except FloodwayError as exc:
        say_error(str(exc))
    except httpx.HTTPError as exc:
        say_error(f"talking to {url}: {exc}")
    raise typer.Exit(1)


def show(task: Task, **extra: Any) -> None:
    out.print_json(json.dumps(task_json(task, **extra)))


def parse_input(text: str) -> dict[str, Any]:
    """``--input``: a JSON object (the task's input), or a one-line error saying so."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        exit_with_error(f"--input is not JSON: {exc}")
    if not isinstance(value, dict):
        exit_with_error(
            f"--input must be a JSON object, not a {json_type(value)}: "
            f"""e.g. --input '{{"prompt": {json.dumps(value)}}}'"""
        )
    return value


def json_type(value: Any) -> str:
    names = {str: "string", list: "list", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def register(app: typer.Typer) -> None:
    @app.command()
    def submit(
        kind: Annotated[str, typer.Argument(help="the task's kind")],
        input: Annotated[str, typer.Option("--input", help="the input, a JSON object")],
        lane: Annotated[str, typer.Option(help="interactive | background")] = "background",
        key: Annotated[str | None, typer.Option("--key", help="Idempotency-Key")] = None,
        wait: Annotated[bool, typer.Option("--wait/--no-wait", help="wait until it ends")] = False,
        url: UrlOpt = DEFAULT_URL,
        api_key: KeyOpt = None,
    ) -> None:
        """Submit a task; prints it (with "reused": true when the key matched). With --wait,
        exits 1 unless it succeeded."""
        value = parse_input(input)

        async def work(c: Client) -> tuple[Task, bool]:
            sub = await c.submit_request(SubmitRequest(kind, value, lane=lane, key=key))
            task = await c.wait(sub.task.id) if wait else sub.task
            return task, sub.reused

        task, reused = call(url, api_key, work)
        show(task, reused=reused)
        if wait and task.status.value not in ("succeeded", "deduped"):
            raise typer.Exit(1)

    @app.command()
    def get(task_id: str, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None) -> None:
        """Show a task."""
        show(call(url, api_key, lambda c: c.get(task_id)))

    @app.command()
    def cancel(task_id: str, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None) -> None:
        """Cancel a task (a running one's call is read to its end and billed)."""
        show(call(url, api_key, lambda c: c.cancel(task_id)))

    @app.command()
    def retry(task_id: str, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None) -> None:
        """Send a failed, dead or timed-out task back to the queue."""
        show(call(url, api_key, lambda c: c.retry(task_id)))

    @app.command("list")
    def list_tasks(
        status: Annotated[str | None, typer.Option(help="only this status")] = None,
        kind: Annotated[str | None, typer.Option(help="only this kind")] = None,
        limit: Annotated[int, typer.Option(min=1, max=1000, help="tasks per page")] = 50,
        after: Annotated[
            str | None, typer.Option("--after", help="the cursor a previous page printed")
        ] = None,
        oldest_first: Annotated[
            bool, typer.Option("--oldest-first", help="oldest first (default: newest first)")
        ] = False,
        as_json: Annotated[
            bool, typer.Option("--json", help="the page as JSON: {items, next} as the API answers")
        ] = False,
        url: UrlOpt = DEFAULT_URL,
        api_key: KeyOpt = None,
    ) -> None:
        """List tasks, newest first, a page at a time; prints the command for the next page."""
        page = call(
            url,
            api_key,
            lambda c: c.list_tasks(
                status=status,
                kind=kind,
                limit=limit,
                after=after,
                newest_first=not oldest_first,
            ),
        )
        if as_json:
            items = [task_json(t) for t in page.items]
            out.print_json(json.dumps({"items": items, "next": page.next}))
            return
        print_tasks(page.items, "tasks")
        if page.next:
            again = ["floodway", "list", "--after", page.next]
            for flag, value in (("--status", status), ("--kind", kind)):
                if value is not None:
                    again += [flag, value]
            if limit != 50:
                again += ["--limit", str(limit)]
            if oldest_first:
                again.append("--oldest-first")
            if url != os.environ.get("FLOODWAY_URL", DEFAULT_URL):
                again += ["--url", url]
            out.print(f"next page: {shlex.join(again)}", soft_wrap=True, highlight=False)

    @app.command()
    def kinds(
        as_json: Annotated[bool, typer.Option("--json", help="the whole answer as JSON")] = False,
        url: UrlOpt = DEFAULT_URL,
        api_key: KeyOpt = None,
    ) -> None:
        """The kinds the server runs, with their resources and limits."""
        found = call(url, api_key, lambda c: c.kinds())
        if as_json:
            out.print_json(json.dumps(found))
            return
        if not found:
            out.print("no kinds are configured on this server")
            return
        table = Table(title="kinds")
        for column in ("kind", "resource", "attempts", "deadline", "models"):
            table.add_column(column, overflow="fold")
        for k in found:
            deadline = "none" if k["deadline_s"] is None else f"{k['deadline_s']:g}s"
            table.add_row(
                escape(k["name"]),
                escape(k["resource"] or "(no limits)"),
                str(k["max_attempts"]),
                deadline,
                escape(", ".join(k["models"])),
            )
        out.print(table)

    @app.command()
    def stats(url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None) -> None:
        """Tasks per state, timings, limiter usage (JSON)."""
        out.print_json(json.dumps(call(url, api_key, lambda c: c.stats())))

    @app.command()
    def spend(
        since: Annotated[
            str | None, typer.Option(help='how far back: "24h", "7d" (default: everything kept)')
        ] = None,
        kind: Annotated[str | None, typer.Option(help="one kind")] = None,
        tenant: Annotated[str | None, typer.Option(help="one tenant (operators)")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="the whole answer as JSON")] = False,
        url: UrlOpt = DEFAULT_URL,
        api_key: KeyOpt = None,
    ) -> None:
        """Spend per tenant and kind, what dedupe saved, and what budgets have left."""
        view = call(url, api_key, lambda c: c.spend(tenant=tenant, kind=kind, since=since))
        if as_json:
            out.print_json(json.dumps(view))
            return
        out.print(spend_table(view))
        for b in view["budgets"]:
            out.print(
                f"budget of {b['tenant']}: {b['left']:.2f} left of {b['amount']:.2f} "
                f"(spent {b['spent']:.2f}, held by running work {b['held']:.2f}); "
                f"resets {b['resets_at']}",
                soft_wrap=True,
                highlight=False,
            )

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
            print_tasks(dead, f"dead letters ({len(dead)})")
        elif action == "retry" and (task_id or all_):
            retried = call(url, api_key, lambda c: retry_dead(c, task_id))
            out.print(f"sent {retried} dead letter(s) back to the queue")
        else:
            exit_with_error("use `dlq list`, `dlq retry ID` or `dlq retry --all`")


async def retry_dead(c: Client, task_id: str | None) -> int:
    """Retry one task, or (no id) every dead letter, in one session."""
    ids = [task_id] if task_id else [t.id for t in await collect(c, "dead")]
    for one in ids:
        await c.retry(one)
    return len(ids)


async def collect(c: Client, status: str) -> list[Task]:
    return [t async for t in c.iter_tasks(status=status)]


#: the columns besides the id need about this much room to say anything
_OTHER_COLUMNS = 60


def print_tasks(tasks: list[Task], title: str) -> None:
    """Tasks as a table when the terminal has room for it, else one paragraph per task. Ids
    are never cut: they are copied into ``floodway get``."""
    widest = max((len(t.id) for t in tasks), default=2)
    if out.width >= widest + _OTHER_COLUMNS:
        out.print(task_table(tasks, title, widest))
        return
    out.print(title)
    for t in tasks:
        out.print(t.id, soft_wrap=True, highlight=False)
        print_indented(f"{t.kind} · {t.status.value} · {t.attempts} attempt(s)")
        if t.error:
            print_indented(f"{t.error.cls.value}: {t.error.message}")


def spend_table(view: dict[str, Any]) -> Table:
    table = Table(title=f"spend: {view['cost']:.2f}, saved by dedupe: {view['saved']:.2f}")
    for column in ("tenant", "kind", "cost", "saved", "calls", "deduped"):
        table.add_column(column, justify="left" if column in ("tenant", "kind") else "right")
    for line in view["lines"]:
        table.add_row(
            escape(line["tenant"]),
            escape(line["kind"]),
            f"{line['cost']:.2f}",
            f"{line['saved']:.2f}",
            str(line["calls"]),
            str(line["deduped"]),
        )
    return table


def print_indented(text: str, indent: str = "    ") -> None:
    """``text`` wrapped to the terminal by words, indented; a long word (an id, a URL) is
    never broken."""
    wrapped = textwrap.fill(
        text,
        width=out.width,
        initial_indent=indent,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    out.print(wrapped, soft_wrap=True, markup=False, highlight=False)


def task_table(tasks: list[Task], title: str, widest: int) -> Table:
    """The id column keeps its whole width; the error column wraps instead."""
    table = Table(title=title)
    table.add_column("id", no_wrap=True, min_width=widest)
    for column in ("kind", "status", "attempts"):
        table.add_column(column, overflow="fold")
    table.add_column("error", overflow="fold", ratio=1)
    for t in tasks:
        error = f"{t.error.cls.value}: {t.error.message}" if t.error else ""
        table.add_row(t.id, t.kind, t.status.value, str(t.attempts), escape(error))
    return table


def read_text(file: Path) -> str:
    try:
        return file.read_text()
    except UnicodeDecodeError:
        exit_with_error(f"cannot read {file}: not UTF-8 text")
    except OSError as exc:
        exit_with_error(f"cannot read {file}: {exc.strerror or exc}")
