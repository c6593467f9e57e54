"""/api/v1/schedules: recurring sessions on a cron or interval trigger."""

from __future__ import annotations

from fastapi import Response

from app.api.deps import DB, Sched, api_router
from app.sessions import schedules as service
from app.sessions.schemas import ScheduleIn, ScheduleOut

router = api_router("schedules")


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
