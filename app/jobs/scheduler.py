"""APScheduler glue: claims sessions, sweeps, comparisons and captures under a lease, fires
recurring sessions.

Several service processes may share one PostgreSQL metadata DB. Each process
has its own in-memory APScheduler (job stores are never shared); coordination
happens only through the DB:

* a session or a client sweep is claimed by a compare-and-set on its lease
  (``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL, then an UPDATE guarded
  by the lease still being free), renewed by its heartbeat
  (app/lease.py); a dead process's lease expires and another process
  takes the work over (and resumes it). Sessions, sweeps and comparisons count against
  ``max_parallel_sessions``: two benchmarks at once spoil each other's figures. A live
  capture (issue 28) is claimed the same way but counts against its own
  ``max_parallel_captures`` and runs on its own threads: it loads no host (it waits on
  its target's log for up to two hours), and the user's busy hour must not wait for a
  benchmark on another target to end, nor hold a benchmark's slot;
* recurring triggers run only in the process holding a PostgreSQL advisory
  lock (SQLite has one process by design, which is always the leader).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger
from pydantic import ValidationError
from sqlalchemy import Connection, or_, select, text, update

from app.captures.runner import CaptureRunner
from app.compare.runner import ComparisonRunner
from app.db import Database, changed_rows, utcnow
from app.errors import ServiceError, errors_text
from app.lease import Leased, forget_owner, stop_owned
from app.models import ACTIVE_STATUSES, Capture, Comparison, Schedule, Sweep, TuningSession
from app.sessions.crashes import session_crashed
from app.sessions.runner import RunEnv, SessionRunner
from app.sessions.schedules import cron_trigger
from app.sessions.schemas import SessionIn
from app.sessions.service import create_session
from app.settings import Settings
from app.sweeps.runner import SweepRunner

log = logging.getLogger(__name__)

LEADER_LOCK_KEY = 0x6B6E6F62  # 'knob': the advisory lock id of the trigger leader

Kind = str  # a key of KINDS: "session", "sweep", "capture", "comparison"


class Runner(Protocol):
    def run(self) -> None: ...


# a runner of one claimed row: (db, settings, row id, owner, the sessions' world)
RunnerFactory = Callable[[Database, Settings, int, str, RunEnv | None], Runner]
# after a runner raised: (db, settings, row id, owner, the exception, the sessions' world)
CrashHandler = Callable[[Database, Settings, int, str, Exception, RunEnv | None], None]


@dataclass(frozen=True)
class LeasedKind:
    """One kind of leased background work: its table and how a claimed row is run."""

    model: Leased
    runner: RunnerFactory
    # the limit it counts against, and the APScheduler executor it runs on: "default",
    # max_parallel_sessions (it loads its target's host with benchmarks), or "captures",
    # max_parallel_captures on threads of their own
    pool: Literal["default", "captures"] = "default"
    crashed: CrashHandler | None = None  # None: the crash is logged only


def _session_crashed(
    db: Database, settings: Settings, row_id: int, owner: str, exc: Exception, env: RunEnv | None
) -> None:
    # counted: retried a few times, then failed (no loop)
    session_crashed(db, settings, row_id, owner, exc, (env or RunEnv()).target)


# Every kind of leased work: adding a kind is one entry.
KINDS: dict[Kind, LeasedKind] = {
    "session": LeasedKind(TuningSession, SessionRunner, crashed=_session_crashed),
    "sweep": LeasedKind(Sweep, lambda db, st, i, owner, _env: SweepRunner(db, st, i, owner)),
    "capture": LeasedKind(
        Capture, lambda db, st, i, owner, _env: CaptureRunner(db, st, i, owner), pool="captures"
    ),
    "comparison": LeasedKind(
        Comparison, lambda db, st, i, owner, _env: ComparisonRunner(db, st, i, owner)
    ),
}
# share max_parallel_sessions: each loads its target's host with benchmarks
BENCHMARKS: tuple[Kind, ...] = tuple(k for k, j in KINDS.items() if j.pool == "default")
CAPTURES: tuple[Kind, ...] = tuple(k for k, j in KINDS.items() if j.pool == "captures")


class Scheduler:
    def __init__(self, db: Database, settings: Settings, env: RunEnv | None = None) -> None:
        self.db, self.settings = db, settings
        self.owner = settings.instance_id
        self.env = env  # the sessions' world (None: real targets); tests pass a simulated one
        self.scheduler = BackgroundScheduler(
            executors={
                "default": ThreadPoolExecutor(settings.max_parallel_sessions + 2),
                "captures": ThreadPoolExecutor(settings.max_parallel_captures),
            },
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 300},
            timezone="UTC",
        )
        self._running: set[tuple[Kind, int]] = set()
        self.claimed: dict[Kind, list[int]] = {}  # what the last claim() took, by kind
        self._lock = threading.Lock()
        self._runs = 0  # runs handed to APScheduler, for their job ids
        self._claiming = threading.Lock()  # one claim at a time: capacity is counted once
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

    def shutdown(self, grace_s: float = 0.0) -> None:
        """Stop claiming, stop every runner of this process and wait up to ``grace_s`` for
        them: each puts its target back (app/sessions/recovery.py, ``pause``). Then the leases
        of the work that stopped are released, so the next start (or another process)
        resumes it at once instead of after the lease runs out. A runner still busy after
        the grace keeps its lease; it expires as after a crash."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        stop_owned(self.owner)
        deadline = time.monotonic() + grace_s
        while self._held() and time.monotonic() < deadline:
            time.sleep(0.1)
        stuck = self._held()
        if stuck:
            log.warning("still running after %.0f s of grace: %s", grace_s, sorted(stuck))
        with contextlib.suppress(Exception), self.db.session() as s:  # the DB may be away
            for kind, job in KINDS.items():
                m = job.model
                ids = [i for k, i in stuck if k == kind]
                s.execute(
                    update(m)
                    .where(
                        m.lease_owner == self.owner,
                        m.status.in_(ACTIVE_STATUSES),
                        m.id.not_in(ids),
                    )
                    .values(lease_owner=None, lease_expires_at=None)
                )
        forget_owner(self.owner)
        if self._leader_conn is not None:
            self._leader_conn.close()
            self._leader_conn = None

    def _held(self) -> set[tuple[Kind, int]]:
        with self._lock:
            return set(self._running)

    def running_of(self, kind: Kind) -> set[int]:
        """The rows of ``kind`` this process is driving."""
        with self._lock:
            return {i for k, i in self._running if k == kind}

    def running(self) -> set[int]:
        """The sessions this process is driving."""
        return self.running_of("session")

    def running_sweeps(self) -> set[int]:
        return self.running_of("sweep")

    def running_captures(self) -> set[int]:
        return self.running_of("capture")

    def running_comparisons(self) -> set[int]:
        return self.running_of("comparison")

    @property
    def claimed_sweeps(self) -> list[int]:
        """The sweeps the last claim() took."""
        return self.claimed.get("sweep", [])

    @property
    def claimed_captures(self) -> list[int]:
        return self.claimed.get("capture", [])

    @property
    def claimed_comparisons(self) -> list[int]:
        return self.claimed.get("comparison", [])

    def wake(self) -> None:
        """Claim now rather than at the next poll (a sweep was just asked for)."""
        if self.scheduler.running:
            self.scheduler.add_job(self.claim, id="claim-now", replace_existing=True)

    # -- sessions and sweeps ------------------------------------------------------
    def claim(self) -> list[int]:
        """Take free work (queued, or running with an expired lease) up to our capacity.

        Sessions, sweeps and comparisons alike, oldest first, up to max_parallel_sessions;
        captures up to max_parallel_captures. Returns the ids of the claimed sessions
        (``claimed`` has every kind's, ``claimed_sweeps`` and the like the others').
        """
        with self._claiming:
            claimed = self._claim(BENCHMARKS, self.settings.max_parallel_sessions)
            claimed += self._claim(CAPTURES, self.settings.max_parallel_captures)
        self.claimed = {kind: [i for k, i in claimed if k == kind] for kind in KINDS}
        return self.claimed["session"]

    def _claim(self, kinds: tuple[Kind, ...], capacity: int) -> list[tuple[Kind, int]]:
        with self._lock:
            busy = {(k, i) for k, i in self._running if k in kinds}
        free = capacity - len(busy)
        if free <= 0:
            return []
        now = utcnow()
        claimed: list[tuple[Kind, int]] = []
        with self.db.session() as s:
            offers: list[tuple[datetime, Kind, int]] = []
            for kind in kinds:
                m = KINDS[kind].model
                rows = s.execute(
                    select(m.created_at, m.id)
                    .where(m.status.in_(ACTIVE_STATUSES), _lease_free(m, now))
                    .order_by(m.created_at, m.id)
                    .limit(free + len(busy))
                    .with_for_update(skip_locked=True)
                ).all()
                # work this process still drives (its lease ran out while the DB was away)
                # is not handed out again
                offers += [(at, kind, i) for at, i in rows if (kind, i) not in busy]
            for _at, kind, i in sorted(offers)[:free]:
                m = KINDS[kind].model
                # Guarded update: only one process can move a free lease to itself, and
                # not onto a row cancelled since the select.
                n = changed_rows(
                    s,
                    update(m)
                    .where(m.id == i, m.status.in_(ACTIVE_STATUSES), _lease_free(m, now))
                    .values(
                        lease_owner=self.owner,
                        lease_expires_at=now + timedelta(seconds=self.settings.lease_seconds),
                    ),
                )
                if n == 1:
                    claimed.append((kind, i))
        for kind, i in claimed:
            with self._lock:
                self._running.add((kind, i))
                self._runs += 1
                run_id = self._runs
            # A claimed row must get its run: an id of its own per claim, as APScheduler
            # skips a job whose id still counts a running instance (max_instances 1: the
            # previous run of this row between its end and APScheduler's bookkeeping),
            # and no misfire limit (a busy pool delays a run, never drops it). A skipped
            # run left the row claimed by this process, in _running for good, never run.
            self.scheduler.add_job(
                self._run,
                args=[kind, i],
                id=f"{kind}-{i}-run{run_id}",
                misfire_grace_time=None,
                executor=KINDS[kind].pool,
            )
        return claimed

    def _run(self, kind: Kind, row_id: int) -> None:
        job = KINDS[kind]
        try:
            job.runner(self.db, self.settings, row_id, self.owner, self.env).run()
        except Exception as exc:
            log.exception("runner of %s %s crashed", kind, row_id)
            if job.crashed is not None:
                job.crashed(self.db, self.settings, row_id, self.owner, exc, self.env)
        finally:
            with self._lock:
                self._running.discard((kind, row_id))

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
        with self.db.session() as s:
            sc = s.get(Schedule, schedule_id)
            if sc is None or not sc.enabled:
                return
            request = sc.request
        try:
            # A schedule stored before a check existed (e.g. a script's \shell) must
            # pass it now: skipped with the reason, never run.
            body = SessionIn.model_validate(request)
            created = create_session(self.db, body, schedule_id=schedule_id)
            result = f"started session {created.id}"
        except ValidationError as exc:
            result = (
                f"skipped: the stored request is refused by this version of knobtune: "
                f"{errors_text(exc)}; delete the schedule and create it again corrected"
            )
        except ServiceError as exc:
            result = f"skipped: {exc.message}"
        with self.db.session() as s:
            sc2 = s.get(Schedule, schedule_id)
            if sc2 is not None:
                sc2.last_fired_at = utcnow()
                sc2.last_result = result
        log.info("schedule %s fired: %s", schedule_id, result)


def _lease_free(m: Leased, now: datetime) -> Any:
    return or_(m.lease_expires_at.is_(None), m.lease_expires_at < now)
