"""`floodway demo --job`: the editor's chain survives a SIGKILL of its worker, billed once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_job_demo_kills_its_worker_and_ends_with_every_step_billed_once(
    tmp_path: Path,
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "floodway.cli", "demo", "--job", "--latency-ms", "100"],
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "160", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "SIGKILL the worker" in out
    ended = re.search(r"job succeeded in [\d.]+s: (\d+) tasks, (\d+) billed by the providers, "
                      r"0 billed twice", out)  # fmt: skip
    assert ended is not None, out
    assert ended.group(1) == ended.group(2)
    for step in ("understand", "script", "tts", "subtitles", "export"):
        assert re.search(rf"│ {step} +│", out), out
