"""A session from start to result: ``knobtune tune`` (start one, follow it, report its
outcome and write its files), ``status``, ``cancel`` and ``sessions``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.cli.captures import find_capture
from app.cli.follow import follow
from app.cli.shared import (
    BUILTINS,
    EXIT_BY_OUTCOME,
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    ISOLATION_LEVELS,
    OBJECTIVES,
    WORKLOAD_KINDS,
    Api,
    CliError,
    Subparsers,
    UsageError,
    add_command,
    add_json,
    add_out_options,
    add_remote,
    add_server_facts,
    clients_arg,
    connect,
    duration,
    existing_metadata_db,
    fail,
    out_dir,
    print_json,
    read_script,
    reader,
    write_text,
)
from app.cli.targets import cli_restart, find_or_create_target, find_target
from optimizer.objective import chart_axis, objective_kind
from optimizer.render import status_label


def register(sub: Subparsers) -> None:
    s = add_command(
        sub, "tune", "tune a server: benchmark candidates, keep what really helps", cmd_tune
    )
    _server_arguments(s.add_argument_group("the server (one of)"))
    _workload_arguments(
        s.add_argument_group(
            "the workload (every option left out takes the workload's own default)"
        )
    )
    _replay_arguments(s.add_argument_group("a captured workload (instead of --builtin/--script)"))
    _search_arguments(s.add_argument_group("the search"))
    out = s.add_argument_group("output")
    add_out_options(out)
    out.add_argument(
        "--follow",
        action="store_true",
        help="with --server: show live progress instead of printing the session id",
    )
    add_remote(s)

    s = add_command(sub, "status", "a session's progress and result in plain words", cmd_status)
    s.add_argument("id", type=int, help="the session's id (see 'knobtune sessions')")
    add_json(s)
    add_remote(s)

    s = add_command(sub, "cancel", "stop a running session; the target is restored", cmd_cancel)
    s.add_argument("id", type=int, help="the session's id")
    add_remote(s)

    s = add_command(sub, "sessions", "list sessions, newest first, with their result", cmd_sessions)
    s.add_argument("--limit", type=int, default=20, metavar="N", help="how many to list")
    add_json(s)
    add_remote(s)


def _server_arguments(where: argparse._ArgumentGroup) -> None:
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
    add_server_facts(where)


def _workload_arguments(wl: argparse._ArgumentGroup) -> None:
    wl.add_argument(
        "--builtin",
        choices=BUILTINS,
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
        choices=ISOLATION_LEVELS,
        help="the benchmark sessions' isolation level (default: the server's)",
    )
    wl.add_argument(
        "--max-tries",
        type=int,
        metavar="N",
        help="pgbench --max-tries: tries of a transaction after a serialization "
        "failure (default: 1, 10 for tpcc/chbench)",
    )


def _replay_arguments(rp: argparse._ArgumentGroup) -> None:
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


def _search_arguments(search: argparse._ArgumentGroup) -> None:
    search.add_argument(
        "--knobs",
        help="comma-separated knobs, tuned in this order (default: "
        "the catalogue's set for the workload)",
    )
    search.add_argument(
        "--workload-kind",
        choices=WORKLOAD_KINDS,
        help="picks the default knob set and the rule of thumb's hints "
        "(default: from the workload)",
    )
    search.add_argument(
        "--objective",
        choices=OBJECTIVES,
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
        help="start from the server's current settings, or from PGTune's whole config "
        "for this machine: its settings outside the knobs tuned are held, so every gain "
        "is measured against PGTune (default: current)",
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


def cmd_tune(args: argparse.Namespace) -> int:
    if (args.target is None) == (args.dsn is None):
        raise UsageError("give --target NAME (a registered target) or --dsn DSN, one of them")
    if args.server and not args.follow and args.out is not None:
        raise UsageError("--out writes a session's files when it ends: add --follow")
    _check_jobs(args)
    out = out_dir(args)  # refused now, not after the session
    url = args.database_url
    if args.target is not None and not args.server:
        url = existing_metadata_db(args, f"no target {args.target!r}: ")
    methods = cli_restart(args)
    with connect(args.server, args.token, database_url=url, restart_methods=methods) as api:
        if args.target is not None:
            target = find_target(api, args.target)
        else:
            target = find_or_create_target(api, args)
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
        return report(api, final, out, force=args.force)


def _check_jobs(args: argparse.Namespace) -> None:
    """--jobs above --clients is refused as the API refuses it (its 422), before a target
    is registered. Without --clients the workload's default applies, and the API says."""
    from app.postgres.pgbench import pgbench_jobs

    if isinstance(args.clients, int) and args.jobs is not None:
        try:
            pgbench_jobs(args.jobs, args.clients, given=True, names=("--jobs", "--clients"))
        except ValueError as exc:
            raise UsageError(str(exc)) from None


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


def report(
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
    objective = objective_kind(sess["request"])
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


def session_files(out: Path, session_id: int) -> list[Path]:
    """A session's files in ``out``: its config, chart and record (the API's session), named
    so that none can pass for a live postgresql.conf."""
    return [out / f"knobtune-session-{session_id}.{ext}" for ext in ("conf", "svg", "json")]


def write_outputs(api: Api, sess: dict[str, Any], out: Path, *, force: bool) -> list[Path]:
    """The session's config, chart and record into ``out`` (see app/outfiles.py); their
    paths as ``out`` was given."""
    from app.outfiles import OutputRefused, check_dir, check_free
    from app.reports.chart import final_label, points_of, render_svg

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
    axis, unit = chart_axis(objective_kind(sess["request"]))
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


def _result_cell(s: dict[str, Any]) -> str:
    """ "throughput +12.0% confirmed", "no change recommended", "-" (running)."""
    from app.sessions.summary import headline

    status = s.get("gain_status")
    if status in ("none", "no-change"):
        return "no change recommended"
    head = headline(objective_kind(s["request"]), s.get("gain"))
    if head is None:
        return "-"
    label = {"confirmed": "confirmed", "not-credible": "not credible"}.get(status or "", "")
    return f"{head} {label or (status or '').upper()}".strip()
