"""Running a rule: hand each step to the backend, send the result back in, until it returns.

An error of a step is thrown into the rule at the ``yield`` that asked for it, so a rule (the
group commit's savepoints) can handle the failure of a statement as it would handle an
exception of its own; errors the backend says must abort the whole transaction (a deadlock:
the group runs again) go straight out.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from floodway.store.steps import Rule, Step

T = TypeVar("T")


def drive(rule: Rule[T], execute: Callable[[Step], Any], aborts: Callable[[Exception], bool]) -> T:
    """Run ``rule`` synchronously (SQLite's writer thread)."""
    try:
        step = next(rule)
        while True:
            try:
                result = execute(step)
            except Exception as exc:
                if aborts(exc):
                    rule.close()
                    raise
                step = rule.throw(exc)
            else:
                step = rule.send(result)
    except StopIteration as stop:
        value: T = stop.value
        return value


async def drive_async(
    rule: Rule[T], execute: Callable[[Step], Awaitable[Any]], aborts: Callable[[Exception], bool]
) -> T:
    """Run ``rule`` on an event loop (PostgreSQL's pooled connections)."""
    try:
        step = next(rule)
        while True:
            try:
                result = await execute(step)
            except Exception as exc:
                if aborts(exc):
                    rule.close()
                    raise
                step = rule.throw(exc)
            else:
                step = rule.send(result)
    except StopIteration as stop:
        value: T = stop.value
        return value
