"""``knobtune targets`` (list, add, remove), and finding a target for other commands:
by name, or by DSN (registered if new)."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from typing import Any

from app.cli.shared import (
    Api,
    CliError,
    Subparsers,
    UsageError,
    add_action,
    add_command,
    add_json,
    add_profile,
    add_remote,
    add_server_facts,
    connect,
    print_json,
    reader,
)

CLI_METHOD = "cli"  # the in-process service's method made from --restart-command


def register(sub: Subparsers) -> None:
    t = add_command(
        sub, "targets", "list, add or remove the servers knobtune may tune", cmd_targets
    )
    # `knobtune targets` alone lists them; the options belong to each action
    t.set_defaults(server=None, token=os.environ.get("KNOBTUNE_API_TOKEN"), database_url=None)
    add_json(t)  # `knobtune targets --json`
    tsub = t.add_subparsers(dest="action", metavar="ACTION")
    s = add_action(tsub, "list", "list the registered targets", cmd_targets)
    add_json(s, default=argparse.SUPPRESS)  # keeps `targets --json list`'s
    add_remote(s)
    s = add_action(
        tsub,
        "add",
        "register a server: knobtune checks it can connect and run ALTER SYSTEM",
        cmd_targets_add,
    )
    _add_arguments(s)
    s = add_action(tsub, "remove", "unregister a target", cmd_targets_remove)
    s.add_argument("name", help="the target's name (or id)")
    keep = s.add_mutually_exclusive_group()
    keep.add_argument(
        "--keep-history",
        action="store_true",
        help="keep its sessions and trials listed (needed when it has any)",
    )
    keep.add_argument(
        "--drop-history", action="store_true", help="delete its sessions and trials with it"
    )
    add_remote(s)


def cmd_targets(args: argparse.Namespace) -> int:
    with reader(args) as api:
        targets = api.call("GET", "/api/v1/targets")
    if args.json:
        print_json(targets)
        return 0
    if not targets:
        print(
            "no targets; register one with 'knobtune targets add NAME --dsn DSN'", file=sys.stderr
        )
        return 0
    width = max(4, *(len(t["name"]) for t in targets))
    print(f"{'name':<{width}}  {'server':<16} {'state':<14} connection")
    for t in targets:
        version = " ".join((t["server_version"] or "?").split(" ")[:2])
        state = f"busy: session {t['busy_session_id']}" if t["busy_session_id"] else "idle"
        print(f"{t['name']:<{width}}  {version:<16} {state:<14} {t['dsn']}")
    return 0


def _add_arguments(s: argparse.ArgumentParser) -> None:
    """``targets add``: the server, how it restarts, what it runs on."""
    s.add_argument("name", help="a name to refer to it by (letters, digits, - _ . and spaces)")
    s.add_argument(
        "--dsn",
        help="libpq connection string or URI of a superuser (or a user granted "
        "ALTER SYSTEM on the knobs)",
    )
    s.add_argument(
        "--sandbox",
        action="store_true",
        help="instead of --dsn: a new local cluster managed by the service",
    )
    s.add_argument(
        "--pg-version",
        type=int,
        metavar="N",
        help="a new sandbox's PostgreSQL major version, one installed on the service's "
        "host (default: KNOBTUNE_PG_BINDIR's, else the system's PostgreSQL)",
    )
    s.add_argument(
        "--recommend-only",
        action="store_true",
        help="with --dsn: a server knobtune never changes (a managed database: RDS, Cloud "
        "SQL, Azure); no ALTER SYSTEM rights needed; it is tuned through a twin sandbox",
    )
    add_profile(s)
    s.add_argument(
        "--restart-method",
        help="name of a restart method configured on the service (KNOBTUNE_RESTART_METHODS); "
        "else knobs that need a restart are skipped",
    )
    s.add_argument(
        "--restart-command",
        metavar="CMD",
        help="in-process only: how this host restarts the server, run as argv without a "
        "shell (e.g. 'sudo -n systemctl restart postgresql'); a --server restarts with the "
        "methods its operator configured: give --restart-method",
    )
    s.add_argument(
        "--data-dir",
        metavar="DIR",
        help="the server's data directory when it is on this host (checks a "
        "config with 'postgres -C' before a restart)",
    )
    add_server_facts(s)
    add_remote(s)


def cmd_targets_add(args: argparse.Namespace) -> int:
    if args.profile is not None or args.pg_version is not None:
        args.sandbox = True
    if bool(args.dsn) == bool(args.sandbox):
        raise UsageError("give --dsn DSN (a server of yours) or --sandbox (a new local one)")
    body: dict[str, Any] = {"name": args.name}
    if args.dsn:
        body["dsn"] = args.dsn
    else:
        sandbox: dict[str, Any] = {"profile": args.profile} if args.profile else {}
        if args.pg_version is not None:
            sandbox["version"] = args.pg_version
        body["sandbox"] = sandbox or True
    if args.recommend_only:
        body["recommend_only"] = True
    methods = cli_restart(args)
    if args.restart_method:
        body["restart_method"] = args.restart_method
    if args.data_dir:
        body["data_dir"] = args.data_dir
    if args.ram_gib:
        body["ram_bytes"] = int(args.ram_gib * 2**30)
    if args.cpus:
        body["cpus"] = args.cpus
    with connect(
        args.server,
        args.token,
        database_url=args.database_url,
        run_scheduler=False,
        restart_methods=methods,
    ) as api:
        t = api.call("POST", "/api/v1/targets", json=body)
    version = " ".join((t["server_version"] or "?").split(" ")[:2])
    restart = (
        f"restarts with method {t['restart_method']!r}"
        if t["restart_method"]
        else "no restart method: knobs that need a restart are skipped"
    )
    if t.get("recommend_only"):
        restart = "recommend-only: never changed; tune a twin sandbox for it"
    print(f"target {t['name']} registered: {version}, {t['dsn']}; {restart}")
    if t.get("hardware_note"):
        print(f"memory and CPUs: {t['hardware_note']}")
    return 0


def cmd_targets_remove(args: argparse.Namespace) -> int:
    history = "keep" if args.keep_history else "drop" if args.drop_history else None
    with reader(args) as api:
        t = find_target(api, args.name)
        params = {"history": history} if history else {}
        api.call("DELETE", f"/api/v1/targets/{t['id']}", params=params)
    kept = " (its sessions stay listed)" if history == "keep" else ""
    print(f"target {t['name']} removed{kept}")
    return 0


def cli_restart(args: argparse.Namespace) -> dict[str, Any] | None:
    """--restart-command: a method of the in-process service, run as argv (no shell)."""
    command = getattr(args, "restart_command", None)
    if not command:
        return None
    if args.server:
        raise UsageError(
            "--restart-command configures the in-process service only; a running service "
            "restarts targets with the methods its operator configured "
            "(KNOBTUNE_RESTART_METHODS): give --restart-method NAME"
        )
    if args.restart_method:
        raise UsageError("give --restart-command or --restart-method, not both")
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise UsageError(f"--restart-command: {exc}") from None
    if not argv:
        raise UsageError("--restart-command is empty")
    args.restart_method = CLI_METHOD
    return {CLI_METHOD: {"kind": "command", "argv": argv}}


def target_name_for(dsn: str) -> str:
    """A readable target name from a DSN: host-port-dbname ("db5.example.com-5432-shop")."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(dsn)
    except Exception:
        params = {}
    host = str(params.get("host") or params.get("hostaddr") or "local")
    if host.startswith("/"):
        host = "local"  # a unix socket directory says nothing to a reader
    parts = [host, str(params.get("port") or ""), str(params.get("dbname") or "")]
    name = "-".join(p for p in parts if p)
    return re.sub(r"[^A-Za-z0-9_.\- ]+", "_", name)[:180] or "target"


def find_or_create_target(api: Api, args: argparse.Namespace) -> dict[str, Any]:
    """The target registered for ``args.dsn`` (found by its masked DSN), else a new one."""
    from app.postgres.dsn import mask_dsn

    targets = api.call("GET", "/api/v1/targets")
    if args.name:
        for t in targets:
            if t["name"] == args.name:
                return dict(t)
    shown = mask_dsn(args.dsn)
    for t in targets:
        if t["dsn"] == shown:  # a second `tune` of the same server finds its target
            return dict(t)
    name = args.name or target_name_for(args.dsn)
    taken = {t["name"] for t in targets}
    base, n = name, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    body: dict[str, Any] = {"name": name, "dsn": args.dsn}
    if getattr(args, "restart_method", None):
        body["restart_method"] = args.restart_method
    if args.ram_gib:
        body["ram_bytes"] = int(args.ram_gib * 2**30)
    if args.cpus:
        body["cpus"] = args.cpus
    return dict(api.call("POST", "/api/v1/targets", json=body))


def find_target(api: Api, ref: str) -> dict[str, Any]:
    """A registered target by name (or id)."""
    targets = api.call("GET", "/api/v1/targets")
    for t in targets:
        if t["name"] == ref or (ref.isdigit() and t["id"] == int(ref)):
            return dict(t)
    names = ", ".join(t["name"] for t in targets) or "none registered yet"
    raise CliError(
        f"no target {ref!r} (targets: {names}); register it with "
        "'knobtune targets add NAME --dsn DSN'"
    )
