"""`floodway demo` runs the whole story offline and ends with its summary, exit 0."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from floodway.cli.demo import PRICE_PER_IMAGE

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_offline_and_prints_the_summary(tmp_path: Path) -> None:
    # A smaller batch than the default (200 images of ~1.5 s) keeps the suite fast; the
    # path through simulator, limiter, workers and summary is the same.
    proc = subprocess.run(
        [sys.executable, "-m", "floodway.cli", "demo", "--images", "40", "--latency-ms", "100"],
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "160", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for line in (
        "summary",
        "makespan",
        "provider peak concurrency",
        "double charged: 0",
        "money saved on duplicates",
    ):
        assert line in out, out
    assert "10 (cap 10)" in out or "(cap 10)" in out
    # The spent line is floodway's spend ledger; the billed line the provider's own ledger.
    billed = re.search(r"billed images\W+(\d+) ", out)
    spent = re.search(r"spent\W+\$(\d+\.\d\d) \((\d+) billed calls", out)
    assert billed and spent, out
    assert spent.group(2) == billed.group(1)
    assert spent.group(1) == f"{int(billed.group(1)) * PRICE_PER_IMAGE:.2f}"
    assert not list(tmp_path.glob("*.db")), "the demo must not leave a database behind"
