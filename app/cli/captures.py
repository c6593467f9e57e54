"""``knobtune capture`` (log every statement a target runs for a while) and ``knobtune
captures`` (list, show, import, download, delete), and finding a capture by name."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from app.cli.follow import follow_job
from app.cli.shared import (
    EXIT_FAILED,
    Api,
    CliError,
    Subparsers,
    UsageError,
    add_action,
    add_command,
    add_remote,
    connect,
    error_detail,
    existing_metadata_db,
    fail,
    reader,
)
from app.cli.targets import find_target


def register(sub: Subparsers) -> None:
    s = add_command(
        sub,
        "capture",
        "log every statement a target runs for a while (its settings are put back), to "
        "replay it as the benchmark",
        cmd_capture,
    )
    s.add_argument(
        "--target", required=True, metavar="NAME", help="a registered target's name (or id)"
    )
    s.add_argument(
        "--minutes",
        type=float,
        required=True,
        metavar="N",
        help="how long to log every statement, in minutes: 1/6 (10 s) to 120, fractions "
        "allowed (0.5 = 30 s)",
    )
    s.add_argument(
        "--database",
        metavar="DB",
        help="the database whose statements are kept (default: the target DSN's database)",
    )
    s.add_argument(
        "--name",
        help="the capture's name: a letter, then letters, digits, _ . - (default: the "
        "target's name and the time)",
    )
    add_remote(s)
    _register_captures(sub)


def _register_captures(sub: Subparsers) -> None:
    """``knobtune captures`` and its actions."""
    c = add_command(
        sub, "captures", "list, show, import, download or delete captures", cmd_captures
    )
    # `knobtune captures` alone lists them; the options belong to each action
    c.set_defaults(
        server=None, token=os.environ.get("KNOBTUNE_API_TOKEN"), database_url=None, limit=50
    )
    csub = c.add_subparsers(dest="action", metavar="ACTION")
    s = add_action(csub, "list", "list the captures, newest first", cmd_captures)
    s.add_argument("--limit", type=int, default=50, metavar="N", help="how many to list")
    add_remote(s)
    s = add_action(
        csub, "show", "a capture's summary: sessions, statements, top queries", cmd_captures_show
    )
    s.add_argument("id", metavar="ID", help="the capture's id (or name)")
    add_remote(s)
    s = add_action(csub, "delete", "delete a capture and its log file", cmd_captures_delete)
    s.add_argument("id", metavar="ID", help="the capture's id (or name)")
    add_remote(s)
    s = add_action(
        csub,
        "import",
        "upload a server log you captured yourself (read here and sent, plain or gzip)",
        cmd_captures_import,
    )
    s.add_argument(
        "file",
        metavar="FILE",
        help="the server's log: stderr format with log_line_prefix '%%m|%%u|%%d|%%c|' and "
        "log_statement = 'all', or a csvlog; plain or .gz",
    )
    s.add_argument(
        "--name",
        required=True,
        help="the capture's name: a letter, then letters, digits, _ . -",
    )
    s.add_argument(
        "--database",
        metavar="DB",
        help="the database whose statements to keep (default: the only one in the log)",
    )
    add_remote(s)
    s = add_action(
        csub,
        "download",
        "write a capture's log (the statements with their values) to a file",
        cmd_captures_download,
    )
    s.add_argument("id", metavar="ID", help="the capture's id (or name)")
    s.add_argument(
        "--out",
        metavar="FILE",
        help="where to write it, gzip, mode 0600 (default: to standard output, when that is "
        "not a terminal)",
    )
    s.add_argument(
        "--force",
        action="store_true",
        help="replace FILE if it exists; write into a directory holding a postgresql.conf",
    )
    add_remote(s)


def find_capture(api: Api, ref: str) -> dict[str, Any]:
    """A capture by name (or id)."""
    captures = api.call("GET", "/api/v1/captures", params={"limit": 1000})
    for c in captures:
        if c["name"] == ref:
            return dict(c)
    for c in captures:
        if ref.isdigit() and c["id"] == int(ref):
            return dict(c)
    names = ", ".join(c["name"] for c in captures[:10]) or "none yet"
    raise CliError(f"no capture {ref!r} (captures: {names}); list them with 'knobtune captures'")


def capture_name_for(target: str) -> str:
    """A default capture name: the target's name and the time (a letter first)."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", target).strip("-.") or "capture"
    if not base[0].isalpha():
        base = f"capture-{base}"
    return f"{base[:80]}-{time.strftime('%Y%m%d-%H%M%S')}"


def _capture_lines(c: dict[str, Any]) -> list[str]:
    size = f"{c['raw_bytes'] / 1e6:.1f} MB of log" if c["raw_bytes"] is not None else "no log"
    where = f"target {c['target_name'] or c['target_id']}" if c["source"] == "live" else "import"
    lines = [
        f"capture {c['id']} {c['name']!r} ({where}, database {c['database']}): {c['status']}"
        + (f", {size}" if c["status"] not in ("queued", "running") else f" ({c['phase']})"),
    ]
    if c["error"]:
        lines.append(f"error: {c['error']}")
    lines += [f"note: {n}" for n in c["notes"]]
    if c["summary"]:
        lines.append(c["summary_text"])
    return lines


def cmd_capture(args: argparse.Namespace) -> int:
    """Log every statement of a target for a while, then put its settings back."""
    url = args.database_url
    if not args.server:
        url = existing_metadata_db(args, f"no target {args.target!r}: ")
    with connect(args.server, args.token, database_url=url) as api:
        target = find_target(api, args.target)
        body: dict[str, Any] = {
            "target_id": target["id"],
            "name": args.name or capture_name_for(target["name"]),
            "seconds": round(args.minutes * 60),
        }
        if args.database:
            body["database"] = args.database
        cap = api.call("POST", "/api/v1/captures", json=body)
        print(
            f"capture {cap['id']} {cap['name']!r} started on {target['name']} (database "
            f"{cap['database']}): every statement is logged for {body['seconds']} s; "
            "Ctrl-C stops it early and restores the settings",
            file=sys.stderr,
        )
        cap = _follow_capture(api, int(cap["id"]))
    for line in _capture_lines(cap):
        print(line)
    if cap["status"] == "failed":
        fail(CliError(f"capture failed: {cap['error']}"))
        return EXIT_FAILED
    if cap["status"] == "cancelled":
        print(
            "cancelled: the logging settings were restored; the capture keeps the statements "
            "logged until then",
            file=sys.stderr,
        )
        return 130
    return 0


def _follow_capture(api: Api, capture_id: int) -> dict[str, Any]:
    """Poll until the capture ends; Ctrl-C or SIGTERM cancel it (its settings are restored)."""
    return follow_job(
        api,
        f"/api/v1/captures/{capture_id}",
        "interrupted: cancelling the capture; restoring the settings",
    )


def cmd_captures(args: argparse.Namespace) -> int:
    with reader(args) as api:
        rows = api.call("GET", "/api/v1/captures", params={"limit": args.limit})
    if not rows:
        print(
            "no captures; start one with 'knobtune capture --target NAME --minutes N', or "
            "import a log with 'knobtune captures import FILE --name NAME'",
            file=sys.stderr,
        )
        return 0
    width = max(4, *(len(c["name"]) for c in rows))
    print(
        f"{'id':>4}  {'name':<{width}}  {'source':<12} {'database':<12} {'status':<10} "
        f"{'statements':>10} {'log MB':>7}"
    )
    for c in rows:
        source = c["target_name"] or ("import" if c["source"] == "import" else "-")
        stmts = f"{c['summary']['statements']:,}" if (c["summary"] or {}).get("statements") else "-"
        mb = f"{c['raw_bytes'] / 1e6:.1f}" if c["raw_bytes"] is not None else "-"
        print(
            f"{c['id']:>4}  {c['name']:<{width}}  {source:<12} {c['database']:<12} "
            f"{c['status']:<10} {stmts:>10} {mb:>7}"
        )
    return 0


def cmd_captures_show(args: argparse.Namespace) -> int:
    with reader(args, f"no capture {args.id}: ") as api:
        cap = find_capture(api, args.id)
    for line in _capture_lines(cap):
        print(line)
    return 0


def cmd_captures_delete(args: argparse.Namespace) -> int:
    with reader(args, f"no capture {args.id}: ") as api:
        cap = find_capture(api, args.id)
        api.call("DELETE", f"/api/v1/captures/{cap['id']}")
    print(f"capture {cap['id']} {cap['name']!r} deleted, its log file with it")
    return 0


def cmd_captures_import(args: argparse.Namespace) -> int:
    """Upload a server log the user captured: read here, on the client, never by the service."""
    import gzip

    try:
        data = Path(args.file).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror or exc}") from None
    if data[:2] != b"\x1f\x8b":
        data = gzip.compress(data, compresslevel=6)  # a smaller upload; the service gunzips
    params = {"name": args.name}
    if args.database:
        params["database"] = args.database
    with connect(
        args.server, args.token, database_url=args.database_url, run_scheduler=False
    ) as api:
        cap = api.call(
            "POST",
            "/api/v1/captures/import",
            params=params,
            content=data,
            headers={"Content-Type": "application/gzip"},
            timeout=600,
        )
    for line in _capture_lines(cap):
        print(line)
    return 0


def cmd_captures_download(args: argparse.Namespace) -> int:
    """The captured log itself (the statements with their values), gzip-compressed."""
    with reader(args, f"no capture {args.id}: ") as api:
        cap = find_capture(api, args.id)
        try:
            r = api.client.get(f"/api/v1/captures/{cap['id']}/log")
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach the knobtune service: {exc}") from exc
    if r.status_code >= 400:
        raise CliError(error_detail(r))
    if args.out is None:
        if sys.stdout.isatty():
            raise UsageError(
                "the log is gzip data: give --out FILE, or redirect the output to a file"
            )
        sys.stdout.buffer.write(r.content)
        sys.stdout.flush()
        return 0
    from app.outfiles import OutputRefused, check_dir, write_file

    out = Path(args.out).expanduser()
    try:
        check_dir(out.parent, force=args.force)
        write_file(out, r.content, mode=0o600, force=args.force)  # it holds user data
    except OutputRefused as exc:
        raise CliError(f"--out: {exc}") from None
    except OSError as exc:
        raise CliError(f"cannot write {out}: {exc.strerror or exc}") from None
    print(f"capture {cap['id']}'s log written to {out} (gzip, mode 0600: it holds the data)")
    return 0
