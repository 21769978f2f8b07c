"""``floodway simulate --anthropic``: Anthropic's Messages and Message Batches APIs with the
simulator's limits, faults and charge ledger, to run an ``anthropic`` kind without an
Anthropic account.

``POST /v1/messages`` echoes the last user message as a Message (usage counted four characters
a token); ``/v1/messages/batches`` creates, retrieves, lists and cancels batches and serves
their results. Like Anthropic it takes no idempotency key: every call is new work, billed in
the ledger (``GET /ledger``: ``sync`` and ``batch``). A request without ``x-api-key`` or
``anthropic-version`` is refused as Anthropic refuses it. ``GET /stats`` and ``POST /reset``
are the simulator's own.
"""

from floodway.providers.sim.anthropic.app import create_anthropic_simulator_app

__all__ = ["create_anthropic_simulator_app"]
