"""The demo's output as a user reads it, in a file: the live view's last line ends before
the summary begins, and a failed task's reason is whole (wrapped by words, never cut)."""

from __future__ import annotations

import io
import re

from rich.console import Console

from floodway.cli.demo import DemoOptions, run_demo


async def test_demo_output_in_a_file_keeps_lines_and_reasons_whole() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=120)
    options = DemoOptions(images=12, duplicates=2, latency_ms=20, refusal_rate=0.5, seed=3)
    await run_demo(options, console)
    text = buffer.getvalue()
    lines = text.splitlines()
    title = next(i for i, line in enumerate(lines) if line.strip() == "summary")
    last_live = re.search(r"refusals \d+", text)
    assert last_live is not None and lines[title - 1].rstrip().endswith(last_live[0]), text
    # The refusal's reason, read back across the table's wrapped lines.
    cells = " ".join(
        part.strip() for line in lines[title:] for part in line.split("│")[2:3] if part.strip()
    )
    assert "the request was refused by the content policy" in cells, text
