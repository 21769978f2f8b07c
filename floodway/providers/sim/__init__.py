"""The simulated AI provider behind ``floodway simulate``, the benchmarks and the demo.

A real HTTP server (FastAPI on uvicorn) that behaves like a rate-limited, billed provider::

    POST /generate            sync: 200 {id, status, result, usage}; async: 202 {id, status}
    GET  /jobs/{id}           poll a job            DELETE /jobs/{id}   cancel a running job
    GET  /jobs?idempotency_key=K                    the job for a key (crash recovery)
    GET  /ledger  GET /stats  POST /reset           what was billed, counters, start over

It honours ``Idempotency-Key`` (a billed key replays its job, a key in flight gets 409),
enforces a concurrency cap and per-minute request/token windows with honest 429s, misbehaves at
configured rates (5xx, hangs, refusals, malformed output, spontaneous 429s) and signs its
webhooks the Standard Webhooks way. The ledger is how benchmarks prove nothing was paid twice.

    async with running_simulator(SimulatorConfig(latency_ms=20, max_concurrency=10)) as sim:
        ...  # point an http kind at f"{sim.url}/generate"; read sim.state.ledger afterwards
"""

from floodway.providers.sim.app import create_simulator_app, simulator_state
from floodway.providers.sim.config import SimulatorConfig
from floodway.providers.sim.server import (
    RunningSimulator,
    run_simulator_blocking,
    running_simulator,
)
from floodway.providers.sim.state import SimulatorState
from floodway.serving import serve_app

__all__ = [
    "RunningSimulator",
    "SimulatorConfig",
    "SimulatorState",
    "create_simulator_app",
    "run_simulator_blocking",
    "running_simulator",
    "serve_app",
    "simulator_state",
]
