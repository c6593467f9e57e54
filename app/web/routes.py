"""Dashboard pages at ``/``: sessions, one session's live view and results, forms, login.

Server-rendered (Jinja2) over the domain services, like the REST API. The only script
is ``static/dashboard.js``: it polls the REST API for the live view. Plain
``def`` routes: the work is sync DB access, run in FastAPI's thread pool. Pages
cost a handful of queries each (no per-row queries) and show bounded lists.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qsl, quote

from cachetools import TTLCache
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from app.api.csrf import cross_site_refusal
from app.api.deps import (
    DB,
    TOKEN_COOKIE,
    AppSettings,
    Sched,
    authenticate,
    is_authorized,
    token_ok,
)
from app.captures import service as capture_svc
from app.captures.schemas import CaptureIn
from app.chart import final_label, points_of, readable, render_svg, render_sweep_svg
from app.compare import service as compare_svc
from app.db import Database
from app.errors import ServiceError
from app.models import ACTIVE_STATUSES, Sweep
from app.postgres.cgroups import PROFILES, Limits
from app.postgres.sandbox import SandboxError
from app.sessions import apply as apply_svc
from app.sessions import service as session_svc
from app.sessions.schemas import ApplyIn, ApplyOut, RollbackIn, SessionIn
from app.sessions.summary import headline, note_kind
from app.sessions.verdicts import judged_runs
from app.sweeps import service as sweep_svc
from app.sweeps.schemas import SweepIn
from app.targets import service as target_svc
from app.targets.schemas import TargetIn
from app.workloads.schemas import PGBENCH_DEFAULTS, workload_defaults
from optimizer.catalogue import CATALOGUE
from optimizer.objective import DEFAULT_OBJECTIVE, chart_axis, in_units, objective_kind
from optimizer.render import status_label

HERE = Path(__file__).parent
SESSIONS_SHOWN = 50  # the index lists the newest sessions only: bounded page cost
MAX_FORM_BYTES = 256 * 1024  # a custom SQL script fits; anything larger is refused
COOKIE_MAX_AGE_S = 7 * 86_400
PAGE_TTL_S = 1.0  # a session page is reused this long: the live view polls once a second

# Everything is same-origin and inline SVG needs no style attributes, so the
# policy can forbid inline scripts and styles: an XSS that slipped through
# escaping could not run.
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
    "script-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
_MEDIA = {
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}


def _load_static() -> dict[str, tuple[bytes, str, str]]:
    """Vendored assets, read once: name -> (body, media type, content hash for cache busting)."""
    out: dict[str, tuple[bytes, str, str]] = {}
    for f in sorted((HERE / "static").iterdir()):
        if f.suffix in _MEDIA:
            body = f.read_bytes()
            out[f.name] = (body, _MEDIA[f.suffix], hashlib.sha256(body).hexdigest()[:12])
    return out


STATIC = _load_static()


def static_url(name: str) -> str:
    return f"/static/{name}?v={STATIC[name][2]}"


def fmt_tps(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.1f}"


def fmt_gain(v: float | None) -> str:
    return "–" if v is None else f"{v * 100:+.1f}%"


def fmt_when(v: datetime | None) -> str:
    return "–" if v is None else v.strftime("%Y-%m-%d %H:%M:%S")


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


templates = Jinja2Templates(directory=HERE / "templates")
templates.env.globals.update(static_url=static_url, ACTIVE=ACTIVE_STATUSES)
templates.env.filters.update(
    tps=fmt_tps,
    gain=fmt_gain,
    when=fmt_when,
    duration=fmt_duration,
    claim=status_label,
    readable=readable,
)


def _page(request: Request, name: str, ctx: dict[str, Any], status: int = 200) -> HTMLResponse:
    settings = request.app.state.settings
    auth = settings.api_token is not None
    # the header says whether this browser is logged in (the login page is not)
    logged_in = auth and token_ok(settings, request.cookies.get(TOKEN_COOKIE, ""))
    ctx = {"auth_enabled": auth, "logged_in": logged_in, **ctx}
    return templates.TemplateResponse(request, name, ctx, status_code=status, headers=_HEADERS)


class RenderedPages:
    """Session pages rendered within the last ``PAGE_TTL_S``, per app (bounded, thread-safe).

    Fifty viewers of a running session then cost one render a second instead of fifty
    (a request took 8.5 ms of CPU, 3.3 ms when served from here; bench/api_load.py runs
    on 2 cores shared with pgbench). A page is at most a second stale; the dashboard's
    own cancel drops it.
    """

    def __init__(self, size: int = 256) -> None:
        self._pages: TTLCache[int, bytes] = TTLCache(maxsize=size, ttl=PAGE_TTL_S)
        self._lock = threading.Lock()  # TTLCache is not thread-safe; routes run in a pool

    def get(self, session_id: int) -> bytes | None:
        with self._lock:
            return self._pages.get(session_id)

    def put(self, session_id: int, body: bytes) -> None:
        with self._lock:
            self._pages[session_id] = body

    def forget(self, session_id: int) -> None:
        with self._lock:
            self._pages.pop(session_id, None)


# -- guards -------------------------------------------------------------------------
def _page_auth(request: Request, ok: Annotated[bool, Depends(is_authorized)]) -> None:
    """Pages accept the API's Bearer header or the login cookie; browsers go to /login."""
    if not ok:
        here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise HTTPException(303, headers={"Location": "/login?next=" + quote(here, safe="")})


def _same_origin(request: Request, settings: AppSettings) -> None:
    """Refuse cross-site form posts (CSRF): a browser always sends Origin on a POST.

    Needed even without a token: otherwise any web page a user visits could
    start sessions on their targets through a plain HTML form. The rule is the API's
    (app/api/csrf.py, whose middleware also runs before this).
    """
    names = ("origin", "sec-fetch-site", "host")
    headers = {k: request.headers[k] for k in names if k in request.headers}
    if cross_site_refusal(request.method, headers, frozenset(settings.allowed_origins)):
        raise HTTPException(403, "cross-site form post refused: use the dashboard's own form")


async def _form(request: Request) -> dict[str, str]:
    """The posted form, parsed here (urlencoded only), so no multipart library is needed."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/x-www-form-urlencoded":
        raise HTTPException(415, "post the dashboard's form (application/x-www-form-urlencoded)")
    if int(request.headers.get("content-length") or 0) > MAX_FORM_BYTES:
        raise HTTPException(413, f"form larger than {MAX_FORM_BYTES} bytes")
    raw = await request.body()
    if len(raw) > MAX_FORM_BYTES:
        raise HTTPException(413, f"form larger than {MAX_FORM_BYTES} bytes")
    return dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))


class PageRoute(APIRoute):
    """A dashboard route: a ServiceError it lets through is the error page, with the
    service's status and message. Here and not in an app-wide handler, so the REST API's
    routes keep answering it in JSON (app/api/errors.py); a route that shows the error
    on its own form (the index, a job's page) catches it first."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def page_or_error(request: Request) -> Response:
            try:
                return await handle(request)
            except ServiceError as exc:
                return _page(request, "error.html", {"message": exc.message}, exc.status)

        return page_or_error


Form = Annotated[dict[str, str], Depends(_form)]
router = APIRouter(include_in_schema=False, route_class=PageRoute)
page = APIRouter(include_in_schema=False, route_class=PageRoute, dependencies=[Depends(_page_auth)])
post = APIRouter(
    include_in_schema=False,
    route_class=PageRoute,
    dependencies=[Depends(_page_auth), Depends(_same_origin)],
)


def _refused(exc: ValidationError | ServiceError) -> tuple[str, int]:
    """What a form shows when its request is refused, and the status: the fields the body
    got wrong (422), or the service's own message and status."""
    if isinstance(exc, ServiceError):
        return exc.message, exc.status
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]).removeprefix("workload.")
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts), 422


# -- index: sessions list and the two forms -------------------------------------------
def _session_defaults() -> dict[str, str]:
    """The form's initial values. The workload's fields stay blank: each workload's own
    defaults apply (shown as placeholders), as over REST and in the CLI."""
    return {
        "builtin": "",
        "max_trials": str(SessionIn.model_fields["max_trials"].default),
        "final_check_runs": str(SessionIn.model_fields["final_check_runs"].default),
        "on_finish": "restore",
        "start": "current",
        "objective": DEFAULT_OBJECTIVE,
        "mode": "power",
    }


def _form_defaults() -> dict[str, dict[str, Any]]:
    """Per workload choice of the form: its defaults (placeholders, the time estimate)."""
    out: dict[str, dict[str, Any]] = {}
    for key, builtin, mode in [
        ("", "tpcb-like", "power"),
        ("tpcb-like", "tpcb-like", "power"),
        ("simple-update", "simple-update", "power"),
        ("select-only", "select-only", "power"),
        ("none", None, "power"),
        ("tpch", "tpch", "power"),
        ("tpch-throughput", "tpch", "throughput"),
        ("tpcc", "tpcc", "power"),
        ("chbench", "chbench", "power"),
    ]:
        d = workload_defaults(builtin, mode)
        out[key] = {k: d[k] for k in ("scale", "clients", "jobs", "duration_s", "warmup_s")}
    return out


def _int(text: str | None, default: int) -> int:
    """A form's number as typed, or the default (a form being re-shown may hold anything)."""
    try:
        value = int(str(text).strip())
    except ValueError:
        return default
    return value if 0 < value <= 10**6 else default


def estimate_text(max_trials: int, duration_s: int) -> str:
    """The session form's time estimate: runs x run length (the dashboard's JS says the same)."""
    secs = max_trials * duration_s
    when = (
        f"{secs} s"
        if secs < 90
        else f"{round(secs / 60)} min"
        if secs < 5400
        else f"{secs / 3600:.1f} h"
    )
    return (
        f"About {when}: up to {max_trials} runs × {duration_s} s, plus loading the data and "
        "warming up after restarts."
    )


def _sessions_ctx(db: Database) -> dict[str, Any]:
    # each row has its target's name, a retired target's too (sessions_out)
    sessions = session_svc.sessions_out(db, session_svc.list_sessions(db, limit=SESSIONS_SHOWN))
    return {
        "sessions": sessions,
        "shown": SESSIONS_SHOWN,
        "any_active": any(s.status in ACTIVE_STATUSES for s in sessions),
    }


def _index(
    request: Request,
    db: Database,
    *,
    session_form: dict[str, str] | None = None,
    session_error: str | None = None,
    target_form: dict[str, str] | None = None,
    target_error: str | None = None,
    capture_form: dict[str, str] | None = None,
    capture_error: str | None = None,
    status: int = 200,
) -> HTMLResponse:
    listed = target_svc.list_targets(db)
    held = target_svc.held_targets(db)  # sweeps: listed apart
    busy = {tid: h.id for tid, h in held.items() if h.kind == "session"}
    capturing = {tid: h.id for tid, h in held.items() if h.kind == "capture"}
    form = _session_defaults()
    if session_form is not None:
        form.update(session_form)
    elif request.query_params.get("target_id"):
        form["target_id"] = request.query_params["target_id"]
    ctx = {
        **_sessions_ctx(db),
        "targets": [
            {
                "id": t.id,
                "name": t.name,
                "dsn": target_svc.shown_dsn(t.dsn),
                "sandbox": t.sandbox_dir is not None,
                "limits": (
                    str(Limits.from_json(t.sandbox_limits))
                    if t.sandbox_limits and t.sandbox_dir
                    else None
                ),
                "version": (t.probe or {}).get("version"),
                "recommend_only": t.recommend_only,
                "busy": busy.get(t.id),
                "capturing": capturing.get(t.id),
            }
            for t in listed
        ],
        "capture_form": capture_form or {"seconds": "600"},
        "capture_error": capture_error,
        "sweeps": _latest_sweeps(db),
        "form": form,
        "session_error": session_error,
        "target_form": {k: v for k, v in (target_form or {}).items() if k != "dsn"},
        "target_error": target_error,
        "restart_methods": sorted(request.app.state.settings.restart_methods),
        "profiles": [(p.name, p.limits.figures(), p.models) for p in PROFILES.values()],
        "knob_names": sorted(CATALOGUE),
        "form_defaults": _form_defaults(),
        "estimate": estimate_text(
            _int(form.get("max_trials"), SessionIn.model_fields["max_trials"].default),
            _int(form.get("duration_s"), PGBENCH_DEFAULTS["duration_s"]),
        ),
    }
    return _page(request, "index.html", ctx, status)


@page.get("/", response_class=HTMLResponse)
def index(request: Request, db: DB) -> HTMLResponse:
    return _index(request, db)


@page.get("/partials/sessions", response_class=HTMLResponse)
def sessions_partial(request: Request, db: DB) -> HTMLResponse:
    return _page(request, "_sessions.html", _sessions_ctx(db))


def _session_request(form: dict[str, str]) -> dict[str, Any]:
    """The form's fields as a SessionIn body; blank fields take the API's defaults."""

    def given(key: str) -> str | None:
        value = form.get(key, "").strip()
        return value or None

    workload: dict[str, Any] = {}
    builtin = given("builtin")  # blank: tpcb-like, or only the script when there is one
    if builtin is not None:
        workload["builtin"] = None if builtin == "none" else builtin
    if script := given("script"):
        workload["scripts"] = [{"sql": script}]
    for key in ("scale", "clients", "jobs", "duration_s", "warmup_s", "mode", "isolation"):
        if (value := given(key)) is not None:
            workload[key] = value
    body: dict[str, Any] = {"workload": workload}
    for key in ("target_id", "max_trials", "final_check_runs", "on_finish", "start", "objective"):
        if (value := given(key)) is not None:
            body[key] = value
    knobs = [k for k in re.split(r"[\s,]+", form.get("knobs", "")) if k]
    if knobs:
        body["knobs"] = knobs
    body["allow_unsafe"] = form.get("allow_unsafe") == "on"
    return body


@post.post("/sessions")
def start_session(request: Request, db: DB, form: Form) -> Response:
    try:
        sess = session_svc.create_session(db, SessionIn.model_validate(_session_request(form)))
    except (ValidationError, ServiceError) as exc:
        message, status = _refused(exc)
        return _index(request, db, session_form=form, session_error=message, status=status)
    return RedirectResponse(f"/sessions/{sess.id}", status_code=303)


def _sandbox_profile(form: dict[str, str]) -> dict[str, Any] | None:
    """The form's hardware profile of a new sandbox (a name and/or limits), or None."""
    out: dict[str, Any] = {}
    if name := form.get("profile", "").strip():
        out["profile"] = name
    if memory := form.get("sandbox_memory", "").strip():
        out["memory"] = memory
    for key, field in (("sandbox_iops", "disk_iops"), ("sandbox_mbps", "disk_mbps")):
        if value := form.get(key, "").strip():
            try:
                out[field] = int(value)
            except ValueError:
                raise ValueError(f"{field}: a whole number, not {value[:20]!r}") from None
    if value := form.get("sandbox_cpus", "").strip():
        try:
            out["cpus"] = int(value)
        except ValueError:
            raise ValueError(f"sandbox CPUs: a whole number, not {value[:20]!r}") from None
    if out and form.get("sandbox") != "on":
        raise ValueError(
            "a hardware profile is for a sandbox: tick Sandbox, or clear the profile fields"
        )
    return out or None


@post.post("/targets")
def register_target(request: Request, db: DB, settings: AppSettings, form: Form) -> Response:
    body: dict[str, Any] = {
        "name": form.get("name", "").strip(),
        "sandbox": form.get("sandbox") == "on",
        "recommend_only": form.get("recommend_only") == "on",
    }
    for key in ("dsn", "restart_method", "data_dir", "cpus"):
        if value := form.get(key, "").strip():
            body[key] = value
    try:
        if ram := form.get("ram_gib", "").strip():
            body["ram_bytes"] = int(float(ram) * 2**30)
    except ValueError:
        return _index(
            request,
            db,
            target_form=form,
            target_error="RAM: give the target's memory in GiB, e.g. 16",
            status=422,
        )
    try:
        profile = _sandbox_profile(form)
    except ValueError as exc:
        return _index(request, db, target_form=form, target_error=str(exc), status=422)
    if profile:
        body["sandbox"] = profile
    try:
        target = target_svc.create_target(db, settings, TargetIn.model_validate(body))
    except (ValidationError, ServiceError) as exc:
        message, _ = _refused(exc)  # the target form answers 422 whatever the refusal
    except SandboxError as exc:  # not mapped by target_svc.create_target (yet): never a 500 here
        message = f"could not create the sandbox: {exc}"
    else:
        return RedirectResponse(f"/?target_id={target.id}#new-session", status_code=303)
    return _index(request, db, target_form=form, target_error=message, status=422)


@post.post("/targets/{target_id}/delete")
def delete_target(target_id: int, request: Request, db: DB, sched: Sched, form: Form) -> Response:
    """The dashboard's remove buttons: keep the target's history (retire) or drop it."""
    choice = form.get("history")
    history: target_svc.HistoryChoice | None = (
        "keep" if choice == "keep" else "drop" if choice == "drop" else None
    )
    try:
        target_svc.delete_target(db, target_id, history)
    except ServiceError as exc:
        return _index(request, db, target_error=exc.message, status=exc.status)
    if sched is not None:
        sched.sync_schedules()
    return RedirectResponse("/#targets", status_code=303)


# -- one session ------------------------------------------------------------------------
def _session_ctx(db: Database, session_id: int) -> dict[str, Any]:
    sess = session_svc.get_session(db, session_id)
    trials = session_svc.trial_rows(db, session_id)
    # Trial count and mean trial time from the rows at hand: no extra count query.
    per_trial = (
        (trials[-1]["finished_at"] - trials[0]["started_at"]).total_seconds() / len(trials)
        if trials
        else None
    )
    target = target_svc.get_target(db, sess.target_id)
    out = session_svc.session_out(
        db, sess, {session_id: (len(trials), per_trial)}, name=target.name
    )
    objective = objective_kind(sess.request)
    axis, unit = chart_axis(objective)
    if unit != "tps":
        levels = session_svc.trial_levels(db, session_id, sess.request)
        for t in trials:
            t["level"] = levels.get(t["index"])
    chart = (
        render_svg(
            points_of(trials, unit=unit),
            baseline=out.baseline_tps if unit == "tps" else None,
            title=f"Session {session_id}: {axis.split(' (')[0]}",
            final_label=final_label(
                {"gain": out.gain, "gain_status": out.gain_status, "request": sess.request}
            ),
            axis=axis,
            unit=unit,
        )
        if any(t["median_tps"] is not None and t["error"] is None for t in trials)
        else None
    )
    start, best = sess.start_config or {}, sess.best_config or {}
    config = [
        {"knob": k, "start": start.get(k), "best": best.get(k), "changed": start.get(k) != best[k]}
        for k in sorted(best)
    ]
    applies = apply_svc.list_applies(db, session_id, sess=sess, target=target)
    return {
        "s": out,
        "target": {
            "id": target.id,
            "name": target.name,
            "dsn": target_svc.shown_dsn(target.dsn),
            "retired": target.retired_at is not None,
        },
        "trials": verdict_rows(trials, objective),
        "chart": chart,
        "config": config,
        # a failed session offers no download of a config that recommends nothing
        "downloads": sess.start_config is not None
        and sess.best_config is not None
        and (sess.status != "failed" or any(c["changed"] for c in config)),
        "wl": out.request.get("workload", {}),
        "knobs": _knobs_label(out.request.get("knobs")),
        # one figure in the objective's units; green when confirmed better, whatever its sign
        "result": "no change"
        if out.gain_status in apply_svc.NOTHING
        else headline(objective, out.gain),
        "result_ci": ""
        if out.gain_status in apply_svc.NOTHING
        else (headline(objective, out.gain, out.gain_ci) or "").partition(" (")[2][:-1],
        "good": out.gain_status == "confirmed" and (out.gain or 0) > 0,
        "bad": out.gain_status == "confirmed" and (out.gain or 0) < 0,
        "notes": [n for n in out.notes if note_kind(str(n)) == "note"],
        "warnings": [n for n in out.notes if note_kind(str(n)) == "warning"],
        "applies": applies,
        "can_apply": sess.status not in ACTIVE_STATUSES
        and target.retired_at is None
        and bool(apply_svc.recommended_changes(sess)),
        "can_rollback": any(a.status == "applied" for a in applies),
    }


def verdict_rows(trials: list[dict[str, Any]], objective: str) -> list[dict[str, Any]]:
    """The trial table's rows with each verdict on the candidate it judged.

    A keep or revert decided on an incumbent re-run (C I I: it lands on the last I) is
    shown on the candidate's row with its gain and p; the re-run says which trial it
    decided. Gains read in the objective's units (a query time that fell: -20%).
    """
    rows = [
        {
            **t,
            "shown_verdict": t["verdict"],
            "shown_gain": t["gain"],
            "shown_p": t["p_value"],
            "decided": None,
        }
        for t in trials
    ]
    by_index = {row["index"]: row for row in rows}
    for index, runs in judged_runs((t["index"], t["role"], t["verdict"]) for t in trials).items():
        if runs[-1] != index:  # decided on an incumbent re-run
            row, last = by_index[index], by_index[runs[-1]]
            last.update(
                shown_verdict=row["verdict"], shown_gain=row["gain"], shown_p=row["p_value"]
            )
            row.update(shown_verdict=None, shown_gain=None, shown_p=None, decided=last["index"])
    for row in rows:
        if row["shown_gain"] is not None:
            row["shown_gain"] = in_units(objective, row["shown_gain"])
    return rows


def _knobs_label(knobs: list[Any] | None) -> str:
    if not knobs:
        return "the catalogue's set for the workload"
    names = []
    for k in knobs:
        if isinstance(k, dict):
            lo, hi = k.get("min") or "", k.get("max") or ""
            names.append(f"{k.get('name')} [{lo}..{hi}]" if lo or hi else str(k.get("name")))
        else:
            names.append(str(k))
    return ", ".join(names)


def _session_page(
    request: Request,
    db: Database,
    session_id: int,
    *,
    error: str | None = None,
    status: int = 200,
) -> HTMLResponse:
    ctx = _session_ctx(db, session_id)
    return _page(request, "session.html", {**ctx, "error": error}, status)


@page.get("/sessions/{session_id}", response_class=HTMLResponse)
def session_view(session_id: int, request: Request, db: DB) -> HTMLResponse:
    pages: RenderedPages = request.app.state.pages
    body = pages.get(session_id)
    if body is not None:
        return HTMLResponse(body, headers=_HEADERS)
    response = _session_page(request, db, session_id)
    if response.status_code == 200:
        pages.put(session_id, bytes(response.body))
    return response


@page.get("/sessions/{session_id}/results", response_class=HTMLResponse)
def session_results(session_id: int, request: Request, db: DB) -> HTMLResponse:
    """The chart, config and trial table: the live view swaps it in when a trial completes."""
    return _page(request, "_results.html", _session_ctx(db, session_id))


# -- client sweeps (issue 16) ------------------------------------------------------------
def _latest_sweeps(db: Database) -> dict[int, Sweep]:
    """Each target's newest sweep, in one query over the newest sweeps."""
    out: dict[int, Sweep] = {}
    for sw in sweep_svc.list_sweeps(db, limit=200):
        out.setdefault(sw.target_id, sw)
    return out


def _sweep_page(
    request: Request, db: Database, sweep_id: int, error: str | None = None, status: int = 200
) -> HTMLResponse:
    sw = sweep_svc.get_sweep(db, sweep_id)
    target = target_svc.get_target(db, sw.target_id)
    out = sweep_svc.sweep_out(sw)
    chart = render_sweep_svg(
        out.points, knee=out.knee_clients, title=f"Client sweep {sw.id}: tps and p99 vs clients"
    )
    ctx = {"w": out, "target": target, "chart": chart, "error": error}
    return _page(request, "sweep.html", ctx, status)


@page.get("/sweeps/{sweep_id}", response_class=HTMLResponse)
def sweep_page(sweep_id: int, request: Request, db: DB) -> HTMLResponse:
    return _sweep_page(request, db, sweep_id)


@post.post("/targets/{target_id}/sweeps")
def start_sweep(target_id: int, request: Request, db: DB, sched: Sched) -> Response:
    """A sweep with the defaults (tpcb-like, 1, 2, 4, ... to the cap, 10 s runs twice)."""
    sw = sweep_svc.create_sweep(db, target_id, SweepIn())
    if sched is not None:
        sched.wake()  # the scheduler claims it now, not at its next poll
    return RedirectResponse(f"/sweeps/{sw.id}", status_code=303)


@post.post("/sweeps/{sweep_id}/cancel")
def cancel_sweep(sweep_id: int, request: Request, db: DB) -> Response:
    try:
        sweep_svc.cancel_sweep(db, sweep_id)
    except ServiceError as exc:
        return _sweep_page(request, db, sweep_id, error=exc.message, status=exc.status)
    return RedirectResponse(f"/sweeps/{sweep_id}", status_code=303)


# -- comparisons (issue 42) ---------------------------------------------------------------
def _comparison_page(
    request: Request, db: Database, comparison_id: int, error: str | None = None, status: int = 200
) -> HTMLResponse:
    row = compare_svc.get_comparison(db, comparison_id)
    target = target_svc.get_target(db, row.target_id)
    ctx = {"c": compare_svc.comparison_out(row, target.name), "target": target, "error": error}
    return _page(request, "comparison.html", ctx, status)


@page.get("/comparisons/{comparison_id}", response_class=HTMLResponse)
def comparison_page(comparison_id: int, request: Request, db: DB) -> HTMLResponse:
    return _comparison_page(request, db, comparison_id)


@post.post("/comparisons/{comparison_id}/cancel")
def cancel_comparison(comparison_id: int, request: Request, db: DB) -> Response:
    try:
        compare_svc.cancel_comparison(db, comparison_id)
    except ServiceError as exc:
        return _comparison_page(request, db, comparison_id, error=exc.message, status=exc.status)
    return RedirectResponse(f"/comparisons/{comparison_id}", status_code=303)


@post.post("/sessions/{session_id}/cancel")
def cancel(session_id: int, request: Request, db: DB) -> Response:
    try:
        session_svc.cancel_session(db, session_id)
    except ServiceError as exc:
        return _session_page(request, db, session_id, error=exc.message, status=exc.status)
    request.app.state.pages.forget(session_id)  # the redirect shows 'cancelling' at once
    return RedirectResponse(f"/sessions/{session_id}", status_code=303)


# -- captured workloads (issue 28) ------------------------------------------------------
CAPTURES_SHOWN = 200


@page.get("/captures", response_class=HTMLResponse)
def captures_page(request: Request, db: DB) -> HTMLResponse:
    names = capture_svc.target_names(db)
    rows = [
        capture_svc.capture_out(c, names.get(c.target_id or 0))
        for c in capture_svc.list_captures(db, CAPTURES_SHOWN)
    ]
    ctx = {
        "captures": rows,
        "shown": CAPTURES_SHOWN,
        "any_active": any(c.status in ACTIVE_STATUSES for c in rows),
    }
    return _page(request, "captures.html", ctx)


def _capture_page(
    request: Request,
    db: Database,
    capture_id: int,
    *,
    error: str | None = None,
    form: dict[str, str] | None = None,
    status: int = 200,
) -> HTMLResponse:
    cap = capture_svc.get_capture(db, capture_id)
    names = capture_svc.target_names(db)
    ctx = {
        "c": capture_svc.capture_out(cap, names.get(cap.target_id or 0)),
        "targets": [{"id": t.id, "name": t.name} for t in target_svc.list_targets(db)],
        "form": form or {"target_id": str(cap.target_id or ""), "speed": "1"},
        "error": error,
    }
    return _page(request, "capture.html", ctx, status)


@page.get("/captures/{capture_id}", response_class=HTMLResponse)
def capture_page(capture_id: int, request: Request, db: DB) -> HTMLResponse:
    return _capture_page(request, db, capture_id)


@post.post("/captures")
def start_capture(request: Request, db: DB, sched: Sched, form: Form) -> Response:
    """The target section's capture form: target, seconds, database."""
    body: dict[str, Any] = {
        "target_id": form.get("target_id", "").strip(),
        "name": form.get("name", "").strip(),
        "seconds": form.get("seconds", "").strip(),
    }
    if database := form.get("database", "").strip():
        body["database"] = database
    if not body["name"]:
        names = {str(t.id): t.name for t in target_svc.list_targets(db)}
        target = names.get(str(body["target_id"]), "capture")
        body["name"] = _capture_name(target)
    try:
        cap = capture_svc.create_capture(db, CaptureIn.model_validate(body))
    except (ValidationError, ServiceError) as exc:
        message, status = _refused(exc)
        return _index(request, db, capture_form=form, capture_error=message, status=status)
    if sched is not None:
        sched.wake()
    return RedirectResponse(f"/captures/{cap.id}", status_code=303)


def _capture_name(target: str) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", target).strip("-.") or "capture"
    if not base[0].isalpha():
        base = f"capture-{base}"
    return f"{base[:80]}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


@post.post("/captures/{capture_id}/cancel")
def cancel_capture(capture_id: int, request: Request, db: DB) -> Response:
    try:
        capture_svc.cancel_capture(db, capture_id)
    except ServiceError as exc:
        return _capture_page(request, db, capture_id, error=exc.message, status=exc.status)
    return RedirectResponse(f"/captures/{capture_id}", status_code=303)


@post.post("/captures/{capture_id}/delete")
def delete_capture(capture_id: int, request: Request, db: DB, settings: AppSettings) -> Response:
    try:
        capture_svc.delete_capture(db, settings, capture_id)
    except ServiceError as exc:
        return _capture_page(request, db, capture_id, error=exc.message, status=exc.status)
    return RedirectResponse("/captures", status_code=303)


@post.post("/captures/{capture_id}/sessions")
def session_from_capture(capture_id: int, request: Request, db: DB, form: Form) -> Response:
    """A session whose benchmark replays the capture (the replay workload)."""
    workload: dict[str, Any] = {"replay": capture_id}
    if speed := form.get("speed", "").strip():
        workload["speed"] = speed
    if database := form.get("replay_database", "").strip():
        workload["replay_database"] = database
    for key in ("duration_s", "warmup_s"):
        if value := form.get(key, "").strip():
            workload[key] = value
    body: dict[str, Any] = {"target_id": form.get("target_id", "").strip(), "workload": workload}
    if max_trials := form.get("max_trials", "").strip():
        body["max_trials"] = max_trials
    knobs = [k for k in re.split(r"[\s,]+", form.get("knobs", "")) if k]
    if knobs:
        body["knobs"] = knobs
    try:
        sess = session_svc.create_session(db, SessionIn.model_validate(body))
    except (ValidationError, ServiceError) as exc:
        message, status = _refused(exc)
        return _capture_page(request, db, capture_id, error=message, form=form, status=status)
    return RedirectResponse(f"/sessions/{sess.id}", status_code=303)


# -- apply a recommendation, roll it back (issue 27) -------------------------------------
def _apply_page(
    request: Request,
    db: Database,
    session_id: int,
    *,
    step: str,
    res: ApplyOut | None = None,
    error: str | None = None,
    status: int = 200,
) -> HTMLResponse:
    sess = session_svc.session_out(db, session_svc.get_session(db, session_id), detail=False)
    ctx = {"s": sess, "res": res, "step": step, "error": error}
    return _page(request, "apply.html", ctx, status)


def _apply_step(
    request: Request, db: Database, session_id: int, body: ApplyIn | RollbackIn
) -> HTMLResponse:
    """Apply or roll back, as ``body`` says (a dry run: the review before the button):
    the result's page, or the step's page again with the service's refusal."""
    settings = request.app.state.settings
    step = "apply" if isinstance(body, ApplyIn) else "rollback"
    try:
        if isinstance(body, ApplyIn):
            res = apply_svc.apply_session(db, settings, session_id, body)
        else:
            res = apply_svc.rollback_session(db, settings, session_id, body)
    except ServiceError as exc:
        return _apply_page(request, db, session_id, step=step, error=exc.message, status=exc.status)
    if body.dry_run:
        return _apply_page(request, db, session_id, step=step, res=res)
    request.app.state.pages.forget(session_id)  # its page lists the applies: not stale
    return _apply_page(request, db, session_id, step="done", res=res)


@page.get("/sessions/{session_id}/apply", response_class=HTMLResponse)
def apply_review(session_id: int, request: Request, db: DB) -> HTMLResponse:
    """What applying would change on the server (a dry run), and the button to do it."""
    return _apply_step(request, db, session_id, ApplyIn(dry_run=True))


@post.post("/sessions/{session_id}/apply")
def apply_now(session_id: int, request: Request, db: DB, form: Form) -> Response:
    body = ApplyIn(force=form.get("force") == "on", restart=form.get("restart") == "on")
    return _apply_step(request, db, session_id, body)


@page.get("/sessions/{session_id}/rollback", response_class=HTMLResponse)
def rollback_review(session_id: int, request: Request, db: DB) -> HTMLResponse:
    return _apply_step(request, db, session_id, RollbackIn(dry_run=True))


@post.post("/sessions/{session_id}/rollback")
def rollback_now(session_id: int, request: Request, db: DB, form: Form) -> Response:
    return _apply_step(request, db, session_id, RollbackIn(confirm=form.get("confirm") == "on"))


# -- login (only meaningful when KNOBTUNE_API_TOKEN is set) -----------------------------
def _safe_next(value: str | None) -> str:
    """Only same-site paths: an open redirect would let a link send users elsewhere."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, settings: AppSettings, next: str = "/") -> Response:
    if settings.api_token is None:
        return RedirectResponse(_safe_next(next), status_code=303)
    return _page(request, "login.html", {"next": _safe_next(next), "error": None})


@router.post("/login", dependencies=[Depends(_same_origin)])
def login(request: Request, settings: AppSettings, form: Form) -> Response:
    nxt = _safe_next(form.get("next"))
    if settings.api_token is None:
        return RedirectResponse(nxt, status_code=303)
    given = form.get("token", "").strip()
    try:
        ok = authenticate(request, given)  # counts wrong tokens per address (429 when locked)
    except HTTPException as exc:
        if exc.status_code != 429:
            raise
        locked = _page(request, "login.html", {"next": nxt, "error": exc.detail}, 429)
        locked.headers.update(exc.headers or {})
        return locked
    if not ok:
        ctx = {"next": nxt, "error": "wrong token: give the service's KNOBTUNE_API_TOKEN"}
        return _page(request, "login.html", ctx, 401)
    resp = RedirectResponse(nxt, status_code=303)
    # HttpOnly: page scripts never see it; SameSite=Lax: other sites' POSTs don't carry it.
    resp.set_cookie(
        TOKEN_COOKIE,
        given,
        max_age=COOKIE_MAX_AGE_S,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
        path="/",
    )
    return resp


@router.post("/logout", dependencies=[Depends(_same_origin)])
def logout() -> Response:
    resp = RedirectResponse("/login", status_code=303)
    resp.delete_cookie(TOKEN_COOKIE, path="/")
    return resp


# -- vendored assets ------------------------------------------------------------------------
@router.get("/static/{name}")
def static(name: str) -> Response:
    item = STATIC.get(name)
    if item is None:
        raise HTTPException(404, f"no static file {name!r}")
    body, media, _ = item
    # URLs carry the content hash (static_url), so browsers may keep them for good.
    headers = {**_HEADERS, "Cache-Control": "public, max-age=31536000, immutable"}
    return Response(body, media_type=media, headers=headers)


router.include_router(page)
router.include_router(post)
