"""floodway: a durable scheduler for calls to slow, rate-limited, billed AI providers."""

from floodway.app import Floodway
from floodway.client import Client
from floodway.config import Settings, load_settings
from floodway.context import Context
from floodway.core.errors import (
    AdmissionRefused,
    AttemptStillOpen,
    BudgetExceeded,
    ConfigError,
    FatalError,
    FloodwayError,
    HandlerError,
    IdempotencyConflict,
    IllegalTransition,
    InvalidInput,
    InvalidOutput,
    LimiterUnavailable,
    RetryableError,
    StoreError,
    TaskNotFound,
    Unavailable,
    UnknownKind,
    WaitTimeout,
)
from floodway.core.outcome import Parked
from floodway.core.states import Status
from floodway.core.task import ErrorClass, ErrorInfo, Lane, SubmitRequest, Submitted, Task
from floodway.store.base import SpendQuery, TaskQuery
from floodway.sync import SyncFloodway
from floodway.version import __version__

__all__ = [
    "AdmissionRefused",
    "AttemptStillOpen",
    "BudgetExceeded",
    "Client",
    "ConfigError",
    "Context",
    "ErrorClass",
    "ErrorInfo",
    "FatalError",
    "Floodway",
    "FloodwayError",
    "HandlerError",
    "IdempotencyConflict",
    "IllegalTransition",
    "InvalidInput",
    "InvalidOutput",
    "Lane",
    "LimiterUnavailable",
    "Parked",
    "RetryableError",
    "Settings",
    "SpendQuery",
    "Status",
    "StoreError",
    "SubmitRequest",
    "Submitted",
    "SyncFloodway",
    "Task",
    "TaskNotFound",
    "TaskQuery",
    "Unavailable",
    "UnknownKind",
    "WaitTimeout",
    "__version__",
    "load_settings",
]
