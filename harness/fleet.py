"""A floodway app for fleet runs: one kind, ``img``, that calls the simulated provider over HTTP
and consumes the resource ``sim`` (in-flight cap ``FLEET_CAP``, default 10; with
``FLEET_ADAPTIVE=1`` no limit at all, ``adaptive`` only: the fleet learns them). The kind
trusts the provider to honour Idempotency-Key and looks work up after a crash, unless
``FLEET_IDEMPOTENT=0`` / ``FLEET_LOOKUP=0``; ``FLEET_TIMEOUT`` is its call timeout (seconds).
``FLEET_CLOCK_SKEW`` (seconds) sets the process's host clock off by that much, as a host
whose clock is wrong would be.

    FLOODWAY_DATABASE=postgresql://... FLOODWAY_REDIS=redis://... SIM_URL=http://... \\
        floodway worker --app harness.fleet:fw --concurrency 10

Every worker process builds the same app, so each one enforces the same resource; with
``redis`` set the cap holds for the sum over the processes.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import redis.asyncio as aioredis
from psycopg import sql as pgsql
from redis.exceptions import RedisError

from floodway import Context, Floodway
from floodway.clock import LedgerClock, SystemClock
from floodway.config import ResourceConfig, load_settings
from floodway.limits.admission import AdmissionTuning, LimitsAdmission
from floodway.limits.factory import build_backend
from floodway.providers.responses import error_for, keep_headers, report_usage
from harness.processes import answers_healthz, spawn_floodway, until

RESOURCE = "sim"
KIND = "img"


class SkewedClock(SystemClock):
    """A host clock ``skew`` seconds off the true time."""

    def __init__(self, skew: float) -> None:
        self.skew = skew

    def now(self) -> float:
        return super().now() + self.skew


def build(
    database: str | None = None,
    sim_url: str | None = None,
    *,
    redis: str | None = None,
    cap: int | None = None,
    tuning: AdmissionTuning | None = None,
    idempotent: bool | None = None,
    lookup: bool | None = None,
    timeout_s: float | None = None,
    adaptive: bool | None = None,
) -> Floodway:
    """``tuning`` replaces floodway's admission knobs (e.g. a short ``claim_ttl_s``)."""
    env = os.environ.get
    idempotent = env("FLEET_IDEMPOTENT", "1") == "1" if idempotent is None else idempotent
    lookup = env("FLEET_LOOKUP", "1") == "1" if lookup is None else lookup
    timeout_s = float(env("FLEET_TIMEOUT", "60")) if timeout_s is None else timeout_s
    settings = load_settings(database=database, redis=redis)
    limit = cap if cap is not None else int(os.environ.get("FLEET_CAP", "10"))
    if adaptive is None:
        adaptive = os.environ.get("FLEET_ADAPTIVE") == "1"
    resource = ResourceConfig(adaptive=True) if adaptive else ResourceConfig(concurrency=limit)
    # A price given in the environment (FLOODWAY_RESOURCES__SIM__PRICE__...) is kept.
    given = settings.resources.get(RESOURCE)
    resource = resource.model_copy(update={"price": given.price if given else None})
    settings = settings.model_copy(update={"resources": {RESOURCE: resource}})
    # floodway's default clock, on a host clock that may be skewed
    clock = LedgerClock(SkewedClock(float(env("FLEET_CLOCK_SKEW", "0"))))
    if tuning is not None:
        backend = build_backend(settings, clock)
        admission = LimitsAdmission(
            settings.resources, {KIND: RESOURCE}, settings.tenants, backend, clock, tuning
        )
        fw = Floodway(settings=settings, clock=clock, admission=admission)
    else:
        fw = Floodway(settings=settings, clock=clock)
    base = sim_url or os.environ.get("SIM_URL", "http://127.0.0.1:9000")
    # Made now, at start-up, as an application would: building a client loads the CA bundle,
    # which would otherwise delay the first call by up to a quarter of a second.
    client = httpx.AsyncClient(base_url=base, timeout=10)

    async def look_up(ctx: Context) -> Any:
        """Recovery: the provider bills per idempotency key; a finished job is taken as is."""
        r = await client.get("/jobs", params={"idempotency_key": ctx.work_key})
        if r.status_code != 200:
            return None
        body = r.json()
        if body.get("status") != "succeeded":
            return None
        report_usage(ctx, body)  # what the provider billed for the job found
        return body.get("result")

    @fw.kind(
        KIND,
        resource=RESOURCE,
        idempotent=idempotent,
        lookup=look_up if lookup else None,
        timeout=timeout_s,
    )
    async def generate(ctx: Context, value: dict[str, Any]) -> Any:
        r = await client.post("/generate", json=value, headers={"Idempotency-Key": ctx.work_key})
        keep_headers(ctx, r)  # the provider's rate-limit figures, for the limiter
        if r.status_code >= 400:  # 429 -> throttled with its Retry-After, 5xx/409 -> retryable
            raise error_for(r, ctx.now(), "POST /generate")
        body = r.json()
        report_usage(ctx, body)  # the tokens the provider billed: the spend ledger's figure
        return body["result"]

    return fw


fw = build() if os.environ.get("FLOODWAY_DATABASE") else None


# -- the harness: real worker processes, a private Redis, a fresh PostgreSQL database ---------
# Shared by tests/acceptance/test_fleet*.py and bench/fleet.py.

ROOT = Path(__file__).resolve().parents[1]
PG_URL = os.environ.get("FLOODWAY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """A private ``redis-server`` on a free port (no persistence, like the CI one), so a test
    can stop and restart its limiter without touching the machine's shared Redis."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self.launch()
        await until(self.ping, 10, f"redis-server on port {self.port} answers")

    def launch(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--logfile",
                str(self.workdir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    async def ping(self) -> bool:
        client = aioredis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        try:
            return bool(await client.ping())
        except (OSError, RedisError):
            return False
        finally:
            await client.aclose()

    def stop(self) -> None:
        """``redis-cli shutdown nosave``: every key is gone, as after a crash."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        subprocess.run(
            ["redis-cli", "-p", str(self.port), "shutdown", "nosave"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @property
    def running(self) -> bool:
        return self.proc is not None


@asynccontextmanager
async def private_redis(workdir: Path) -> AsyncIterator[RedisServer]:
    server = RedisServer(workdir)
    await server.start()
    try:
        yield server
    finally:
        server.stop()


@asynccontextmanager
async def fresh_database(base_url: str = PG_URL) -> AsyncIterator[str]:
    """A new, empty PostgreSQL database on the server of ``base_url``; dropped afterwards
    (``WITH (FORCE)``: connections of killed workers do not keep it alive)."""
    name = f"fw_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(base_url, autocommit=True) as admin:
        await admin.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    try:
        yield urlunsplit(urlsplit(base_url)._replace(path=f"/{name}"))
    finally:
        async with await psycopg.AsyncConnection.connect(base_url, autocommit=True) as admin:
            await admin.execute(
                pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
            )


@dataclass
class WorkerProcess:
    """One ``floodway worker --app harness.fleet:fw`` process."""

    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def owns(self, owner: str | None) -> bool:
        """Whether a lease owner (``host:pid:token:role``) is one of this process's workers."""
        return owner is not None and f":{self.pid}:" in owner

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def ready(self) -> bool:
        return "worker" in self.output() and self.proc.poll() is None

    def count(self, text: str) -> int:
        return self.output().count(text)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not stop in time. The exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


def _fleet_env(
    database: str, redis: str, sim_url: str, cap: int, adaptive: bool = False
) -> dict[str, str]:
    return {
        "FLOODWAY_DATABASE": database,
        "FLOODWAY_REDIS": redis,
        "FLEET_CAP": str(cap),
        "FLEET_ADAPTIVE": "1" if adaptive else "0",
        "SIM_URL": sim_url,
    }


def _spawn(args: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    return spawn_floodway([*args, "--app", "harness.fleet:fw"], env, log)


def spawn_worker(
    database: str,
    redis: str,
    sim_url: str,
    log: Path,
    *,
    lease: str = "2s",
    concurrency: int = 10,
    cap: int = 10,
    idempotent: bool = True,
    lookup: bool = True,
    timeout_s: float = 60.0,
    adaptive: bool = False,
    extra_env: Mapping[str, str] | None = None,
) -> WorkerProcess:
    """``extra_env``: more settings (``FLOODWAY_...``) for the process."""
    env = {
        **_fleet_env(database, redis, sim_url, cap, adaptive),
        **(extra_env or {}),
        "FLOODWAY_WORKER__LEASE": lease,
        "FLEET_IDEMPOTENT": "1" if idempotent else "0",
        "FLEET_LOOKUP": "1" if lookup else "0",
        "FLEET_TIMEOUT": str(timeout_s),
    }
    return WorkerProcess(_spawn(["worker", "--concurrency", str(concurrency)], env, log), log)


@dataclass
class ApiProcess(WorkerProcess):
    """One ``floodway api --app harness.fleet:fw`` process on a free port."""

    url: str = ""

    async def healthy(self) -> bool:
        assert self.proc.poll() is None, f"the API process exited:\n{self.output()}"
        return await answers_healthz(self.url)

    async def submit_batch(self, kind: str, inputs: list[dict[str, Any]]) -> list[str]:
        """POST /v1/batches: every task in one transaction; their ids, in order."""
        async with httpx.AsyncClient(base_url=self.url, timeout=30) as http:
            resp = await http.post(
                "/v1/batches", json={"tasks": [{"kind": kind, "input": v} for v in inputs]}
            )
        assert resp.status_code == 202, resp.text
        ids: list[str] = resp.json()["task_ids"]
        return ids


def spawn_api(
    database: str,
    redis: str,
    sim_url: str,
    log: Path,
    *,
    cap: int = 10,
    adaptive: bool = False,
    extra_env: Mapping[str, str] | None = None,
) -> ApiProcess:
    port = free_port()
    args = ["api", "--host", "127.0.0.1", "--port", str(port)]
    env = {**_fleet_env(database, redis, sim_url, cap, adaptive), **(extra_env or {})}
    proc = _spawn(args, env, log)
    return ApiProcess(proc, log, url=f"http://127.0.0.1:{port}")


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    return str(candidates[-1]) if candidates else None


class PostgresCluster:
    """A private PostgreSQL server (``initdb`` into a temporary directory, a free port), so a
    test can restart its ledger without touching the machine's shared server. As root, the
    server runs as the ``postgres`` user (PostgreSQL refuses to run as root)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.data = workdir / "data"
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    @staticmethod
    def missing() -> str | None:
        for name in ("initdb", "pg_ctl"):
            if _pg_bin(name) is None:
                return f"{name} is not installed"
        if os.geteuid() == 0 and shutil.which("runuser") is None:
            return "runuser is needed to run PostgreSQL as the postgres user"
        return None

    def _run(self, tool: str, *args: str) -> None:
        binary = _pg_bin(tool)
        assert binary is not None, tool
        subprocess.run(
            [*self._as, binary, *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _server_options(self) -> str:
        return (
            f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=200"
        )

    def init(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._as:
            shutil.chown(self.workdir, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def start(self) -> None:
        log = str(self.workdir / "server.log")
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", self._server_options(), "-l", log, "-w", "start"
        )

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every session is cut, as in a real restart."""
        log = str(self.workdir / "server.log")
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-m",
            "fast",
            "-o",
            self._server_options(),
            "-l",
            log,
            "-w",
            "restart",
        )

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")


@contextmanager
def private_postgres(workdir: Path) -> Iterator[PostgresCluster]:
    cluster = PostgresCluster(workdir)
    cluster.init()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
