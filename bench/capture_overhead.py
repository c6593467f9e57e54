"""What a capture costs the server it logs (issue 28): throughput, latency, log volume.

    .venv/bin/python bench/capture_overhead.py                  # ~25 minutes
    .venv/bin/python bench/capture_overhead.py --profile small  # on a capped disk

A capture turns on the logging settings of app/postgres/serverlog.py (CAPTURE_SETTINGS:
``log_statement = 'all'``, connections and disconnections, the prefix ``%m|%u|%d|%c|``,
``lc_messages = 'C'``...) with ALTER SYSTEM and a reload, as app/captures/runner.py does.
Here, on one sandbox with the logging collector on (``logging_collector = on``, the log in
``log/`` of its data directory, pg_stat_statements loaded: what a capture needs), pgbench
runs with those settings off (A) and on (B), alternating A B B A A B ... for ``--rounds``
rounds, through the session's own trial executor (app/sessions/trial.py; bench/common.py
interleaved): each run applies its config on top of the server's settings, and the
settings are put back at the end. Workloads: pgbench tpcb-like (7 statements a
transaction) and select-only (1: the statement-heavy worst case, every statement a log
line), at each of ``--clients``.

Per run: pgbench's throughput and mean latency (its summary), the bytes the server's log
grew by (``pg_ls_logdir()``), and the statements the benchmark database ran
(pg_stat_statements' calls), both from the start of pgbench to its end. Per workload and
client count: the paired change of throughput and of mean latency, on vs off
(bench/common.py paired_gain: paired t on the rounds' log ratios; 95% interval,
p-value), and the log volume per minute and per 1,000 statements with logging on.

``--profile NAME`` runs the sandbox in that hardware profile's cgroup (docs/profiles.md):
its capped disk is where the log's writes cost the most.

Prints one line per run on stderr, then one line per workload and client count; writes
every run and the estimates to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.postgres.cgroups import PROFILES, Limits, resolve  # noqa: E402
from app.postgres.sandbox import BENCH_DB, Sandbox  # noqa: E402
from app.postgres.serverlog import CAPTURE_SETTINGS  # noqa: E402
from app.postgres.target import TargetController  # noqa: E402
from app.sessions.trial import TrialExecutor, TrialHooks, TrialOutcome  # noqa: E402
from app.workloads import workload_for  # noqa: E402
from app.workloads.schemas import WorkloadIn  # noqa: E402
from bench.common import (  # noqa: E402
    interleaved,
    load_average,
    machine,
    measured,
    paired_gain,
    profile_of,
    run_main,
    shown,
)
from tests.helpers import logging_sandbox  # noqa: E402

WORKLOADS = ("tpcb-like", "select-only")
CONFIGS: dict[str, dict[str, str]] = {"off": {}, "on": dict(CAPTURE_SETTINGS)}
# --small throttles pgbench (-R 100): its runs check the path (the log grew, the statements
# were counted), never a level, and a run flat out kept a CPU busy that the suite's other
# workers wait for
SMALL = {"rounds": 1, "duration": 2, "clients": "2", "scale": 1, "rate": 100.0}
FULL = {"rounds": 6, "duration": 30, "clients": "2,8", "scale": 20, "rate": None}


def log_bytes(sb: Sandbox) -> int:
    """The server's log files, in bytes, as the server lists them (what a capture reads)."""
    with psycopg.connect(sb.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(sum(size), 0)::bigint FROM pg_ls_logdir()").fetchone()
    return int(row[0]) if row else 0


def statements(sb: Sandbox) -> int | None:
    """Statements the benchmark database has run (pg_stat_statements; None: not loaded)."""
    try:
        with psycopg.connect(make_conninfo(sb.dsn, dbname=BENCH_DB), autocommit=True) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements"
                " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()
    except psycopg.Error:
        return None
    return int(row[0]) if row else None


def measure_cell(
    sb: Sandbox, ctl: TargetController, builtin: str, clients: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One workload at one client count: ``--rounds`` rounds of logging off and on."""
    wl = WorkloadIn.model_validate(
        {
            "builtin": builtin,
            "scale": args.scale,
            "clients": clients,
            "jobs": min(2, clients),
            "duration_s": args.duration,
            "warmup_s": max(0, min(5, args.duration // 4)),
            "rate": args.rate,
        }
    )
    workload = workload_for(wl)
    note = workload.prepare(sb.bench_dsn)
    before: dict[str, Any] = {}

    def at_start() -> None:  # the measured run begins: the log and the counters now
        before.update(bytes=log_bytes(sb), statements=statements(sb), t=time.monotonic())

    executor = TrialExecutor(
        ctl,
        sb.bench_dsn,
        workload,
        duration_s=wl.duration_s,
        warmup_s=wl.warmup_s,
        rate=wl.rate,
        hooks=TrialHooks(on_run_start=at_start),
    )
    runs: list[dict[str, Any]] = []

    def record(rnd: int, label: str, out: TrialOutcome) -> None:
        measured(out, f"{builtin} at {clients} clients, logging {label}")
        seconds = time.monotonic() - before["t"]
        grown = log_bytes(sb) - before["bytes"]
        now = statements(sb)
        ran = None if now is None or before["statements"] is None else now - before["statements"]
        r = out.result
        assert r is not None
        run = {
            "round": rnd + 1,
            "logging": label,
            "tps": r.tps,
            "latency_ms": r.latency_mean_ms,
            "transactions": r.transactions,
            "failed": r.failed_transactions,
            "seconds": round(seconds, 2),
            "log_bytes": grown,
            "statements": ran,
            "load1": load_average(),
        }
        runs.append(run)
        print(
            f"  {builtin} {clients} clients, round {rnd + 1}, logging {label}: "
            f"{r.tps or 0:.0f} tps, {r.latency_mean_ms or 0:.3f} ms, log +{grown / 1e6:.1f} MB, "
            f"{ran if ran is not None else '?'} statements",
            file=sys.stderr,
        )

    interleaved(ctl, executor, CONFIGS, args.rounds, record)
    return {
        "workload": builtin,
        "clients": clients,
        "data": note,
        "runs": runs,
        **estimates(runs),
    }


def estimates(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """On against off: paired changes, and the log volume with logging on."""
    by = {k: [r for r in runs if r["logging"] == k] for k in CONFIGS}
    pairs = list(zip(by["on"], by["off"], strict=True))  # run i of each: the same round

    def change(key: str) -> dict[str, Any]:
        # a positive quantity's paired change: the rounds' geometric mean ratio, minus 1
        return paired_gain([on[key] for on, _ in pairs], [off[key] for _, off in pairs])

    def volume(side: list[dict[str, Any]]) -> dict[str, float | None]:
        per_min = [r["log_bytes"] * 60 / r["seconds"] for r in side if r["seconds"] > 0]
        per_k = [r["log_bytes"] * 1000 / r["statements"] for r in side if r["statements"]]
        return {
            "bytes_per_minute": round(statistics.median(per_min)) if per_min else None,
            "bytes_per_1000_statements": round(statistics.median(per_k)) if per_k else None,
            "statements_per_second": round(
                statistics.median(r["statements"] / r["seconds"] for r in side), 1
            )
            if side and all(r["statements"] is not None and r["seconds"] > 0 for r in side)
            else None,
        }

    return {
        "throughput_change": change("tps"),
        "latency_change": change("latency_ms"),
        "log_volume": {"on": volume(by["on"]), "off": volume(by["off"])},
    }


def line(cell: dict[str, Any]) -> str:
    vol = cell["log_volume"]["on"]
    per_min, per_k = vol["bytes_per_minute"], vol["bytes_per_1000_statements"]
    tps, lat = shown(cell["throughput_change"]), shown(cell["latency_change"])
    return (
        f"{cell['workload']}, {cell['clients']} clients: throughput {tps}; mean latency {lat}; "
        + (f"log {per_min / 1e6:.1f} MB/min" if per_min is not None else "log ? MB/min")
        + (f", {per_k / 1e3:.1f} kB per 1,000 statements" if per_k is not None else "")
    )


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, help=f"rounds of off/on (default {FULL['rounds']})")
    p.add_argument(
        "--duration", type=int, help=f"seconds per pgbench run (default {FULL['duration']})"
    )
    p.add_argument("--clients", help=f"client counts, comma-separated (default {FULL['clients']})")
    p.add_argument("--scale", type=int, help=f"pgbench's scale (default {FULL['scale']})")
    p.add_argument(
        "--rate",
        type=float,
        help="pgbench -R, transactions a second (default: none, flat out; --small: 100)",
    )
    p.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"pgbench builtins, comma-separated (default {','.join(WORKLOADS)})",
    )
    p.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        help="run the sandbox as this hardware profile's small server (docs/profiles.md)",
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "capture-overhead.json"))
    p.add_argument(
        "--small",
        action="store_true",
        help="the smallest sizes (1 round of 2 s runs, 2 clients, scale 1, 100 transactions a "
        "second): a check that the command runs (tests/docs), not a measurement",
    )
    args = p.parse_args()
    for name, value in (SMALL if args.small else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    workloads = args.workloads.split(",")
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        p.error(f"unknown workloads {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    client_counts = [int(c) for c in str(args.clients).split(",")]
    limits: Limits | None = resolve(profile=args.profile) if args.profile else None
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    load_before, t0 = load_average(), time.monotonic()
    started = datetime.now(UTC)
    cells: list[dict[str, Any]] = []
    sb = logging_sandbox(pgss=True, limits=limits)
    with sb:
        ctl = TargetController.for_sandbox(sb)
        for builtin in workloads:
            for clients in client_counts:
                print(f"{builtin}, {clients} clients: {args.rounds} rounds", file=sys.stderr)
                cells.append(measure_cell(sb, ctl, builtin, clients, args))
    results: dict[str, Any] = {
        "machine": machine(),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "args": vars(args),
        "profile": profile_of(limits),
        "settings_on": CONFIGS["on"],
        "cells": cells,
        "wall_s": round(time.monotonic() - t0, 1),
        "load_average_1m": {"before": load_before, "after": load_average()},
    }
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    for cell in cells:
        print(line(cell))
    print(
        f"load average (1 min) {load_before} before, {results['load_average_1m']['after']} "
        f"after; {results['wall_s']:.0f} s; written to {args.out}"
    )
    return 0


if __name__ == "__main__":
    run_main(main)
