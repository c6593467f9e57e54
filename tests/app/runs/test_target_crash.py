"""The server dies under a trial's config (issue 29, part A), on a real sandbox.

Found as a user would: the OOM killer took the postmaster under a config the session had
just applied; the session waited forever, saying the settings would be restored once the
target was back, and the crashing config stayed in postgresql.auto.conf. Here the
postmaster is killed (SIGKILL, as the OOM killer does) while the first candidate runs: the
session must roll the config back to the snapshot, start the server with its own restart
method, record the crash against that config and never recommend it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest

import app.sessions.recovery as recovery
from app.db import utcnow
from app.models import Target
from app.postgres.sandbox import Sandbox
from app.postgres.target import TargetController, parse_conf
from app.sessions.recovery import SessionTarget
from app.sessions.runner import CRASH_PREFIX, Executor, ExecutorArgs, RunEnv
from app.settings import Settings
from app.workloads.schemas import WorkloadIn
from optimizer.descent import Candidate
from optimizer.knobs import Config
from tests.app.runs.fake import add_session, make_db, run_session
from tests.app.runs.test_session_loop import trials_of


class KillOnFirstCandidate(RunEnv):
    """The real target and pgbench; the postmaster is SIGKILLed as the first candidate runs."""

    def __init__(self, sb: Sandbox) -> None:
        self.sb = sb
        self.killed: Candidate | None = None

    def target(self, row: Target, settings: Settings) -> SessionTarget:
        return TargetController.for_sandbox(self.sb)

    def executor(self, target: SessionTarget, wl: WorkloadIn, args: ExecutorArgs) -> Executor:
        real = super().executor(target, wl, args)
        env, start = self, args.hooks.on_run_start
        current: list[Candidate] = []

        def on_run_start() -> None:
            start()
            if env.killed is None and current and current[-1].role == "candidate":
                env.killed = current[-1]
                pid = int((env.sb.data_dir / "postmaster.pid").read_text().split()[0])
                os.kill(pid, signal.SIGKILL)

        args.hooks.on_run_start = on_run_start
        inner = real.run

        def run(cand: Candidate, *, incumbent: Config, remeasuring: bool = False) -> Any:
            current.append(cand)
            return inner(cand, incumbent=incumbent, remeasuring=remeasuring)

        real.run = run  # type: ignore[method-assign]
        return real


def test_a_crash_under_a_trial_config_rolls_it_back_restarts_and_records_it(
    tmp_path: Path, fresh_sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recovery, "CRASH_GRACE_S", 0.5)  # a dead postmaster never comes back
    monkeypatch.setattr(recovery, "RESTORE_WAIT_S", 5.0)  # a failure must not hang the test
    sb = fresh_sandbox
    auto_conf = sb.data_dir / "postgresql.auto.conf"
    before = parse_conf(auto_conf.read_text())
    db = make_db(tmp_path)
    with db.session() as s:
        t = Target(
            name="crashy",
            dsn=sb.dsn,
            bench_dsn=sb.bench_dsn,
            data_dir=str(sb.data_dir),
            ram_bytes=4 << 30,
            cpus=2,
            created_at=utcnow(),
        )
        s.add(t)
        s.flush()
        tid = t.id
    workload = {"builtin": "select-only", "scale": 1, "clients": 1, "duration_s": 1, "warmup_s": 0,
                "rate": 100}  # fmt: skip
    sid = add_session(
        db,
        tid,
        {
            "workload": workload,
            "knobs": ["work_mem"],
            "hints": False,
            "max_trials": 7,
            "final_check_runs": 2,
            "seed": 1,
        },
    )
    env = KillOnFirstCandidate(sb)
    sess = run_session(db, tmp_path, sid, env, target_retry_s=30)
    assert env.killed is not None
    crashed = env.killed.config
    assert sess.status == "succeeded", (sess.error, sess.notes)
    # the server is up, with exactly the snapshot's ALTER SYSTEM entries
    assert TargetController.for_sandbox(sb).is_up()
    assert parse_conf(auto_conf.read_text()) == before
    # the crash is a failed trial of that config, with the reason
    (trial,) = [t for t in trials_of(db, sid) if t.index == env.killed.index + 1]
    assert trial.config == crashed
    assert trial.error is not None
    assert trial.error.startswith(CRASH_PREFIX)
    # never tried again, never recommended
    later = [t for t in trials_of(db, sid) if t.index > trial.index]
    assert all(t.config != crashed for t in later)
    assert sess.best_config is not None
    assert sess.best_config["work_mem"] != crashed["work_mem"]
    note = next(n for n in sess.notes if "crashed under" in str(n))
    assert f"work_mem={crashed['work_mem']}" in str(note)
    assert "started" in str(note)
    db.dispose()
    # the pool's fill (part B's note) as the controller reads it, on the same server
    ctl = TargetController.for_sandbox(sb)
    bound = ctl.buffer_pool()
    assert bound is not None
    assert bound.pool_bytes > 0
    assert bound.used_bytes is None  # knobtune never installs pg_buffercache itself
    with psycopg.connect(sb.dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_buffercache")
    read = ctl.buffer_pool()
    assert read is not None
    assert read.used_bytes is not None
    assert 0 < read.fill <= 1
