"""The one kind every quota benchmark uses: the ``http`` adapter pointed at the simulator,
declared in configuration as a user would, consuming one provider resource."""

from __future__ import annotations

from floodway.config import KindConfig, ResourceConfig, Settings

KIND = "gen"
RESOURCE = "provider"


def provider_settings(
    sim_url: str,
    database: str,
    resource: ResourceConfig,
    *,
    cost: str | None = None,
    timeout_s: float = 30.0,
    keys: bool = True,
) -> Settings:
    """Settings with one resource and one http kind calling ``sim_url``.

    ``lookup_url`` lets crash recovery take the result of work the provider already finished
    (and billed) instead of resubmitting it; the simulator honours Idempotency-Key, so the kind
    says so (``idempotent``) and work a dead worker left running is resubmitted at once (the
    provider joins it to the running job); ``cost="tokens"`` reads the input's ``tokens``.
    ``keys=False``: a provider that ignores Idempotency-Key and has no look-up (the simulator
    with ``honor_idempotency_key = false``), declared so.
    """
    kind = KindConfig(
        adapter="http",
        resource=RESOURCE,
        url=f"{sim_url}/generate",
        lookup_url=f"{sim_url}/jobs?idempotency_key={{key}}" if keys else None,
        cost=cost,
        timeout=timeout_s,
        max_attempts=4,
        options={"idempotent": keys},
    )
    return Settings(database=database, resources={RESOURCE: resource}, kinds={KIND: kind})
