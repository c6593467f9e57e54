"""/api/v1/sessions: start, list, poll and cancel tuning sessions; trials; exports;
apply a session's recommendation to its target and roll it back."""

from __future__ import annotations

from typing import Literal

from fastapi import Query, Response
from fastapi.responses import PlainTextResponse

from app.api.deps import DB, AppSettings, api_router
from app.sessions import apply, export, service
from app.sessions.schemas import ApplyIn, ApplyOut, RollbackIn, SessionIn, SessionOut, TrialOut
from app.sessions.summary import run_value

router = api_router("sessions")

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]


@router.post("/sessions", status_code=202, response_model=SessionOut)
def create_session(body: SessionIn, db: DB, response: Response) -> SessionOut:
    sess = service.create_session(db, body)
    response.headers["Location"] = f"/api/v1/sessions/{sess.id}"
    return service.session_out(db, sess)


@router.get("/sessions", response_model=list[SessionOut])
def list_sessions(
    db: DB,
    status: Status | None = None,
    target_id: int | None = None,
    limit: int = Query(default=100, ge=1, le=1000),
) -> list[SessionOut]:
    return service.sessions_out(
        db, service.list_sessions(db, status=status, target_id=target_id, limit=limit)
    )


@router.get("/sessions/{session_id}", response_model=SessionOut)
def get_session(session_id: int, db: DB) -> SessionOut:
    return service.session_out(db, service.get_session(db, session_id))


@router.post("/sessions/{session_id}/cancel", status_code=202, response_model=SessionOut)
def cancel_session(session_id: int, db: DB) -> SessionOut:
    return service.session_out(db, service.cancel_session(db, session_id))


@router.get("/sessions/{session_id}/trials", response_model=list[TrialOut])
def list_trials(session_id: int, db: DB) -> list[TrialOut]:
    request = service.get_session(db, session_id).request
    out = []
    for t in service.list_trials(db, session_id):
        row = service.trial_out(t)
        row.level = run_value(t.evidence, request)
        out.append(row)
    return out


# media type and file name per export format
EXPORT_FILES = {
    "conf": ("text/plain", "postgresql.conf"),
    "sql": ("application/sql", "knobtune.sql"),
    "json": ("application/json", "knobtune.json"),
    "rds": ("application/json", "rds-parameters.json"),
    "cloudsql": ("text/x-shellscript", "cloudsql-flags.sh"),
    "azure": ("text/x-shellscript", "azure-parameters.sh"),
    "cnpg": ("application/yaml", "cnpg-parameters.yaml"),
    "patroni": ("application/yaml", "patroni-parameters.yaml"),
}


@router.get("/sessions/{session_id}/config", response_class=PlainTextResponse)
def export_config(
    session_id: int,
    db: DB,
    format: Literal["conf", "sql", "json", "rds", "cloudsql", "azure", "cnpg", "patroni"] = "conf",
) -> Response:
    """The recommended config: postgresql.conf lines, ALTER SYSTEM, JSON, or a managed
    service's own form (rds: a modify-db-parameter-group file; cloudsql, azure: their CLI
    lines; cnpg, patroni: YAML)."""
    body = export.export(db, session_id, format)
    media, filename = EXPORT_FILES[format]
    return Response(
        body,
        media_type=f"{media}; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="session-{session_id}-{filename}"'},
    )


# apply and rollback change a server: their JSON body is required ({} for the defaults),
# so a POST without one (a foreign page's, or a mistake) gets 422 before any work.
@router.post("/sessions/{session_id}/apply", response_model=ApplyOut)
def apply_session(session_id: int, db: DB, settings: AppSettings, body: ApplyIn) -> ApplyOut:
    """Apply the session's recommendation to its target (``dry_run``: only the diff).

    ALTER SYSTEM, a reload (a restart where a knob needs one and the target has a
    restart method), every value checked in pg_settings; recorded for a rollback. The
    body is required: ``{}`` applies with the defaults.
    """
    return apply.apply_session(db, settings, session_id, body)


@router.post("/sessions/{session_id}/rollback", response_model=ApplyOut)
def rollback_session(session_id: int, db: DB, settings: AppSettings, body: RollbackIn) -> ApplyOut:
    """Put back the settings the session's last apply replaced (body required: ``{}``).

    A server whose settings changed since the apply gets 409 with the difference, unless
    ``confirm`` is true.
    """
    return apply.rollback_session(db, settings, session_id, body)


@router.get("/sessions/{session_id}/applies", response_model=list[ApplyOut])
def list_applies(session_id: int, db: DB) -> list[ApplyOut]:
    return apply.list_applies(db, session_id)
