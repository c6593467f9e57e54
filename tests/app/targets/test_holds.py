"""The one rule of who holds a target (app/targets/holds.py), as every caller applies it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.db import Database, upgrade, utcnow
from app.errors import ServiceError
from app.models import Sweep, Target, TuningSession
from app.sweeps.schemas import SweepIn
from app.sweeps.service import create_sweep
from app.targets.holds import Holder, holder, holders
from app.targets.service import delete_target


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    upgrade(url)
    d = Database(url)
    yield d
    d.dispose()


def _target(db: Database, name: str) -> int:
    with db.session() as s:
        t = Target(name=name, dsn="host=/nowhere", probe={}, created_at=utcnow())
        s.add(t)
        s.flush()
        return t.id


def _session(db: Database, tid: int, status: str = "running") -> int:
    with db.session() as s:
        sess = TuningSession(
            target_id=tid, status=status, phase=status, request={}, seed=1, benchmark_s=0.0,
            notes=[], cancel_requested=False, attempts=0, created_at=utcnow(),
        )  # fmt: skip
        s.add(sess)
        s.flush()
        return sess.id


def _sweep(db: Database, tid: int, status: str = "running") -> int:
    with db.session() as s:
        sw = Sweep(
            target_id=tid, status=status, phase=status, request={}, runs=[],
            cancel_requested=False, attempts=0, created_at=utcnow(),
        )  # fmt: skip
        s.add(sw)
        s.flush()
        return sw.id


def test_a_session_or_a_sweep_holds_a_target_and_a_finished_one_does_not(db: Database) -> None:
    idle, by_session, by_sweep, done = (_target(db, n) for n in ("a", "b", "c", "d"))
    sid = _session(db, by_session)
    wid = _sweep(db, by_sweep, "queued")
    _session(db, done, "succeeded")
    _sweep(db, done, "failed")
    with db.session() as s:
        assert holder(s, idle) is None
        assert holder(s, done) is None
        assert holder(s, by_session) == Holder("session", sid)
        assert holder(s, by_sweep) == Holder("sweep", wid)
        assert holders(s) == {by_session: Holder("session", sid), by_sweep: Holder("sweep", wid)}


def test_every_caller_refuses_a_held_target(db: Database) -> None:
    by_session, by_sweep = _target(db, "a"), _target(db, "b")
    sid = _session(db, by_session)
    wid = _sweep(db, by_sweep)
    with pytest.raises(ServiceError, match=f"busy with session {sid}; wait or cancel it"):
        create_sweep(db, by_session, SweepIn())
    with pytest.raises(ServiceError, match=f"busy with sweep {wid}; wait or cancel it"):
        create_sweep(db, by_sweep, SweepIn())
    with pytest.raises(ServiceError, match=f"busy with sweep {wid}; cancel it first") as exc:
        delete_target(db, by_sweep)
    assert exc.value.status == 409
