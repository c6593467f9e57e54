"""``knobtune compare``: measure named configs against each other in interleaved rounds
(app/compare/)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from app.cli.follow import follow_job
from app.cli.shared import (
    BUILTINS,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    ISOLATION_LEVELS,
    OBJECTIVES,
    WORKLOAD_KINDS,
    CliError,
    Subparsers,
    UsageError,
    add_command,
    add_json,
    add_remote,
    connect,
    existing_metadata_db,
    fail,
    print_json,
    read_script,
)
from app.cli.targets import find_target


def register(sub: Subparsers) -> None:
    s = add_command(
        sub,
        "compare",
        "measure named configs against each other in interleaved rounds, before trusting a "
        "claim; the target's settings are put back",
        cmd_compare,
    )
    s.add_argument("target", metavar="TARGET", help="a registered target's name (or id)")
    s.add_argument(
        "configs",
        nargs="+",
        metavar="CONFIG",
        help="2 to 8 of: default (PostgreSQL's defaults of the knobs knobtune tunes), "
        "current (the server's settings as they are), pgtune (PGTune's config for the memory "
        "and CPUs the server really has), session:N (session N's recommendation), "
        "file:PATH (a postgresql.conf-style file, read here; its knobs are sent). The first "
        "is the reference",
    )
    s.add_argument(
        "--rounds",
        type=int,
        metavar="N",
        help="rounds, 2 to 20; each runs every config once, in a random order (default: 4)",
    )
    s.add_argument(
        "--reference", metavar="CONFIG", help="compare with this config (default: the first)"
    )
    s.add_argument(
        "--warmup-run-s",
        dest="warmup_run",
        type=int,
        metavar="SECONDS",
        help="a discarded run after every apply, before the measured one (default: a quarter "
        "of --duration-s, 2 to 30 s)",
    )
    s.add_argument("--seed", type=int, help="seed of the rounds' orders (default: random)")
    s.add_argument(
        "--objective",
        choices=OBJECTIVES,
        help="what a run's level is, as for a session (default: throughput)",
    )
    s.add_argument(
        "--workload-kind",
        choices=WORKLOAD_KINDS,
        help="pgtune's database type (default: from the workload)",
    )
    s.add_argument(
        "--allow-unsafe",
        action="store_true",
        help="allow durability-unsafe knobs (fsync, synchronous_commit, full_page_writes) in "
        "a config (default: no)",
    )
    _workload_arguments(
        s.add_argument_group("the workload, as a session's (each option left out: its default)")
    )
    add_json(s)
    add_remote(s)


def _workload_arguments(wl: argparse._ArgumentGroup) -> None:
    wl.add_argument(
        "--builtin",
        choices=BUILTINS,
        help="pgbench's builtin script, or tpch, tpcc, chbench (default: tpcb-like without "
        "--script)",
    )
    wl.add_argument(
        "--script",
        action="append",
        metavar="FILE",
        help="your SQL in pgbench's script syntax; repeatable (default: none)",
    )
    wl.add_argument(
        "--duration-s",
        "--duration",
        dest="duration",
        type=int,
        metavar="SECONDS",
        help="length of one measured run, warm-up seconds included (default: the workload's: "
        "60 s, 120 s for tpch)",
    )
    wl.add_argument(
        "--warmup",
        type=int,
        metavar="SECONDS",
        help="seconds at the start of each measured run that are not counted (default: 5)",
    )
    wl.add_argument("--clients", type=int, metavar="N", help="concurrent clients (default: 8)")
    wl.add_argument("--jobs", type=int, metavar="N", help="pgbench threads (default: 2)")
    wl.add_argument("--scale", type=float, help="pgbench scale, TPC-H scale factor, or warehouses")
    wl.add_argument(
        "--init",
        action=argparse.BooleanOptionalAction,
        help="create pgbench's tables first (default: yes with a pgbench builtin)",
    )
    wl.add_argument("--mode", choices=["power", "throughput"], help="tpch's mode")
    wl.add_argument("--queries", help="tpch/chbench: comma-separated queries (default: all)")
    wl.add_argument(
        "--olap-clients", type=int, metavar="N", help="chbench: analytic clients (default: 1)"
    )
    wl.add_argument(
        "--isolation",
        choices=ISOLATION_LEVELS,
        help="the benchmark sessions' isolation level (default: the server's)",
    )
    wl.add_argument(
        "--max-tries", type=int, metavar="N", help="pgbench --max-tries (default: 1, 10 for tpcc)"
    )
    wl.add_argument(
        "--rate",
        type=float,
        metavar="TPS",
        help="pgbench -R: each run throttled to this many transactions a second (default: "
        "as fast as the server goes)",
    )


def compare_configs(specs: list[str]) -> list[dict[str, Any]]:
    """The configs of ``knobtune compare`` as the API takes them: named ones as given, a
    ``file:PATH`` read here, on the client (the service never reads a path), its knobs
    sent inline and the rest of the file (listen_addresses, logging, ...) left out."""
    from app.postgres.target import parse_conf
    from optimizer.catalogue import CATALOGUE

    out: list[dict[str, Any]] = []
    for spec in specs:
        if not spec.startswith("file:"):
            out.append({"name": spec})
            continue
        path = Path(spec.removeprefix("file:")).expanduser()
        try:
            settings = parse_conf(path.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or exc
            raise CliError(f"cannot read {spec}: {why}") from None
        knobs = {k: v for k, v in settings.items() if k in CATALOGUE}
        other = sorted(set(settings) - set(knobs))
        if other:
            left = ", ".join(other)
            print(f"{spec}: left out, not knobs knobtune compares: {left}", file=sys.stderr)
        if not knobs:
            raise CliError(
                f"{spec} sets none of the knobs knobtune compares (postgresql.conf lines "
                "'name = value'; GET /api/v1/knobs lists them)"
            )
        name = "file:" + re.sub(r"[^A-Za-z0-9_.+@-]", "_", path.name)[:95]
        taken = {c["name"] for c in out}
        base, n = name, 2
        while name in taken:
            name, n = f"{base}-{n}", n + 1
        out.append({"name": name, "settings": knobs})
    return out


def cmd_compare(args: argparse.Namespace) -> int:
    """Interleaved rounds of named configs on a target; each config's level, each one's gain
    over the reference, the target restored (app/compare/)."""
    from app.compare.report import table_lines

    if len(args.configs) < 2:
        raise UsageError("give at least 2 configs, e.g. default pgtune")
    given = {
        "builtin": args.builtin,
        "scale": args.scale,
        "clients": args.clients,
        "jobs": args.jobs,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "init": args.init,
        "mode": args.mode,
        "olap_clients": args.olap_clients,
        "isolation": args.isolation,
        "max_tries": args.max_tries,
        "rate": args.rate,
        "queries": [q.strip() for q in args.queries.split(",")] if args.queries else None,
    }
    workload: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    if args.script:
        workload["scripts"] = [{"sql": read_script(f), "weight": 1} for f in args.script]
    configs = compare_configs(args.configs)
    url = args.database_url
    if not args.server:
        url = existing_metadata_db(args, f"no target {args.target!r}: ")
    with connect(args.server, args.token, database_url=url) as api:
        target = find_target(api, args.target)
        body: dict[str, Any] = {"target_id": target["id"], "configs": configs, "workload": workload}
        options = {
            "rounds": args.rounds,
            "reference": args.reference,
            "warmup_run_s": args.warmup_run,
            "objective": args.objective,
            "workload_kind": args.workload_kind,
            "allow_unsafe": args.allow_unsafe or None,
            "seed": args.seed,
        }
        body.update({k: v for k, v in options.items() if v is not None})
        started = api.call("POST", "/api/v1/comparisons", json=body)
        print(f"comparison {started['id']} started on {target['name']}", file=sys.stderr)
        path = f"/api/v1/comparisons/{started['id']}"
        done = follow_job(api, path, "interrupted: cancelling; the target is being restored")
    if args.json:
        print_json(done)
    else:
        print("\n".join(table_lines(done)))
    if done["status"] == "failed":
        fail(CliError(f"comparison failed: {done['error']}"))
        return EXIT_FAILED
    return EXIT_INTERRUPTED if done["status"] == "cancelled" else EXIT_OK
