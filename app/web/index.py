"""The dashboard's home page at ``/``: the sessions list, the targets with their newest
sweep, and the forms (new session, new target, capture). The forms' posts live with
their domains (app/web/sessions.py, targets.py, captures.py) and show a refusal here
again, on the form that was sent."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse

from app.api.deps import DB
from app.db import Database
from app.models import ACTIVE_STATUSES
from app.postgres.cgroups import PROFILES, Limits
from app.sessions import service as session_svc
from app.sessions.schemas import SessionIn
from app.sweeps import service as sweep_svc
from app.sweeps.schemas import SweepOut
from app.targets import service as target_svc
from app.web.render import page_routers, render_page
from app.workloads.schemas import PGBENCH_DEFAULTS, workload_defaults
from optimizer.catalogue import CATALOGUE
from optimizer.objective import CHOICE_WORDS, DEFAULT_OBJECTIVE

SESSIONS_SHOWN = 50  # the index lists the newest sessions only: bounded page cost

page, post = page_routers()


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


def _latest_sweeps(db: Database) -> dict[int, SweepOut]:
    """Each target's newest sweep, in one query over the newest sweeps."""
    out: dict[int, SweepOut] = {}
    for sw in sweep_svc.list_sweeps(db, limit=200):
        if sw.target_id not in out:
            out[sw.target_id] = sweep_svc.sweep_out(sw)
    return out


def index_page(
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
    """The home page; a form that was refused is shown again with its error."""
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
        # built here, not from target_svc.target_out: that costs a query per target
        # (its holder), and the page has the holders of all of them from one query
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
        "objective_choices": list(CHOICE_WORDS.items()),
        "estimate": estimate_text(
            _int(form.get("max_trials"), SessionIn.model_fields["max_trials"].default),
            _int(form.get("duration_s"), PGBENCH_DEFAULTS["duration_s"]),
        ),
    }
    return render_page(request, "index.html", ctx, status)


@page.get("/", response_class=HTMLResponse)
def index(request: Request, db: DB) -> HTMLResponse:
    return index_page(request, db)


@page.get("/partials/sessions", response_class=HTMLResponse)
def sessions_partial(request: Request, db: DB) -> HTMLResponse:
    return render_page(request, "_sessions.html", _sessions_ctx(db))
