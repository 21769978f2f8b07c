"""What a ledger's record sets (the OpenAI records, jobs, the batch tier's lines) read and
write through: the ledger's own reads and its one write path, declared once for all of them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, TypeVar

from floodway.store import rules
from floodway.store.base import TaskChange
from floodway.store.steps import Row, Rule

T = TypeVar("T")


class LedgerAccess(ABC):
    """The ledger's reads (one row, every row of a named query) and its write of a rule."""

    @abstractmethod
    async def _one(self, query: str, /, **params: Any) -> Row | None: ...

    @abstractmethod
    async def _all(self, query: str, /, **params: Any) -> list[Row]: ...

    @abstractmethod
    async def _write(
        self,
        rule: Callable[[list[TaskChange]], Rule[T]],
        *,
        wake: bool = False,
        merge: rules.Submission | None = None,
    ) -> T: ...
