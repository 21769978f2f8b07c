"""floodway's HTTP API: the app factory, its server helpers and the webhook outbox."""

from floodway.api.app import create_app
from floodway.api.auth import check_bind
from floodway.api.outbox import Outbox, OutboxOptions
from floodway.api.serve import run, serving, uvicorn_config

__all__ = [
    "Outbox",
    "OutboxOptions",
    "check_bind",
    "create_app",
    "run",
    "serving",
    "uvicorn_config",
]
