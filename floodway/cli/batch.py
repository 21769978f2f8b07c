"""``floodway batch FILE.jsonl``: submit a file of tasks as one batch, follow it, say why the
ones that did not succeed failed, and exit 1 when any did not (as ``submit --wait`` does)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from floodway.api.schemas import SubmitIn
from floodway.cli.remote import (
    KeyOpt,
    UrlOpt,
    call,
    exit_with_error,
    out,
    print_indented,
    read_text,
)
from floodway.client import DEFAULT_URL, BatchProgress, Client
from floodway.core.states import TERMINAL
from floodway.core.task import Task

#: a line with an object ``input`` and only these keys is a submit body, as ``POST /v1/tasks``
#: takes it; any other object is the input itself
SUBMIT_FIELDS = frozenset(SubmitIn.model_fields)
SUCCESS = ("succeeded", "deduped")
#: statuses in the order the summary shows them
ORDER = ("succeeded", "deduped", "failed", "dead", "timeout", "cancelled")
EXAMPLES = 3  # tasks shown for each reason


@dataclass(frozen=True)
class BatchFile:
    tasks: list[dict[str, Any]]  # submit bodies
    shape: str  # what the lines were read as, for the user


def register(app: typer.Typer) -> None:
    @app.command()
    def batch(
        file: Annotated[
            Path,
            typer.Argument(
                help="JSONL: one input object per line, or one submit body per line "
                '({"kind": ..., "input": {...}}); or "show" and a batch id'
            ),
        ],
        batch_id: Annotated[
            str | None, typer.Argument(help="with show: the batch to report on")
        ] = None,
        kind: Annotated[
            str | None,
            typer.Option("--kind", help="the tasks' kind (for lines that do not name one)"),
        ] = None,
        wait: Annotated[
            bool,
            typer.Option(
                "--wait/--no-wait", help="follow until all end; exit 1 if any did not succeed"
            ),
        ] = False,
        url: UrlOpt = DEFAULT_URL,
        api_key: KeyOpt = None,
    ) -> None:
        """Submit a JSONL file as one batch; with --wait, a live progress bar and a summary.
        `batch show ID`: a batch's tasks per status (JSON)."""
        if str(file) == "show":  # a file named show is ./show
            if batch_id is None:
                exit_with_error("batch show: name the batch: `floodway batch show ID`")
            shown = batch_id
            progress = call(url, api_key, lambda c: c.batch_status(shown))
            out.print_json(json.dumps(dataclasses.asdict(progress)))
            return
        if batch_id is not None:
            exit_with_error(f"batch {file}: one file at a time (`batch show ID` shows a batch)")
        parsed = read_jsonl(file, kind)
        ok = call(url, api_key, lambda c: run_batch(c, parsed, wait))
        if not ok:
            raise typer.Exit(1)


def read_jsonl(file: Path, kind: str | None) -> BatchFile:
    """The file's lines as submit bodies. Every line is an input object, or every line is a
    submit body; a mix is refused at the first line that differs (it is almost always a
    mistake, and guessing per line would submit some lines' options as input)."""
    bodies: list[dict[str, Any]] = []
    first_shape: tuple[int, bool] | None = None
    for number, line in enumerate(read_text(file).splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            exit_with_error(f"{file}:{number}: not JSON: {exc.msg}")
        if not isinstance(value, dict):
            exit_with_error(f"{file}:{number}: each line must be a JSON object")
        is_body = is_submit_body(value)
        if first_shape is None:
            first_shape = (number, is_body)
        elif first_shape[1] != is_body:
            exit_with_error(
                f"{file}:{number}: a {'submit body' if is_body else 'plain input'} after "
                f"{'submit bodies' if first_shape[1] else 'plain inputs'} (line "
                f"{first_shape[0]}): use one shape for the whole file"
            )
        body = dict(value) if is_body else {"input": value}
        body.setdefault("kind", kind)
        if body["kind"] is None:
            exit_with_error(f'{file}:{number}: no kind: give --kind or a "kind" on the line')
        bodies.append(body)
    if first_shape is None:
        exit_with_error(f"{file} holds no tasks")
    shape = "submit bodies" if first_shape[1] else "inputs"
    return BatchFile(bodies, shape)


def is_submit_body(value: dict[str, Any]) -> bool:
    return isinstance(value.get("input"), dict) and value.keys() <= SUBMIT_FIELDS


async def run_batch(c: Client, parsed: BatchFile, wait: bool) -> bool:
    """Submit, and with ``wait`` follow to the end; True when every task succeeded."""
    submitted = await c.batch(parsed.tasks)
    out.print(
        f"batch {submitted.id}: {len(submitted.task_ids)} tasks submitted "
        f"(lines read as {parsed.shape})"
    )
    if not wait:
        return True
    started = time.monotonic()
    progress = await follow(c, submitted.id, len(submitted.task_ids))
    elapsed = time.monotonic() - started
    unsuccessful = [
        t
        for status in ORDER
        if status not in SUCCESS and progress.counts.get(status)
        for t in [x async for x in c.iter_tasks(status=status, batch=submitted.id)]
    ]
    print_summary(submitted.id, progress, elapsed, unsuccessful)
    return not unsuccessful


async def follow(c: Client, batch_id: str, total: int) -> BatchProgress:
    """A progress bar until every task is terminal (its counts fit 80 columns)."""
    with Progress(
        TextColumn("{task.description}", table_column=Column(no_wrap=True, ratio=1)),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=out,
    ) as bar:
        line = bar.add_task("queued", total=total)
        while True:
            progress = await c.batch_status(batch_id)
            finished = sum(n for s, n in progress.counts.items() if s in TERMINAL)
            bar.update(line, completed=finished, description=brief_counts(progress.counts))
            if progress.done:
                return progress
            await asyncio.sleep(0.5)


def brief_counts(counts: dict[str, int]) -> str:
    done = sum(counts.get(s, 0) for s in SUCCESS)
    bad = sum(n for s, n in counts.items() if s in TERMINAL and s not in SUCCESS)
    running = counts.get("running", 0)
    return f"ok {done}, failed {bad}, running {running}"


def print_summary(
    batch_id: str, progress: BatchProgress, elapsed: float, unsuccessful: Sequence[Task]
) -> None:
    out.print(f"batch {batch_id} ended in {elapsed:.1f}s", soft_wrap=True)
    table = Table()
    table.add_column("status")
    table.add_column("tasks", justify="right")
    for status in ORDER:
        if progress.counts.get(status):
            table.add_row(status, str(progress.counts[status]))
    out.print(table)
    if unsuccessful:
        print_reasons(unsuccessful, progress.total)


def print_reasons(tasks: Sequence[Task], total: int) -> None:
    """Why tasks did not succeed: one paragraph per (status, error class, error type), most
    common first: the first task's message and up to a few ids (whole: they are copied into
    ``floodway get``), wrapped to the terminal's width."""
    groups: dict[tuple[str, str], list[Task]] = {}
    for task in tasks:
        why = f"{task.error.cls.value} {task.error.type}" if task.error else "no error recorded"
        groups.setdefault((task.status.value, why), []).append(task)
    out.print(f"why {len(tasks)} of {total} did not succeed:")
    ranked = Counter({key: len(group) for key, group in groups.items()}).most_common()
    for (status, why), count in ranked:
        group = groups[status, why]
        out.print(f"{count} {status}: {escape(why)}", soft_wrap=False)
        message = group[0].error.message if group[0].error else ""
        ids = ", ".join(t.id for t in group[:EXAMPLES]) + (", ..." if count > EXAMPLES else "")
        for text in (message, ids):
            if text:
                print_indented(text)
