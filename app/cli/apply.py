"""A session's recommendation: ``knobtune export`` prints it, ``apply`` applies it to the
target and checks it took effect, ``rollback`` puts back what an apply replaced."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from app.cli.shared import Subparsers, add_command, add_remote, reader


def register(sub: Subparsers) -> None:
    s = add_command(sub, "export", "print a session's recommended config", cmd_export)
    s.add_argument("id", type=int, help="the session's id")
    s.add_argument(
        "--format",
        choices=["conf", "sql", "json", "rds", "cloudsql", "azure", "cnpg", "patroni"],
        default="conf",
        help="postgresql.conf lines, ALTER SYSTEM statements, JSON, or a managed service's "
        "form: rds (an aws rds modify-db-parameter-group file, also Aurora), cloudsql "
        "(gcloud --database-flags), azure (az parameter set lines), cnpg or patroni (YAML)",
    )
    add_remote(s)

    s = add_command(
        sub,
        "apply",
        "apply a session's recommendation to its target and check it took effect",
        cmd_apply,
    )
    s.add_argument("id", type=int, help="the session's id")
    s.add_argument(
        "--dry-run",
        action="store_true",
        help="only show the difference with the server's current settings",
    )
    s.add_argument(
        "--restart",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="restart the server where a knob needs it and the target has a "
        "restart method; --no-restart leaves such knobs pending (default: yes)",
    )
    s.add_argument(
        "--force", action="store_true", help="apply a gain the final check did not confirm"
    )
    add_remote(s)

    s = add_command(
        sub, "rollback", "put back the settings a session's apply replaced", cmd_rollback
    )
    s.add_argument("id", type=int, help="the session's id")
    s.add_argument("--dry-run", action="store_true", help="only show what would be put back")
    s.add_argument(
        "--yes",
        action="store_true",
        help="roll back although the server's settings changed since the apply",
    )
    add_remote(s)


def cmd_export(args: argparse.Namespace) -> int:
    with reader(args, f"no session {args.id}: ") as api:
        text = api.call("GET", f"/api/v1/sessions/{args.id}/config", params={"format": args.format})
    sys.stdout.write(text if isinstance(text, str) else json.dumps(text, indent=2))
    return 0


def _print_apply(res: dict[str, Any]) -> None:
    rows = res["changes"]
    if rows:
        width = max(4, *(len(c["knob"]) for c in rows))
        print(f"  {'knob':<{width}}  {'now':>12}     {'new':<12} note")
        for c in rows:
            note = "needs a restart" if c["needs_restart"] and c["changes"] else ""
            if not c["changes"]:
                note = "already so"
            print(f"  {c['knob']:<{width}}  {c['current'] or '?':>12}  -> {c['new']:<12} {note}")
    for k, (a, b) in (res.get("changed_since") or {}).items():
        print(f"  changed since the apply: {k}: {a} -> {b}")
    for v in res.get("verified") or []:
        state = "ok" if v["ok"] else "PENDING RESTART" if v["pending_restart"] else "NOT APPLIED"
        print(f"  pg_settings: {v['knob']} = {v['effective']} ({state})")
    for w in res.get("warnings") or []:
        print(f"  warning: {w}")
    print(res["message"])


def cmd_apply(args: argparse.Namespace) -> int:
    body = {"dry_run": args.dry_run, "restart": args.restart, "force": args.force}
    with reader(args, f"no session {args.id}: ") as api:
        res = api.call("POST", f"/api/v1/sessions/{args.id}/apply", json=body)
    _print_apply(res)
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    body = {"dry_run": args.dry_run, "confirm": args.yes}
    with reader(args, f"no session {args.id}: ") as api:
        res = api.call("POST", f"/api/v1/sessions/{args.id}/rollback", json=body)
    _print_apply(res)
    return 0
