"""``floodway simulate --openai``: an OpenAI-compatible provider with the simulator's limits,
faults and charge ledger, to try the OpenAI-compatible front without an OpenAI account.

One module per endpoint family (``chat``, ``embeddings``, ``images``, ``responses``,
``models``), each contributing its routes to :func:`create_openai_simulator_app`; they share
:class:`~floodway.providers.sim.openai.calls.OpenAISimulator` (the simulator's state: limits,
faults, ledger, counters) and its one path for a billed call. ``GET /ledger``, ``GET /stats``
and ``POST /reset`` are the simulator's own.

A call's fate can be forced with ``metadata = {"fail": "429" | "5xx" | "refusal" | "timeout"
| "malformed" | "cut"}`` (chat and responses; ``cut`` ends a stream halfway, without its end).
"""

from floodway.providers.sim.openai.app import create_openai_simulator_app

__all__ = ["create_openai_simulator_app"]
