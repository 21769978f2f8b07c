"""Render bench/results/*.json as one Markdown table (id, scenario, figures, floor, result).

    python -m bench.report            # full-size results; also writes bench/results/README.md
    python -m bench.report --quick    # prefer the -quick results where a scenario has them

Each benchmark writes its own shape of JSON; the readers below know the shapes in use
(``bench.quota``/``bench.crash``: id, figures, floor, passed; ``bench.throughput``: T1;
``bench.peers``: T3; ``bench.http_load``: H1; ``bench.scale``: T2; ``bench.upstream``: U1;
``bench.jobs``: J1, J2) and fall back to a generic reading for others.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import RESULTS

ORDER = (
    "T1",
    "T3",
    "H1",
    "T2",
    "Q1",
    "Q2",
    "Q2b",
    "Q3",
    "Q4",
    "Q4b",
    "Q5",
    "Q6",
    "Q6 (fleet)",
    "Q7",
    "Q7 (fleet)",
    "Q8",
    "U1",
    "U2",
    "C1",
    "F1",
    "F2",
    "O1",
    "O2",
    "O3",
    "J1",
    "J1 (x10)",
    "J2",
)
#: bench.fleet's runs of the learning scenarios: (makespan/optimum floor, share of 429s floor)
FLEET_LEARNING = {"Q6": (1.15, 0.02), "Q7": (1.20, 0.05)}
QUICK_SUFFIX = "-quick"
#: T1's floors: Dramatiq's submit and drain rates on this machine's first measurement, the
#: fastest of the Python queues compared then
T1_DRAINED_PER_S = 2_100
T1_SUBMITTED_PER_S = 5_500
#: T3: floodway's drain at the defaults against Dramatiq's, measured in the same run
T3_TIMES_DRAMATIQ = 2.0
#: H1: single submits/s and their p99 (ms); tasks/s of a batch of 1,000
H1_SUBMITS_PER_S, H1_P99_MS, H1_BATCH_TASKS_PER_S = 1_500, 100, 10_000
T3_SETUPS = {
    "sqlite": "1 `floodway worker`, SQLite",
    "pg-1": "1 `floodway worker`, PostgreSQL",
    "pg-4": "4 `floodway worker` processes, PostgreSQL",
}

Data = dict[str, Any]


@dataclass(frozen=True)
class Row:
    id: str
    scenario: str
    figures: str
    floor: str
    passed: bool | None  # None: reported, not judged
    source: str
    when: str

    def markdown(self) -> str:
        result = {True: "pass", False: "**MISS**", None: "reported"}[self.passed]
        cells = (self.id, self.scenario, self.figures, self.floor, result, self.source)
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:  # NaN
            return "n/a"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {fmt(v)}" for k, v in value.items())
    return str(value)


def figures_text(figures: Data, keys: list[str] | None = None) -> str:
    shown = keys if keys is not None else list(figures)
    return "; ".join(f"{k} {fmt(figures[k])}" for k in shown if k in figures)


# -- readers, one per shape of result file -----------------------------------------------------
def read_own(path: Path, data: Data) -> Row:
    """bench.quota / bench.crash: they say their id, figures, floor and verdict."""
    return Row(
        data["id"],
        data.get("scenario", ""),
        figures_text(data["figures"], data.get("shown")),
        data.get("floor", ""),
        data.get("passed"),
        path.name,
        _when(data),
    )


def read_throughput(path: Path, data: Data) -> Row:
    workers = data.get("worker_processes") or "inline"
    scenario = f"{data.get('tasks', '?')} no-op tasks, {data.get('backend')}, workers {workers}"
    submitted, drained = data["submitted_per_s"], data["drained_per_s"]
    floor = (
        f"ahead of Dramatiq: > {T1_SUBMITTED_PER_S:,} submitted/s, > {T1_DRAINED_PER_S:,} drained/s"
    )
    passed: bool | None = submitted > T1_SUBMITTED_PER_S and drained > T1_DRAINED_PER_S
    if data.get("keyed"):  # Dramatiq's figures are for plain messages: nothing to judge against
        scenario += ", every submit with a request key"
        floor, passed = "none (compare with the plain row)", None
    if data.get("budgeted"):  # what the spend ledger and a budget cost: compared, not judged
        scenario += ", a priced kind and a tenant budget"
        floor, passed = "none (compare with the plain row)", None
    return Row(
        "T1",
        scenario,
        f"submitted/s {fmt(submitted)}; drained/s {fmt(drained)}; runs {len(data['runs'])}",
        floor,
        passed,
        path.name,
        _when(data),
    )


def read_peers(path: Path, data: Data) -> list[Row]:
    """bench.peers: each floodway setup against Dramatiq's drain in the same run."""
    found = data["rows"]
    dramatiq = found["dramatiq"]["drained_per_s"]
    out = []
    for name, setup in T3_SETUPS.items():
        if name not in found:
            continue
        drained = found[name]["drained_per_s"]
        out.append(
            Row(
                "T3",
                f"{data['tasks']:,} no-op tasks submitted by another process, drained at the "
                f"defaults by {setup}",
                f"drained/s {fmt(drained)}; Dramatiq, same run: {fmt(dramatiq)} "
                f"({fmt(drained / dramatiq)}x); pickup by an idle worker p50/max "
                f"{fmt(found[name].get('pickup_p50_ms', float('nan')))}/"
                f"{fmt(found[name].get('pickup_max_ms', float('nan')))} ms; "
                f"runs {len(found[name]['runs'])}",
                f">= {T3_TIMES_DRAMATIQ:g}x Dramatiq's drain in the same run",
                drained >= T3_TIMES_DRAMATIQ * dramatiq,
                path.name,
                _when(data),
            )
        )
    return out


def read_http(path: Path, data: Data) -> list[Row]:
    """bench.http_load: single submits from keep-alive clients, and batches."""
    servers = {"serve-sqlite": "`floodway serve`, SQLite", "api-pg": "`floodway api`, PostgreSQL"}
    out = []
    for name, figures in data["rows"].items():
        out.append(
            Row(
                "H1",
                f"{data['submits']:,} single submits from {data['clients']} keep-alive httpx "
                f"clients, and batches of {data['batch_size']:,}; {servers.get(name, name)}",
                f"submits/s {fmt(figures['submits_per_s'])}, p50 {fmt(figures['p50_ms'])} ms, "
                f"p99 {fmt(figures['p99_ms'])} ms; batches {fmt(figures['batch_tasks_per_s'])} "
                f"tasks/s; CPU per submit: server {figures['server_cpu_ms']:.2f} ms, clients "
                f"{figures['client_cpu_ms']:.2f} ms; runs {len(figures['runs'])}",
                f">= {H1_SUBMITS_PER_S:,} submits/s, p99 <= {H1_P99_MS} ms; batches >= "
                f"{H1_BATCH_TASKS_PER_S:,} tasks/s",
                figures["submits_per_s"] >= H1_SUBMITS_PER_S
                and figures["p99_ms"] <= H1_P99_MS
                and figures["batch_tasks_per_s"] >= H1_BATCH_TASKS_PER_S,
                path.name,
                _when(data),
            )
        )
        if "wrk_submits_per_s" in figures:  # the same singles from a compiled client
            out.append(
                Row(
                    "H1",
                    f"single submits from wrk, {data['clients']} keep-alive connections; "
                    f"{servers.get(name, name)}",
                    f"submits/s {fmt(figures['wrk_submits_per_s'])}, p50 "
                    f"{fmt(figures['wrk_p50_ms'])} ms, p99 {fmt(figures['wrk_p99_ms'])} ms; "
                    f"CPU per submit: server {figures['wrk_server_cpu_ms']:.2f} ms, wrk "
                    f"{figures['wrk_client_cpu_ms']:.2f} ms; runs {len(figures['runs'])}",
                    f">= {H1_SUBMITS_PER_S:,} submits/s, p99 <= {H1_P99_MS} ms",
                    figures["wrk_submits_per_s"] >= H1_SUBMITS_PER_S
                    and figures["wrk_p99_ms"] <= H1_P99_MS,
                    path.name,
                    _when(data),
                )
            )
    return out


def read_scale(path: Path, data: Data) -> Row:
    small, big = data["small"], data["big"]
    ratio, rss = data["p99_ratio_big_to_small"], data["peak_rss_mb"]
    figures = (
        f"p50/p99 claim ms: {small['queued']:,} queued {fmt(small['claim_p50_ms'])}/"
        f"{fmt(small['claim_p99_ms'])}, {big['queued']:,} queued {fmt(big['claim_p50_ms'])}/"
        f"{fmt(big['claim_p99_ms'])}; p99 ratio {fmt(ratio)}; RSS {fmt(rss)} MB"
    )
    return Row(
        "T2",
        "claim latency and RSS, 1k vs 1M queued, SQLite",
        figures,
        "p99 at 1M within 2x of 1k; RSS < 200 MB",
        ratio <= 2 and rss < 200,
        path.name,
        _when(data),
    )


def read_upstream(path: Path, data: Data) -> Row:
    return Row(
        "U1",
        data.get("scenario", ""),
        figures_text(data["median_over_seeds"]),
        fmt(data.get("targets", {})),
        data.get("met"),
        path.name,
        _when(data),
    )


def read_jobs(path: Path, data: Data) -> list[Row]:
    """bench.jobs: J1, each resource's makespan against its optimum; J2, a job's added cost
    over the same steps submitted by hand."""
    j1, j2 = data["J1"], data.get("J2")
    scale = data.get("latency_scale", 1.0)
    longer = "" if scale == 1 else f", every call {scale:g}x longer"
    resources = [r for r in j1 if r != "run"]
    spans = ", ".join(
        f"{r} {fmt(j1[r]['ratio'])}x ({fmt(j1[r]['makespan_s'])} s / {fmt(j1[r]['optimum_s'])} s, "
        f"a slot's hand-off p50 {fmt(j1[r].get('handoff_p50_ms', float('nan')))} ms)"
        for r in resources
    )
    run = j1["run"]
    caps = ", ".join(f"{r} {int(j1[r]['cap'])}" for r in resources)

    def cost(f: Data) -> str:
        return (
            f"{fmt(f['submits_per_s'])} submits/s, {fmt(f['submit_cpu_ms'])} ms CPU a submit, "
            f"{fmt(f['cpu_ms_per_chain'])} ms CPU a chain, a step's start after its dependency "
            f"p50 {fmt(f['start_after_dependency_p50_ms'])} / p99 "
            f"{fmt(f['start_after_dependency_p99_ms'])} ms"
        )

    rows = [
        Row(
            "J1" if scale == 1 else f"J1 (x{scale:g})",
            f"{data['jobs']} jobs of {data['steps']} steps at once over three resources "
            f"(caps {caps}{longer}), SQLite, one process",
            f"{spans}; the whole run {fmt(run['ratio'])}x the pipeline bound "
            f"({fmt(run['makespan_s'])} s / {fmt(run['optimum_s'])} s); runs {data['runs']}",
            f"each resource <= {fmt(data['J1_floor'])}x its work / cap",
            data["J1_met"],
            path.name,
            _when(data),
        )
    ]
    if j2 is not None:
        rows.append(
            Row(
                "J2",
                f"the same {data['jobs']} chains as jobs and as steps submitted by hand, "
                "room on every resource",
                f"jobs: {cost(j2['jobs'])}; by hand: {cost(j2['by_hand'])}",
                "",
                None,
                path.name,
                _when(data),
            )
        )
    return rows


def read_fleet(path: Path, data: Data) -> Row:
    """bench.fleet: F1 (PostgreSQL + Redis, 4 workers) and F2-<fault> (a worker killed,
    Redis stopped)."""
    name = str(data["scenario"])
    keys = [
        "makespan_over_optimum",
        "provider_peak_concurrency",
        "provider_429s",
        "lost",
        "charged_twice",
        "failed",
        "limit_exceeded",
    ]
    if name == "F1":
        floor = "peak <= 10; 429s 0; makespan/optimum <= 1.10"
        passed = (
            data["provider_peak_concurrency"] <= 10
            and data["provider_429s"] == 0
            and data["makespan_over_optimum"] <= 1.10
        )
    elif name in FLEET_LEARNING:
        ratio, share = FLEET_LEARNING[name]
        floor = f"makespan/optimum <= {ratio:.2f}; 429s < {share:.0%} of requests"
        keys = ["makespan_over_optimum", "share_429", "provider_429s", "lost", "charged_twice"]
        passed = data["makespan_over_optimum"] <= ratio and data.get("share_429", 1) < share
    else:
        floor = "lost 0; charged twice 0; limit never exceeded"
        passed = data["lost"] == 0 and data["charged_twice"] == 0 and not data["limit_exceeded"]
    setup = data.get("setup", {})
    scenario = f"{name}: {fmt(setup)}" if setup else name
    return Row(
        name.split("-")[0] + (" (fleet)" if name in FLEET_LEARNING else ""),
        scenario,
        figures_text(data, keys),
        floor,
        bool(passed),
        path.name,
        _when(data),
    )


def read_generic(path: Path, data: Data) -> Row:
    scalars = {k: v for k, v in data.items() if isinstance(v, int | float | bool)}
    verdict = data.get("passed", data.get("met"))
    return Row(
        str(data.get("id", path.stem)),
        str(data.get("scenario", "")),
        figures_text(scalars),
        fmt(data.get("floor", data.get("targets", ""))),
        verdict if isinstance(verdict, bool) else None,
        path.name,
        _when(data),
    )


Reader = Callable[[Path, Data], Row | list[Row]]


def reader_for(data: Data) -> Reader:
    if "id" in data and isinstance(data.get("figures"), dict):
        return read_own
    if data.get("scenario") == "T3" and "rows" in data:
        return read_peers
    if data.get("scenario") == "H1" and "rows" in data:
        return read_http
    if data.get("scenario") == "T1" and "drained_per_s" in data:
        return read_throughput
    if data.get("scenario") == "T2" and "p99_ratio_big_to_small" in data:
        return read_scale
    if isinstance(data.get("median_over_seeds"), dict):
        return read_upstream
    if isinstance(data.get("J1"), dict) and "J1_floor" in data:
        return read_jobs
    if "limit_exceeded" in data and str(data.get("scenario", "")).startswith(("F", "Q")):
        return read_fleet
    return read_generic


def _when(data: Data) -> str:
    return str(data.get("machine", {}).get("when", ""))


# -- choosing files and rendering ----------------------------------------------------------------
def result_files(quick: bool) -> list[Path]:
    """Every result file, with one of each full/quick pair: the quick one only if asked."""
    paths = {p.stem: p for p in sorted(RESULTS.glob("*.json"))}
    chosen = []
    for stem, path in paths.items():
        is_quick = stem.endswith(QUICK_SUFFIX)
        twin = stem.removesuffix(QUICK_SUFFIX) if is_quick else stem + QUICK_SUFFIX
        if is_quick and not quick and twin in paths:
            continue
        if not is_quick and quick and twin in paths:
            continue
        chosen.append(path)
    return chosen


def rows(quick: bool = False) -> list[Row]:
    out = []
    for path in result_files(quick):
        try:
            data = json.loads(path.read_text())
            read = reader_for(data)(path, data)
            out.extend(read if isinstance(read, list) else [read])
        except (ValueError, KeyError, TypeError) as exc:
            out.append(Row(path.stem, "unreadable result", str(exc), "", False, path.name, ""))
    rank = {k: i for i, k in enumerate(ORDER)}
    return sorted(out, key=lambda r: (rank.get(r.id, len(ORDER)), r.id, r.source))


def render(quick: bool = False) -> str:
    table = rows(quick)
    lines = [
        "# Benchmark results",
        "",
        "Generated by `python -m bench.report` from `bench/results/*.json` (run everything with",
        "`python -m bench.run_all`). Each floor is in the table (and in `bench/report.py`); how",
        "each optimum is defined: the `definitions` field of each result file and the docstrings",
        "of `bench/quota.py` and `bench/crash.py`. Figures are medians over runs; counts that must",
        "be zero are the worst run." + (" Quick sizes where a scenario has one." if quick else ""),
        "",
        "| id | scenario | figures | floor | result | file |",
        "|---|---|---|---|---|---|",
        *(r.markdown() for r in table),
        "",
    ]
    missed = [r.id for r in table if r.passed is False]
    lines.append(f"Floors missed: {', '.join(missed)}." if missed else "Every judged floor met.")
    machines = {r.when for r in table if r.when}
    if machines:
        lines.append(f"Runs from {min(machines)} to {max(machines)}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="prefer the -quick results")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    text = render(args.quick)
    print(text)
    if not args.no_write:
        (RESULTS / "README.md").write_text(text)


if __name__ == "__main__":
    main()
