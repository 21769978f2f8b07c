"""Every problem the server can send for a floodway error is raised by the client as the class
the library raises, with the same fields (one table, floodway.wire.problems, for both sides)."""

from __future__ import annotations

import time

import httpx
import pytest

from floodway.api.problems import from_floodway_error
from floodway.client import ApiError, raise_for_problem
from floodway.core.errors import (
    AdmissionRefused,
    AttemptStillOpen,
    BudgetExceeded,
    FloodwayError,
    IdempotencyConflict,
    IllegalTransition,
    InvalidInput,
    InvalidJob,
    JobNotFound,
    LimiterUnavailable,
    StoreError,
    TaskNotFound,
    UnknownKind,
)
from floodway.wire.problems import HTTP_SLUGS, TABLE, TYPE_PREFIX, ProblemType

NOW = time.time()

#: one error of each class the table names, with the fields a client acts on
SAMPLES: dict[type[FloodwayError], FloodwayError] = {
    TaskNotFound: TaskNotFound("t-1"),
    UnknownKind: UnknownKind("imagee"),
    InvalidInput: InvalidInput("input must be a JSON object"),
    InvalidJob: InvalidJob("tts", "unknown kind 'ttss'"),
    JobNotFound: JobNotFound("j-1"),
    IdempotencyConflict: IdempotencyConflict("click-42", "t-2"),
    AttemptStillOpen: AttemptStillOpen("t-3", "failed", NOW + 30, NOW),
    IllegalTransition: IllegalTransition("succeeded", "queued"),
    BudgetExceeded: BudgetExceeded("acme", 10.0, 0.5, 2.0, NOW + 3600, NOW),
    AdmissionRefused: AdmissionRefused("interactive_depth", "too many waiting", 4.0),
    LimiterUnavailable: LimiterUnavailable("redis timed out"),
    StoreError: StoreError("disk I/O error"),
}

#: the fields that must survive the round trip, per class
FIELDS = {
    TaskNotFound: ("task_id",),
    UnknownKind: ("kind",),
    InvalidJob: ("step", "reason"),
    JobNotFound: ("job_id",),
    IdempotencyConflict: ("key", "task_id"),
    AttemptStillOpen: ("task_id", "frm"),
    IllegalTransition: ("frm", "to"),
    BudgetExceeded: ("tenant", "amount", "left", "needed"),
    AdmissionRefused: ("limit", "retry_after"),
}


def _through_the_wire(exc: FloodwayError) -> httpx.Response:
    answer = from_floodway_error(exc, instance="/v1/tasks")
    request = httpx.Request("POST", "http://floodway.test/v1/tasks")
    headers = {k: v for k, v in answer.headers.items() if k != "content-length"}
    return httpx.Response(answer.status_code, headers=headers, content=answer.body, request=request)


def test_every_row_has_a_sample() -> None:
    assert {row.error for row in TABLE} == set(SAMPLES)


@pytest.mark.parametrize("row", TABLE, ids=lambda row: row.slug)
def test_the_client_raises_the_librarys_class(row: ProblemType) -> None:
    sent = SAMPLES[row.error]
    response = _through_the_wire(sent)
    assert response.status_code == row.status
    assert response.json()["type"] == TYPE_PREFIX + row.slug
    with pytest.raises(FloodwayError) as raised:
        raise_for_problem(response)
    assert type(raised.value) is row.error
    for name in FIELDS.get(row.error, ()):
        assert getattr(raised.value, name) == getattr(sent, name), name
    if row.wait is not None:
        assert int(response.headers["retry-after"]) >= 1


def test_a_wait_survives_the_round_trip() -> None:
    sent = SAMPLES[AttemptStillOpen]
    assert isinstance(sent, AttemptStillOpen)
    with pytest.raises(AttemptStillOpen) as raised:
        raise_for_problem(_through_the_wire(sent))
    assert raised.value.retry_after == pytest.approx(sent.retry_after, abs=1.0)


@pytest.mark.parametrize("status", sorted(set(HTTP_SLUGS) - {429}))
def test_a_plain_http_problem_is_an_api_error(status: int) -> None:
    body = {"type": TYPE_PREFIX + HTTP_SLUGS[status], "title": "x", "status": status}
    request = httpx.Request("GET", "http://floodway.test/v1/nowhere")
    with pytest.raises(ApiError) as raised:
        raise_for_problem(httpx.Response(status, json=body, request=request))
    assert raised.value.status == status
