"""Captured workloads (issue 28): the captures list, one capture's page, starting a
capture from the home page's form, cancelling, deleting, and a session replaying one."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.api.deps import DB, AppSettings, Sched
from app.captures import service as capture_svc
from app.captures.schemas import CaptureIn
from app.db import Database
from app.models import ACTIVE_STATUSES
from app.sessions import service as session_svc
from app.sessions.schemas import SessionIn
from app.targets import service as target_svc
from app.web.index import index_page
from app.web.render import Form, page_routers, render_page, shown_on

CAPTURES_SHOWN = 200

page, post = page_routers()


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
    return render_page(request, "captures.html", ctx)


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
    return render_page(request, "capture.html", ctx, status)


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
    with shown_on(
        lambda message, status: index_page(
            request, db, capture_form=form, capture_error=message, status=status
        ),
        form=True,
    ):
        cap = capture_svc.create_capture(db, CaptureIn.model_validate(body))
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
    with shown_on(
        lambda message, status: _capture_page(request, db, capture_id, error=message, status=status)
    ):
        capture_svc.cancel_capture(db, capture_id)
    return RedirectResponse(f"/captures/{capture_id}", status_code=303)


@post.post("/captures/{capture_id}/delete")
def delete_capture(capture_id: int, request: Request, db: DB, settings: AppSettings) -> Response:
    with shown_on(
        lambda message, status: _capture_page(request, db, capture_id, error=message, status=status)
    ):
        capture_svc.delete_capture(db, settings, capture_id)
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
    with shown_on(
        lambda message, status: _capture_page(
            request, db, capture_id, error=message, form=form, status=status
        ),
        form=True,
    ):
        sess = session_svc.create_session(db, SessionIn.model_validate(body))
    return RedirectResponse(f"/sessions/{sess.id}", status_code=303)
