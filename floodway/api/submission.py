"""Turning a submit body into work: the checks that must refuse bad input with a 4xx before the
engine sees it, and the request the engine takes."""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from floodway.api.schemas import SubmitIn
from floodway.api.state import ApiState
from floodway.app import Floodway
from floodway.core.errors import AdmissionRefused, InvalidInput
from floodway.core.task import NewTask, SubmitRequest
from floodway.core.validation import check_input


def new_task(
    fw: Floodway, item: SubmitIn, tenant: str, key: str | None, batch_id: str | None = None
) -> NewTask:
    """What the store inserts for one submitted item; raises UnknownKind / InvalidInput for
    what the engine would otherwise trip over (the input and its cost are checked once, by
    the runtime; here what only the API takes: a callback host, metadata)."""
    if item.callback_url is not None:
        check_callback_host(item.callback_url, fw.settings.api.callback_hosts)
    if item.metadata is not None:
        try:
            check_input(item.metadata)
        except InvalidInput as exc:
            raise InvalidInput(f"metadata: {exc}") from None
    return fw.runtime.new_task(request_of(item, key), tenant=tenant, batch_id=batch_id)


def check_callback_host(url: str, allowed: Sequence[str]) -> None:
    """``api.callback_hosts``: the outbox POSTs from inside the deployment's network, so only
    hosts the operator named may receive it (no list: any host)."""
    if not allowed:
        return
    host = (urlsplit(url).hostname or "").lower()
    if not any(fnmatchcase(host, pattern.lower()) for pattern in allowed):
        raise InvalidInput(
            f"callback_url: host {host!r} is not allowed here (api.callback_hosts: "
            f"{', '.join(allowed)})"
        )


async def admit_submit(state: ApiState, tenant: str) -> None:
    """The tenant's submit rate: one token per submit request (a batch is one request).
    The bucket lives in the limiter backend, so with Redis every API process shares it."""
    if state.submit_rate is None:
        return
    wait = await state.submit_rate.check(tenant)
    if wait is not None:
        raise AdmissionRefused(
            "submit_rate",
            f"too fast: tenant {tenant!r} is over its submit rate "
            f"({state.settings.tenants.submit_rate}); try again in {wait:.1f}s",
            retry_after=wait,
        )


def request_of(item: SubmitIn, key: str | None) -> SubmitRequest:
    """The library's request for one submitted item."""
    return SubmitRequest(
        item.kind,
        item.input,
        lane=item.lane,
        key=key,
        max_attempts=item.max_attempts,
        deadline_s=item.deadline_s,
        metadata=item.metadata,
        callback_url=item.callback_url,
    )
