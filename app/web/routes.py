"""Dashboard pages at ``/``: sessions, one session's live view and results, forms, login.

Server-rendered (Jinja2) over ``app.service``, like the REST API. The only script
is ``static/dashboard.js``: it polls the REST API for the live view. Plain
``def`` routes: the work is sync DB access, run in FastAPI's thread pool. Pages
cost a handful of queries each (no per-row queries) and show bounded lists.
"""

from __future__ import annotations

import hashlib
import re
import threading
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qsl, quote, urlsplit

from cachetools import TTLCache
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError
from sqlalchemy import select

from app import service
from app import sweep as sweeps
from app.api.deps import DB, TOKEN_COOKIE, AppSettings, Sched, is_authorized, token_ok
from app.chart import final_label, points_of, readable, render_svg, render_sweep_svg
from app.db import Database
from app.models import ACTIVE_STATUSES, Sweep, Trial, TuningSession
from app.postgres.dsn import mask_dsn
from app.postgres.sandbox import SandboxError
from app.schemas import SessionIn, SweepIn, TargetIn, WorkloadIn
from optimizer.catalogue import CATALOGUE
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
    ctx = {"auth_enabled": settings.api_token is not None, **ctx}
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


def _same_origin(request: Request) -> None:
    """Refuse cross-site form posts (CSRF): a browser always sends Origin on a POST.

    Needed even without a token: otherwise any web page a user visits could
    start sessions on their targets through a plain HTML form.
    """
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
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


Form = Annotated[dict[str, str], Depends(_form)]
router = APIRouter(include_in_schema=False)
page = APIRouter(include_in_schema=False, dependencies=[Depends(_page_auth)])
post = APIRouter(include_in_schema=False, dependencies=[Depends(_page_auth), Depends(_same_origin)])


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]).removeprefix("workload.")
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


# -- index: sessions list and the two forms -------------------------------------------
def _session_defaults() -> dict[str, str]:
    wl = WorkloadIn()
    return {
        "builtin": wl.builtin or "none",
        "scale": f"{wl.scale:g}",
        "clients": str(wl.clients),
        "jobs": str(wl.jobs),
        "duration_s": str(wl.duration_s),
        "warmup_s": str(wl.warmup_s),
        "max_trials": str(SessionIn.model_fields["max_trials"].default),
        "final_check_runs": str(SessionIn.model_fields["final_check_runs"].default),
        "on_finish": "restore",
        "start": "current",
        "objective": "throughput",
        "mode": wl.mode,
    }


def _sessions_ctx(db: Database) -> dict[str, Any]:
    sessions = service.sessions_out(db, service.list_sessions(db, limit=SESSIONS_SHOWN))
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
    status: int = 200,
) -> HTMLResponse:
    targets = service.list_targets(db)
    with db.session() as s:
        # One narrow query (not full session rows): which target is busy with which session.
        busy = dict(
            s.execute(
                select(TuningSession.target_id, TuningSession.id).where(
                    TuningSession.status.in_(ACTIVE_STATUSES)
                )
            )
            .tuples()
            .all()
        )
    form = _session_defaults()
    if session_form is not None:
        form.update(session_form)
    elif request.query_params.get("target_id"):
        form["target_id"] = request.query_params["target_id"]
    ctx = {
        **_sessions_ctx(db),
        # Retired targets' sessions stay listed: their names too.
        "target_names": {t.id: t.name for t in service.list_targets(db, include_retired=True)},
        "targets": [
            {
                "id": t.id,
                "name": t.name,
                "dsn": mask_dsn(t.dsn),
                "sandbox": t.sandbox_dir is not None,
                "version": (t.probe or {}).get("version"),
                "busy": busy.get(t.id),
            }
            for t in targets
        ],
        "sweeps": _latest_sweeps(db),
        "form": form,
        "session_error": session_error,
        "target_form": {k: v for k, v in (target_form or {}).items() if k != "dsn"},
        "target_error": target_error,
        "knob_names": sorted(CATALOGUE),
    }
    return _page(request, "index.html", ctx, status)


@page.get("/", response_class=HTMLResponse)
def index(request: Request, db: DB) -> HTMLResponse:
    return _index(request, db)


@page.get("/partials/sessions", response_class=HTMLResponse)
def sessions_partial(request: Request, db: DB) -> HTMLResponse:
    names = {t.id: t.name for t in service.list_targets(db, include_retired=True)}
    return _page(request, "_sessions.html", {**_sessions_ctx(db), "target_names": names})


def _session_request(form: dict[str, str]) -> dict[str, Any]:
    """The form's fields as a SessionIn body; blank fields take the API's defaults."""

    def given(key: str) -> str | None:
        value = form.get(key, "").strip()
        return value or None

    workload: dict[str, Any] = {}
    builtin = given("builtin") or "tpcb-like"
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
        sess = service.create_session(db, SessionIn.model_validate(_session_request(form)))
    except ValidationError as exc:
        return _index(
            request, db, session_form=form, session_error=_validation_message(exc), status=422
        )
    except service.ServiceError as exc:
        return _index(request, db, session_form=form, session_error=exc.message, status=exc.status)
    return RedirectResponse(f"/sessions/{sess.id}", status_code=303)


@post.post("/targets")
def register_target(request: Request, db: DB, settings: AppSettings, form: Form) -> Response:
    body: dict[str, Any] = {
        "name": form.get("name", "").strip(),
        "sandbox": form.get("sandbox") == "on",
    }
    for key in ("dsn", "restart_command", "data_dir", "cpus"):
        if value := form.get(key, "").strip():
            body[key] = value
    try:
        if ram := form.get("ram_gib", "").strip():
            body["ram_bytes"] = int(float(ram) * 2**30)
        target = service.create_target(db, settings, TargetIn.model_validate(body))
    except ValidationError as exc:
        message = _validation_message(exc)
    except ValueError:
        message = "RAM: give the target's memory in GiB, e.g. 16"
    except service.ServiceError as exc:
        message = exc.message
    except SandboxError as exc:  # not mapped by service.create_target (yet): never a 500 here
        message = f"could not create the sandbox: {exc}"
    else:
        return RedirectResponse(f"/?target_id={target.id}#new-session", status_code=303)
    return _index(request, db, target_form=form, target_error=message, status=422)


@post.post("/targets/{target_id}/delete")
def delete_target(target_id: int, request: Request, db: DB, sched: Sched, form: Form) -> Response:
    """The dashboard's remove buttons: keep the target's history (retire) or drop it."""
    choice = form.get("history")
    history: service.HistoryChoice | None = (
        "keep" if choice == "keep" else "drop" if choice == "drop" else None
    )
    try:
        service.delete_target(db, target_id, history)
    except service.ServiceError as exc:
        return _index(request, db, target_error=exc.message, status=exc.status)
    if sched is not None:
        sched.sync_schedules()
    return RedirectResponse("/#targets", status_code=303)


# -- one session ------------------------------------------------------------------------
def _trials(db: Database, session_id: int) -> list[dict[str, Any]]:
    """The trial table's columns, shaped like TrialOut (what points_of reads).

    Narrow on purpose: the per-second samples (the bulk of a trial row) are not
    loaded, so a page costs the same however long the runs were.
    """
    cols = (
        Trial.index,
        Trial.role,
        Trial.knob,
        Trial.value,
        Trial.median_tps,
        Trial.latency_p95_ms,
        Trial.gain,
        Trial.p_value,
        Trial.verdict,
        Trial.reason,
        Trial.error,
        Trial.drift,
        Trial.started_at,
        Trial.finished_at,
    )
    with db.session() as s:
        rows = (
            s.execute(select(*cols).where(Trial.session_id == session_id).order_by(Trial.index))
            .mappings()
            .all()
        )
    return [
        {
            **row,
            "samples": {"median_tps": row["median_tps"], "latency_p95_ms": row["latency_p95_ms"]},
        }
        for row in rows
    ]


def _session_ctx(db: Database, session_id: int) -> dict[str, Any]:
    sess = service.get_session(db, session_id)
    trials = _trials(db, session_id)
    # Trial count and mean trial time from the rows at hand: no extra count query.
    per_trial = (
        (trials[-1]["finished_at"] - trials[0]["started_at"]).total_seconds() / len(trials)
        if trials
        else None
    )
    out = service.session_out(db, sess, {session_id: (len(trials), per_trial)})
    target = service.get_target(db, sess.target_id)
    chart = (
        render_svg(
            points_of(trials),
            baseline=out.baseline_tps,
            title=f"Session {session_id}: median throughput per trial",
            final_label=final_label({"gain": out.gain, "gain_status": out.gain_status}),
        )
        if any(t["median_tps"] is not None and t["error"] is None for t in trials)
        else None
    )
    start, best = sess.start_config or {}, sess.best_config or {}
    config = [
        {"knob": k, "start": start.get(k), "best": best.get(k), "changed": start.get(k) != best[k]}
        for k in sorted(best)
    ]
    return {
        "s": out,
        "target": {"id": target.id, "name": target.name, "dsn": mask_dsn(target.dsn)},
        "trials": trials,
        "chart": chart,
        "config": config,
        # a failed session offers no download of a config that recommends nothing
        "downloads": sess.start_config is not None
        and sess.best_config is not None
        and (sess.status != "failed" or any(c["changed"] for c in config)),
        "wl": out.request.get("workload", {}),
        "knobs": _knobs_label(out.request.get("knobs")),
    }


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
    try:
        ctx = _session_ctx(db, session_id)
    except service.ServiceError as exc:
        return _page(request, "error.html", {"message": exc.message}, exc.status)
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
    try:
        ctx = _session_ctx(db, session_id)
    except service.ServiceError as exc:
        return _page(request, "error.html", {"message": exc.message}, exc.status)
    return _page(request, "_results.html", ctx)


# -- client sweeps (issue 16) ------------------------------------------------------------
def _latest_sweeps(db: Database) -> dict[int, Sweep]:
    """Each target's newest sweep, in one query over the newest sweeps."""
    out: dict[int, Sweep] = {}
    for sw in sweeps.list_sweeps(db, limit=200):
        out.setdefault(sw.target_id, sw)
    return out


def _sweep_page(
    request: Request, db: Database, sweep_id: int, error: str | None = None, status: int = 200
) -> HTMLResponse:
    try:
        sw = sweeps.get_sweep(db, sweep_id)
        target = service.get_target(db, sw.target_id)
    except service.ServiceError as exc:
        return _page(request, "error.html", {"message": exc.message}, exc.status)
    out = sweeps.sweep_out(sw)
    chart = render_sweep_svg(
        out.points, knee=out.knee_clients, title=f"Client sweep {sw.id}: tps and p99 vs clients"
    )
    ctx = {"w": out, "target": target, "chart": chart, "error": error}
    return _page(request, "sweep.html", ctx, status)


@page.get("/sweeps/{sweep_id}", response_class=HTMLResponse)
def sweep_page(sweep_id: int, request: Request, db: DB) -> HTMLResponse:
    return _sweep_page(request, db, sweep_id)


@post.post("/targets/{target_id}/sweeps")
def start_sweep(target_id: int, request: Request, db: DB, settings: AppSettings) -> Response:
    """A sweep with the defaults (tpcb-like, 1, 2, 4, ... to the cap, 10 s runs twice)."""
    try:
        sw = sweeps.create_sweep(db, target_id, SweepIn(), settings.instance_id)
    except service.ServiceError as exc:
        return _page(request, "error.html", {"message": exc.message}, exc.status)
    sweeps.start_sweep_job(db, settings, sw.id)
    return RedirectResponse(f"/sweeps/{sw.id}", status_code=303)


@post.post("/sweeps/{sweep_id}/cancel")
def cancel_sweep(sweep_id: int, request: Request, db: DB) -> Response:
    try:
        sweeps.cancel_sweep(db, sweep_id)
    except service.ServiceError as exc:
        return _sweep_page(request, db, sweep_id, error=exc.message, status=exc.status)
    return RedirectResponse(f"/sweeps/{sweep_id}", status_code=303)


@post.post("/sessions/{session_id}/cancel")
def cancel(session_id: int, request: Request, db: DB) -> Response:
    try:
        service.cancel_session(db, session_id)
    except service.ServiceError as exc:
        return _session_page(request, db, session_id, error=exc.message, status=exc.status)
    request.app.state.pages.forget(session_id)  # the redirect shows 'cancelling' at once
    return RedirectResponse(f"/sessions/{session_id}", status_code=303)


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
    if not token_ok(settings, given):
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
