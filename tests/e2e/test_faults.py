"""Faults during a session, on real sandboxes: the CI-sized share of bench/faults.py.

The scenarios are bench/faults.py's own, run in-process with 2 s benchmarks; the
SIGKILL-at-each-phase runs (3 per phase, plus a kill in the middle of a restart into an
unbootable config) are bench/faults.py's; in CI the service is killed mid-benchmark and
resumes its session by tests/acceptance/test_service_lifecycle.py (a restarted process)
and tests/acceptance/test_two_processes.py (another process, a target of one's own).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path

import psycopg
import pytest

from app.postgres.pgbench import BenchResult, BenchSpec, run_bench
from app.postgres.sandbox import Sandbox, SandboxError
from app.postgres.target import TargetController, render_auto_conf
from bench.faults import (
    InProcessService,
    Run,
    children_named,
    metadata_outage,
    pgbench_fault,
    target_killed,
    unbootable_candidate,
)
from tests.helpers import file_settings


def assert_ok(run: Run) -> None:
    assert run.ok, asdict(run)
    assert run.trials_lost == 0
    assert run.trials_duplicated == 0
    assert not run.target_changed


def test_unbootable_candidate_is_rolled_back_and_narrowed(tmp_path: Path) -> None:
    run = unbootable_candidate(tmp_path, InProcessService, quick=True)
    assert_ok(run)
    values = [v for v, _ in run.details["trials"]]
    errors = dict(run.details["trials"])
    assert "512MB" in values  # the descent's first step, beyond what the restart may map
    assert errors["512MB"].startswith("could not apply: shared_buffers='512MB' was not applied")
    assert values.index("512MB") < len(values) - 1  # ... and the session went on


def test_target_killed_mid_benchmark_and_back(tmp_path: Path) -> None:
    run = target_killed(True, tmp_path, InProcessService, quick=True)
    assert_ok(run)
    assert run.details["status"] == "succeeded"
    assert run.details["failed_trials"]
    # the postmaster died under the trial's config: a suspect, rolled back (issue 29)
    assert any("the server crashed under" in n for n in run.details["notes"])


def test_target_killed_and_gone_fails_cleanly_and_restores_later(tmp_path: Path) -> None:
    run = target_killed(False, tmp_path, InProcessService, quick=True)
    assert_ok(run)
    assert run.details["status"] == "failed"
    assert run.details["error"].startswith("the target crashed under ")
    assert "could not be started again with the snapshot's settings" in run.details["error"]
    assert "restored once it is back" in run.details["phase_while_down"]
    assert "the target came back; its settings were restored" in run.details["notes"]


def test_metadata_db_outage_pauses_the_session(tmp_path: Path) -> None:
    run = metadata_outage(tmp_path, InProcessService, outage_s=5, quick=True)
    assert_ok(run)
    assert run.details["paused_not_restarted"]  # one runner went on: attempts 1


def test_pgbench_unavailable_is_a_clear_error(tmp_path: Path) -> None:
    """A work directory pgbench cannot write its logs to. (pgbench missing: the same
    scenario through bench/faults.py itself, tests/docs/test_results_quality.py.)"""
    run = pgbench_fault("logdir_unwritable", tmp_path, InProcessService, quick=True)
    assert_ok(run)
    assert run.details["status"] == "failed"
    assert run.details["error"].startswith("trial 1: benchmark failed: ")


def test_killed_pgbench_is_a_failed_run_with_the_signal(sandbox: Sandbox) -> None:
    box: dict[str, BenchResult] = {}
    spec = BenchSpec(builtin=None, scripts=[("SELECT 1;", 1)], clients=2, jobs=1, duration_s=20)
    th = threading.Thread(target=lambda: box.update(r=run_bench(sandbox.dsn, spec)))
    t0 = time.monotonic()
    th.start()
    pids: list[int] = []
    while not pids and time.monotonic() - t0 < 10:
        time.sleep(0.2)
        pids = children_named(os.getpid(), "pgbench")
    assert pids
    time.sleep(1)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    th.join(timeout=30)
    res = box["r"]
    assert time.monotonic() - t0 < 10
    assert not res.ok
    assert not res.fatal  # another run may work: not a reason to end the session
    assert res.error is not None
    assert res.error.startswith("pgbench was killed by SIGKILL (not by knobtune)")


def test_recover_offline_starts_a_target_left_down_by_a_crashed_restart(
    fresh_sandbox: Sandbox,
) -> None:
    sb = fresh_sandbox
    ctl = TargetController.for_sandbox(sb)
    assert ctl.recover_offline(ctl.snapshot(["work_mem"])).endswith("nothing to recover")
    with psycopg.connect(sb.dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET random_page_cost = 1.5")  # an entry before the session
        conn.execute("SELECT pg_reload_conf()")
    before = file_settings(sb.dsn)
    snap = ctl.snapshot(["work_mem", "shared_buffers", "random_page_cost"])
    # What a service killed mid-restart leaves: the candidate written, the server down.
    sb.stop()
    auto = sb.data_dir / "postgresql.auto.conf"
    auto.write_text(render_auto_conf({"random_page_cost": "1.5", "shared_buffers": "1TB"}))
    with pytest.raises(SandboxError):
        sb.start()  # it really does not boot
    what = ctl.recover_offline(snap)
    assert "snapshot's entries were written" in what
    assert what.endswith("the server was started and accepts connections")
    assert ctl.is_up()
    assert file_settings(sb.dsn) == before
