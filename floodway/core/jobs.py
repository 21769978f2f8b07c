"""Multi-step jobs as values: a job's definition, its validation, and what to do next.

A job is named steps, each a floodway task of some kind. A step runs once every step of its
``after`` has ended well; its input may take values from earlier steps' results through
templates (a JSON string that is exactly ``"${steps.NAME.result.PATH}"``,
``"${steps.NAME.results}"``, ``"${item}"`` or ``"${index}"``); ``for_each`` fans it out over
a list, one task per item, and a later step reads the fanned-out step's results as one list,
in order. No I/O here: the ledger's rule (``store/rules.py``: ``advance_job``) reads a job's
state, asks :func:`next_moves`, and writes what it says in the transaction that ended the
step.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

from floodway.core.errors import InvalidJob
from floodway.core.states import TERMINAL, Status
from floodway.core.task import JSON, ErrorInfo, Lane

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_REF = re.compile(r"^\$\{steps\.([A-Za-z0-9_-]{1,64})\.(results|result((?:\.[^.{}]+)*))\}$")
#: a job id's (a task's is "t_")
JOB_PREFIX = "j_"
#: the id of a job's step's task: a write that ended only other tasks has no job to advance
STEP_PREFIX = "s_"
ITEM = "${item}"
INDEX = "${index}"
_STEP_KEYS = frozenset({"name", "kind", "input", "after", "for_each", "optional"})


class JobStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Ref:
    """``${steps.STEP.result.PATH}`` (``path`` its keys; ``whole`` for ``results``)."""

    step: str
    path: tuple[str, ...] = ()
    whole: bool = False

    def text(self) -> str:
        if self.whole:
            return f"${{steps.{self.step}.results}}"
        return "${steps." + ".".join((self.step, "result", *self.path)) + "}"


def parse_ref(value: str) -> Ref | None:
    m = _REF.match(value)
    if m is None:
        return None
    if m.group(2) == "results":
        return Ref(m.group(1), whole=True)
    path = tuple(p for p in (m.group(3) or "").split(".") if p)
    return Ref(m.group(1), path)


def _looks_like_template(value: str) -> bool:
    return value.startswith("${") and value.endswith("}")


@dataclass(frozen=True)
class StepSpec:
    name: str
    kind: str
    input: JSON
    after: tuple[str, ...] = ()
    #: a list, or one reference to a list an earlier step produced; None: one task
    for_each: JSON = None
    optional: bool = False

    @property
    def fans_out(self) -> bool:
        return self.for_each is not None

    def to_json(self) -> dict[str, JSON]:
        return {
            "name": self.name,
            "kind": self.kind,
            "input": self.input,
            "after": list(self.after),
            "for_each": self.for_each,
            "optional": self.optional,
        }


@dataclass(frozen=True)
class JobSpec:
    """A checked definition; ``steps`` in an order where each comes after what it needs."""

    steps: tuple[StepSpec, ...]

    def step(self, name: str) -> StepSpec:
        return self._by_name[name]

    @cached_property
    def _by_name(self) -> dict[str, StepSpec]:
        return {s.name: s for s in self.steps}

    def dependants(self, name: str) -> list[str]:
        return [s.name for s in self.steps if name in s.after]

    def chain_length(self, name: str) -> int:
        """Steps on the longest chain from ``name`` to the job's end, ``name`` included."""
        lengths: dict[str, int] = {}
        for s in reversed(self.steps):
            lengths[s.name] = 1 + max((lengths[d] for d in self.dependants(s.name)), default=0)
        return lengths[name]

    def sinks(self) -> list[str]:
        """The steps nothing depends on: the job's result is theirs."""
        return [s.name for s in self.steps if not self.dependants(s.name)]

    def to_json(self) -> list[dict[str, JSON]]:
        return [s.to_json() for s in self.steps]

    @classmethod
    def from_json(cls, data: Sequence[Mapping[str, Any]]) -> JobSpec:
        """A definition written by :meth:`to_json` (checked when it was submitted)."""
        return cls(
            tuple(
                StepSpec(
                    d["name"],
                    d["kind"],
                    d["input"],
                    tuple(d["after"]),
                    d["for_each"],
                    bool(d["optional"]),
                )
                for d in data
            )
        )


# -- validation --------------------------------------------------------------------------------


def parse_job(steps: object, kinds: Container[str], max_steps: int, max_items: int) -> JobSpec:
    """The checked definition of ``steps`` (a list of step objects), or InvalidJob naming the
    step at fault: an unknown kind, a name given twice, an ``after`` or a reference to a step
    that does not exist or does not come before, a cycle, a template outside the step that
    may use it, a ``for_each`` over something that is not a list, too many steps."""
    if not isinstance(steps, list) or not steps:
        raise InvalidJob(None, "steps must be a non-empty list of step objects")
    if len(steps) > max_steps:
        raise InvalidJob(None, f"a job has at most {max_steps} steps, not {len(steps)}")
    parsed: list[StepSpec] = []
    names: set[str] = set()
    for i, raw in enumerate(steps):
        step = _parse_step(i, raw, kinds, max_items)
        if step.name in names:
            raise InvalidJob(step.name, "another step has this name")
        names.add(step.name)
        parsed.append(step)
    for step in parsed:
        for before in step.after:
            if before not in names:
                raise InvalidJob(step.name, f"after names {before!r}, which is not a step")
            if before == step.name:
                raise InvalidJob(step.name, "a step cannot come after itself")
    ordered = _in_order(parsed)
    ancestors = _ancestors(ordered)
    for step in ordered:
        _check_refs(step, ancestors[step.name], {s.name: s for s in ordered})
    return JobSpec(tuple(ordered))


def _parse_step(i: int, raw: object, kinds: Container[str], max_items: int) -> StepSpec:
    if not isinstance(raw, dict):
        raise InvalidJob(None, f"steps[{i}] must be an object")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidJob(
            None, f"steps[{i}]: name must be 1-64 letters, digits, '_' or '-', not {name!r}"
        )
    unknown = sorted(set(raw) - _STEP_KEYS)
    if unknown:
        raise InvalidJob(name, f"unknown fields {unknown} (known: {sorted(_STEP_KEYS)})")
    kind = raw.get("kind")
    if not isinstance(kind, str) or kind not in kinds:
        raise InvalidJob(name, f"unknown kind {kind!r}")
    after = raw.get("after", [])
    if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
        raise InvalidJob(name, "after must be a list of step names")
    optional = raw.get("optional", False)
    if not isinstance(optional, bool):
        raise InvalidJob(name, "optional must be true or false")
    for_each = raw.get("for_each")
    if for_each is not None:
        if isinstance(for_each, str):
            ref = parse_ref(for_each)
            if ref is None:
                raise InvalidJob(name, "for_each must be a list or one ${steps...} reference")
        elif not isinstance(for_each, list):
            raise InvalidJob(name, f"for_each is over a {type(for_each).__name__}, not a list")
        elif len(for_each) > max_items:
            raise InvalidJob(name, f"for_each has {len(for_each)} items (at most {max_items})")
    if "input" not in raw:
        raise InvalidJob(name, "input is missing")
    return StepSpec(name, kind, raw["input"], tuple(dict.fromkeys(after)), for_each, optional)


def _in_order(steps: list[StepSpec]) -> list[StepSpec]:
    """Kahn's order, stable in the given order; a cycle names a step on it."""
    done: set[str] = set()
    ordered: list[StepSpec] = []
    left = list(steps)
    while left:
        ready = [s for s in left if all(a in done for a in s.after)]
        if not ready:
            raise InvalidJob(_on_cycle(left), "its after makes a cycle")
        for s in ready:
            done.add(s.name)
            ordered.append(s)
        left = [s for s in left if s.name not in done]
    return ordered


def _on_cycle(left: list[StepSpec]) -> str:
    """A step on a cycle among ``left`` (each has an ``after`` in ``left``): walk back until
    a step repeats."""
    by_name = {s.name: s for s in left}
    seen: list[str] = []
    name = left[0].name
    while name not in seen:
        seen.append(name)
        name = next(a for a in by_name[name].after if a in by_name)
    return name


def _ancestors(ordered: list[StepSpec]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for s in ordered:
        found[s.name] = set(s.after).union(*(found[a] for a in s.after))
    return found


def templates(value: JSON) -> list[str]:
    """Every string of ``value`` that is a template (or looks like one)."""
    if isinstance(value, str):
        return [value] if _looks_like_template(value) else []
    if isinstance(value, list):
        return [t for v in value for t in templates(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in templates(v)]
    return []


def _check_refs(step: StepSpec, before: set[str], steps: Mapping[str, StepSpec]) -> None:
    found = templates(step.input)
    if isinstance(step.for_each, str):
        found.append(step.for_each)
    for text in found:
        if text in (ITEM, INDEX):
            if not step.fans_out:
                raise InvalidJob(step.name, f"{text} is only for a step with for_each")
            continue
        ref = parse_ref(text)
        if ref is None:
            raise InvalidJob(
                step.name,
                f"{text!r} is not a template floodway knows (${{steps.NAME.result.PATH}}, "
                "${steps.NAME.results}, ${item}, ${index})",
            )
        if ref.step not in steps:
            raise InvalidJob(step.name, f"{text} names {ref.step!r}, which is not a step")
        if ref.step not in before:
            raise InvalidJob(
                step.name, f"{text} reads {ref.step!r}, which does not come before it (after)"
            )
        if ref.whole != steps[ref.step].fans_out:
            use = "results" if steps[ref.step].fans_out else "result"
            raise InvalidJob(step.name, f"{text}: read step {ref.step!r} as .{use}")


# -- a job's state and what comes next ----------------------------------------------------------


@dataclass(frozen=True)
class Instance:
    """One task of a step (a fanned-out step has one per item, ``index`` its item's)."""

    index: int
    task_id: str
    status: Status
    result: JSON = None
    error: ErrorInfo | None = None

    @property
    def ok(self) -> bool:
        return self.status in (Status.SUCCEEDED, Status.DEDUPED)


@dataclass(frozen=True)
class JobState:
    """What the ledger holds of a job: how many tasks each started step has, and its tasks."""

    sizes: Mapping[str, int] = field(default_factory=dict)
    tasks: Mapping[str, Sequence[Instance]] = field(default_factory=dict)

    def instances(self, step: str) -> list[Instance]:
        return sorted(self.tasks.get(step, ()), key=lambda t: t.index)


class StepStatus(StrEnum):
    WAITING = "waiting"  # not started: what it comes after has not ended
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a task failed (an optional step's dependants get null)
    DEAD = "dead"  # a task is a dead letter: the job stops


def step_status(spec: StepSpec, state: JobState) -> StepStatus:
    size = state.sizes.get(spec.name)
    if size is None:
        return StepStatus.WAITING
    tasks = state.instances(spec.name)
    if any(t.status is Status.DEAD for t in tasks):
        return StepStatus.DEAD
    ended = [t for t in tasks if t.status in TERMINAL]
    if any(not t.ok for t in ended):
        return StepStatus.FAILED
    if len(ended) == size:
        return StepStatus.SUCCEEDED
    return StepStatus.RUNNING


def _settled(spec: StepSpec, status: StepStatus, state: JobState) -> bool:
    """Ended so that what comes after may start: every task ended, and well unless the step
    is optional (a dead task is never allowed)."""
    if status is StepStatus.SUCCEEDED:
        return True
    if status is not StepStatus.FAILED or not spec.optional:
        return False
    ended = [t for t in state.instances(spec.name) if t.status in TERMINAL]
    return len(ended) == state.sizes[spec.name]


def value_of(spec: StepSpec, state: JobState) -> JSON:
    """What later steps read of a settled step: its result (a fanned-out step's list of
    results, in order), null for a task that failed."""
    values = [t.result if t.ok else None for t in state.instances(spec.name)]
    if spec.fans_out:
        return values
    return values[0] if values else None


@dataclass(frozen=True)
class Start:
    """One task to write: step ``step``'s ``index``-th (0 when it does not fan out)."""

    step: str
    index: int
    input: JSON
    #: its share of the job's deadline (None: the job has none; the kind's applies)
    deadline_s: float | None


@dataclass(frozen=True)
class End:
    status: JobStatus
    result: JSON = None
    #: why it failed: the step, its task, and the task's error (or what went wrong planning)
    error: dict[str, JSON] | None = None


@dataclass(frozen=True)
class Moves:
    #: steps starting now, with how many tasks each has (a fan-out over [] has none)
    expand: tuple[tuple[str, int], ...] = ()
    start: tuple[Start, ...] = ()
    end: End | None = None


def next_moves(
    job: JobSpec,
    state: JobState,
    now: float,
    deadline_at: float | None,
    max_items: int,
) -> Moves:
    """What a running job does now: start the steps whose ``after`` all settled (their
    inputs resolved), or end (succeeded when every step settled; failed at the first step
    that failed and may not, or whose input cannot be made)."""
    statuses = {s.name: step_status(s, state) for s in job.steps}
    for s in job.steps:
        bad = statuses[s.name]
        if bad is StepStatus.DEAD or (bad is StepStatus.FAILED and not s.optional):
            return Moves(end=End(JobStatus.FAILED, error=_failure(s, state, bad)))
    settled = {s.name for s in job.steps if _settled(s, statuses[s.name], state)}
    if len(settled) == len(job.steps):
        result = {name: value_of(job.step(name), state) for name in job.sinks()}
        return Moves(end=End(JobStatus.SUCCEEDED, result=result))
    values = {name: value_of(job.step(name), state) for name in settled}
    expand: list[tuple[str, int]] = []
    start: list[Start] = []
    for s in job.steps:
        if statuses[s.name] is not StepStatus.WAITING or not all(a in settled for a in s.after):
            continue
        deadline_s = None
        if deadline_at is not None:
            left = deadline_at - now
            if left <= 0:
                return Moves(end=planning_failed(s.name, "the job's deadline passed"))
            deadline_s = left / job.chain_length(s.name)
        try:
            inputs = _inputs(s, values, max_items)
        except InvalidJob as exc:
            return Moves(end=planning_failed(s.name, exc.reason))
        expand.append((s.name, len(inputs)))
        start.extend(Start(s.name, i, v, deadline_s) for i, v in enumerate(inputs))
    return Moves(tuple(expand), tuple(start))


def _failure(spec: StepSpec, state: JobState, status: StepStatus) -> dict[str, JSON]:
    bad = next(t for t in state.instances(spec.name) if t.status in TERMINAL and not t.ok)
    if status is StepStatus.DEAD:
        bad = next(t for t in state.instances(spec.name) if t.status is Status.DEAD)
    return {
        "step": spec.name,
        "task_id": bad.task_id,
        "status": bad.status.value,
        "message": f"step {spec.name!r}: task {bad.task_id} {bad.status.value}"
        + (f": {bad.error.message}" if bad.error else ""),
        "error": None if bad.error is None else bad.error.to_json(),
    }


def planning_failed(step: str, why: str) -> End:
    """The end of a job whose step ``step`` cannot start (``why``)."""
    error = {"step": step, "message": f"step {step!r}: {why}", "reason": why}
    return End(JobStatus.FAILED, error=error)


def _inputs(spec: StepSpec, values: Mapping[str, JSON], max_items: int) -> list[JSON]:
    if not spec.fans_out:
        return [fill(spec.input, lambda ref: read(ref, values, spec.name))]
    items = spec.for_each
    if isinstance(items, str):
        items = read(_must(parse_ref(items)), values, spec.name)
    if not isinstance(items, list):
        raise InvalidJob(
            spec.name, f"for_each {spec.for_each} is a {type(items).__name__}, not a list"
        )
    if len(items) > max_items:
        raise InvalidJob(spec.name, f"for_each has {len(items)} items (at most {max_items})")
    return [
        fill(spec.input, lambda ref: read(ref, values, spec.name), item, i)
        for i, item in enumerate(items)
    ]


def _must(ref: Ref | None) -> Ref:
    assert ref is not None  # checked at submit
    return ref


def read(ref: Ref, values: Mapping[str, JSON], reader: str) -> JSON:
    """The value ``ref`` names (null under a step that failed and was allowed to)."""
    value = values[ref.step]
    for key in ref.path:
        if value is None:
            return None
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            raise InvalidJob(reader, f"{ref.text()}: the result of {ref.step!r} has no {key!r}")
    return value


def fill(
    value: JSON, lookup: Callable[[Ref], JSON], item: JSON = None, index: int | None = None
) -> JSON:
    """``value`` with each template replaced by what it names."""
    if isinstance(value, str) and _looks_like_template(value):
        if value == ITEM:
            return item
        if value == INDEX:
            return index
        ref = parse_ref(value)
        return value if ref is None else lookup(ref)
    if isinstance(value, list):
        return [fill(v, lookup, item, index) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, lookup, item, index) for k, v in value.items()}
    return value


def work_key(job_id: str, step: str, index: int) -> str:
    """A step's work key (its tasks' fingerprint, sent upstream as Idempotency-Key): the same
    for the same step of the same job, whatever runs it again."""
    digest = hashlib.sha256(f"{job_id}\x00{step}\x00{index}".encode()).hexdigest()
    return f"job:{digest[:48]}"


@dataclass(frozen=True)
class Progress:
    steps: int
    steps_done: int
    tasks: int
    tasks_done: int

    def to_json(self) -> dict[str, int]:
        return {
            "steps": self.steps,
            "steps_done": self.steps_done,
            "tasks": self.tasks,
            "tasks_done": self.tasks_done,
        }


def progress(job: JobSpec, state: JobState) -> Progress:
    statuses = [step_status(s, state) for s in job.steps]
    tasks = [t for ts in state.tasks.values() for t in ts]
    return Progress(
        len(job.steps),
        sum(s in (StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.DEAD) for s in statuses),
        len(tasks),
        sum(t.status in TERMINAL for t in tasks),
    )


@dataclass(frozen=True)
class JobRequest:
    """What a caller asks for: the steps as sent (checked by :func:`parse_job`) and how to
    run the job."""

    steps: JSON
    lane: Lane | str = Lane.BACKGROUND
    #: the whole job's time limit, split across its remaining steps (None: each kind's)
    deadline_s: float | None = None
    metadata: dict[str, JSON] | None = None
    #: POSTed once the job ends (through the outbox)
    callback_url: str | None = None


@dataclass(frozen=True)
class Job:
    """A job as the ledger holds it; its steps' tasks are in :class:`JobState`."""

    id: str
    tenant: str
    status: JobStatus
    lane: Lane
    spec: JobSpec
    created_at: float
    updated_at: float
    #: the job's whole time limit (None: each step's kind's), and when it ends
    deadline_s: float | None = None
    deadline_at: float | None = None
    finished_at: float | None = None
    metadata: dict[str, JSON] = field(default_factory=dict)
    callback_url: str | None = None
    callback_state: str | None = None
    callback_attempts: int = 0
    #: the results of the steps nothing depends on, by step
    result: JSON = None
    error: dict[str, JSON] | None = None
    seq: int = 0

    @property
    def ended(self) -> bool:
        return self.status is not JobStatus.RUNNING
