"""/api/v1: targets, sessions, trials, exports, schedules, knob catalogue."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Query, Response
from fastapi.responses import PlainTextResponse

from app import service
from app import sweep as sweeps
from app.api.deps import DB, AppSettings, Sched, require_token
from app.chart import render_sweep_svg
from app.schemas import (
    ScheduleIn,
    ScheduleOut,
    SessionIn,
    SessionOut,
    SweepIn,
    SweepOut,
    TargetIn,
    TargetOut,
    TrialOut,
)
from optimizer.catalogue import CATALOGUE

# Plain `def` routes: their work is sync (psycopg, SQLAlchemy), so FastAPI runs
# them in its thread pool and the event loop never blocks.
router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_token)])

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]


@router.post("/targets", status_code=201, response_model=TargetOut)
def create_target(body: TargetIn, db: DB, settings: AppSettings, response: Response) -> TargetOut:
    target = service.create_target(db, settings, body)
    response.headers["Location"] = f"/api/v1/targets/{target.id}"
    return service.target_out(db, target)


@router.get("/targets", response_model=list[TargetOut])
def list_targets(db: DB) -> list[TargetOut]:
    return [service.target_out(db, t) for t in service.list_targets(db)]


@router.get("/targets/{target_id}", response_model=TargetOut)
def get_target(target_id: int, db: DB) -> TargetOut:
    return service.target_out(db, service.get_target(db, target_id))


@router.delete("/targets/{target_id}", status_code=204)
def delete_target(
    target_id: int,
    db: DB,
    sched: Sched,
    history: Literal["keep", "drop"] | None = Query(
        default=None,
        description="For a target with sessions: 'keep' retires it (hidden from lists, its "
        "sessions and trials stay), 'drop' deletes them with it. Without it such a target "
        "gets 409.",
    ),
) -> Response:
    service.delete_target(db, target_id, history)
    if sched is not None:
        sched.sync_schedules()  # its schedules went with it
    return Response(status_code=204)


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
    return [service.trial_out(t) for t in service.list_trials(db, session_id)]


@router.get("/sessions/{session_id}/config", response_class=PlainTextResponse)
def export_config(
    session_id: int, db: DB, format: Literal["conf", "sql", "json"] = "conf"
) -> Response:
    body = service.export(db, session_id, format)
    media = {"conf": "text/plain", "sql": "application/sql", "json": "application/json"}[format]
    filename = {"conf": "postgresql.conf", "sql": "knobtune.sql", "json": "knobtune.json"}[format]
    return Response(
        body,
        media_type=f"{media}; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="session-{session_id}-{filename}"'},
    )


@router.get("/knobs")
def list_knobs() -> list[dict[str, object]]:
    return [spec.describe() for spec in CATALOGUE.values()]


@router.post("/schedules", status_code=201, response_model=ScheduleOut)
def create_schedule(body: ScheduleIn, db: DB, sched: Sched) -> ScheduleOut:
    sc = service.create_schedule(db, body)
    if sched is not None:
        sched.sync_schedules()
    return service.schedule_out(sc, sched.next_fire(sc.id) if sched else None)


@router.get("/schedules", response_model=list[ScheduleOut])
def list_schedules(db: DB, sched: Sched) -> list[ScheduleOut]:
    return [
        service.schedule_out(sc, sched.next_fire(sc.id) if sched else None)
        for sc in service.list_schedules(db)
    ]


@router.delete("/schedules/{schedule_id}", status_code=204)
def delete_schedule(schedule_id: int, db: DB, sched: Sched) -> Response:
    service.delete_schedule(db, schedule_id)
    if sched is not None:
        sched.sync_schedules()
    return Response(status_code=204)


# -- client sweeps (issue 16) ---------------------------------------------------------
@router.post("/targets/{target_id}/sweeps", status_code=202, response_model=SweepOut)
def create_sweep(
    target_id: int, body: SweepIn, db: DB, settings: AppSettings, response: Response
) -> SweepOut:
    sw = sweeps.create_sweep(db, target_id, body, settings.instance_id)
    sweeps.start_sweep_job(db, settings, sw.id)
    response.headers["Location"] = f"/api/v1/sweeps/{sw.id}"
    return sweeps.sweep_out(sw)


@router.get("/sweeps", response_model=list[SweepOut])
def list_sweeps(
    db: DB, target_id: int | None = None, limit: int = Query(default=100, ge=1, le=1000)
) -> list[SweepOut]:
    return [sweeps.sweep_out(x) for x in sweeps.list_sweeps(db, target_id, limit)]


@router.get("/sweeps/{sweep_id}", response_model=SweepOut)
def get_sweep(sweep_id: int, db: DB) -> SweepOut:
    return sweeps.sweep_out(sweeps.get_sweep(db, sweep_id))


@router.post("/sweeps/{sweep_id}/cancel", status_code=202, response_model=SweepOut)
def cancel_sweep(sweep_id: int, db: DB) -> SweepOut:
    return sweeps.sweep_out(sweeps.cancel_sweep(db, sweep_id))


@router.get("/sweeps/{sweep_id}/chart.svg")
def sweep_chart(sweep_id: int, db: DB) -> Response:
    sw = sweeps.get_sweep(db, sweep_id)
    points = (sw.result or {}).get("points", [])
    svg = render_sweep_svg(
        points, knee=sw.knee_clients, title=f"Client sweep {sw.id}: tps and p99 vs clients"
    )
    return Response(svg, media_type="image/svg+xml")
