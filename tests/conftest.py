"""Shared fixtures: a fake clock, an opened Floodway on a temporary SQLite file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from floodway import Floodway
from floodway.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/floodway.db"


@pytest.fixture
async def fw(db_url: str, clock: FakeClock) -> AsyncIterator[Floodway]:
    app = Floodway(database=db_url, clock=clock)
    yield app
    await app.close()
