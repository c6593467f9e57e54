"""Scale-out on a shared PostgreSQL metadata DB: leases, takeover, one trigger leader."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from app.db import Database, upgrade, utcnow
from app.jobs.scheduler import Scheduler
from app.lease import write_leased
from app.main import create_app
from app.models import Sweep, Target, TuningSession
from app.sessions.service import cancel_session
from app.settings import Settings
from app.sweeps.service import cancel_sweep

ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"


@pytest.fixture
def pg_db() -> Iterator[Database]:
    name = f"knobtune_sched_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    upgrade(url)
    db = Database(url)
    try:
        yield db
    finally:
        db.dispose()
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def add_sessions(db: Database, n: int, tag: str = "") -> list[int]:
    ids = []
    with db.session() as s:
        for i in range(n):
            t = Target(name=f"t{tag}{i}", dsn="host=/nowhere", probe={}, created_at=utcnow())
            s.add(t)
            s.flush()
            sess = TuningSession(
                target_id=t.id,
                status="queued",
                phase="queued",
                request={},
                seed=1,
                benchmark_s=0.0,
                notes=[],
                cancel_requested=False,
                attempts=0,
                created_at=utcnow(),
            )
            s.add(sess)
            s.flush()
            ids.append(sess.id)
    return ids


def add_sweeps(db: Database, n: int, tag: str = "") -> list[int]:
    ids = []
    with db.session() as s:
        for i in range(n):
            t = Target(name=f"w{tag}{i}", dsn="host=/nowhere", probe={}, created_at=utcnow())
            s.add(t)
            s.flush()
            sw = Sweep(
                target_id=t.id,
                status="queued",
                phase="queued",
                request={},
                runs=[],
                cancel_requested=False,
                attempts=0,
                created_at=utcnow(),
            )
            s.add(sw)
            s.flush()
            ids.append(sw.id)
    return ids


def scheduler(db: Database, name: str, capacity: int = 10) -> Scheduler:
    settings = Settings(
        database_url=db.url, instance_id=name, max_parallel_sessions=capacity, lease_seconds=30
    )
    sched = Scheduler(db, settings)
    sched._run = lambda kind, sid: None  # type: ignore[method-assign]  # claim only: no runner
    return sched


def test_two_processes_never_claim_the_same_session(pg_db: Database) -> None:
    ids = add_sessions(pg_db, 12)
    a, b = scheduler(pg_db, "a"), scheduler(pg_db, "b")
    got: dict[str, list[int]] = {}
    barrier = threading.Barrier(2)

    def claim(s: Scheduler, name: str) -> None:
        barrier.wait()
        got[name] = s.claim()

    threads = [threading.Thread(target=claim, args=(s, n)) for s, n in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not set(got["a"]) & set(got["b"])
    assert sorted(got["a"] + got["b"]) == sorted(ids)[: len(got["a"]) + len(got["b"])]
    assert len(got["a"]) + len(got["b"]) == 12  # capacity 10 each: all taken, once
    with pg_db.session() as s:
        owners = {x.id: x.lease_owner for x in s.query(TuningSession)}
    assert all(owners[i] == ("a" if i in got["a"] else "b") for i in ids)


def test_expired_lease_is_taken_over(pg_db: Database) -> None:
    (sid,) = add_sessions(pg_db, 1)
    a, b = scheduler(pg_db, "a"), scheduler(pg_db, "b")
    assert a.claim() == [sid]
    assert b.claim() == []  # a's lease is live
    with pg_db.session() as s:
        sess = s.get(TuningSession, sid)
        assert sess is not None
        sess.status = "running"
        sess.lease_expires_at = utcnow() - timedelta(seconds=1)  # a died, its heartbeat stopped
    assert b.claim() == [sid]
    with pg_db.session() as s:
        sess = s.get(TuningSession, sid)
        assert sess is not None
        assert sess.lease_owner == "b"


def test_sweeps_are_claimed_with_sessions_under_one_capacity(pg_db: Database) -> None:
    """A sweep is work like a session: claimed oldest first, counted against one limit."""
    sessions = add_sessions(pg_db, 2)
    sweeps = add_sweeps(pg_db, 2)
    a = scheduler(pg_db, "a", capacity=3)
    assert a.claim() == sessions  # the two older sessions ...
    assert a.claimed_sweeps == sweeps[:1]  # ... and the oldest sweep: 3 in all
    assert a.running() == set(sessions)
    assert a.running_sweeps() == set(sweeps[:1])
    assert a.claim() == []  # full
    assert a.claimed_sweeps == []
    b = scheduler(pg_db, "b", capacity=3)
    assert b.claim() == []
    assert b.claimed_sweeps == sweeps[1:]  # the rest goes to another process
    with pg_db.session() as s:
        owners = {x.id: x.lease_owner for x in s.query(Sweep)}
    assert owners == {sweeps[0]: "a", sweeps[1]: "b"}


def test_a_dead_process_s_sweep_is_taken_over(pg_db: Database) -> None:
    (wid,) = add_sweeps(pg_db, 1)
    a, b = scheduler(pg_db, "a"), scheduler(pg_db, "b")
    a.claim()
    assert a.claimed_sweeps == [wid]
    b.claim()
    assert b.claimed_sweeps == []  # a's lease is live
    with pg_db.session() as s:
        sw = s.get(Sweep, wid)
        assert sw is not None
        sw.status = "running"
        sw.lease_expires_at = utcnow() - timedelta(seconds=1)  # a died, its heartbeat stopped
    b.claim()
    assert b.claimed_sweeps == [wid]
    with pg_db.session() as s:
        sw = s.get(Sweep, wid)
        assert sw is not None
        assert sw.lease_owner == "b"


def test_only_one_process_leads_the_recurring_triggers(pg_db: Database) -> None:
    a, b = scheduler(pg_db, "a"), scheduler(pg_db, "b")
    try:
        assert a.is_leader()
        assert not b.is_leader()
        assert a.is_leader()  # keeps it
        a.shutdown()  # releases the advisory lock with its connection
        assert b.is_leader()
    finally:
        a.shutdown()
        b.shutdown()


def test_schedules_are_stored_listed_fired_and_removed(tmp_path: Path) -> None:
    from app.postgres.sandbox import Sandbox

    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'm.db'}", work_dir=tmp_path, poll_seconds=3600
    )  # no claiming: we only look at what fires
    with Sandbox.create() as sb, TestClient(create_app(settings)) as c:
        tid = c.post("/api/v1/targets", json={"name": "s", "dsn": sb.dsn}).json()["id"]
        session = {"target_id": tid, "knobs": ["work_mem"]}
        assert (
            c.post("/api/v1/schedules", json={"cron": "61 2 * * *", "session": session}).status_code
            == 422
        )
        assert c.post("/api/v1/schedules", json={"session": session}).status_code == 422
        r = c.post("/api/v1/schedules", json={"cron": "0 2 * * sun", "session": session})
        assert r.status_code == 201, r.text
        sc = r.json()
        assert sc["next_fire_at"] is not None
        assert sc["next_fire_at"].startswith(tuple(str(y) for y in range(2026, 2030)))
        listed = c.get("/api/v1/schedules").json()
        assert [x["id"] for x in listed] == [sc["id"]]

        sched = c.app.state.scheduler  # type: ignore[attr-defined]
        sched.fire(sc["id"])  # what the trigger does on Sunday 02:00
        sessions = c.get("/api/v1/sessions", params={"target_id": tid}).json()
        assert len(sessions) == 1
        sched.fire(sc["id"])  # the target is busy: skipped, and said so
        assert len(c.get("/api/v1/sessions", params={"target_id": tid}).json()) == 1
        assert "skipped" in c.get("/api/v1/schedules").json()[0]["last_result"]

        assert c.delete(f"/api/v1/schedules/{sc['id']}").status_code == 204
        assert c.get("/api/v1/schedules").json() == []
        assert sched.scheduler.get_job(f"schedule-{sc['id']}") is None
        c.post(f"/api/v1/sessions/{sessions[0]['id']}/cancel")


def test_healthz_metrics_and_catalogue(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'm.db'}", run_scheduler=False)
    with TestClient(create_app(settings)) as c:
        assert c.get("/healthz").json()["status"] == "ok"
        metrics = c.get("/metrics").text
        assert 'knobtune_sessions{status="running"} 0' in metrics
        assert "knobtune_trials_total 0" in metrics
        knobs = c.get("/api/v1/knobs").json()
        assert len(knobs) >= 20
        assert {"shared_buffers", "work_mem", "max_wal_size"} <= {k["name"] for k in knobs}
        docs = c.get("/docs")
        assert docs.status_code == 200
        # Served from the package, not a CDN: the docs work without internet.
        assert "cdn" not in docs.text.lower()
        assert c.get("/static-offline-docs/swagger-ui-bundle.js").status_code == 200


def test_metadata_db_outage_is_a_503_not_a_500(tmp_path: Path) -> None:
    db_file = tmp_path / "m.db"
    settings = Settings(database_url=f"sqlite:///{db_file}", run_scheduler=False)
    with TestClient(create_app(settings)) as c:
        assert c.get("/api/v1/sessions").status_code == 200
        c.app.state.db.dispose()  # type: ignore[attr-defined]
        db_file.unlink()
        (tmp_path / "m.db").mkdir()  # the path now cannot be opened as a database
        r = c.get("/api/v1/sessions")
        assert r.status_code == 503
        assert r.headers["Retry-After"] == "5"


@pytest.mark.parametrize("kind", ["session", "sweep"])
def test_a_cancel_racing_a_claim_is_never_lost(kind: str, tmp_path: Path) -> None:
    """On SQLite (the default metadata DB, where FOR UPDATE is a no-op): a scheduler claims
    the row and its runner reads it between the cancel's first look and its write. The
    runner then writes "running"; the cancel must still reach it (found: a dashboard sweep
    cancelled, reported "cancelled" once, then ran to the end)."""
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    upgrade(url)
    db = Database(url)
    model, add, cancel = (
        (TuningSession, add_sessions, cancel_session)
        if kind == "session"
        else (Sweep, add_sweeps, cancel_sweep)
    )
    (rid,) = add(db, 1)
    a = scheduler(db, "a")
    seen: dict[str, object] = {}

    def claim_and_read(_conn: Any, _cur: Any, statement: str, *_args: Any) -> None:
        if seen or not statement.lstrip().upper().startswith(
            f"UPDATE {model.__tablename__.upper()}"
        ):
            return
        seen["claimed"] = []  # (the claim's own UPDATE comes through here too)
        seen["claimed"] = a.claim() + a.claimed_sweeps
        with db.session() as s:  # the runner's first read: queued, no cancel yet
            row = s.get(model, rid)
            assert row is not None
            seen["read"] = (row.status, row.cancel_requested)

    event.listen(db.engine, "before_cursor_execute", claim_and_read)
    try:
        cancel(db, rid)
    finally:
        event.remove(db.engine, "before_cursor_execute", claim_and_read)
    assert seen == {"claimed": [rid], "read": ("queued", False)}
    write_leased(db, model, rid, "a", status="running")  # the runner starts
    with db.session() as s:
        row = s.get(model, rid)
        assert row is not None
        assert row.cancel_requested, (row.status, row.phase)  # its heartbeat will stop it
    # A row cancelled before any claim is never leased.
    (other,) = add(db, 1, "later")
    cancel(db, other)
    assert other not in a.claim() + a.claimed_sweeps
    with db.session() as s:
        row = s.get(model, other)
        assert row is not None
        assert (row.status, row.lease_owner) == ("cancelled", None)
    db.dispose()
