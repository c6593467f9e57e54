"""A runner that crashes on a session: retried a few times, then the session fails with the
reason and its target is restored (or the entries to restore are said), never a loop.

On the simulated world of tests/app/runs/fake.py with the real scheduler (claims, leases,
APScheduler): a first process dies mid-session with a trial's work_mem on the target, then
every runner that takes the session over raises before it can start it.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from app.db import Database, utcnow
from app.jobs.scheduler import Scheduler
from app.models import Target, TuningSession
from app.sessions import runner as session_module
from app.sessions.crashes import CRASH_LIMIT, CRASH_NOTE
from app.sessions.recovery import SessionTarget
from app.settings import Settings
from tests.app.runs.fake import FakeEnv, Faults, add_session, add_target, make_db, row, run_session
from tests.optimizer.sim import reporting_surface

WORKLOAD = {"builtin": "tpcb-like", "scale": 1, "clients": 2, "duration_s": 20, "warmup_s": 2}
BODY = {"workload": WORKLOAD, "knobs": ["work_mem"], "hints": False, "max_trials": 12, "seed": 3}


@pytest.fixture
def db(tmp_path: Path) -> Any:
    d = make_db(tmp_path)
    yield d
    d.dispose()


def died_mid_session(db: Database, tmp_path: Path, env: FakeEnv) -> int:
    """A session whose first process died at trial 3, a trial's config on the target and
    its lease run out."""
    env.fake_target.settings = {"work_mem": "8MB"}  # an ALTER SYSTEM entry of the DBA's
    sid = add_session(db, add_target(db, env.surface), BODY)
    sess = run_session(db, tmp_path, sid, env)
    assert sess.status == "running"
    assert env.fake_target.settings != {"work_mem": "8MB"}  # a trial's value is in force
    with db.session() as s:
        dead = s.get(TuningSession, sid)
        assert dead is not None
        dead.lease_expires_at = utcnow() - timedelta(seconds=1)
    return sid


def drive(db: Database, tmp_path: Path, env: FakeEnv, sid: int, timeout_s: float = 30) -> Any:
    """A second process's scheduler until the session ends; its row."""
    settings = Settings(
        database_url=db.url, work_dir=tmp_path, instance_id="b", poll_seconds=0.2, lease_seconds=30
    )
    sched = Scheduler(db, settings, env)
    sched.start()
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            sess = row(db, sid)
            if sess.status not in ("queued", "running"):
                return sess
            time.sleep(0.1)
        raise AssertionError(f"session {sid} still {sess.status}: {sess.notes}")
    finally:
        sched.shutdown()


def crash_notes(sess: TuningSession) -> list[str]:
    return [n for n in sess.notes if n.startswith(CRASH_NOTE)]


def test_a_runner_that_crashes_every_time_fails_the_session_and_restores_the_target(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = FakeEnv(reporting_surface(), seed=3, faults=Faults(crash=3))
    sid = died_mid_session(db, tmp_path, env)
    loads: list[int] = []

    def broken(target: Target) -> str | None:  # a bug in loading the session, every time
        loads.append(target.id)
        raise RuntimeError("simulated: this version cannot load the session")

    monkeypatch.setattr(session_module, "admin_dsn_for", broken)
    sess = drive(db, tmp_path, env, sid)
    assert sess.status == "failed"
    assert len(loads) == CRASH_LIMIT  # tried that often, then stopped: no loop
    assert f"crashed {CRASH_LIMIT} times" in sess.error
    assert "simulated: this version cannot load the session" in sess.error
    assert "restored to the snapshot" in sess.error
    assert env.fake_target.settings == {"work_mem": "8MB"}  # the DBA's entry, back
    assert len(crash_notes(sess)) == CRASH_LIMIT
    assert sess.lease_owner is None
    assert sess.finished_at is not None


class UnreadableTarget(FakeEnv):
    """After the first process: no runner can open the target (its DSN unreadable here)."""

    broken = False

    def target(self, row: Target, settings: Settings) -> SessionTarget:
        if self.broken:
            raise ValueError("invalid connection string 'knobtune:undecryptable'")
        return super().target(row, settings)


def test_a_target_no_runner_can_open_fails_saying_what_to_restore(
    db: Database, tmp_path: Path
) -> None:
    env = UnreadableTarget(reporting_surface(), seed=3, faults=Faults(crash=3))
    sid = died_mid_session(db, tmp_path, env)
    env.broken = True
    sess = drive(db, tmp_path, env, sid)
    assert sess.status == "failed"
    assert "invalid connection string" in sess.error  # the reason
    assert "NOT restored" in sess.error
    # what to put back, by hand
    assert "postgresql.auto.conf entries by hand (work_mem = '8MB')" in sess.error
    assert sess.applied == {"config": None, "unknown": True}
    assert len(crash_notes(sess)) == CRASH_LIMIT


def test_a_claim_right_after_a_run_of_the_same_session_still_runs(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next poll may claim a session again before APScheduler has counted the previous
    run of it as ended (a crash gives the lease up at once). Under one job id per session
    APScheduler skipped that run (max_instances 1): the session stayed claimed by this
    process, never run. Reproduced by claiming from inside the ending run."""
    env = FakeEnv(reporting_surface(), seed=3)
    sid = add_session(db, add_target(db, env.surface), BODY)
    fails = [RuntimeError("simulated: a crash of the first runner only")]

    def once(target: Target) -> str | None:
        if fails:
            raise fails.pop()
        return None

    monkeypatch.setattr(session_module, "admin_dsn_for", once)
    settings = Settings(
        database_url=db.url, work_dir=tmp_path, instance_id="b", poll_seconds=3600
    )  # no polls: the claims below are the only ones
    sched = Scheduler(db, settings, env)
    env.db, env.session_id = db, sid
    run = sched._run
    claimed_again: list[list[int]] = []

    def run_then_claim(kind: Any, row_id: int) -> None:
        run(kind, row_id)
        if not claimed_again:  # the poll landing as this run ends
            claimed_again.append(sched.claim())

    monkeypatch.setattr(sched, "_run", run_then_claim)
    sched.scheduler.start()  # the claim loop's jobs are not added: only these claims
    try:
        assert sched.claim() == [sid]
        deadline = time.monotonic() + 30
        while row(db, sid).status in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        sched.shutdown()
    assert claimed_again == [[sid]]
    sess = row(db, sid)
    assert sess.status == "succeeded", (sess.status, sess.notes)
    assert len(crash_notes(sess)) == 1  # the first runner's crash, noted before the plan
