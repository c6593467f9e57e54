"""``knobtune sweep``: find the client count where throughput stops rising."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from app.cli.follow import follow_job
from app.cli.shared import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    PGBENCH_BUILTINS,
    Api,
    CliError,
    Subparsers,
    UsageError,
    add_command,
    add_remote,
    add_server_facts,
    add_warmup,
    connect,
    fail,
    out_dir,
    write_text,
)
from app.cli.targets import find_or_create_target, find_target


def register(sub: Subparsers) -> None:
    s = add_command(sub, "sweep", "find the client count where throughput stops rising", cmd_sweep)
    s.add_argument("--dsn", help="libpq DSN of the target (registered if new)")
    s.add_argument("--target", metavar="NAME", help="a registered target's name (or id)")
    s.add_argument("--name", help="with --dsn: the new target's name (default: host-port-db)")
    add_server_facts(s)
    s.add_argument(
        "--builtin",
        choices=PGBENCH_BUILTINS,
        default="tpcb-like",
        help="pgbench's builtin script",
    )
    s.add_argument(
        "--clients",
        metavar="N,N,...",
        help="comma-separated counts (default: 1, 2, 4, ... to a cap from "
        "max_connections and CPUs)",
    )
    s.add_argument(
        "--duration",
        type=int,
        default=10,
        metavar="SECONDS",
        help="seconds per run, warm-up included",
    )
    add_warmup(s)
    s.add_argument(
        "--repeats", type=int, default=2, metavar="N", help="runs per count (up-down order)"
    )
    s.add_argument("--jobs", type=int, default=2, metavar="N", help="pgbench threads")
    s.add_argument("--scale", type=int, default=10, help="pgbench scale (x 100,000 accounts)")
    s.add_argument(
        "--init",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="create pgbench's tables first (default: yes)",
    )
    s.add_argument(
        "--connect-cost",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure a new connection per transaction (-C) at the knee (default: yes)",
    )
    s.add_argument(
        "--out",
        metavar="DIR",
        help="write the chart there, as knobtune-sweep-N.svg (default: no file)",
    )
    s.add_argument(
        "--force",
        action="store_true",
        help="replace an existing chart; write into a directory holding a postgresql.conf",
    )
    add_remote(s)


def cmd_sweep(args: argparse.Namespace) -> int:
    """Sweep client counts on a target (by --target id, or --dsn: found or registered)."""
    if (args.target is None) == (args.dsn is None):
        raise UsageError("give exactly one of --dsn or --target")
    body: dict[str, Any] = {
        "builtin": args.builtin,
        "scale": args.scale,
        "init": args.init,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "repeats": args.repeats,
        "jobs": args.jobs,
        "connect_cost": args.connect_cost,
    }
    out = out_dir(args)  # refused now, not after the sweep
    if args.clients:
        try:
            body["clients"] = [int(c) for c in args.clients.split(",") if c.strip()]
        except ValueError:
            raise UsageError(
                f"--clients must be comma-separated integers, not {args.clients!r}"
            ) from None
    with connect(args.server, args.token, database_url=args.database_url) as api:
        if args.target is not None:
            target = find_target(api, args.target)
        else:
            target = find_or_create_target(api, args)
        tid = int(target["id"])
        sw = api.call("POST", f"/api/v1/targets/{tid}/sweeps", json=body)
        print(f"sweep {sw['id']} started on {target['name']}", file=sys.stderr)
        sw = _follow_sweep(api, int(sw["id"]))
        if sw["status"] == "failed":
            fail(CliError(f"sweep failed: {sw['error']}"))
            return EXIT_FAILED
        chart = None
        if out is not None:
            chart = out / f"knobtune-sweep-{sw['id']}.svg"
            out.mkdir(parents=True, exist_ok=True)
            write_text(
                chart, api.call("GET", f"/api/v1/sweeps/{sw['id']}/chart.svg"), force=args.force
            )
    print(f"{'clients':>7} {'tps':>9} {'95% interval':>19} {'p99 ms':>8} {'CPU':>5}  ")
    for p in sw["points"]:
        if p["tps"] is None:
            print(f"{p['clients']:>7} {'failed':>9}")
            continue
        cpu = f"{p['cpu_util']:.0%}" if p.get("cpu_util") is not None else "-"
        p99 = f"{p['latency_p99_ms']:.1f}" if p["latency_p99_ms"] else "-"
        mark = "  <- knee" if p["clients"] == sw["knee_clients"] else ""
        print(
            f"{p['clients']:>7} {p['tps']:>9.0f} {p['tps_low']:>9.0f}-{p['tps_high']:<9.0f} "
            f"{p99:>8} {cpu:>5}{mark}"
        )
    if not sw["cpu_visible"]:
        print(sw["cpu_note"])
    for line in sw["advice"]:
        print(line)
    if chart is not None:
        print(f"chart: {chart}")
    else:
        print(f"chart: none written (--out DIR writes knobtune-sweep-{sw['id']}.svg)")
    return EXIT_INTERRUPTED if sw["status"] == "cancelled" else EXIT_OK


def _follow_sweep(api: Api, sweep_id: int) -> dict[str, Any]:
    """Poll until the sweep ends; Ctrl-C or SIGTERM cancel it (nothing to restore)."""
    return follow_job(api, f"/api/v1/sweeps/{sweep_id}", "interrupted: cancelling the sweep")
