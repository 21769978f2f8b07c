"""``floodway job submit FILE | show ID | cancel ID | retry ID``: multi-step jobs on a running
server (docs/jobs.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from floodway.cli.remote import KeyOpt, UrlOpt, call, exit_with_error, json_type, out, read_text
from floodway.client import DEFAULT_URL, Client

app = typer.Typer(help="Multi-step jobs: submit a definition, show, cancel or retry one.")


def read_job(file: Path) -> dict[str, Any]:
    """A job file: ``POST /v1/jobs``'s body (``{"steps": [...], ...}``) or just its steps."""
    try:
        value = json.loads(read_text(file))
    except json.JSONDecodeError as exc:
        exit_with_error(f"{file} is not JSON: {exc}")
    if isinstance(value, list):
        return {"steps": value}
    if not isinstance(value, dict):
        exit_with_error(
            f"{file} must hold a job object or a list of steps, not a {json_type(value)}"
        )
    return value


def show(job: dict[str, Any]) -> None:
    out.print_json(json.dumps(job))


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help='JSON: {"steps": [...], ...} or a list of steps')],
    wait: Annotated[bool, typer.Option("--wait", help="wait until it ends")] = False,
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
) -> None:
    """Submit a job; prints it. With --wait, exits 1 unless it succeeded."""
    body = read_job(file)

    async def work(c: Client) -> dict[str, Any]:
        job = await c.submit_job(body)
        return await c.wait_job(job["id"]) if wait else job

    job = call(url, api_key, work)
    show(job)
    if wait and job["status"] != "succeeded":
        raise typer.Exit(1)


@app.command("show")
def show_job(job_id: str, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None) -> None:
    """Show a job: its status, each step's tasks and statuses, progress, result or error."""
    show(call(url, api_key, lambda c: c.get_job(job_id)))


@app.command()
def cancel(job_id: str, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None) -> None:
    """Cancel a job: what has not been sent is cancelled, no further step starts."""
    show(call(url, api_key, lambda c: c.cancel_job(job_id)))


@app.command()
def retry(job_id: str, url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None) -> None:
    """Run a failed job again: only its failed steps and what depends on them."""
    show(call(url, api_key, lambda c: c.retry_job(job_id)))
