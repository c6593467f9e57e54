"""APScheduler glue: claims sessions under a lease and fires recurring sessions.

Several service processes may share one PostgreSQL metadata DB. Each process
has its own in-memory APScheduler (job stores are never shared); coordination
happens only through the DB:

* a session is claimed by a compare-and-set on its lease (``SELECT ... FOR
  UPDATE SKIP LOCKED`` on PostgreSQL, then an UPDATE guarded by the lease
  still being free), renewed by the runner's heartbeat; a dead process's
  lease expires and another process takes the session over (and resumes it);
* recurring triggers run only in the process holding a PostgreSQL advisory
  lock (SQLite has one process by design, which is always the leader).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from datetime import timedelta
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy import Connection, or_, select, text, update

from app.db import Database, changed_rows, utcnow
from app.models import ACTIVE_STATUSES, Schedule, TuningSession
from app.runner import SessionRunner
from app.settings import Settings

log = logging.getLogger(__name__)

LEADER_LOCK_KEY = 0x6B6E6F62  # 'knob': the advisory lock id of the trigger leader


def cron_trigger(cron: str) -> CronTrigger:
    """A crontab line as a UTC trigger; ValueError with APScheduler's reason otherwise."""
    return CronTrigger.from_crontab(cron, timezone="UTC")


class Scheduler:
    def __init__(self, db: Database, settings: Settings) -> None:
        self.db, self.settings = db, settings
        self.owner = settings.instance_id
        self.scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(settings.max_parallel_sessions + 2)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 300},
            timezone="UTC",
        )
        self._running: set[int] = set()
        self._lock = threading.Lock()
        self._leader_conn: Connection | None = None

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        self.scheduler.add_job(
            self.claim,
            "interval",
            seconds=self.settings.poll_seconds,
            id="claim",
            next_run_time=utcnow(),
        )
        self.scheduler.add_job(
            self.sync_schedules, "interval", seconds=15, id="sync-schedules", next_run_time=utcnow()
        )
        self.scheduler.start()

    def shutdown(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        if self._leader_conn is not None:
            self._leader_conn.close()
            self._leader_conn = None

    def running(self) -> set[int]:
        with self._lock:
            return set(self._running)

    # -- sessions ----------------------------------------------------------------
    def claim(self) -> list[int]:
        """Take free sessions (queued, or running with an expired lease) up to our capacity."""
        with self._lock:
            free = self.settings.max_parallel_sessions - len(self._running)
        if free <= 0:
            return []
        now = utcnow()
        lease_free = or_(
            TuningSession.lease_expires_at.is_(None), TuningSession.lease_expires_at < now
        )
        claimed: list[int] = []
        with self.db.session() as s:
            ids = s.scalars(
                select(TuningSession.id)
                .where(TuningSession.status.in_(ACTIVE_STATUSES), lease_free)
                .order_by(TuningSession.created_at, TuningSession.id)
                .limit(free)
                .with_for_update(skip_locked=True)
            ).all()
            for sid in ids:
                # Guarded update: only one process can move a free lease to itself.
                n = changed_rows(
                    s,
                    update(TuningSession)
                    .where(TuningSession.id == sid, lease_free)
                    .values(
                        lease_owner=self.owner,
                        lease_expires_at=now + timedelta(seconds=self.settings.lease_seconds),
                    ),
                )
                if n == 1:
                    claimed.append(sid)
        for sid in claimed:
            with self._lock:
                self._running.add(sid)
            self.scheduler.add_job(
                self._run, args=[sid], id=f"session-{sid}", replace_existing=True
            )
        return claimed

    def _run(self, session_id: int) -> None:
        try:
            SessionRunner(self.db, self.settings, session_id, self.owner).run()
        except Exception:
            log.exception("runner of session %s crashed", session_id)
        finally:
            with self._lock:
                self._running.discard(session_id)

    # -- recurring sessions --------------------------------------------------------
    def is_leader(self) -> bool:
        if not self.db.is_postgres:
            return True
        if self._leader_conn is not None:
            try:
                self._leader_conn.execute(text("SELECT 1"))
                return True
            except Exception:
                # Connection lost: the lock went with it; compete again below.
                with contextlib.suppress(Exception):
                    self._leader_conn.close()
                self._leader_conn = None
        conn = self.db.engine.connect()
        # Detached from the pool: closing it must end the DB session, and with
        # it the session-level lock, not park the lock in the pool.
        conn.detach()
        got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LEADER_LOCK_KEY}).scalar()
        conn.commit()
        if got:
            self._leader_conn = conn  # held open: the lock lives as long as it does
            return True
        conn.close()
        return False

    def sync_schedules(self) -> None:
        """Mirror the DB's schedules into this process's triggers (leader only)."""
        leader = self.is_leader()
        with self.db.session() as s:
            schedules = (
                s.scalars(select(Schedule).where(Schedule.enabled.is_(True))).all()
                if leader
                else []
            )
            wanted = {f"schedule-{sc.id}": sc for sc in schedules}
        for job in self.scheduler.get_jobs():
            if job.id.startswith("schedule-") and job.id not in wanted:
                job.remove()
        for job_id, sc in wanted.items():
            if self.scheduler.get_job(job_id) is None:
                trigger: Any = (
                    cron_trigger(sc.cron)
                    if sc.cron
                    else IntervalTrigger(seconds=sc.interval_s or 3600, timezone="UTC")
                )
                self.scheduler.add_job(self.fire, trigger, args=[sc.id], id=job_id)

    def next_fire(self, schedule_id: int) -> Any:
        job = self.scheduler.get_job(f"schedule-{schedule_id}")
        return job.next_run_time if job else None

    def fire(self, schedule_id: int) -> None:
        from app.schemas import SessionIn
        from app.service import ServiceError, create_session

        with self.db.session() as s:
            sc = s.get(Schedule, schedule_id)
            if sc is None or not sc.enabled:
                return
            body = SessionIn.model_validate(sc.request)
        try:
            created = create_session(self.db, body, schedule_id=schedule_id)
            result = f"started session {created.id}"
        except ServiceError as exc:
            result = f"skipped: {exc.message}"
        with self.db.session() as s:
            sc2 = s.get(Schedule, schedule_id)
            if sc2 is not None:
                sc2.last_fired_at = utcnow()
                sc2.last_result = result
        log.info("schedule %s fired: %s", schedule_id, result)
