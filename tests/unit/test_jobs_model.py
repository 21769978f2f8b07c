"""The job model (floodway/core/jobs.py): validation names the step at fault, templates
resolve as declared, and what comes next follows the failure policy."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from floodway.core.jobs import (
    Instance,
    InvalidJob,
    JobSpec,
    JobState,
    JobStatus,
    StepStatus,
    fill,
    next_moves,
    parse_job,
    parse_ref,
    progress,
    step_status,
    work_key,
)
from floodway.core.states import Status
from floodway.core.task import ErrorClass, ErrorInfo

KINDS = {"understand", "script", "tts", "subtitles", "export"}


def parse(steps: Any, max_steps: int = 10, max_items: int = 100) -> JobSpec:
    return parse_job(steps, KINDS, max_steps, max_items)


def step(name: str, kind: str = "script", **more: Any) -> dict[str, Any]:
    return {"name": name, "kind": kind, "input": more.pop("input", {}), **more}


EDITOR = [
    step("understand", "understand", input={"video": "v.mp4"}),
    step(
        "script",
        input={"scenes": "${steps.understand.result.scenes}"},
        after=["understand"],
    ),
    step(
        "tts",
        "tts",
        input={"text": "${item}", "n": "${index}"},
        after=["script"],
        for_each="${steps.script.result.paragraphs}",
    ),
    step("subtitles", "subtitles", input={"audio": "${steps.tts.results}"}, after=["tts"]),
    step("export", "export", input={"subs": "${steps.subtitles.result}"}, after=["subtitles"]),
]

#: (definition, the step the 422 must name, a word its message must hold)
INVALID: list[tuple[Any, str | None, str]] = [
    ([step("a", "paint")], "a", "unknown kind"),
    ([step("a", after=["b"]), step("b", after=["a"])], "a", "cycle"),
    ([step("a", after=["a"])], "a", "itself"),
    ([step("a", after=["ghost"])], "a", "not a step"),
    ([step("a", input={"x": "${steps.ghost.result}"})], "a", "not a step"),
    ([step("a"), step("b", input={"x": "${steps.a.result}"})], "b", "does not come before"),
    ([step("a", for_each={"not": "a list"}, input={})], "a", "not a list"),
    ([step("a", for_each=7, input={})], "a", "not a list"),
    ([step("a", input={"x": "${item}"})], "a", "only for a step with for_each"),
    ([step("a"), step("a")], "a", "another step"),
    ([step(f"s{i}") for i in range(11)], None, "at most 10 steps"),
    ([step("a"), step("b", input={"x": "${steps.a.reslt}"}, after=["a"])], "b", "template"),
    (
        [step("a", for_each=[1, 2]), step("b", input={"x": "${steps.a.result}"}, after=["a"])],
        "b",
        ".results",
    ),
    ([step("a", for_each=list(range(101)))], "a", "at most 100"),
    ([{"name": "a", "kind": "script"}], "a", "input is missing"),
    ([step("a", optional="yes")], "a", "true or false"),
    ([], None, "non-empty"),
]


@pytest.mark.parametrize(("steps", "named", "word"), INVALID)
def test_an_invalid_definition_is_refused_naming_its_step(
    steps: Any, named: str | None, word: str
) -> None:
    with pytest.raises(InvalidJob) as caught:
        parse(steps)
    assert caught.value.step == named
    assert word in str(caught.value)
    if named is not None:
        assert f"step {named!r}" in str(caught.value)


def test_the_editors_chain_is_valid_and_ordered() -> None:
    job = parse(list(reversed(EDITOR)))
    assert [s.name for s in job.steps] == ["understand", "script", "tts", "subtitles", "export"]
    assert job.chain_length("understand") == 5
    assert job.chain_length("export") == 1
    assert job.sinks() == ["export"]
    assert JobSpec.from_json(job.to_json()) == job


def _ok(index: int, result: Any, task: str = "t") -> Instance:
    return Instance(index, f"{task}{index}", Status.SUCCEEDED, result)


def test_results_flow_through_a_fan_out_and_its_fan_in() -> None:
    job = parse(EDITOR)
    first = next_moves(job, JobState(), 0.0, None, 100)
    assert first.expand == (("understand", 1),)
    assert [s.input for s in first.start] == [{"video": "v.mp4"}]
    state = JobState(
        {"understand": 1, "script": 1},
        {
            "understand": [_ok(0, {"scenes": [1, 2]})],
            "script": [_ok(0, {"paragraphs": ["p0", "p1", "p2"]})],
        },
    )
    moves = next_moves(job, state, 0.0, None, 100)
    assert moves.expand == (("tts", 3),)
    assert [s.input for s in moves.start] == [
        {"text": "p0", "n": 0},
        {"text": "p1", "n": 1},
        {"text": "p2", "n": 2},
    ]
    state = JobState(
        {**state.sizes, "tts": 3},
        {**state.tasks, "tts": [_ok(2, "a2"), _ok(0, "a0"), _ok(1, "a1")]},
    )
    (subtitles,) = next_moves(job, state, 0.0, None, 100).start
    assert subtitles.input == {"audio": ["a0", "a1", "a2"]}


def test_a_fan_out_over_nothing_settles_at_once() -> None:
    job = parse([step("a", for_each=[]), step("b", input={"r": "${steps.a.results}"}, after=["a"])])
    assert next_moves(job, JobState(), 0.0, None, 10).expand == (("a", 0),)
    (b,) = next_moves(job, JobState({"a": 0}, {}), 0.0, None, 10).start
    assert b.input == {"r": []}


def test_a_fan_out_over_what_turns_out_not_a_list_fails_the_job_naming_the_step() -> None:
    job = parse([step("a"), step("b", for_each="${steps.a.result.x}", after=["a"])])
    end = next_moves(job, JobState({"a": 1}, {"a": [_ok(0, {"x": 3})]}), 0.0, None, 10).end
    assert end is not None and end.status is JobStatus.FAILED
    assert end.error is not None and end.error["step"] == "b"
    assert "not a list" in str(end.error["message"])


def _failed(index: int, status: Status = Status.FAILED) -> Instance:
    return Instance(index, f"f{index}", status, None, ErrorInfo(ErrorClass.FATAL, "x", "boom"))


def test_a_failed_step_fails_the_job_unless_optional_whose_dependants_get_null() -> None:
    must = parse([step("a"), step("b", input={"x": "${steps.a.result.k}"}, after=["a"])])
    end = next_moves(must, JobState({"a": 1}, {"a": [_failed(0)]}), 0.0, None, 10).end
    assert end is not None and end.status is JobStatus.FAILED
    assert end.error is not None and end.error["task_id"] == "f0" and "boom" in str(end.error)
    may = parse(
        [step("a", optional=True), step("b", input={"x": "${steps.a.result.k}"}, after=["a"])]
    )
    (b,) = next_moves(may, JobState({"a": 1}, {"a": [_failed(0)]}), 0.0, None, 10).start
    assert b.input == {"x": None}


def test_a_dead_step_stops_the_job_even_when_optional() -> None:
    job = parse([step("a", optional=True), step("b", after=["a"])])
    state = JobState({"a": 1}, {"a": [_failed(0, Status.DEAD)]})
    assert step_status(job.step("a"), state) is StepStatus.DEAD
    end = next_moves(job, state, 0.0, None, 10).end
    assert end is not None and end.error is not None and end.error["status"] == "dead"


def test_the_job_deadline_is_split_over_the_longest_remaining_chain() -> None:
    job = parse(EDITOR)
    (first,) = next_moves(job, JobState(), 100.0, 600.0, 100).start
    assert first.deadline_s == pytest.approx(500.0 / 5)
    late = next_moves(job, JobState(), 700.0, 600.0, 100).end
    assert late is not None and late.status is JobStatus.FAILED


def test_the_job_succeeds_with_its_last_steps_results() -> None:
    job = parse([step("a"), step("b", after=["a"])])
    state = JobState({"a": 1, "b": 1}, {"a": [_ok(0, 1)], "b": [_ok(0, {"done": True})]})
    end = next_moves(job, state, 0.0, None, 10).end
    assert end is not None and end.status is JobStatus.SUCCEEDED
    assert end.result == {"b": {"done": True}}
    assert progress(job, state).to_json() == {
        "steps": 2,
        "steps_done": 2,
        "tasks": 2,
        "tasks_done": 2,
    }


def test_a_reference_to_a_missing_key_fails_naming_the_step() -> None:
    job = parse([step("a"), step("b", input={"x": "${steps.a.result.k.0}"}, after=["a"])])
    ok = next_moves(job, JobState({"a": 1}, {"a": [_ok(0, {"k": [5]})]}), 0.0, None, 10)
    assert ok.start[0].input == {"x": 5}
    bad = next_moves(job, JobState({"a": 1}, {"a": [_ok(0, {"j": 1})]}), 0.0, None, 10).end
    assert bad is not None and bad.error is not None and bad.error["step"] == "b"


def test_work_keys_differ_by_job_step_and_index_and_repeat_for_the_same() -> None:
    keys = {work_key(j, s, i) for j in ("j1", "j2") for s in ("a", "b") for i in (0, 1)}
    assert len(keys) == 8
    assert work_key("j1", "a", 0) == work_key("j1", "a", 0)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=10,
)


@given(json_values)
def test_a_value_without_templates_is_left_as_it_is(value: Any) -> None:
    assert fill(value, lambda ref: pytest.fail("no reference here")) == value


@given(st.from_regex(r"[a-z]{1,5}", fullmatch=True), st.lists(st.from_regex(r"[a-z]{1,4}",
       fullmatch=True), max_size=3))  # fmt: skip
def test_a_reference_reads_back_as_it_was_written(name: str, path: list[str]) -> None:
    ref = parse_ref("${steps." + ".".join([name, "result", *path]) + "}")
    assert ref is not None and ref.step == name and list(ref.path) == path
    assert parse_ref(ref.text()) == ref


@st.composite
def dags(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 8))
    steps = []
    for i in range(n):
        after = draw(st.lists(st.integers(0, i - 1), unique=True, max_size=3)) if i else []
        steps.append(step(f"s{i}", after=[f"s{a}" for a in after]))
    return draw(st.permutations(steps))


@given(dags())
def test_any_acyclic_definition_is_ordered_with_each_step_after_what_it_needs(
    steps: list[dict[str, Any]],
) -> None:
    job = parse(steps)
    seen: set[str] = set()
    for s in job.steps:
        assert set(s.after) <= seen
        seen.add(s.name)


@given(dags(), st.data())
def test_running_any_definition_to_its_end_starts_each_step_once(
    steps: list[dict[str, Any]], data: st.DataObject
) -> None:
    job = parse(steps)
    sizes: dict[str, int] = {}
    tasks: dict[str, list[Instance]] = {}
    for _ in range(4 * len(job.steps)):
        moves = next_moves(job, JobState(sizes, tasks), 0.0, None, 10)
        if moves.end is not None:
            assert moves.end.status is JobStatus.SUCCEEDED
            assert set(sizes) == {s.name for s in job.steps}
            return
        for name, size in moves.expand:
            assert name not in sizes  # a step starts once
            sizes[name] = size
        for s in moves.start:
            tasks.setdefault(s.step, []).append(Instance(s.index, s.step, Status.RUNNING))
        running = [(n, t) for n, ts in tasks.items() for t in ts if t.status is Status.RUNNING]
        assert running  # a job that has not ended has something going on
        # any non-empty part of what runs ends now; the rest goes on
        ending = data.draw(st.sets(st.sampled_from(running), min_size=1))
        for name, t in ending:
            tasks[name] = [_ok(t.index, None, name) if u == t else u for u in tasks[name]]
    pytest.fail("the job never ended")
