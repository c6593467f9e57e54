"""``knobtune demo``: tune a throw-away sandbox cluster and show the result."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from app.cli.follow import follow
from app.cli.sessions import report, session_files
from app.cli.shared import (
    CliError,
    Subparsers,
    add_command,
    add_out_options,
    add_profile,
    add_warmup,
    connect,
    out_dir,
)
from app.postgres.cgroups import CgroupUnavailable, Limits, ProfileError, resolve

DEMO_SORT_SQL = (
    "\\set a random(1, 100000 * :scale - 60000)\n"
    "SELECT aid FROM (SELECT aid, filler FROM pgbench_accounts "
    "WHERE aid BETWEEN :a AND :a + 60000 ORDER BY filler DESC, aid) s OFFSET 59990;\n"
)


def register(sub: Subparsers) -> None:
    s = add_command(sub, "demo", "tune a throw-away sandbox cluster and show the result", cmd_demo)
    add_out_options(s)
    s.add_argument("--knobs", default="work_mem", help="comma-separated knobs to tune")
    s.add_argument(
        "--duration",
        type=int,
        default=12,
        metavar="SECONDS",
        help="length of one benchmark run in seconds, warm-up included",
    )
    add_warmup(s)
    s.add_argument("--clients", type=int, default=4, help="pgbench clients")
    s.add_argument("--scale", type=int, default=10, help="pgbench scale (100,000 accounts each)")
    s.add_argument(
        "--max-trials",
        type=int,
        default=14,
        metavar="N",
        help="benchmark runs in all, final check included",
    )
    s.add_argument("--seed", type=int, default=1, help="random seed of the search")
    add_profile(s)


def cmd_demo(args: argparse.Namespace) -> int:
    from app.outfiles import OutputRefused, check_free
    from app.postgres.pgbench import pgbench_jobs
    from app.postgres.sandbox import Sandbox

    out = out_dir(args)
    if out is not None:
        try:  # the demo's session is the first of a new metadata DB: session 1
            check_free(session_files(out, 1), force=args.force)
        except OutputRefused as exc:
            raise CliError(f"--out: {exc}") from None
    limits = _profile_limits(args.profile)
    with tempfile.TemporaryDirectory(prefix="knobtune-demo-") as tmp:
        print("creating a sandbox PostgreSQL cluster...", file=sys.stderr)
        try:
            made = Sandbox.create(limits=limits)
        except CgroupUnavailable as exc:
            raise CliError(f"--profile {args.profile}: {exc}") from None
        with made as sandbox:
            print(
                f"sandbox at {sandbox.root} (port {sandbox.port}"
                + (f", profile {limits.describe()}" if limits else "")
                + "); removed at the end",
                file=sys.stderr,
            )
            db_url = f"sqlite:///{tmp}/knobtune.db"
            methods = {"demo": sandbox.restart_method.model_dump(by_alias=True)}
            with connect(
                None, None, database_url=db_url, work_dir=Path(tmp), restart_methods=methods
            ) as api:
                target = api.call(
                    "POST",
                    "/api/v1/targets",
                    json={"name": "demo", "dsn": sandbox.dsn, "restart_method": "demo"},
                )
                workload: dict[str, Any] = {
                    "builtin": None,
                    "scripts": [{"sql": DEMO_SORT_SQL, "weight": 1}],
                    "init": True,  # the script sorts pgbench's accounts
                    "scale": args.scale,
                    "clients": args.clients,
                    "jobs": pgbench_jobs(2, args.clients),
                    "duration_s": args.duration,
                    "warmup_s": args.warmup,
                }
                body = {
                    "target_id": target["id"],
                    "knobs": args.knobs.split(","),
                    "workload": workload,
                    "workload_kind": "mixed",
                    "max_trials": args.max_trials,
                    "seed": args.seed,
                }
                final = follow(
                    api,
                    body,
                    lambda sess: (
                        f"session {sess['id']}: tuning {args.knobs} on a sort-heavy "
                        f"workload ({args.duration} s per run)"
                    ),
                )
                return report(api, final, out, force=args.force, demo=True)


def _profile_limits(name: str | None) -> Limits | None:
    """The limits of a named hardware profile (None: no profile)."""
    if name is None:
        return None
    try:
        return resolve(profile=name)
    except ProfileError as exc:  # e.g. more memory than this host has
        raise CliError(f"--profile {name}: {exc}") from None
