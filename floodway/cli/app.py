"""The ``floodway`` command (Typer + Rich)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from floodway.app import Floodway
from floodway.cli.batch import register as register_batch
from floodway.cli.jobs import app as jobs_app
from floodway.cli.remote import exit_with_error
from floodway.cli.remote import register as register_remote
from floodway.clock import SystemClock
from floodway.config import Settings, load_settings
from floodway.core.errors import FloodwayError, LimiterUnavailable, StoreError
from floodway.limits.factory import build_backend
from floodway.serving import bind_socket
from floodway.store.factory import redact
from floodway.version import __version__

app = typer.Typer(
    name="floodway",
    help="A durable scheduler for calls to slow, rate-limited, billed AI providers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # click's plain help: a flag reads "--wait / --no-wait", not "--wait <bool>"
    rich_markup_mode=None,
)
console = Console(stderr=True)

ConfigOpt = Annotated[Path | None, typer.Option("--config", help="TOML config file")]
AppOpt = Annotated[str | None, typer.Option("--app", help="module:attribute of a Floodway")]
DatabaseOpt = Annotated[str | None, typer.Option("--database", help="database URL")]
RedisOpt = Annotated[str | None, typer.Option("--redis", help="redis URL for fleet limits")]
HostOpt = Annotated[str, typer.Option(help="address to bind")]
PortOpt = Annotated[int, typer.Option(help="port")]
ConcurrencyOpt = Annotated[
    int | None, typer.Option("--concurrency", min=1, help="tasks run at once")
]


log = logging.getLogger("floodway")


def fail(message: str, code: int = 2) -> NoReturn:
    exit_with_error(message, code)


def one_line(exc: BaseException) -> str:
    """A driver's multi-line message (libpq's "Is the server running...") on one line."""
    return " ".join(str(exc).split())


def store_hint(url: str) -> str:
    if url.split(":", 1)[0].lower() in ("postgresql", "postgres"):
        return (
            " (is PostgreSQL running and the database created? see docs/deploy.md; "
            "set `database` in the config, --database or FLOODWAY_DATABASE)"
        )
    return " (set `database` in the config, --database or FLOODWAY_DATABASE)"


def load_floodway(
    app_ref: str | None, config: Path | None, database: str | None, redis: str | None
) -> Floodway:
    """The Floodway of ``--app module:attr`` (with CLI overrides), or one from the config."""
    try:
        return _load_floodway(app_ref, config, database, redis)
    except FloodwayError as exc:
        fail(str(exc))


def settings_or_fail(config: Path | None, **overrides: Any) -> Settings:
    try:
        return load_settings(config, **overrides)
    except FloodwayError as exc:
        fail(str(exc))


def listen_or_fail(host: str, port: int) -> socket.socket:
    try:
        return bind_socket(host, port)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc} (pick another --port)")


def setup_logging() -> None:
    """Warnings and errors by default; ``FLOODWAY_LOG_LEVEL`` (debug, info...) says more."""
    wanted = os.environ.get("FLOODWAY_LOG_LEVEL", "warning").upper()
    level = logging.getLevelNamesMapping().get(wanted)
    if level is None:
        fail(f"FLOODWAY_LOG_LEVEL={wanted.lower()}: not a level (debug, info, warning, error)")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")


def _load_floodway(
    app_ref: str | None, config: Path | None, database: str | None, redis: str | None
) -> Floodway:
    if app_ref is None:
        return Floodway(settings=load_settings(config, database=database, redis=redis))
    module_name, _, attr = app_ref.partition(":")
    if not attr:
        fail(f"--app {app_ref!r}: use module:attribute, e.g. myapp.tasks:fw")
    sys.path.insert(0, str(Path.cwd()))
    try:
        target: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        fail(f"--app {app_ref!r}: cannot load it: {exc}")
    if not isinstance(target, Floodway):
        fail(f"--app {app_ref!r} is a {type(target).__name__}, not a floodway.Floodway")
    if config is not None or database is not None or redis is not None:
        base = load_settings(config) if config is not None else target.settings
        updates = {k: v for k, v in {"database": database, "redis": redis}.items() if v}
        target.settings = base.model_copy(update=updates)
    return target


def run(coro: Any, database: str | None = None) -> Any:
    """Run a coroutine; floodway errors become one clear line, not a traceback (a store
    error also says where the database URL is set, when ``database`` names it)."""
    try:
        return asyncio.run(coro)
    except StoreError as exc:
        if isinstance(exc, LimiterUnavailable) or database is None:
            fail(one_line(exc))
        fail(one_line(exc) + store_hint(database))
    except FloodwayError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def check_startup(fw: Floodway) -> None:
    """Open everything once before serving, so a wrong database URL, an unreachable
    PostgreSQL or a kind that cannot be built is one line naming the fix, not the traceback
    of a failed server start-up. An unreachable Redis is not fatal (dispatch waits for it and
    retries by itself), but it is said at once instead of one "dispatch paused" per second."""

    async def go() -> None:
        async with fw:
            pass
        await warn_if_redis_unreachable(fw.settings)

    run(go(), fw.settings.database)


async def warn_if_redis_unreachable(settings: Settings) -> None:
    if not settings.redis:
        return
    backend = build_backend(settings, SystemClock())
    try:
        await backend.now()
    except LimiterUnavailable as exc:
        log.warning(
            "the limiter's Redis at %s is unreachable (%s): nothing is dispatched until it "
            "answers; retrying every second",
            redact(settings.redis),
            one_line(exc.__cause__ or exc),
        )
    finally:
        await backend.aclose()


async def run_until_signalled(fw: Floodway, concurrency: int | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    async with fw, fw.worker(concurrency) as worker:
        console.print(
            f"[green]worker[/] {worker.owner} on {escape(redact(fw.settings.database))} "
            f"running {', '.join(fw.kinds.names()) or 'no kinds'}",
            soft_wrap=True,
        )
        await stop.wait()
        console.print(
            f"stopping: letting running tasks finish (grace {fw.settings.worker.grace:g}s)"
        )


@app.command()
def worker(
    config: ConfigOpt = None,
    app_ref: AppOpt = None,
    database: DatabaseOpt = None,
    redis: RedisOpt = None,
    concurrency: ConcurrencyOpt = None,
) -> None:
    """Run workers and maintenance (no HTTP). SIGTERM stops gracefully."""
    setup_logging()
    fw = load_floodway(app_ref, config, database, redis)
    check_startup(fw)
    run(run_until_signalled(fw, concurrency), fw.settings.database)


@app.command()
def migrate(config: ConfigOpt = None, database: DatabaseOpt = None) -> None:
    """Create or upgrade the schema (also done at every start)."""
    settings = settings_or_fail(config, database=database)

    async def go() -> None:
        from floodway.store.factory import open_store

        store = open_store(settings.database)
        await store.open()
        await store.close()

    run(go(), settings.database)
    console.print(f"[green]schema up to date[/] on {redact(settings.database)}")


@app.command()
def simulate(
    port: Annotated[int, typer.Option(help="port to listen on")] = 9000,
    host: HostOpt = "127.0.0.1",
    latency_ms: Annotated[
        float, typer.Option("--latency-ms", help="time to answer one request")
    ] = 500.0,
    max_concurrency: Annotated[
        int,
        typer.Option(
            "--max-concurrency", help="requests in flight at once (429 beyond); 0 = no cap"
        ),
    ] = 0,
    rpm: Annotated[
        int, typer.Option("--rpm", help="requests per sliding minute; 0 = no limit")
    ] = 0,
    tpm: Annotated[int, typer.Option("--tpm", help="tokens per sliding minute; 0 = no limit")] = 0,
    error_rate: Annotated[
        float, typer.Option("--error-rate", help="share answered 503 (0 to 1)")
    ] = 0.0,
    rate_limit_rate: Annotated[
        float, typer.Option("--rate-limit-rate", help="share answered a spontaneous 429")
    ] = 0.0,
    refusal_rate: Annotated[
        float, typer.Option("--refusal-rate", help="share refused: 400 content_policy")
    ] = 0.0,
    malformed_rate: Annotated[
        float, typer.Option("--malformed-rate", help="share answered 200 without a usable result")
    ] = 0.0,
    async_jobs: Annotated[bool, typer.Option("--async", help="jobs: 202, then poll")] = False,
    job_duration_ms: Annotated[
        float, typer.Option("--job-duration-ms", help="--async: mean job duration")
    ] = 3000.0,
    webhook: Annotated[bool, typer.Option("--webhook", help="signed callbacks")] = False,
    webhook_drop_rate: Annotated[
        float, typer.Option("--webhook-drop-rate", help="--webhook: share never sent (0 to 1)")
    ] = 0.0,
    seed: Annotated[
        int | None, typer.Option("--seed", help="the faults' random seed (repeatable runs)")
    ] = None,
    openai: Annotated[
        bool, typer.Option("--openai", help="an OpenAI-compatible API under /v1 instead")
    ] = False,
    anthropic: Annotated[
        bool,
        typer.Option("--anthropic", help="Anthropic's Messages and Message Batches APIs instead"),
    ] = False,
    chunk_ms: Annotated[
        float, typer.Option("--chunk-ms", help="--openai: gap between streamed events")
    ] = 0.0,
    batch_hold_ms: Annotated[
        float,
        typer.Option(
            "--batch-hold-ms", help="--openai, --anthropic: how long a provider batch takes"
        ),
    ] = 0.0,
) -> None:
    """Run a fake AI provider over HTTP (limits, faults, async jobs, a charge ledger)."""
    from pydantic import ValidationError

    from floodway.providers.sim import SimulatorConfig, run_simulator_blocking

    try:
        cfg = SimulatorConfig(
            latency_ms=latency_ms,
            max_concurrency=max_concurrency,
            rpm=rpm,
            tpm=tpm,
            error_rate=error_rate,
            rate_limit_rate=rate_limit_rate,
            refusal_rate=refusal_rate,
            malformed_rate=malformed_rate,
            async_jobs=async_jobs,
            job_duration_ms=job_duration_ms,
            webhook=webhook,
            webhook_drop_rate=webhook_drop_rate,
            seed=seed,
            chunk_ms=chunk_ms,
            batch_hold_s=batch_hold_ms / 1000,
        )
    except ValidationError as exc:
        fail(f"simulator options: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}")
    sock = listen_or_fail(host, port)
    if openai and anthropic:
        fail("simulator options: --openai and --anthropic are two providers: pick one")
    if anthropic:
        what = f"Anthropic provider[/] on http://{host}:{port} (/v1/messages)"
    elif openai:
        what = f"OpenAI-compatible provider[/] on http://{host}:{port}/v1"
    else:
        what = f"provider[/] on http://{host}:{port}"
    console.print(f"[green]simulated {what} (GET /ledger, GET /stats)")
    run_simulator_blocking(cfg, host, port, sock=sock, openai=openai, anthropic=anthropic)


@app.command()
def demo(
    realistic: Annotated[
        bool, typer.Option("--realistic", help="20 s per image, like a real image API")
    ] = False,
    images: Annotated[int, typer.Option(min=1, help="how many images")] = 200,
    latency_ms: Annotated[
        float | None,
        typer.Option(
            "--latency-ms", min=1, help="time per image (default 1500, 20000 with --realistic)"
        ),
    ] = None,
    job: Annotated[
        bool,
        typer.Option(
            "--job", help="the editor's chain as one multi-step job, with a SIGKILL in the middle"
        ),
    ] = False,
) -> None:
    """The 200-image batch against a simulated image API (offline, no setup)."""
    from floodway.cli.demo import DemoOptions, run_demo

    out = Console()
    if job:
        from floodway.cli.job_demo import run_job_demo

        raise typer.Exit(run(run_job_demo(out, latency_ms or 300.0)))
    latency = latency_ms or (20_000.0 if realistic else 1_500.0)
    code = run(run_demo(DemoOptions(images=images, latency_ms=latency), out))
    raise typer.Exit(code)


@app.command()
def serve(
    config: ConfigOpt = None,
    app_ref: AppOpt = None,
    database: DatabaseOpt = None,
    redis: RedisOpt = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    concurrency: ConcurrencyOpt = None,
) -> None:
    """HTTP API + workers + maintenance + dashboard, in one process."""
    serve_http(config, app_ref, database, redis, host, port, concurrency, run_workers=True)


@app.command()
def api(
    config: ConfigOpt = None,
    app_ref: AppOpt = None,
    database: DatabaseOpt = None,
    redis: RedisOpt = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
) -> None:
    """HTTP API only (scale it out beside `floodway worker` processes)."""
    serve_http(config, app_ref, database, redis, host, port, None, run_workers=False)


def serve_http(
    config: Path | None,
    app_ref: str | None,
    database: str | None,
    redis: str | None,
    host: str,
    port: int,
    concurrency: int | None,
    *,
    run_workers: bool,
) -> None:
    from floodway.api import check_bind
    from floodway.api import run as run_api

    setup_logging()
    fw = load_floodway(app_ref, config, database, redis)
    check_startup(fw)
    try:
        check_bind(host, fw.settings)
    except FloodwayError as exc:
        fail(str(exc))
    sock = listen_or_fail(host, port)
    if not fw.settings.kinds and not fw.kinds.names():
        console.print(
            "[yellow]no kinds are configured[/]: every submit will be refused (422 unknown "
            "kind); pass --config FILE with \\[kinds.NAME] tables, or --app module:fw"
        )
    console.print(
        f"[green]floodway[/] on http://{host}:{port} (dashboard /, docs /docs) "
        f"with {escape(redact(fw.settings.database))}",
        soft_wrap=True,
    )
    run_api(fw, host, port, run_workers=run_workers, concurrency=concurrency, sock=sock)


def _print_version(asked: bool) -> None:
    if asked:
        print(f"floodway {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="print the version and exit"
        ),
    ] = False,
) -> None:
    """A durable scheduler for calls to slow, rate-limited, billed AI providers."""


register_remote(app)
register_batch(app)
app.add_typer(jobs_app, name="job")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
