"""Leased jobs, the primitives every domain's background work shares: sessions, sweeps,
captures and comparisons.

One low-level module (it imports only ``db`` and ``models``), so that each domain's runner
and service may import it and no arrow runs back up: ``Heartbeat`` (renew, publish, notice
a cancel), ``request_cancel``, ``write_leased``, ``LeaseLost``/``ShuttingDown``/``Cancelled``,
``stop_owned``/``forget_owner`` for the scheduler's shutdown, and ``LeasedRunner``: the
steps a runner takes around its work (load the row it holds, mark it running, heartbeat,
finish and release it).

A row that background work holds (``sessions``, ``sweeps``, ``captures``, ``comparisons``)
carries ``lease_owner``, ``lease_expires_at`` and ``cancel_requested``. Once a second the
heartbeat renews the lease (a compare-and-set on the owner), writes what the work publishes
(live samples, its phase) and reads the cancel flag. A lease taken by another process sets
``lost``; a cancel sets ``cancel``; either sets ``stop_bench`` so that pgbench stops at once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from sqlalchemy import update
from sqlalchemy.orm import Session

from app.db import Database, changed_rows, db_message, utcnow
from app.models import ACTIVE_STATUSES, Capture, Comparison, Sweep, TuningSession

log = logging.getLogger(__name__)

LIVE_SAMPLES = 120  # per-second samples kept for the live view


class Cancelled(Exception):
    """The user asked to cancel."""


class LeaseLost(Exception):
    """Another process took the work over: stop without touching the target."""


class ShuttingDown(LeaseLost):
    """This process is stopping (SIGTERM): stop now and put the target back; the lease is
    released, so the next start (or another process) resumes the work."""


# owners (Settings.instance_id) whose process is stopping, and the heartbeats running now
_STOPPING: set[str] = set()
_LIVE: set[Heartbeat] = set()
_LIVE_LOCK = threading.Lock()


def stop_owned(owner: str) -> None:
    """Tell every runner of ``owner`` to stop at once (app shutdown): the running ones and
    any that start from now on."""
    with _LIVE_LOCK:
        _STOPPING.add(owner)
        live = [hb for hb in _LIVE if hb.owner == owner]
    for hb in live:
        hb.stop()


def forget_owner(owner: str) -> None:
    """The stopped scheduler is gone: a later app with this id (tests) starts clean."""
    with _LIVE_LOCK:
        _STOPPING.discard(owner)


Leased = type[TuningSession] | type[Sweep] | type[Capture] | type[Comparison]


def request_cancel(s: Session, model: Leased, row_id: int, stopping_phase: str) -> str | None:
    """Cancel a row in two compare-and-set steps, so that a claim racing the cancel cannot undo it.

    A row nobody has claimed ends now ("cancelled"); a claimed one gets the flag its runner's
    heartbeat reads ("requested"). Reading the row and then writing it would let a runner
    that claimed it in between write "running" over "cancelled" and never see a cancel.
    None: the row is missing or no longer active (the caller says which).
    """
    unclaimed = (model.id == row_id, model.status == "queued", model.lease_owner.is_(None))
    done = (
        update(model)
        .where(*unclaimed)
        .values(status="cancelled", phase="cancelled", finished_at=utcnow())
    )
    if changed_rows(s, done):
        return "cancelled"
    active = (model.id == row_id, model.status.in_(ACTIVE_STATUSES))
    flag = update(model).where(*active).values(cancel_requested=True, phase=stopping_phase)
    return "requested" if changed_rows(s, flag) else None


def write_leased(db: Database, model: Leased, row_id: int, owner: str, **values: Any) -> None:
    """Write ``values`` to a row this process holds the lease of; LeaseLost when another
    process took it over (its work, not ours, from now on)."""
    with db.session() as s:
        n = changed_rows(
            s,
            update(model).where(model.id == row_id, model.lease_owner == owner).values(**values),
        )
    if n == 0:
        raise LeaseLost


class Heartbeat:
    """Renews the lease of one row, publishes its values and notices a cancel, once a second.

    ``publish(now)`` gives the extra columns written with every beat (a session's live
    samples, a sweep's phase).
    """

    def __init__(
        self,
        db: Database,
        model: Leased,
        row_id: int,
        owner: str,
        lease_s: float,
        publish: Callable[[datetime], dict[str, Any]] | None = None,
    ) -> None:
        self.db, self.model, self.row_id, self.owner = db, model, row_id, owner
        self.lease_s = lease_s
        self.publish = publish
        self.what = f"{model.__tablename__[:-1]} {row_id}"  # "session 3", "sweep 4"
        self.live: deque[float] = deque(maxlen=LIVE_SAMPLES)
        self.cancel = threading.Event()  # user asked to cancel
        self.lost = threading.Event()  # lease taken by another process
        self.stop_bench = threading.Event()  # any of these: stop pgbench now
        self.stopping = threading.Event()  # this process is shutting down
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"heartbeat-{self.what.replace(' ', '-')}", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        with _LIVE_LOCK:
            _LIVE.add(self)
            stopping = self.owner in _STOPPING
        if stopping:
            self.stop()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with _LIVE_LOCK:
            _LIVE.discard(self)
        self._done.set()
        self._thread.join(timeout=10)

    def stop(self) -> None:
        """The process is stopping: the work ends as on a lost lease (every runner already
        stops on ``lost``), and ``check`` says why."""
        self.stopping.set()
        self.lost.set()
        self.stop_bench.set()

    def sample(self, _t: float, tps: float) -> None:
        self.live.append(tps)

    def _loop(self) -> None:
        failing = False
        while not self._done.wait(1.0):
            try:
                self.beat()
                if failing:
                    log.warning("heartbeat of %s works again", self.what)
                failing = False
            except Exception as exc:  # metadata DB briefly unavailable: keep the run going
                if not failing:  # once per outage, not once a second
                    log.warning("heartbeat of %s failed: %s", self.what, db_message(exc))
                failing = True

    def beat(self) -> None:
        now = utcnow()
        values: dict[str, Any] = {"lease_expires_at": now + timedelta(seconds=self.lease_s)}
        if self.publish is not None:
            values |= self.publish(now)
        m = self.model
        with self.db.session() as s:
            res = s.execute(
                update(m)
                .where(m.id == self.row_id, m.lease_owner == self.owner)
                .values(**values)
                .returning(m.cancel_requested)
            ).first()
        if res is None:
            self.lost.set()
            self.stop_bench.set()
        elif res[0]:
            self.cancel.set()
            self.stop_bench.set()

    def check(self) -> None:
        """Raise ShuttingDown, LeaseLost or Cancelled once the heartbeat has seen one."""
        if self.stopping.is_set():
            raise ShuttingDown
        if self.lost.is_set():
            raise LeaseLost
        if self.cancel.is_set():
            raise Cancelled


# the kinds with a heartbeat_at column (a session publishes live samples instead)
Row = TypeVar("Row", Sweep, Capture, Comparison)


class LeasedRunner(Generic[Row]):
    """The steps every runner of a claimed row takes around its own work.

    A subclass writes ``_run``: load the row (``held``: None when this process no longer
    holds it or it has ended), check it again, ``start``, do the work under
    ``heartbeat()``, ``finish``. ``run`` ends quietly on a LeaseLost (a ShuttingDown too):
    another process, or the next start of this one, finishes the work. ``start`` and the
    heartbeat write ``heartbeat_at``: sweeps, captures and comparisons have it.
    """

    def __init__(
        self, db: Database, model: type[Row], row_id: int, owner: str, lease_s: float
    ) -> None:
        self.db, self.row_id, self.owner = db, row_id, owner
        self.model: type[Row] = model
        self.lease_s = lease_s
        self.phase = "starting"  # published by the heartbeat

    def run(self) -> None:
        with contextlib.suppress(LeaseLost):
            self._run()

    def _run(self) -> None:
        raise NotImplementedError

    def held(self, s: Session) -> Row | None:
        """The row, if this process holds its lease and it has not ended."""
        row = s.get(self.model, self.row_id)
        if row is None or row.lease_owner != self.owner or row.status not in ACTIVE_STATUSES:
            return None
        return row

    def write(self, **values: Any) -> None:
        write_leased(self.db, self.model, self.row_id, self.owner, **values)

    def start(self, *, resumed: bool) -> None:
        """Mark the row running and count the attempt; ``resumed``: after a process that
        ran it died (its ``started_at`` stays)."""
        now = utcnow()
        self.write(
            status="running",
            phase="resuming" if resumed else "starting",
            heartbeat_at=now,
            attempts=self.model.attempts + 1,
            **({} if resumed else {"started_at": now}),
        )

    def heartbeat(self) -> Heartbeat:
        """The row's heartbeat, publishing the time and ``self.phase``; enter it to start."""
        hb = Heartbeat(self.db, self.model, self.row_id, self.owner, self.lease_s)
        hb.publish = lambda at: {"heartbeat_at": at, "phase": self.phase}
        return hb

    def finish(self, status: str, **values: Any) -> None:
        """The row ends with ``status`` (its phase too) and its lease is released."""
        self.write(
            status=status,
            phase=status,
            finished_at=utcnow(),
            lease_owner=None,
            lease_expires_at=None,
            **values,
        )

    @staticmethod
    def end_loaded(row: Row, status: str, error: str) -> None:
        """End a row loaded in the caller's DB session before any work (its request is
        refused now, say), releasing its lease."""
        row.status = row.phase = status
        row.finished_at = utcnow()
        row.lease_owner, row.lease_expires_at = None, None
        row.error = error
