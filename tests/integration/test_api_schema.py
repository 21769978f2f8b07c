"""The API against its own OpenAPI document (schemathesis): no 5xx for any generated request,
and every response conforms to the documented status codes, media types, headers and schemas.

Runs in-process through schemathesis's ASGI transport (its lifespan opens the ledger),
bounded to ~30 examples per operation.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from schemathesis.python.asgi import shutdown_lifespans
from schemathesis.schemas import BaseSchema

from floodway import Floodway
from floodway.api import create_app
from floodway.config import ApiConfig, Settings
from floodway.testing import SimulatedProvider

KEY = "schema-test-key"
# A body over [api] max_body_bytes is refused with 413 whatever its schema says (a size limit
# in bytes is not something JSON Schema can state): an expected answer to valid and invalid
# data alike. A job's steps form a graph (unique names, references to steps before, no cycle)
# that JSON Schema cannot state: a schema-valid job may be refused with 422 naming its step.
# A task's tier is one its kind offers (`tiers` in the kind's config), which one schema for every
# kind cannot state: a schema-valid tier may be refused with 422 naming the kind's tiers.
# A page cursor is sealed (floodway/wire/cursors.py): a string of any shape is one only if
# this server gave it to this tenant, so a schema-valid ?after= may be refused with 400.
# The rest are schemathesis's defaults.
CONFIG = SchemathesisConfig.from_str(
    """
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "413", "429", "5xx"]
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422",
                     "428", "429", "5xx"]
[[operations]]
include-name = ["POST /v1/jobs", "POST /v1/tasks", "POST /v1/batches"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "409", "413", "422",
                                                     "429", "5xx"]
[[operations]]
include-name = ["GET /v1/tasks", "GET /v1/jobs"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "409", "413",
                                                     "429", "5xx"]
"""
)


@pytest.fixture
def api_schema(tmp_path: Path) -> Iterator[BaseSchema]:
    fw = Floodway(
        settings=Settings(
            database=f"sqlite:///{tmp_path / 'schema.db'}", api=ApiConfig(keys={KEY: "tenant"})
        )
    )
    fw.kind("sim")(SimulatedProvider(latency_s=0.01).handler)
    # No workers here: they would draw full-jitter delays from the global `random` while
    # Hypothesis generates cases in another thread, which Hypothesis rightly reports. The
    # endpoints' behaviour with workers running is covered by the other test_api_* files.
    app = create_app(fw, run_workers=False, sse_recheck_s=0.2)
    # Fetching the document starts the app's lifespan, so it lists the declared kinds.
    yield schemathesis.openapi.from_asgi("/openapi.json", app, config=CONFIG)
    shutdown_lifespans()  # stops the app schemathesis started: workers, then the ledger


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=int(os.environ.get("FLOODWAY_SCHEMA_EXAMPLES", "30")),  # more when exploring
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_api_conforms_to_its_openapi(case: schemathesis.Case[Any]) -> None:
    case.call_and_validate(headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
