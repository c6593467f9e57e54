"""The manual's commands around a session (docs/tuning.md, reading-results.md): register,
tune, apply, export, rollback with --yes, list and remove targets, cancel. One module of
its own: the suite hands out whole modules to its workers, and this one is long."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from app.postgres.sandbox import Sandbox
from tests.acceptance.conftest import BIN, user_env
from tests.docs.blocks import command, replace
from tests.docs.shell import bash, knobtune
from tests.helpers import WORK_MEM_SQL, file_settings


def session_status(user_dir: Path, sid: int) -> str | None:
    """A session's status in the metadata DB of ``user_dir`` (None: not there yet)."""
    try:
        with contextlib.closing(
            sqlite3.connect(f"file:{user_dir / 'knobtune.db'}?mode=ro", uri=True, timeout=5)
        ) as conn:
            row = conn.execute("SELECT status FROM sessions WHERE id = ?", (sid,)).fetchone()
    except sqlite3.Error:  # no DB or table yet
        return None
    return str(row[0]) if row else None


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_targets_cancel_export_and_rollback_with_yes(user_dir: Path, staging: Sandbox) -> None:
    # a session that recommends a change (work_mem cuts this script's time 16x), then applied
    (user_dir / "s.sql").write_text(WORK_MEM_SQL + "\n")
    res = knobtune("targets", "add", "staging", "--dsn", staging.dsn, cwd=user_dir)
    assert res.returncode == 0, res.stderr
    res = knobtune(
        "tune", "--target", "staging", "--script", "s.sql", "--knobs", "work_mem",
        "--duration", "2", "--warmup", "1", "--clients", "1", "--jobs", "1",
        "--max-trials", "7", "--final-check-runs", "2", cwd=user_dir, timeout=400,
    )  # fmt: skip
    # finished: a confirmed gain (0), or one 2 s runs left unconfirmed (4) or not credible (3)
    assert res.returncode in (0, 3, 4), res.stderr[-3000:]
    before = file_settings(staging.dsn)
    res = knobtune("apply", "1", "--force", cwd=user_dir)
    assert res.returncode == 0, res.stderr

    # docs/reading-results.md: the export as ALTER SYSTEM statements
    res = bash(command("reading-export"), user_dir)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("-- knobtune recommendation")
    assert "ALTER SYSTEM SET work_mem" in res.stdout

    # docs/tuning.md: somebody changes a setting; the rollback shows it, --yes goes ahead
    with psycopg.connect(staging.dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET random_page_cost = '1.5'")
        conn.execute("SELECT pg_reload_conf()")
    res = knobtune("rollback", "1", cwd=user_dir)
    assert res.returncode == 1
    assert "random_page_cost" in res.stderr
    assert "--yes" in res.stderr
    res = bash(command("tuning-rollback-yes"), user_dir)
    assert res.returncode == 0, res.stderr
    assert "changed since the apply: random_page_cost" in res.stdout
    assert "Rolled back session 1 on staging" in res.stdout
    after = [r for r in file_settings(staging.dsn) if r[1] != "random_page_cost"]
    assert after == [r for r in before if r[1] != "random_page_cost"]

    # docs/tuning.md: list, register another server, remove it
    other = Sandbox.create()
    try:
        # this host may give its servers fewer than the block's 4 CPUs (a cpuset, a quota),
        # and the service refuses a declared count above what the server may use
        block = replace(command("tuning-targets"), "--cpus 4", "--cpus 1")
        res = bash(block, user_dir, DSN=other.dsn)
        assert res.returncode == 0, res.stderr
        assert "staging" in res.stdout
        assert "idle" in res.stdout
        assert "target reporting registered" in res.stdout
        assert "target reporting removed" in res.stdout
    finally:
        other.destroy()

    # docs/tuning.md: cancel a running session (its id is 2 here), from another shell
    untouched = file_settings(staging.dsn)
    tune = subprocess.Popen(
        [str(BIN / "knobtune"), "tune", "--target", "staging", "--script", "s.sql",
         "--knobs", "work_mem", "--duration", "30", "--warmup", "1", "--clients", "1",
         "--jobs", "1", "--max-trials", "11"],
        cwd=user_dir, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        # running: read where the tune process writes it (a `knobtune status` a second
        # started the app in a process each time, 3-4 s of CPU a poll)
        deadline = time.monotonic() + 120
        while session_status(user_dir, 2) != "running" and time.monotonic() < deadline:
            time.sleep(0.3)
        res = bash(command("tuning-cancel"), user_dir)
        assert res.returncode == 0, res.stderr
        assert "session 2: cancelling" in res.stdout
        _out, err = tune.communicate(timeout=120)
        assert tune.returncode == 130, err[-2000:]
    finally:
        if tune.poll() is None:
            os.killpg(tune.pid, signal.SIGKILL)
            tune.wait()
    assert file_settings(staging.dsn) == untouched  # the cancel restored the server
