"""A fake AI provider over real HTTP: latency, published limits, failures, async jobs, signed
webhooks and a charge ledger that shows double billing. See :mod:`floodway.providers.simulator`."""

from floodway.providers.sim.app import create_simulator_app, simulator_state
from floodway.providers.sim.config import SimulatorConfig
from floodway.providers.sim.server import (
    RunningSimulator,
    run_simulator_blocking,
    running_simulator,
    serve_app,
)
from floodway.providers.sim.state import SimulatorState
from floodway.providers.sim.webhooks import sign_webhook

__all__ = [
    "RunningSimulator",
    "SimulatorConfig",
    "SimulatorState",
    "create_simulator_app",
    "run_simulator_blocking",
    "running_simulator",
    "serve_app",
    "sign_webhook",
    "simulator_state",
]
