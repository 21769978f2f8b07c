"""The guarantees table is written once: the README shows docs/guarantees.md's own."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
START, END = "<!-- guarantees:start -->", "<!-- guarantees:end -->"


def table_in(path: Path) -> str:
    text = path.read_text()
    return text[text.index(START) : text.index(END)]


def test_the_readme_shows_the_guarantees_table_of_the_docs() -> None:
    docs = table_in(ROOT / "docs" / "guarantees.md")
    assert "| what happens |" in docs
    assert table_in(ROOT / "README.md") == docs
