"""Client sweep on this machine: where throughput stops rising with concurrency.

For each workload (tpcb-like and select-only, as in the reference studies), on one fresh
sandbox cluster (small scale): app.sweeps.measure.measure, the same code the service runs, with
every count measured ``--repeats`` times in up-down order, then ``pgbench -C`` at the
knee. Prints each count's level (95% interval from the moderated run-to-run spread), p99
latency and host CPU, the knee, the advice and the wall time; saves the raw runs and the
analysis to bench/results/sweep.json and a chart per workload (tps and p99 vs clients).

    .venv/bin/python bench/sweep.py                          # ~6 minutes on 2 cores
    .venv/bin/python bench/sweep.py --duration 5 --clients 1,2,4,8   # quicker look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.postgres.sandbox import Sandbox  # noqa: E402
from app.reports.chart import render_sweep_svg  # noqa: E402
from app.sweeps.measure import measure  # noqa: E402
from app.sweeps.schemas import SweepIn  # noqa: E402
from bench.common import run_main  # noqa: E402


def show(name: str, res: dict[str, Any]) -> None:
    print(f"\n== {name}: {len(res['runs'])} runs + warm-up + -C in {res['wall_s']:.0f} s")
    print(f"{'clients':>7} {'tps':>8} {'95% interval':>17} {'p99 ms':>8} {'CPU':>5} {'iowait':>6}")
    for p in res["points"]:
        if p["tps"] is None:
            print(f"{p['clients']:>7} {'failed':>8}")
            continue
        cpu = f"{p['cpu_util']:.0%}" if p["cpu_util"] is not None else "-"
        io = f"{p['cpu_iowait']:.1%}" if p["cpu_iowait"] is not None else "-"
        p99 = f"{p['latency_p99_ms']:.1f}" if p["latency_p99_ms"] else "-"
        mark = "  <- knee" if p["clients"] == res["knee_clients"] else ""
        print(
            f"{p['clients']:>7} {p['tps']:>8.0f} {p['tps_low']:>8.0f}-{p['tps_high']:<8.0f} "
            f"{p99:>8} {cpu:>5} {io:>6}{mark}"
        )
    for line in res["advice"]:
        print("  " + line)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workloads", default="tpcb-like,select-only")
    p.add_argument("--clients", help="comma-separated (default: 1, 2, 4, ... to the cap)")
    p.add_argument("--duration", type=int, default=10, help="seconds per run, warm-up included")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="runs per count, up-down (2-6)")
    p.add_argument("--scale", type=int, default=10)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "sweep.json"))
    args = p.parse_args()
    clients = [int(c) for c in args.clients.split(",")] if args.clients else None
    try:  # the service's own limits (e.g. repeats 2-6: up and down at least once)
        bodies = {
            name: SweepIn(
                builtin=name,
                scale=args.scale,
                clients=clients,
                duration_s=args.duration,
                warmup_s=args.warmup,
                repeats=args.repeats,
            )
            for name in args.workloads.split(",")
        }
    except ValidationError as exc:
        flag = {"builtin": "workloads", "duration_s": "duration", "warmup_s": "warmup"}
        p.error(
            "; ".join(
                f"--{flag.get(str(e['loc'][0]), str(e['loc'][0]))}: {e['msg']}"
                for e in exc.errors()
            )
        )
    out = Path(args.out)
    results: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "machine": platform.machine()},
        "args": vars(args),
        "load_average_1m": {"before": round(os.getloadavg()[0], 2)},
        "workloads": {},
    }
    print(f"load average (1 min) before: {results['load_average_1m']['before']}")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="knobtune-sweep-") as tmp, Sandbox.create() as sb:
        for name, body in bodies.items():
            # as the sandbox's unprivileged benchmark role, in its database: a sweep runs
            # no workload as a superuser (app/postgres/roles.py, docs/security.md)
            res = measure(sb.bench_dsn, body, workdir=Path(tmp))
            results["workloads"][name] = res
            show(name, res)
            svg = render_sweep_svg(
                res["points"],
                knee=res["knee_clients"],
                title=f"Client sweep, {name} (scale {args.scale}, {os.cpu_count()} CPUs): "
                "tps and p99 vs clients",
            )
            chart = out.with_name(f"sweep-{name}.svg")
            chart.write_text(svg)
            print(f"  chart: {chart}")
    results["load_average_1m"]["after"] = round(os.getloadavg()[0], 2)
    results["wall_s"] = round(time.monotonic() - t0, 1)
    out.write_text(json.dumps(results, indent=2))
    la = results["load_average_1m"]
    print(f"\nload average (1 min) before {la['before']}, after {la['after']}")
    print(f"total {results['wall_s']:.0f} s; raw runs and analysis: {out}")
    return 0


if __name__ == "__main__":
    run_main(main)
