"""The README's shell examples, run as written, in order, as one terminal session would run them.

The README's configuration block is saved as ``floodway.toml`` (as the README tells a reader
to), every ``bash`` block runs in one bash script in a fresh directory, and ports 8000 and 9000
become free ports (the only change made to the text). A block just after the HTML comment
``<!-- not run by the README test: <why> -->`` (which a reader of the rendered page does not
see) is skipped: installing packages, or running the whole suite, belongs to the reader's
machine and to CI, not to a test inside that suite.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.processes import ROOT
from tests.acceptance.clirun import free_port

README = ROOT / "README.md"
FENCE = re.compile(
    r"^(?:<!-- not run by the README test: (?P<why>[^\n]*?) -->\n)?"
    r"```(?P<lang>\w*)\n(?P<body>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)


@dataclass(frozen=True)
class Block:
    lang: str
    body: str
    line: int  # where it starts in the README, for messages
    skipped_because: str | None = None


def blocks(text: str) -> list[Block]:
    return [
        Block(m["lang"], m["body"], text.count("\n", 0, m.start()) + 1, m["why"])
        for m in FENCE.finditer(text)
    ]


def configuration(text: str) -> str:
    """The TOML block of the README's Configuration section."""
    section = text[text.index("\n## Configuration\n") :]
    found = [b for b in blocks(section) if b.lang == "toml"]
    assert found, "the README's Configuration section has no toml block"
    return found[0].body


def with_ports(text: str, api: int, provider: int, openai: int | None = None) -> str:
    text = re.sub(r"\b9000\b", str(provider), re.sub(r"\b8000\b", str(api), text))
    return text if openai is None else re.sub(r"\b9001\b", str(openai), text)


def test_every_shell_block_says_why_when_it_is_not_run() -> None:
    shell = [b for b in blocks(README.read_text()) if b.lang in ("bash", "sh", "shell", "")]
    assert all(b.lang == "bash" for b in shell), "shell blocks are ```bash, so the test finds them"
    skipped = [b for b in shell if b.skipped_because is not None]
    assert len(skipped) < len(shell) / 2, "most of the README's examples must be run"
    for block in skipped:
        assert block.skipped_because, f"README.md line {block.line}: say why it is not run"
    for block in shell:  # the marker is the comment above the block, never a line inside it
        assert "not run by the README test" not in block.body, f"README.md line {block.line}"


@pytest.mark.timeout(600)
def test_the_readme_runs_as_written(tmp_path: Path) -> None:
    text = README.read_text()
    api, provider, openai = free_port(), free_port(), free_port()
    (tmp_path / "floodway.toml").write_text(with_ports(configuration(text), api, provider))
    run = [b for b in blocks(text) if b.lang == "bash" and b.skipped_because is None]
    script = [
        "set -euo pipefail",
        # What the reader's terminal would end when closed: the servers started with `&`.
        "trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT",
    ]
    for block in run:
        script += [
            f"echo '>>> README.md line {block.line}'",
            with_ports(block.body, api, provider, openai),
        ]
    (tmp_path / "readme.sh").write_text("\n".join(script) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOODWAY_")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}", COLUMNS="100")
    proc = subprocess.Popen(
        ["bash", "readme.sh"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, ended below whatever happens
    )
    try:
        out, _ = proc.communicate(timeout=540)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-6000:]
    for shown in (
        "money saved on duplicates",  # the demo's summary
        '"status":"ok"',  # /readyz, once the server is up
        "event: status",  # a task's event stream
        "next page: floodway list --after",  # the CLI's paging
    ):
        assert shown in out, (shown, out[-6000:])
    # curl exits 0 on an HTTP error: a problem document in the output is the README failing.
    assert "urn:floodway:problem" not in out, out[-6000:]


def test_the_readme_library_block_runs_as_pasted(tmp_path: Path) -> None:
    """The Python block of "Three ways in", saved as a file and run in a fresh directory."""
    section = README.read_text().split("\n## Three ways in, one engine\n", 1)[1]
    (block,) = [b for b in blocks(section.split("\n## ", 1)[0]) if b.lang == "python"]
    (tmp_path / "app.py").write_text(block.body)
    done = subprocess.run(
        [sys.executable, "app.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("succeeded "), done.stdout
