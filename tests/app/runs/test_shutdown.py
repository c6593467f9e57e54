"""A service process stopped (SIGTERM) mid-benchmark: it puts the target back before it
ends, releases the session, and the next process resumes it at once (no lease to wait out).

On the simulated world of tests/app/runs/fake.py with the real scheduler (claims, leases,
APScheduler); tests/acceptance/test_service_lifecycle.py does the same to `knobtune serve`
with a sandbox.
"""

from __future__ import annotations

import time
from pathlib import Path

from app.jobs.scheduler import Scheduler
from app.settings import Settings
from tests.app.runs.fake import FakeEnv, Faults, add_session, add_target, make_db, row
from tests.optimizer.sim import reporting_surface

WORKLOAD = {"builtin": "tpcb-like", "scale": 1, "clients": 2, "duration_s": 20, "warmup_s": 2}
BODY = {"workload": WORKLOAD, "knobs": ["work_mem"], "hints": False, "max_trials": 12, "seed": 3}


def _scheduler(tmp_path: Path, env: FakeEnv, name: str) -> Scheduler:
    assert env.db is not None
    settings = Settings(
        database_url=env.db.url,
        work_dir=tmp_path,
        instance_id=name,
        poll_seconds=0.2,
        lease_seconds=300,  # a resume that waited for the lease would time the test out
    )
    sched = Scheduler(env.db, settings, env)
    sched.start()
    return sched


def test_a_stopped_process_restores_the_target_and_the_next_resumes_the_session(
    tmp_path: Path,
) -> None:
    db = make_db(tmp_path)
    env = FakeEnv(reporting_surface(), seed=3, faults=Faults(hold=3), db=db)
    env.fake_target.settings = {"work_mem": "8MB"}  # an ALTER SYSTEM entry of the DBA's
    sid = add_session(db, add_target(db, env.surface), BODY)
    env.session_id = sid
    try:
        first = _scheduler(tmp_path, env, "a")
        assert env.faults.held.wait(30), "trial 3 never ran"
        assert env.fake_target.settings != {"work_mem": "8MB"}  # the trial's value, in force
        began = time.monotonic()
        first.shutdown(grace_s=20)
        assert time.monotonic() - began < 10  # the runner stopped at once, not at the grace
        sess = row(db, sid)
        assert (sess.status, sess.lease_owner) == ("running", None)
        assert sess.phase.startswith("paused: the service stopped"), sess.phase
        assert env.fake_target.settings == {"work_mem": "8MB"}  # put back before the end

        env.faults.hold = None
        second = _scheduler(tmp_path, env, "b")
        try:
            deadline = time.monotonic() + 30
            while row(db, sid).status == "running" and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            second.shutdown()
        sess = row(db, sid)
        assert sess.status == "succeeded", (sess.status, sess.error, sess.notes)
        assert sess.attempts == 2
        assert env.fake_target.settings == {"work_mem": "8MB"}
        assert env.trials_run.count(3) == 2  # the stopped trial ran again, nothing else did
    finally:
        db.dispose()
