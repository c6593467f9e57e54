"""Recurring sessions: a session request re-run on a cron or interval trigger."""

from __future__ import annotations

from typing import Any

from apscheduler.triggers.cron import CronTrigger
from sqlalchemy import select

from app.db import Database, utcnow
from app.errors import ServiceError, to_id
from app.models import Schedule
from app.sessions.schemas import ScheduleIn, ScheduleOut
from app.sessions.service import validate_session
from app.targets.service import get_target


def cron_trigger(cron: str) -> CronTrigger:
    """A crontab line as a UTC trigger; ValueError with APScheduler's reason otherwise."""
    return CronTrigger.from_crontab(cron, timezone="UTC")


def create_schedule(db: Database, body: ScheduleIn) -> Schedule:
    if body.cron is not None:
        try:
            cron_trigger(body.cron)
        except ValueError as exc:
            raise ServiceError(422, f"bad cron {body.cron!r}: {exc} (e.g. '0 2 * * sun')") from exc
    target = get_target(db, body.session.target_id)
    validate_session(target, body.session)
    sc = Schedule(
        target_id=target.id,
        cron=body.cron,
        interval_s=body.interval_s,
        request=body.session.model_dump(mode="json"),
        enabled=True,
        created_at=utcnow(),
    )
    with db.session() as s:
        s.add(sc)
    return sc


def schedule_out(sc: Schedule, next_fire: Any) -> ScheduleOut:
    return ScheduleOut(
        id=sc.id,
        target_id=sc.target_id,
        cron=sc.cron,
        interval_s=sc.interval_s,
        enabled=sc.enabled,
        last_fired_at=sc.last_fired_at,
        last_result=sc.last_result,
        next_fire_at=next_fire,
        request=sc.request,
    )


def list_schedules(db: Database) -> list[Schedule]:
    with db.session() as s:
        return list(s.scalars(select(Schedule).order_by(Schedule.id)).all())


def delete_schedule(db: Database, schedule_id: int) -> None:
    with db.session() as s:
        sc = s.get(Schedule, to_id(schedule_id))
        if sc is None:
            raise ServiceError(404, f"no schedule {schedule_id}")
        s.delete(sc)
