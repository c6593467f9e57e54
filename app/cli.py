"""The ``knobtune`` command line.

Every command talks to the REST API: to a running service (``--server``) or to
the same app run in-process (FastAPI's ASGI client starts it with its
scheduler), so the CLI and the service share one code path.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from optimizer.render import status_label

DEMO_SORT_SQL = (
    "\\set a random(1, 100000 * :scale - 60000)\n"
    "SELECT aid FROM (SELECT aid, filler FROM pgbench_accounts "
    "WHERE aid BETWEEN :a AND :a + 60000 ORDER BY filler DESC, aid) s OFFSET 59990;\n"
)


class CliError(Exception):
    """One line for the user, saying what to do; printed without a traceback."""


# -- API access --------------------------------------------------------------------
class Api:
    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self.client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach the knobtune service: {exc}") from exc
        if r.status_code >= 400:
            raise CliError(_detail(r))
        if r.headers.get("content-type", "").startswith("application/json"):
            return r.json()
        return r.text


def _detail(r: httpx.Response) -> str:
    try:
        detail = r.json().get("detail")
    except ValueError:
        return f"HTTP {r.status_code}: {r.text[:300]}"
    if isinstance(detail, list):  # pydantic validation errors
        parts = []
        for d in detail:
            loc = ".".join(str(x) for x in d.get("loc", [])[1:])
            parts.append(f"{loc}: {d.get('msg')}" if loc else str(d.get("msg")))
        return "; ".join(parts)
    return str(detail)


@contextlib.contextmanager
def connect(
    server: str | None,
    token: str | None,
    *,
    database_url: str | None = None,
    work_dir: Path | None = None,
    run_scheduler: bool = True,
) -> Iterator[Api]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if server:
        with httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=60) as client:
            yield Api(client)
        return
    with warnings.catch_warnings():
        # Starlette nudges toward another HTTP client package; irrelevant to users here.
        warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
        from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    overrides: dict[str, Any] = {}
    if database_url:
        overrides["database_url"] = database_url
    if work_dir:
        overrides["work_dir"] = work_dir
    if not run_scheduler:
        overrides["run_scheduler"] = False  # read-only commands must not start sessions
    settings = Settings(**overrides)
    token = token or (settings.api_token.get_secret_value() if settings.api_token else None)
    if token:
        headers = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(settings), headers=headers, raise_server_exceptions=False) as client:
        yield Api(client)


# -- live view ----------------------------------------------------------------------
def follow(api: Api, session_id: int) -> dict[str, Any]:
    """Show trials and progress until the session ends; Ctrl-C cancels it cleanly.

    On a terminal: a live table with a progress bar. Otherwise (logs, pipes): one
    line per finished trial, so the output reads well after the fact.
    """
    from rich.console import Console

    console = Console(stderr=True)
    view = _LiveView(console) if console.is_terminal else _LineView(console)
    interrupted = False

    def on_sigint(_sig: int, _frame: Any) -> None:
        nonlocal interrupted
        interrupted = True

    # SIGTERM (timeout, systemd, kill) gets the same clean cancel as Ctrl-C.
    old = {sig: signal.signal(sig, on_sigint) for sig in (signal.SIGINT, signal.SIGTERM)}
    cancel_sent = False
    try:
        with view:
            while True:
                if interrupted and not cancel_sent:
                    console.print("interrupted: cancelling; the target is being restored...")
                    with contextlib.suppress(CliError):
                        api.call("POST", f"/api/v1/sessions/{session_id}/cancel")
                    cancel_sent = True
                sess = api.call("GET", f"/api/v1/sessions/{session_id}")
                trials = api.call("GET", f"/api/v1/sessions/{session_id}/trials")
                view.update(sess, trials)
                if sess["status"] in ("succeeded", "failed", "cancelled"):
                    return dict(sess)
                time.sleep(1.0)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _trial_cells(t: dict[str, Any], trials: list[dict[str, Any]]) -> list[str]:
    gain = f"{t['gain'] * 100:+.1f}%" if t["gain"] is not None else ""
    med = t["samples"]["median_tps"]
    verdict = t["verdict"] or ("failed" if t["error"] else "")
    if t["verdict"] in ("keep", "revert") and t["role"] != "candidate":
        # decided on an incumbent re-run (C I I): say which candidate it was about
        about = [c for c in trials if c["role"] == "candidate" and c["index"] < t["index"]]
        if about:
            verdict += f" {about[-1]['knob'] or ''} {about[-1]['value'] or ''}".rstrip()
    return [
        str(t["index"]),
        t["knob"] or f"({t['role']})",
        t["value"] or "",
        f"{med:.1f}" if med is not None else "-",
        gain,
        verdict,
    ]


def _progress_line(sess: dict[str, Any]) -> str:
    prog = sess["progress"]
    eta = f", ETA {prog['eta_s']:.0f} s" if prog["eta_s"] is not None else ""
    now = f", now {sess['live_tps'][-1]:.0f} tps" if sess["live_tps"] else ""
    return f"{prog['trials_done']}/{prog['trials_planned'] or '?'} trials{eta}{now}"


class _LiveView:
    def __init__(self, console: Any) -> None:
        from rich.live import Live

        self.live = Live(console=console, refresh_per_second=2)

    def __enter__(self) -> _LiveView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def update(self, sess: dict[str, Any], trials: list[dict[str, Any]]) -> None:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        table = Table(title=f"session {sess['id']}: {sess['status']} - {sess['phase']}")
        for col in ("#", "knob", "value", "median tps", "gain", "verdict"):
            table.add_column(col, justify="right" if col in ("#", "median tps", "gain") else "left")
        for t in trials[-15:]:
            table.add_row(*_trial_cells(t, trials))
        prog = sess["progress"]
        total = max(prog["trials_planned"] or 1, prog["trials_done"], 1)
        bar = ProgressBar(total=total, completed=prog["trials_done"], width=40)
        self.live.update(Group(table, bar, _progress_line(sess)))


class _LineView:
    def __init__(self, console: Any) -> None:
        self.console = console
        self.shown = 0
        self.phase = ""

    def __enter__(self) -> _LineView:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, sess: dict[str, Any], trials: list[dict[str, Any]]) -> None:
        for t in trials[self.shown :]:
            idx, knob, value, med, gain, verdict = _trial_cells(t, trials)
            self.console.print(
                f"trial {idx:>3}  {knob} {value}  {med} tps  {gain}  {verdict}  "
                f"[{_progress_line(sess)}]",
                highlight=False,
                soft_wrap=True,  # one line per trial, whatever the width
            )
        self.shown = len(trials)
        if sess["phase"] != self.phase and sess["status"] in ("succeeded", "failed", "cancelled"):
            self.console.print(f"session {sess['id']}: {sess['status']} ({sess['phase']})")
        self.phase = sess["phase"]


def write_outputs(api: Api, session_id: int, out: Path) -> tuple[Path, Path]:
    from app.chart import final_label, points_of, render_svg

    out.mkdir(parents=True, exist_ok=True)
    conf = out / "postgresql.conf"
    conf.write_text(api.call("GET", f"/api/v1/sessions/{session_id}/config"))
    sess = api.call("GET", f"/api/v1/sessions/{session_id}")
    trials = api.call("GET", f"/api/v1/sessions/{session_id}/trials")
    chart = out / "knobtune-chart.svg"
    chart.write_text(
        render_svg(
            points_of(trials),
            baseline=sess["baseline_tps"],
            title=f"knobtune session {session_id}: throughput per trial",
            final_label=final_label(sess),
        )
    )
    return conf, chart


# -- commands ------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    import app.main  # noqa: F401  (the service's modules, loaded before the freeze below)
    from app.db import upgrade
    from app.settings import get_settings

    upgrade(get_settings().database_url)
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
    )
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from app.db import downgrade, upgrade
    from app.settings import get_settings

    url = get_settings().database_url
    if args.action == "upgrade":
        upgrade(url, args.revision or "head")
    else:
        downgrade(url, args.revision or "base")
    default = "head" if args.action == "upgrade" else "base"
    print(f"metadata DB {args.action}d to {args.revision or default}")
    return 0


def _session_body(args: argparse.Namespace, target_id: int) -> dict[str, Any]:
    auto = args.clients == "auto"  # a client sweep first, then tune at its knee
    workload: dict[str, Any] = {
        "clients": args.clients if auto else int(args.clients),
        "jobs": args.jobs if auto else min(args.jobs, int(args.clients)),
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "scale": args.scale,
        "init": not args.no_init,
    }
    optional = {
        "isolation": args.isolation,
        "max_tries": args.max_tries,
        "mode": args.mode,
        "olap_clients": args.olap_clients,
        "queries": [q.strip() for q in args.queries.split(",")] if args.queries else None,
    }
    workload.update({k: v for k, v in optional.items() if v is not None})
    if args.script:
        workload["scripts"] = [{"sql": Path(f).read_text(), "weight": 1} for f in args.script]
        workload["builtin"] = args.builtin
    else:
        workload["builtin"] = args.builtin or "tpcb-like"
    body: dict[str, Any] = {
        "target_id": target_id,
        "workload": workload,
        "max_trials": args.max_trials,
        "min_gain": args.min_gain,
        "on_finish": args.on_finish,
        "objective": args.objective,
    }
    if args.workload_kind:
        body["workload_kind"] = args.workload_kind
    if args.knobs:
        body["knobs"] = [k.strip() for k in args.knobs.split(",") if k.strip()]
    if args.time_budget:
        body["time_budget_s"] = args.time_budget
    return body


def cmd_demo(args: argparse.Namespace) -> int:
    from app.postgres.sandbox import Sandbox

    out = Path(args.out).resolve()
    with tempfile.TemporaryDirectory(prefix="knobtune-demo-") as tmp:
        print("creating a sandbox PostgreSQL cluster...", file=sys.stderr)
        with Sandbox.create() as sandbox:
            print(
                f"sandbox at {sandbox.root} (port {sandbox.port}); removed at the end",
                file=sys.stderr,
            )
            db_url = f"sqlite:///{tmp}/knobtune.db"
            with connect(None, None, database_url=db_url, work_dir=Path(tmp)) as api:
                target = api.call(
                    "POST",
                    "/api/v1/targets",
                    json={
                        "name": "demo",
                        "dsn": sandbox.dsn,
                        "restart_command": sandbox.restart_command,
                        "data_dir": str(sandbox.data_dir),
                    },
                )
                workload: dict[str, Any] = {
                    "builtin": None,
                    "scripts": [{"sql": DEMO_SORT_SQL, "weight": 1}],
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
                sess = api.call("POST", "/api/v1/sessions", json=body)
                print(
                    f"session {sess['id']}: tuning {args.knobs} on a sort-heavy workload "
                    f"({args.duration} s per run)",
                    file=sys.stderr,
                )
                final = follow(api, sess["id"])
                return _report(api, final, out)


def _report(api: Api, final: dict[str, Any], out: Path) -> int:
    if final["status"] == "cancelled":
        print("cancelled: the target was restored", file=sys.stderr)
        return 130
    if final["status"] == "failed":
        raise CliError(f"session failed: {final['error']}")
    conf, chart = write_outputs(api, final["id"], out)
    gain, label = final["gain"], status_label(final.get("gain_status"))
    ci = final.get("gain_ci")
    sure = f"95% CI {ci[0]:+.1%}..{ci[1]:+.1%}, " if ci else ""
    print(
        f"baseline {final['baseline_tps']:.1f} tps -> best {final['best_tps']:.1f} tps "
        f"({gain * 100:+.1f}%; {sure}{label or 'not checked'})"
        if gain is not None
        else "no measured gain"
    )
    if final.get("gain_text"):
        print(f"objective: {final['gain_text']}")
    for line in evidence_lines(final):
        print(line)
    print(f"recommended config: {conf}")
    print(f"chart: {chart}")
    return 0


def evidence_lines(final: dict[str, Any]) -> list[str]:
    """Per stream (start and best) and per label (best vs start) tables for the summary."""
    from app.service import label_line, stream_line

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


def cmd_tune(args: argparse.Namespace) -> int:
    url = args.database_url
    with connect(args.server, args.token, database_url=url) as api:
        target = _find_or_create_target(api, args)
        sess = api.call("POST", "/api/v1/sessions", json=_session_body(args, target["id"]))
        print(f"session {sess['id']} started", file=sys.stderr)
        if args.server and not args.follow:
            print(sess["id"])
            return 0
        final = follow(api, sess["id"])
        return _report(api, final, Path(args.out).resolve())


def _find_or_create_target(api: Api, args: argparse.Namespace) -> dict[str, Any]:
    # A stable name (hash() is salted per process), so a second `tune` of the same server
    # finds its target, and with it the one-session-per-target guard.
    name = args.name or f"target-{hashlib.sha256(args.dsn.encode()).hexdigest()[:8]}"
    for t in api.call("GET", "/api/v1/targets"):
        if t["name"] == name:
            return dict(t)
    body: dict[str, Any] = {"name": name, "dsn": args.dsn, "restart_command": args.restart_command}
    if args.ram_bytes:
        body["ram_bytes"] = args.ram_bytes
    if args.cpus:
        body["cpus"] = args.cpus
    return dict(api.call("POST", "/api/v1/targets", json=body))


def _existing_metadata_db(args: argparse.Namespace, missing: str = "") -> str:
    """The in-process metadata DB a read-only command looks at; it must exist already.

    Says which DB it is (a bare listing from the wrong directory looked empty) and never
    creates one: SQLite would silently make a new, empty file.
    """
    from sqlalchemy.engine import make_url

    from app.settings import absolute_sqlite_url, get_settings

    url = absolute_sqlite_url(args.database_url or get_settings().database_url)
    parsed = make_url(url)
    shown = parsed.render_as_string(hide_password=True)
    db = parsed.database or ""
    if parsed.drivername.startswith("sqlite") and db != ":memory:" and not Path(db).exists():
        raise CliError(
            f"{missing}no metadata DB at {db} (from KNOBTUNE_DATABASE_URL or its default "
            "sqlite:///knobtune.db, relative to the current directory); give --server URL of "
            "a running service, --database-url of the service's DB, or run this where the "
            "service ran"
        )
    print(f"metadata DB: {shown}", file=sys.stderr)
    return url


def cmd_sessions(args: argparse.Namespace) -> int:
    url = None if args.server else _existing_metadata_db(args)
    with connect(args.server, args.token, database_url=url, run_scheduler=False) as api:
        rows = api.call("GET", "/api/v1/sessions", params={"limit": args.limit})
    if not rows:
        where = args.server or "this metadata DB"
        print(
            f"no sessions in {where}; start one with 'knobtune tune --dsn ...' or "
            "POST /api/v1/sessions",
            file=sys.stderr,
        )
    for s in rows:
        gain = f"{s['gain'] * 100:+.1f}%" if s["gain"] is not None else "-"
        if s.get("gain_status") == "unconfirmed":
            gain += " (UNCONFIRMED)"
        status, target = s["status"], s["target_id"]
        print(f"{s['id']:>5}  {status:<10} target {target:<4} gain {gain:>7}  {s['phase']}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    url = None if args.server else _existing_metadata_db(args, f"no session {args.id}: ")
    with connect(args.server, args.token, database_url=url, run_scheduler=False) as api:
        text = api.call("GET", f"/api/v1/sessions/{args.id}/config", params={"format": args.format})
    sys.stdout.write(text if isinstance(text, str) else json.dumps(text, indent=2))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """Sweep client counts on a target (by --target id, or --dsn: found or registered)."""
    if (args.target is None) == (args.dsn is None):
        raise CliError("give exactly one of --dsn or --target")
    body: dict[str, Any] = {
        "builtin": args.builtin,
        "scale": args.scale,
        "init": not args.no_init,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "repeats": args.repeats,
        "jobs": args.jobs,
        "connect_cost": not args.no_connect_cost,
    }
    if args.clients:
        try:
            body["clients"] = [int(c) for c in args.clients.split(",") if c.strip()]
        except ValueError:
            raise CliError(
                f"--clients must be comma-separated integers, not {args.clients!r}"
            ) from None
    with connect(args.server, args.token, database_url=args.database_url) as api:
        if args.target is not None:
            tid = int(args.target)
        else:
            args.restart_command = None
            tid = int(_find_or_create_target(api, args)["id"])
        sw = api.call("POST", f"/api/v1/targets/{tid}/sweeps", json=body)
        print(f"sweep {sw['id']} started on target {tid}", file=sys.stderr)
        sw = _follow_sweep(api, int(sw["id"]))
        if sw["status"] == "failed":
            raise CliError(f"sweep failed: {sw['error']}")
        out = Path(args.out).resolve()
        out.mkdir(parents=True, exist_ok=True)
        chart = out / f"knobtune-sweep-{sw['id']}.svg"
        chart.write_text(api.call("GET", f"/api/v1/sweeps/{sw['id']}/chart.svg"))
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
    print(f"chart: {chart}")
    return 130 if sw["status"] == "cancelled" else 0


def _follow_sweep(api: Api, sweep_id: int) -> dict[str, Any]:
    """Poll until the sweep ends; Ctrl-C or SIGTERM cancel it (nothing to restore)."""
    interrupted = False

    def on_sigint(_sig: int, _frame: Any) -> None:
        nonlocal interrupted
        interrupted = True

    old = {sig: signal.signal(sig, on_sigint) for sig in (signal.SIGINT, signal.SIGTERM)}
    sent, last = False, ""
    try:
        while True:
            if interrupted and not sent:
                print("interrupted: cancelling the sweep", file=sys.stderr)
                with contextlib.suppress(CliError):
                    api.call("POST", f"/api/v1/sweeps/{sweep_id}/cancel")
                sent = True
            sw: dict[str, Any] = api.call("GET", f"/api/v1/sweeps/{sweep_id}")
            if sw["phase"] != last:
                print(f"  {sw['phase']}", file=sys.stderr)
                last = sw["phase"]
            if sw["status"] in ("succeeded", "failed", "cancelled"):
                return sw
            time.sleep(1.0)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _fail(exc: BaseException) -> None:
    # One line, whatever the driver said: newlines and tabs from libpq folded.
    print(f"knobtune: {' '.join(str(exc).split())}", file=sys.stderr)


def _clients_arg(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number or 'auto', not {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="knobtune", description="Tune PostgreSQL knobs by noise-aware coordinate descent."
    )
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the REST service (upgrades the metadata DB first)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--workers", type=int, default=1)
    s.add_argument("--log-level", default="info")
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("db", help="migrate the metadata DB (KNOBTUNE_DATABASE_URL)")
    s.add_argument("action", choices=["upgrade", "downgrade"])
    s.add_argument("revision", nargs="?")
    s.set_defaults(func=cmd_db)

    s = sub.add_parser("demo", help="tune a throw-away sandbox cluster and write the results here")
    s.add_argument("--out", default=".", help="where postgresql.conf and the chart go (default: .)")
    s.add_argument("--knobs", default="work_mem", help="comma-separated knobs (default: work_mem)")
    s.add_argument("--duration", type=int, default=12, help="seconds per benchmark run")
    s.add_argument("--warmup", type=int, default=2)
    s.add_argument("--clients", type=int, default=4)
    s.add_argument("--scale", type=int, default=10)
    s.add_argument("--max-trials", type=int, default=14)
    s.add_argument("--seed", type=int, default=1)
    s.set_defaults(func=cmd_demo)

    def remote(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--server", help="URL of a running knobtune service (default: in-process)")
        sp.add_argument("--token", default=os.environ.get("KNOBTUNE_API_TOKEN"))
        sp.add_argument(
            "--database-url", help="in-process: metadata DB (default KNOBTUNE_DATABASE_URL)"
        )

    s = sub.add_parser("tune", help="tune a real server")
    s.add_argument(
        "--dsn", required=True, help="libpq DSN of the target (superuser or ALTER SYSTEM rights)"
    )
    s.add_argument("--name", help="target name (default: derived from the DSN)")
    s.add_argument(
        "--restart-command",
        help="shell command that restarts the target (else restart knobs are skipped)",
    )
    s.add_argument("--ram-bytes", type=int)
    s.add_argument("--cpus", type=int)
    s.add_argument(
        "--knobs", help="comma-separated knobs (default: the catalogue's set for the workload)"
    )
    s.add_argument(
        "--builtin",
        choices=["tpcb-like", "simple-update", "select-only", "tpch", "tpcc", "chbench"],
        help="pgbench's builtin script, or a built-in workload with its own data: tpch "
        "(--scale = scale factor, e.g. 0.2), tpcc or chbench (--scale = warehouses)",
    )
    s.add_argument("--script", action="append", help="SQL script file for pgbench (repeatable)")
    s.add_argument("--mode", choices=["power", "throughput"], help="tpch: power or throughput")
    s.add_argument("--queries", help="tpch/chbench: comma-separated queries, e.g. Q1,Q6")
    s.add_argument("--olap-clients", type=int, help="chbench: clients of the analytic stream")
    s.add_argument("--workload-kind", choices=["write-heavy", "read-heavy", "mixed", "analytics"])
    s.add_argument("--duration", type=int, default=60)
    s.add_argument("--warmup", type=int, default=5)
    s.add_argument(
        "--clients",
        type=_clients_arg,
        default=8,
        help='pgbench clients, or "auto": a client sweep first, then tune at its knee',
    )
    s.add_argument("--jobs", type=int, default=2)
    s.add_argument("--scale", type=float, default=10)
    s.add_argument("--no-init", action="store_true", help="do not create pgbench tables")
    s.add_argument("--max-trials", type=int, default=30)
    s.add_argument("--time-budget", type=float)
    s.add_argument("--min-gain", type=float, default=0.02)
    s.add_argument("--on-finish", choices=["restore", "apply_best"], default="restore")
    s.add_argument(
        "--objective",
        choices=["throughput", "latency_p95", "query_time_geomean", "query_time_total"],
        default="throughput",
        help="what a run's level is, from its transactions (query times: lower is better)",
    )
    s.add_argument("--isolation", choices=["read committed", "repeatable read", "serializable"])
    s.add_argument(
        "--max-tries",
        type=int,
        help="pgbench --max-tries (serialization retries; default 1, 10 for tpcc/chbench)",
    )
    s.add_argument("--follow", action="store_true", help="with --server: show live progress")
    s.add_argument("--out", default=".")
    remote(s)
    s.set_defaults(func=cmd_tune)

    s = sub.add_parser("sweep", help="find the client count where throughput stops rising")
    s.add_argument("--dsn", help="libpq DSN of the target (registered if new)")
    s.add_argument("--target", type=int, help="id of a registered target")
    s.add_argument("--name", help="with --dsn: target name (default: derived from the DSN)")
    s.add_argument("--ram-bytes", type=int)
    s.add_argument("--cpus", type=int)
    s.add_argument(
        "--builtin", choices=["tpcb-like", "simple-update", "select-only"], default="tpcb-like"
    )
    s.add_argument("--clients", help="comma-separated counts (default: 1, 2, 4, ... to a cap)")
    s.add_argument("--duration", type=int, default=10, help="seconds per run, warm-up included")
    s.add_argument("--warmup", type=int, default=2)
    s.add_argument("--repeats", type=int, default=2, help="runs per count (up-down order)")
    s.add_argument("--jobs", type=int, default=2)
    s.add_argument("--scale", type=int, default=10)
    s.add_argument("--no-init", action="store_true", help="do not create pgbench tables")
    s.add_argument("--no-connect-cost", action="store_true", help="skip the -C run at the knee")
    s.add_argument("--out", default=".", help="where the chart goes (default: .)")
    remote(s)
    s.set_defaults(func=cmd_sweep)

    s = sub.add_parser("sessions", help="list sessions")
    s.add_argument("--limit", type=int, default=20)
    remote(s)
    s.set_defaults(func=cmd_sessions)

    s = sub.add_parser("export", help="print a session's recommended config")
    s.add_argument("id", type=int)
    s.add_argument("--format", choices=["conf", "sql", "json"], default="conf")
    remote(s)
    s.set_defaults(func=cmd_export)
    return p


def _terminate(_sig: int, _frame: Any) -> None:
    # Outside the live view, SIGTERM unwinds like Ctrl-C so that with-blocks clean up
    # (a demo sandbox is removed, never orphaned).
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return int(args.func(args))
    except CliError as exc:
        _fail(exc)
        return 2
    except KeyboardInterrupt:
        print("knobtune: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # Errors a user can cause arrive as our own types; anything else still
        # gets one line (the service logs have the details).
        from app.postgres.sandbox import PostgresNotInstalled

        if isinstance(exc, PostgresNotInstalled | FileNotFoundError | PermissionError):
            _fail(exc)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
