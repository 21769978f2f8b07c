"""Run every benchmark available, then print the results table (and write its README).

    python -m bench.run_all            # full sizes: tens of minutes
    python -m bench.run_all --quick    # smoke sizes: a couple of minutes

Each benchmark runs as ``python -m bench.<module>`` in its own process, so one crash or stuck
event loop does not take the others down; a failure is reported and the sweep goes on.
Optional benchmarks (``bench/upstream.py``: U1/U2, ``bench/fleet.py``: F1/F2) run when their
module exists. T1 on PostgreSQL runs when ``FLOODWAY_BENCH_POSTGRES`` holds a database URL; T3
(``bench/peers.py``) and H1 (``bench/http_load.py``) use PostgreSQL at that URL, or at the
tests' default (``FLOODWAY_TEST_PG_URL``, else postgresql://postgres@127.0.0.1:5432/test).

``--quick`` runs only the benchmarks that have a quick size of their own (a ``--quick`` flag):
the others write their results under their full-size names, so a smoke sweep would overwrite
real figures with small ones. They are listed as skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench import report
from bench.common import RESULTS

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Step:
    covers: str  # scenario ids, for the log
    module: str
    args: tuple[str, ...] = ()

    def available(self) -> bool:
        return importlib.util.find_spec(self.module) is not None

    def has_quick(self) -> bool:
        """Whether the module takes ``--quick`` (read from its source: importing it to ask
        would drag every benchmark's dependencies into this process)."""
        spec = importlib.util.find_spec(self.module)
        origin = spec.origin if spec is not None else None
        return origin is not None and '"--quick"' in Path(origin).read_text()


def steps() -> list[Step]:
    plan = [
        Step("T1 (SQLite, in-process worker)", "bench.throughput"),
    ]
    postgres = os.environ.get("FLOODWAY_BENCH_POSTGRES")
    if postgres:
        for workers in ("1", "4"):
            plan.append(
                Step(
                    f"T1 (PostgreSQL, {workers} workers)",
                    "bench.throughput",
                    ("--database", postgres, "--workers", workers),
                )
            )
        plan.append(
            Step(
                "T1 (PostgreSQL, 1 worker, every submit with a request key)",
                "bench.throughput",
                ("--database", postgres, "--workers", "1", "--keyed"),
            )
        )
    server = ("--database", postgres) if postgres else ()
    plan += [
        Step("T3 (drain at the defaults, floodway beside Dramatiq)", "bench.peers", server),
        Step("H1 (the HTTP front at the defaults)", "bench.http_load", server),
        Step("T2", "bench.scale"),
        Step("Q1-Q8, Q2b, Q4b (Q1 beside Dramatiq)", "bench.quota", ("--peers",)),
        Step("L1-L3 (learned limits that follow a provider down and up)", "bench.learning"),
        Step("U1/U2", "bench.upstream"),
        Step("C1", "bench.crash"),
        Step("F1/F2, Q6/Q7 on the fleet", "bench.fleet"),
        Step("O1-O3 (the OpenAI-compatible front)", "bench.openai_front"),
        Step("O4 (the OpenAI front's overhead, from wrk)", "bench.openai_gateway"),
    ]
    return plan


def run_step(step: Step, quick: bool) -> str:
    """Run one benchmark; its outcome in a word or two."""
    if not step.available():
        return "absent"
    if quick and not step.has_quick():
        return "skipped (no quick size)"
    command = [sys.executable, "-m", step.module, *step.args, *(["--quick"] if quick else [])]
    print(f"\n=== {step.covers}: {' '.join(command[1:])}", flush=True)
    started = time.monotonic()
    code = subprocess.run(command, cwd=ROOT, check=False).returncode
    took = time.monotonic() - started
    return f"ok in {took:.0f} s" if code == 0 else f"FAILED (exit {code}) after {took:.0f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke sizes; see the module doc")
    args = parser.parse_args()
    outcomes = [(step, run_step(step, args.quick)) for step in steps()]
    print("\n=== benchmarks run")
    for step, outcome in outcomes:
        print(f"  {step.covers:<34} {step.module:<18} {outcome}")
    text = report.render(args.quick)
    print()
    print(text)
    (RESULTS / "README.md").write_text(text)
    if any(outcome.startswith("FAILED") for _step, outcome in outcomes):
        sys.exit(1)


if __name__ == "__main__":
    main()
