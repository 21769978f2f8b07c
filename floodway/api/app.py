"""The HTTP API's app factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from floodway.api.direct import DirectRoutes
from floodway.api.guard import GuardMiddleware
from floodway.api.history import SAMPLE_INTERVAL_S, History
from floodway.api.openapi import install_openapi
from floodway.api.problems import install_problem_handlers
from floodway.api.routes import batches, events, jobs, kinds, ops, spend, tasks, webhooks
from floodway.api.routes import openai as openai_routes
from floodway.api.routes.openai.headers import OpenAIHeaders
from floodway.api.state import ApiState
from floodway.app import Floodway
from floodway.limits.factory import build_backend
from floodway.limits.submit_rate import SubmitRateLimiter
from floodway.serving import serve_app
from floodway.version import __version__

DESCRIPTION = """A durable scheduler for calls to rate-limited, billed AI providers.

Send request bodies as JSON, with `Content-Type: application/json` (anything else is a 415).
Errors are RFC 9457 `application/problem+json`. Authenticate with `Authorization: Bearer <key>`
or `X-API-Key: <key>` when `[api] keys` is configured; every task is scoped to the key's tenant.
`/healthz` is a liveness probe, `/readyz` a readiness probe (503 while a dependency is down).
"""


def create_app(
    fw: Floodway,
    *,
    run_workers: bool = False,
    concurrency: int | None = None,
    sse_recheck_s: float = 3.0,
    stats_sample_s: float = SAMPLE_INTERVAL_S,
) -> FastAPI:
    """The API over ``fw``. Its lifespan opens ``fw`` (and closes it if it opened it).

    ``run_workers``: also run ``fw.worker(concurrency)`` (workers and maintenance, which
    delivers the outbound callbacks) for the app's lifetime, as ``floodway serve`` does.
    ``stats_sample_s``: how often the history behind ``/v1/stats/history`` takes a sample.
    """
    state = ApiState(fw=fw, sse_recheck_s=sse_recheck_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        opened_here = not _is_open(fw)
        await fw.open()
        try:
            async with AsyncExitStack() as stack:
                if fw.settings.tenants.submit_rate or fw.settings.redis:
                    state.limiter = build_backend(fw.settings, fw.clock)
                    stack.push_async_callback(state.limiter.aclose)
                if fw.settings.tenants.submit_rate and state.limiter is not None:
                    state.submit_rate = SubmitRateLimiter(fw.settings.tenants, state.limiter)
                if run_workers:
                    await stack.enter_async_context(fw.worker(concurrency))
                state.history = await stack.enter_async_context(
                    History(lambda: ops.stats_views(state), fw.clock, interval_s=stats_sample_s)
                )
                api = fw.settings.api
                if api.metrics_port is not None:
                    metrics = metrics_app(state)
                    await stack.enter_async_context(
                        serve_app(metrics, api.metrics_port, api.metrics_host)
                    )
                yield
        finally:
            state.submit_rate = state.limiter = state.history = None
            if opened_here:
                await fw.close()

    # /docs and /redoc from assets shipped in the package, not a CDN: they work air-gapped.
    app = FastAPIOffline(
        title="floodway",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        favicon_url="/static/favicon.svg",
    )
    app.state.api = state
    install_problem_handlers(app)
    for module in (tasks, events, batches, jobs, kinds, webhooks, spend, openai_routes, ops):
        app.include_router(module.router)
    if ops.DASHBOARD.parent.is_dir():  # the dashboard's own scripts and styles, if it has any
        app.mount("/static", StaticFiles(directory=ops.DASHBOARD.parent), name="static")
    direct = {**tasks.DIRECT, **openai_routes.DIRECT}
    app.add_middleware(DirectRoutes, routes=direct, exception_handlers=app.exception_handlers)
    limits = fw.settings.api
    app.add_middleware(  # around DirectRoutes
        GuardMiddleware,
        max_body_bytes=limits.max_body_bytes,
        max_json_depth=limits.max_json_depth,
        body_timeout_s=limits.body_timeout,
        on_response=lambda code: state.metrics.responses.labels(str(code)).inc(),
        larger={openai_routes.FILES_PATH: ("max_file_bytes", limits.max_file_bytes)},
    )
    # Outermost: the guard's own answers on /openai/v1 carry the headers an SDK reads too.
    app.add_middleware(OpenAIHeaders, prefix=openai_routes.PREFIX)
    install_openapi(app, kinds=fw.kinds.names)
    return app


def metrics_app(state: ApiState) -> Starlette:
    """``/metrics`` alone, without keys, for ``[api] metrics_port`` (a private listener)."""

    async def metrics(_: Request) -> Response:
        return await ops.render_metrics(state)

    return Starlette(routes=[Route("/metrics", metrics)])


def _is_open(fw: Floodway) -> bool:
    try:
        fw.runtime  # noqa: B018 - the property raises when not open
    except RuntimeError:
        return False
    return True
