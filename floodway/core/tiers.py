"""Provider tiers: the same call, sent now at full price ("sync"), at a lower priority and a
lower price ("flex"), or in a provider batch at half price that answers within hours ("batch").

Which tier a task takes is decided when it runs, by one rule (:func:`choose_tier`): its pin if
the submit set one, "sync" for the interactive lane, else the cheapest tier the kind allows
whose expected turnaround still leaves room, before the deadline, to send the call again on
the sync tier. The expected turnaround is what floodway measured of the kind's tier
(:class:`Turnarounds`), the kind's configured estimate until then. No I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

Tier = Literal["sync", "flex", "batch"]
TIER_NAMES: tuple[Tier, ...] = get_args(Tier)
#: cheapest first: the order a task's tier is looked for in
BY_PRICE: tuple[Tier, ...] = ("batch", "flex", "sync")
#: the first estimates of the slow tiers (a sync call's is the kind's timeout)
DEFAULT_TURNAROUND_S: Mapping[Tier, float] = {"flex": 600.0, "batch": 3600.0}
#: how many of a tier's recent turnarounds the estimate is drawn from
RECENT = 20


def as_tier(value: object) -> Tier:
    """``value`` as a tier name; ValueError names the tiers when it is none."""
    for tier in TIER_NAMES:
        if value == tier:
            return tier
    raise ValueError(f"tier must be one of {', '.join(TIER_NAMES)}, not {value!r}")


@dataclass
class Turnarounds:
    """How long a call of one kind takes on each tier, from submit to answer: the longest of
    the recent ones measured (a deadline is met by the slow calls, not the typical), the
    configured estimate before any was."""

    estimates: dict[Tier, float]
    _recent: dict[Tier, deque[float]] = field(default_factory=dict)

    def expected(self, tier: Tier) -> float:
        recent = self._recent.get(tier)
        if recent:
            return max(recent)
        return self.estimates[tier]

    def observe(self, tier: Tier, seconds: float) -> None:
        self._recent.setdefault(tier, deque(maxlen=RECENT)).append(max(0.0, seconds))

    def room_for(self, tier: Tier) -> float:
        """The time a task must have left before its deadline to go on ``tier``: its
        turnaround, then a sync call should it have to be sent again."""
        return self.expected(tier) + self.expected("sync")


def turnarounds(sync_s: float, configured: Mapping[Tier, float]) -> Turnarounds:
    return Turnarounds({"sync": sync_s, **DEFAULT_TURNAROUND_S, **configured})


def choose_tier(
    allowed: Iterable[Tier],
    *,
    pinned: Tier | None,
    interactive: bool,
    remaining_s: float | None,
    times: Turnarounds,
) -> Tier:
    """The tier a call is sent on now (see the module's rule). ``remaining_s``: the time left
    before the task's deadline (None: it has none)."""
    if pinned is not None:
        return pinned
    if interactive:
        return "sync"
    offered = set(allowed)
    for tier in BY_PRICE:
        if tier not in offered:
            continue
        if tier == "sync" or remaining_s is None:
            return tier
        if times.room_for(tier) <= remaining_s:
            return tier
    return "sync"


#: where a task's line of a provider batch is: waiting to be packed, in a batch sent upstream,
#: answered, failed, or taken out before its deadline (to go on a faster tier)
LineState = Literal["queued", "sent", "done", "failed", "withdrawn"]
#: the states of a line whose task has its answer (or went elsewhere): kept only as long as
#: results are
ENDED_LINES: tuple[LineState, ...] = ("done", "failed", "withdrawn")
#: a provider batch's row: packed (the provider not asked yet, or its answer not recorded),
#: sent (its provider id recorded), ended (its lines' results recorded)
CREATING, SENT, BATCH_ENDED = "creating", "sent", "ended"
#: the provider batch states from which no more lines will be answered
ENDED = frozenset({"completed", "failed", "expired", "cancelled"})
#: a provider batch asked to stop, not ended yet
CANCELLING = "cancelling"


@dataclass(frozen=True)
class BatchLine:
    """One task's request in a provider batch, as the ledger keeps it."""

    task_id: str
    kind: str
    model: str
    body: dict[str, object]
    state: LineState
    added_at: float
    deadline_at: float | None = None
    batch_id: str | None = None
    result: object = None
    input_tokens: float = 0.0
    output_tokens: float = 0.0
    error: str | None = None
    error_type: str | None = None
    #: failed in a way that sending it again would repeat (a 4xx): no retry
    fatal: bool = False


@dataclass(frozen=True)
class UpstreamView:
    """A provider batch as the provider describes it, its status in OpenAI's words (an
    adapter whose provider words it otherwise translates: see :data:`ENDED`)."""

    ref: str
    status: str
    #: where its answered lines are read from (OpenAI: the output file; Anthropic: the
    #: results URL) and its failed ones (OpenAI's error file)
    output_file: str | None = None
    error_file: str | None = None
    tag: str | None = None  # the id floodway gave it (its metadata, where it has any)

    @property
    def ended(self) -> bool:
        return self.status in ENDED


@dataclass(frozen=True)
class SoughtBatch:
    """A provider batch whose row was written but whose provider id was not: what is known of
    it to find it at the provider (its tag, its size, when its row was written)."""

    tag: str
    lines: int
    packed_at: float


@dataclass(frozen=True)
class LineResult:
    """One line of a provider batch's output or error file."""

    custom_id: str
    ok: bool
    result: object = None
    input_tokens: float = 0.0
    output_tokens: float = 0.0
    error: str | None = None
    error_type: str | None = None
    fatal: bool = False
