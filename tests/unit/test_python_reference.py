"""docs/python.md is what the code's signatures say, and its Python blocks run as pasted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.python_reference import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "python.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(), re.MULTILINE | re.DOTALL)


def test_the_reference_is_current() -> None:
    assert DOC.read_text() == render(), (
        "docs/python.md is stale: python -m harness.python_reference > docs/python.md"
    )


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{n}" for n in range(len(BLOCKS))])
def test_its_python_blocks_run(tmp_path: Path, block: str) -> None:
    (tmp_path / "example.py").write_text(block)
    done = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
