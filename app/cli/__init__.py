"""The ``knobtune`` command line.

Every command talks to the REST API: to a running service (``--server``) or to
the same app run in-process (FastAPI's ASGI client starts it with its
scheduler), so the CLI and the service share one code path.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from app.cli.follow import follow, follow_job
from app.cli.shared import (
    EXIT_BY_OUTCOME,
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Api,
    CliError,
    Help,
    UsageError,
    clients_arg,
    connect,
    duration,
    error_detail,
    existing_metadata_db,
    fail,
    out_dir,
    print_json,
    read_script,
    reader,
    write_text,
)
from app.postgres.cgroups import PROFILES, CgroupUnavailable, Limits, ProfileError, resolve
from optimizer.render import status_label

CLI_METHOD = "cli"  # the in-process service's method made from --restart-command
DEMO_SORT_SQL = (
    "\\set a random(1, 100000 * :scale - 60000)\n"
    "SELECT aid FROM (SELECT aid, filler FROM pgbench_accounts "
    "WHERE aid BETWEEN :a AND :a + 60000 ORDER BY filler DESC, aid) s OFFSET 59990;\n"
)


def session_files(out: Path, session_id: int) -> list[Path]:
    """A session's files in ``out``: its config, chart and record (the API's session), named
    so that none can pass for a live postgresql.conf."""
    return [out / f"knobtune-session-{session_id}.{ext}" for ext in ("conf", "svg", "json")]


def write_outputs(api: Api, sess: dict[str, Any], out: Path, *, force: bool) -> list[Path]:
    """The session's config, chart and record into ``out`` (see app/outfiles.py); their
    paths as ``out`` was given."""
    from app.chart import final_label, points_of, render_svg
    from app.outfiles import OutputRefused, check_dir, check_free
    from app.sessions.summary import chart_axis

    session_id = int(sess["id"])
    paths = session_files(out, session_id)
    try:
        check_dir(out, force=force)  # again: the directory may have changed meanwhile
        check_free(paths, force=force)  # all or none
        out.mkdir(parents=True, exist_ok=True)
    except OutputRefused as exc:
        raise CliError(
            f"{exc} (the session is stored: 'knobtune export {session_id}' prints its config)"
        ) from None
    conf = api.call("GET", f"/api/v1/sessions/{session_id}/config")
    trials = api.call("GET", f"/api/v1/sessions/{session_id}/trials")
    axis, unit = chart_axis(str(sess["request"].get("objective", "throughput")))
    chart = render_svg(
        points_of(trials, unit=unit),
        baseline=sess["baseline_tps"] if unit == "tps" else None,
        title=f"knobtune session {session_id}: {axis.split(' (')[0]}",
        final_label=final_label(sess),
        axis=axis,
        unit=unit,
    )
    record = json.dumps(sess, indent=2) + "\n"
    for path, text in zip(paths, (conf, chart, record), strict=True):
        write_text(path, text, force=force)
    return paths


# -- commands ------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    import app.main  # noqa: F401  (the service's modules, loaded before the freeze below)
    from app.db import Database, upgrade
    from app.main import check_key, secure_startup, uvicorn_options
    from app.settings import get_settings
    from app.vault import SecretKeyError

    settings = get_settings()
    try:
        secure_startup(settings)  # private files and the key, before the DB is created
        upgrade(settings.database_url)
        db = Database(settings.database_url)
        try:  # here too, so that a refusal is one line, not uvicorn's startup traceback
            check_key(settings, db)
        finally:
            db.dispose()
    except SecretKeyError as exc:
        raise CliError(str(exc)) from None
    # What is loaded now (modules, classes, mappers) lives as long as the process. Out of
    # the collector's sight, a full collection no longer stops every thread for ~125 ms
    # (most of the pollers' p99 in bench/api_load.py).
    gc.collect()
    gc.freeze()
    uvicorn.run(
        "app.main:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        # proxy headers from KNOBTUNE_TRUSTED_PROXIES only; a deadline for request headers
        **uvicorn_options(settings),
    )
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from app.db import downgrade, upgrade
    from app.settings import get_settings

    url = get_settings().database_url
    if args.action == "adopt-key":
        return _adopt_key()
    if args.action == "upgrade":
        upgrade(url, args.revision or "head")
    else:
        downgrade(url, args.revision or "base")
    default = "head" if args.action == "upgrade" else "base"
    print(f"metadata DB {args.action}d to {args.revision or default}")
    return 0


def _adopt_key() -> int:
    """``knobtune db adopt-key``: this process's key becomes the metadata DB's; the keys
    it lacks are given up (lost for good: app/vault.py)."""
    from app import vault
    from app.db import Database, upgrade
    from app.main import service_key
    from app.settings import get_settings

    settings = get_settings()
    try:
        key, source = service_key(settings)
    except vault.SecretKeyError as exc:
        raise CliError(str(exc)) from None
    upgrade(settings.database_url)
    db = Database(settings.database_url)
    try:
        dropped = vault.adopt_key(db.engine, key, source=source, instance=settings.instance_id)
    finally:
        db.dispose()
    print(f"the metadata DB's secrets now need only this key ({source})")
    for fp in dropped:
        print(f"  gave up key {fp[:12]}: DSNs it encrypted must be registered again")
    return 0


def _session_body(args: argparse.Namespace, target_id: int) -> dict[str, Any]:
    """The session request: only what the user gave; the workload's own defaults fill in
    the rest (TPC-H's power test is one client, whatever pgbench's default is)."""
    given = {
        "clients": args.clients,
        "jobs": args.jobs,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "scale": args.scale,
        "init": args.init,
        "isolation": args.isolation,
        "max_tries": args.max_tries,
        "mode": args.mode,
        "olap_clients": args.olap_clients,
        "queries": [q.strip() for q in args.queries.split(",")] if args.queries else None,
    }
    workload: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    if isinstance(args.clients, int) and args.jobs is not None and args.jobs > args.clients:
        workload["jobs"] = args.clients
    if args.builtin:
        workload["builtin"] = args.builtin
    if args.script:
        workload["scripts"] = [{"sql": read_script(f), "weight": 1} for f in args.script]
    replay = getattr(args, "replay_id", None)
    if replay is not None:  # a captured workload replayed as the benchmark (issue 28)
        workload["replay"] = replay
        if args.speed is not None:
            workload["speed"] = args.speed
        if args.replay_database is not None:
            workload["replay_database"] = args.replay_database
    body: dict[str, Any] = {"target_id": target_id, "workload": workload}
    options = {
        "max_trials": args.max_trials,
        "min_gain": args.min_gain,
        "on_finish": args.on_finish,
        "objective": args.objective,
        "workload_kind": args.workload_kind,
        "time_budget_s": args.time_budget,
        "allow_unsafe": args.allow_unsafe or None,
        "hints": args.hints,
        "start": args.start,
        "final_check_runs": args.final_check_runs,
        "seed": args.seed,
    }
    body.update({k: v for k, v in options.items() if v is not None})
    if args.knobs:
        body["knobs"] = [k.strip() for k in args.knobs.split(",") if k.strip()]
    return body


def cmd_demo(args: argparse.Namespace) -> int:
    from app.outfiles import OutputRefused, check_free
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
                    "jobs": min(2, args.clients),
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
                return _report(api, final, out, force=args.force, demo=True)


def _profile_limits(name: str | None) -> Limits | None:
    """The limits of a named hardware profile (None: no profile)."""
    if name is None:
        return None
    try:
        return resolve(profile=name)
    except ProfileError as exc:  # e.g. more memory than this host has
        raise CliError(f"--profile {name}: {exc}") from None


def _report(
    api: Api, final: dict[str, Any], out: Path | None, *, force: bool, demo: bool = False
) -> int:
    """The end of a tune or demo: the result in plain words, the files written (only with
    --out), and the exit status of the session's outcome."""
    from app.sessions.summary import outcome

    result = final.get("outcome") or outcome(
        final["status"],
        final.get("gain_status"),
        final.get("start_config"),
        final.get("best_config"),
    )  # the API's; computed alike for a service older than the field
    if result == "cancelled":
        print("cancelled: the target was restored", file=sys.stderr)
        return EXIT_INTERRUPTED
    if result == "failed":
        fail(CliError(f"session failed: {final['error']}"))
        return EXIT_FAILED
    for line in report_lines(final):
        print(line)
    if out is not None:
        for what, path in zip(
            ("config", "chart", "record"), write_outputs(api, final, out, force=force), strict=True
        ):
            print(f"{what}: {path}")
    elif demo:
        print("no file written: --out DIR keeps the config, the chart and the session's record")
    else:
        sid = final["id"]
        print(
            f"no file written: 'knobtune export {sid} > knobtune-session-{sid}.conf' prints "
            "the config (--out DIR writes it with the chart and the session's record)"
        )
    return EXIT_BY_OUTCOME.get(result or "", EXIT_ERROR)


def report_lines(final: dict[str, Any]) -> list[str]:
    """The result a finished tune or demo prints (the API's session): README's sample."""
    return result_lines(final) + evidence_lines(final)


def result_lines(sess: dict[str, Any]) -> list[str]:
    """What was found (one figure in the objective's units), how sure, what to do next."""
    from app.sessions.summary import changed_knobs

    lines = [
        f"session {sess['id']} on {sess.get('target_name') or sess['target_id']}: "
        f"{sess['status']} ({sess['phase']})"
    ]
    label = status_label(sess.get("gain_status"))
    if sess.get("headline"):
        lines.append(f"result: {sess['headline']}{', ' + label if label else ''}")
    elif label:
        lines.append(f"result: {label}")
    objective = str(sess["request"].get("objective", "throughput"))
    if objective == "throughput" and sess.get("baseline_tps") and sess.get("best_tps"):
        lines.append(
            f"throughput: {sess['baseline_tps']:.1f} tps at the start, {sess['best_tps']:.1f} "
            "tps with the recommendation (medians of the runs that decided it)"
        )
    changes = changed_knobs(sess.get("start_config"), sess.get("best_config"))
    if changes and sess.get("gain_status") not in ("none", "no-change"):
        lines.append(f"recommended: {changes}")
    if sess.get("summary"):
        lines.append(sess["summary"])
    return lines


def evidence_lines(final: dict[str, Any]) -> list[str]:
    """Per stream (start and best) and per label (best vs start) tables for the summary."""
    from app.sessions.export import label_line, stream_line

    lines: list[str] = []
    streams = final.get("per_stream") or []
    if streams:
        lines.append("per stream (median over runs):")
        for row in streams:
            lines.append(f"  {row['stream']:<12} {row['config']:<5} {stream_line(row)}")
    labels = final.get("per_label") or []
    if labels:
        lines.append(
            f"mean latency per label, best vs start ({final.get('per_label_status') or '?'}):"
        )
        width = max(len(f"{c['stream']}/{c['label']}") for c in labels)
        for c in labels:
            where = f"{c['stream']}/{c['label']}"
            lines.append(f"  {where:<{width}}  {label_line(c)}")
    return lines


def _cli_restart(args: argparse.Namespace) -> dict[str, Any] | None:
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


def cmd_tune(args: argparse.Namespace) -> int:
    if (args.target is None) == (args.dsn is None):
        raise UsageError("give --target NAME (a registered target) or --dsn DSN, one of them")
    if args.server and not args.follow and args.out is not None:
        raise UsageError("--out writes a session's files when it ends: add --follow")
    out = out_dir(args)  # refused now, not after the session
    url = args.database_url
    if args.target is not None and not args.server:
        url = existing_metadata_db(args, f"no target {args.target!r}: ")
    methods = _cli_restart(args)
    with connect(args.server, args.token, database_url=url, restart_methods=methods) as api:
        if args.target is not None:
            target = find_target(api, args.target)
        else:
            target = _find_or_create_target(api, args)
        if args.replay is not None:
            args.replay_id = find_capture(api, args.replay)["id"]
        elif args.speed is not None or args.replay_database is not None:
            raise UsageError("--speed and --replay-database go with --replay CAPTURE")
        body = _session_body(args, target["id"])

        def started(sess: dict[str, Any]) -> str:
            return f"session {sess['id']} started on {target['name']}"

        if args.server and not args.follow:
            sess = api.call("POST", "/api/v1/sessions", json=body)
            print(started(sess), file=sys.stderr)
            print(sess["id"])
            return 0
        final = follow(api, body, started)
        return _report(api, final, out, force=args.force)


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


def _find_or_create_target(api: Api, args: argparse.Namespace) -> dict[str, Any]:
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


def _result_cell(s: dict[str, Any]) -> str:
    """ "throughput +12.0% confirmed", "no change recommended", "-" (running)."""
    from app.sessions.summary import headline

    status = s.get("gain_status")
    if status in ("none", "no-change"):
        return "no change recommended"
    head = headline(str(s["request"].get("objective", "throughput")), s.get("gain"))
    if head is None:
        return "-"
    label = {"confirmed": "confirmed", "not-credible": "not credible"}.get(status or "", "")
    return f"{head} {label or (status or '').upper()}".strip()


def cmd_sessions(args: argparse.Namespace) -> int:
    with reader(args) as api:
        rows = api.call("GET", "/api/v1/sessions", params={"limit": args.limit})
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        where = args.server or "this metadata DB"
        print(
            f"no sessions in {where}; start one with 'knobtune tune --target NAME' or "
            "POST /api/v1/sessions",
            file=sys.stderr,
        )
        return 0
    width = max(6, *(len(s.get("target_name") or str(s["target_id"])) for s in rows))
    print(f"{'id':>5}  {'target':<{width}}  {'status':<10} {'result':<40} phase")
    for s in rows:
        target = s.get("target_name") or str(s["target_id"])
        print(
            f"{s['id']:>5}  {target:<{width}}  {s['status']:<10} {_result_cell(s):<40} {s['phase']}"
        )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    with reader(args, f"no session {args.id}: ") as api:
        sess = api.call("GET", f"/api/v1/sessions/{args.id}")
        if args.json:
            print_json(sess)
            return 0
        applies = api.call("GET", f"/api/v1/sessions/{args.id}/applies")
    print("\n".join(status_lines(sess, applies)))
    return 0


def status_lines(sess: dict[str, Any], applies: list[dict[str, Any]]) -> list[str]:
    """What `knobtune status` prints for a session (the API's session and its applies)."""
    from app.sessions.summary import note_kind

    prog = sess["progress"]
    planned = prog["trials_planned"]
    lines = result_lines(sess)
    done = f"{prog['trials_done']}" + (f" of ~{planned}" if planned else "")
    elapsed = f", {prog['elapsed_s']:.0f} s" if prog["elapsed_s"] is not None else ""
    eta = f", about {prog['eta_s']:.0f} s left" if prog["eta_s"] is not None else ""
    lines.insert(1, f"progress: {done} trials{elapsed}{eta}")
    if sess.get("error"):
        lines.append(f"error: {sess['error']}")
    notes = [n for n in sess.get("notes") or [] if note_kind(str(n)) == "note"]
    warnings = [n for n in sess.get("notes") or [] if note_kind(str(n)) == "warning"]
    lines += [f"note: {n}" for n in notes] + [f"WARNING: {w}" for w in warnings]
    for ap in applies:
        lines.append(f"apply #{ap['id']} to {ap['target_name']}: {ap['message']}")
    return lines


def cmd_cancel(args: argparse.Namespace) -> int:
    with reader(args, f"no session {args.id}: ") as api:
        sess = api.call("POST", f"/api/v1/sessions/{args.id}/cancel")
    if sess["status"] == "cancelled":
        print(f"session {args.id} cancelled before it started: nothing to restore")
    else:
        print(
            f"session {args.id}: cancelling; the benchmark stops and the target is restored "
            f"(follow with: knobtune status {args.id})"
        )
    return 0


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
    methods = _cli_restart(args)
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


# -- captures (issue 28) ---------------------------------------------------------------
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
            target = _find_or_create_target(api, args)
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="knobtune",
        description="Tune PostgreSQL knobs by noise-aware coordinate descent. "
        "The flow: targets add, tune, status, apply (and rollback).",
        formatter_class=Help,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str, func: Any) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=text, description=text, formatter_class=Help)
        sp.set_defaults(func=func)
        return sp

    def remote(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--server",
            metavar="URL",
            help="a running knobtune service, e.g. http://127.0.0.1:8000 (default: run "
            "in-process on the metadata DB of the current directory)",
        )
        sp.add_argument(
            "--token",
            default=os.environ.get("KNOBTUNE_API_TOKEN"),
            help="the service's API token (default: $KNOBTUNE_API_TOKEN)",
        )
        sp.add_argument(
            "--database-url",
            metavar="URL",
            help="in-process: the metadata DB (default: $KNOBTUNE_DATABASE_URL, else "
            "sqlite:///knobtune.db in the current directory)",
        )

    def json_option(sp: argparse.ArgumentParser, default: Any = False) -> None:
        sp.add_argument(
            "--json",
            action="store_true",
            default=default,
            help="print the REST API's response as JSON (the same fields, passwords masked)",
        )

    def out_options(sp: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        sp.add_argument(
            "--out",
            metavar="DIR",
            help="write the session's files there: knobtune-session-N.conf (the config), .svg "
            "(the chart) and .json (its record); never into a data directory (default: no "
            "file)",
        )
        sp.add_argument(
            "--force",
            action="store_true",
            help="replace those files if they exist; write into a directory holding a "
            "postgresql.conf (default: refuse both)",
        )

    def server_facts(sp: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        sp.add_argument(
            "--ram-gib",
            type=float,
            metavar="GIB",
            help="the server's memory in GiB; needed when it is on another host (default: "
            "read from this host, or less where the server's cgroup limits it)",
        )
        sp.add_argument(
            "--cpus",
            type=int,
            metavar="N",
            help="the server's CPUs; needed when it is on another host (default: this host's)",
        )

    def profile_option(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--profile",
            choices=list(PROFILES),
            help="a new sandbox's hardware profile (a cgroup caps its memory, disk and "
            "CPUs like a small server's; docs/profiles.md): "
            + "; ".join(f"{n}: {p.limits.figures()}" for n, p in PROFILES.items()),
        )

    s = command(
        "serve", "run the REST service and dashboard (upgrades the metadata DB first)", cmd_serve
    )
    s.add_argument("--host", default="127.0.0.1", help="address to listen on")
    s.add_argument("--port", type=int, default=8000, help="TCP port")
    s.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    s.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level",
    )

    s = command("db", "migrate the metadata DB ($KNOBTUNE_DATABASE_URL)", cmd_db)
    s.add_argument(
        "action",
        choices=["upgrade", "downgrade", "adopt-key"],
        help="direction; adopt-key: this process's secret key becomes the DB's, giving up "
        "a lost one (the DSNs it encrypted must be registered again)",
    )
    s.add_argument(
        "revision", nargs="?", help="Alembic revision (default: head to upgrade, base to downgrade)"
    )

    s = command("demo", "tune a throw-away sandbox cluster and show the result", cmd_demo)
    out_options(s)
    s.add_argument("--knobs", default="work_mem", help="comma-separated knobs to tune")
    s.add_argument(
        "--duration",
        type=int,
        default=12,
        metavar="SECONDS",
        help="length of one benchmark run in seconds, warm-up included",
    )
    s.add_argument(
        "--warmup",
        type=int,
        default=2,
        metavar="SECONDS",
        help="seconds at the start of each run that are not measured",
    )
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
    profile_option(s)

    # -- targets
    t = command("targets", "list, add or remove the servers knobtune may tune", cmd_targets)
    # `knobtune targets` alone lists them; the options belong to each action
    t.set_defaults(server=None, token=os.environ.get("KNOBTUNE_API_TOKEN"), database_url=None)
    json_option(t)  # `knobtune targets --json`
    tsub = t.add_subparsers(dest="action", metavar="ACTION")
    s = tsub.add_parser("list", help="list the registered targets", formatter_class=Help)
    s.set_defaults(func=cmd_targets)
    json_option(s, default=argparse.SUPPRESS)  # keeps `targets --json list`'s
    remote(s)
    s = tsub.add_parser(
        "add",
        help="register a server: knobtune checks it can connect and run ALTER SYSTEM",
        formatter_class=Help,
    )
    s.set_defaults(func=cmd_targets_add)
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
    profile_option(s)
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
    server_facts(s)
    remote(s)
    s = tsub.add_parser("remove", help="unregister a target", formatter_class=Help)
    s.set_defaults(func=cmd_targets_remove)
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
    remote(s)

    # -- tune
    s = command("tune", "tune a server: benchmark candidates, keep what really helps", cmd_tune)
    where = s.add_argument_group("the server (one of)")
    where.add_argument("--target", metavar="NAME", help="a registered target's name (or id)")
    where.add_argument("--dsn", help="a libpq DSN: registered as a target if new")
    where.add_argument("--name", help="with --dsn: the new target's name (default: host-port-db)")
    where.add_argument(
        "--restart-method",
        metavar="NAME",
        help="with --dsn: a restart method configured on the service "
        "(KNOBTUNE_RESTART_METHODS); without one, knobs that need a restart are skipped",
    )
    where.add_argument(
        "--restart-command",
        metavar="CMD",
        help="with --dsn, in-process only: how this host restarts the server, run as argv "
        "without a shell; without it or --restart-method, restart knobs are skipped",
    )
    server_facts(where)
    wl = s.add_argument_group(
        "the workload (every option left out takes the workload's own default)"
    )
    wl.add_argument(
        "--builtin",
        choices=["tpcb-like", "simple-update", "select-only", "tpch", "tpcc", "chbench"],
        help="pgbench's builtin script, or a built-in workload with its own data: tpch "
        "(--scale = scale factor, e.g. 0.2), tpcc or chbench (--scale = warehouses) (default: "
        "tpcb-like without --script; with --script, your scripts only)",
    )
    wl.add_argument(
        "--script",
        action="append",
        metavar="FILE",
        help="your SQL in pgbench's script syntax, one transaction; repeatable (default: none)",
    )
    wl.add_argument(
        "--duration",
        type=int,
        metavar="SECONDS",
        help="length of one benchmark run, warm-up included (default: the "
        "workload's: 60 s, 120 s for tpch)",
    )
    wl.add_argument(
        "--warmup",
        type=int,
        metavar="SECONDS",
        help="seconds at the start of each run that are not measured (default: "
        "the workload's: 5 s, 10 s for tpch; at most a quarter of --duration)",
    )
    wl.add_argument(
        "--clients",
        type=clients_arg,
        metavar="N|auto",
        help='concurrent clients, or "auto": a client sweep first, then tune at its knee '
        "(default: the workload's: 8, 1 for TPC-H's power mode)",
    )
    wl.add_argument(
        "--jobs", type=int, metavar="N", help="pgbench threads, at most --clients (default: 2)"
    )
    wl.add_argument(
        "--scale",
        type=float,
        help="pgbench scale (x 100,000 accounts), TPC-H scale factor, or "
        "warehouses (default: the workload's: 10, 1 for tpch)",
    )
    wl.add_argument(
        "--init",
        action=argparse.BooleanOptionalAction,
        help="create pgbench's tables first (default: yes with a pgbench builtin, "
        "no for your scripts only)",
    )
    wl.add_argument(
        "--mode",
        choices=["power", "throughput"],
        help="tpch: power (1 client, queries in turn) or throughput (default: power)",
    )
    wl.add_argument(
        "--queries", help="tpch/chbench: comma-separated queries, e.g. Q1,Q6 (default: all)"
    )
    wl.add_argument(
        "--olap-clients",
        type=int,
        metavar="N",
        help="chbench: clients of the analytic stream (default: 1)",
    )
    wl.add_argument(
        "--isolation",
        choices=["read committed", "repeatable read", "serializable"],
        help="the benchmark sessions' isolation level (default: the server's)",
    )
    wl.add_argument(
        "--max-tries",
        type=int,
        metavar="N",
        help="pgbench --max-tries: tries of a transaction after a serialization "
        "failure (default: 1, 10 for tpcc/chbench)",
    )
    rp = s.add_argument_group("a captured workload (instead of --builtin/--script)")
    rp.add_argument(
        "--replay",
        metavar="CAPTURE",
        help="replay a capture's statements as the benchmark: its name or id (see 'knobtune "
        "captures') (default: none)",
    )
    rp.add_argument(
        "--speed",
        type=float,
        metavar="FACTOR",
        help="with --replay: how fast, relative to the capture's own pace, e.g. 2 = twice as "
        "fast (default: 1)",
    )
    rp.add_argument(
        "--replay-database",
        metavar="DB",
        help="with --replay: the database holding the starting data that the replay copies "
        "(default: the capture's database)",
    )
    search = s.add_argument_group("the search")
    search.add_argument(
        "--knobs",
        help="comma-separated knobs, tuned in this order (default: "
        "the catalogue's set for the workload)",
    )
    search.add_argument(
        "--workload-kind",
        choices=["write-heavy", "read-heavy", "mixed", "analytics"],
        help="picks the default knob set and the rule of thumb's hints "
        "(default: from the workload)",
    )
    search.add_argument(
        "--objective",
        choices=[
            "throughput",
            "latency_p95",
            "query_time_geomean",
            "query_time_total",
            "latency_mean",
        ],
        help="what a run is judged by (query times and latency: lower is better) (default: "
        "throughput; latency_mean for a replay)",
    )
    search.add_argument(
        "--max-trials",
        type=int,
        metavar="N",
        help="benchmark runs in all, final check included (default: 30)",
    )
    search.add_argument(
        "--time-budget",
        type=duration,
        metavar="DURATION",
        help="wall-clock limit: seconds, or 15m, 2h (default: none)",
    )
    search.add_argument(
        "--min-gain",
        type=float,
        metavar="FRACTION",
        help="smallest gain worth keeping, 0.02 = 2%% (default: 0.02)",
    )
    search.add_argument(
        "--final-check-runs",
        type=int,
        metavar="N",
        help="runs of the final check (start and best side by side), even; 0 "
        "leaves any gain unconfirmed (default: 6)",
    )
    search.add_argument(
        "--hints",
        action=argparse.BooleanOptionalAction,
        help="try PGTune-style values for this machine first, each judged "
        "like any candidate (default: yes)",
    )
    search.add_argument(
        "--start",
        choices=["current", "heuristic"],
        help="start from the server's current settings or from the rule of "
        "thumb's config (default: current)",
    )
    search.add_argument(
        "--allow-unsafe",
        action="store_true",
        help="also tune durability-unsafe knobs (synchronous_commit, fsync, "
        "full_page_writes): faster, but a crash can lose commits (default: no)",
    )
    search.add_argument(
        "--on-finish",
        choices=["restore", "apply_best"],
        help="at the end, restore the server's settings or leave the best "
        "config applied (default: restore; see also 'knobtune apply')",
    )
    search.add_argument("--seed", type=int, help="random seed of the search (default: random)")
    out = s.add_argument_group("output")
    out_options(out)
    out.add_argument(
        "--follow",
        action="store_true",
        help="with --server: show live progress instead of printing the session id",
    )
    remote(s)

    s = command("status", "a session's progress and result in plain words", cmd_status)
    s.add_argument("id", type=int, help="the session's id (see 'knobtune sessions')")
    json_option(s)
    remote(s)

    s = command("cancel", "stop a running session; the target is restored", cmd_cancel)
    s.add_argument("id", type=int, help="the session's id")
    remote(s)

    s = command("sessions", "list sessions, newest first, with their result", cmd_sessions)
    s.add_argument("--limit", type=int, default=20, metavar="N", help="how many to list")
    json_option(s)
    remote(s)

    s = command("export", "print a session's recommended config", cmd_export)
    s.add_argument("id", type=int, help="the session's id")
    s.add_argument(
        "--format",
        choices=["conf", "sql", "json", "rds", "cloudsql", "azure", "cnpg", "patroni"],
        default="conf",
        help="postgresql.conf lines, ALTER SYSTEM statements, JSON, or a managed service's "
        "form: rds (an aws rds modify-db-parameter-group file, also Aurora), cloudsql "
        "(gcloud --database-flags), azure (az parameter set lines), cnpg or patroni (YAML)",
    )
    remote(s)

    s = command(
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
    remote(s)

    s = command("rollback", "put back the settings a session's apply replaced", cmd_rollback)
    s.add_argument("id", type=int, help="the session's id")
    s.add_argument("--dry-run", action="store_true", help="only show what would be put back")
    s.add_argument(
        "--yes",
        action="store_true",
        help="roll back although the server's settings changed since the apply",
    )
    remote(s)

    # -- captures (issue 28)
    s = command(
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
    remote(s)

    c = command("captures", "list, show, import, download or delete captures", cmd_captures)
    # `knobtune captures` alone lists them; the options belong to each action
    c.set_defaults(
        server=None, token=os.environ.get("KNOBTUNE_API_TOKEN"), database_url=None, limit=50
    )
    csub = c.add_subparsers(dest="action", metavar="ACTION")
    s = csub.add_parser("list", help="list the captures, newest first", formatter_class=Help)
    s.set_defaults(func=cmd_captures)
    s.add_argument("--limit", type=int, default=50, metavar="N", help="how many to list")
    remote(s)
    s = csub.add_parser(
        "show", help="a capture's summary: sessions, statements, top queries", formatter_class=Help
    )
    s.set_defaults(func=cmd_captures_show)
    s.add_argument("id", metavar="ID", help="the capture's id (or name)")
    remote(s)
    s = csub.add_parser("delete", help="delete a capture and its log file", formatter_class=Help)
    s.set_defaults(func=cmd_captures_delete)
    s.add_argument("id", metavar="ID", help="the capture's id (or name)")
    remote(s)
    s = csub.add_parser(
        "import",
        help="upload a server log you captured yourself (read here and sent, plain or gzip)",
        formatter_class=Help,
    )
    s.set_defaults(func=cmd_captures_import)
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
    remote(s)
    s = csub.add_parser(
        "download",
        help="write a capture's log (the statements with their values) to a file",
        formatter_class=Help,
    )
    s.set_defaults(func=cmd_captures_download)
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
    remote(s)

    s = command("sweep", "find the client count where throughput stops rising", cmd_sweep)
    s.add_argument("--dsn", help="libpq DSN of the target (registered if new)")
    s.add_argument("--target", metavar="NAME", help="a registered target's name (or id)")
    s.add_argument("--name", help="with --dsn: the new target's name (default: host-port-db)")
    server_facts(s)
    s.add_argument(
        "--builtin",
        choices=["tpcb-like", "simple-update", "select-only"],
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
    s.add_argument(
        "--warmup",
        type=int,
        default=2,
        metavar="SECONDS",
        help="seconds at the start of each run that are not measured",
    )
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
    remote(s)

    # -- compare (issue 42)
    s = command(
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
        choices=[
            "throughput",
            "latency_p95",
            "query_time_geomean",
            "query_time_total",
            "latency_mean",
        ],
        help="what a run's level is, as for a session (default: throughput)",
    )
    s.add_argument(
        "--workload-kind",
        choices=["write-heavy", "read-heavy", "mixed", "analytics"],
        help="pgtune's database type (default: from the workload)",
    )
    s.add_argument(
        "--allow-unsafe",
        action="store_true",
        help="allow durability-unsafe knobs (fsync, synchronous_commit, full_page_writes) in "
        "a config (default: no)",
    )
    wl = s.add_argument_group("the workload, as a session's (each option left out: its default)")
    wl.add_argument(
        "--builtin",
        choices=["tpcb-like", "simple-update", "select-only", "tpch", "tpcc", "chbench"],
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
        choices=["read committed", "repeatable read", "serializable"],
        help="the benchmark sessions' isolation level (default: the server's)",
    )
    wl.add_argument(
        "--max-tries", type=int, metavar="N", help="pgbench --max-tries (default: 1, 10 for tpcc)"
    )
    json_option(s)
    remote(s)
    return p


def _terminate(_sig: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def unwind_on_sigterm() -> None:
    """SIGTERM (kill, timeout, systemd) unwinds like Ctrl-C from here on, so that
    with-blocks clean up: a demo's or a bench script's sandbox is removed, never orphaned
    (Python's default SIGTERM ends the process without running them). The live view
    installs its own handler while it runs."""
    signal.signal(signal.SIGTERM, _terminate)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    unwind_on_sigterm()
    try:
        return int(args.func(args))
    except CliError as exc:
        fail(exc)
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_ERROR
    except KeyboardInterrupt:
        print("knobtune: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        # Errors a user can cause arrive as our own types; anything else still
        # gets one line (the service logs have the details).
        from app.postgres.sandbox import PostgresNotInstalled

        if isinstance(exc, PostgresNotInstalled | FileNotFoundError | PermissionError):
            fail(exc)
            return EXIT_ERROR
        raise


if __name__ == "__main__":
    sys.exit(main())
