"""Helpers shared by tests and bench scripts: the service as a user runs it, target state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from app.models import ACTIVE_STATUSES
from app.postgres.cgroups import CgroupUnavailable, Host, Limits
from app.postgres.sandbox import BENCH_DB, BENCH_ROLE, Sandbox, free_port

ROOT = Path(__file__).resolve().parents[1]


# A workload whose speed work_mem decides, without the noise of a real sort: each
# transaction waits 32 ms at work_mem <= 4MB and 2 ms above (any PGTune value or x4 step).
# Sleep-bound, so a busy CPU (parallel tests) hardly moves it, and sixteenfold, so that a
# session keeps it within a few runs of 2 s on a loaded CI host (an 8 -> 4 ms halving was
# lost in such a host's scheduling jitter: tests/app/workloads/test_streams.py).
WORK_MEM_SQL = (
    "SELECT pg_sleep(CASE WHEN pg_size_bytes(current_setting('work_mem')) > 4194304 "
    "THEN 0.002 ELSE 0.032 END);"
)


def wait_done(client: httpx.Client, sid: int, timeout: float = 300) -> dict[str, Any]:
    """A session's body once it has finished (succeeded, failed or cancelled)."""
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = client.get(f"/api/v1/sessions/{sid}").json()
        if body["status"] not in ACTIVE_STATUSES:
            return body
        time.sleep(0.3)
    raise AssertionError(f"session {sid} did not finish in {timeout:g} s: {body}")


def wait_capture(
    client: Any, cid: int, *, until: str = "final", timeout: float = 120
) -> dict[str, Any]:
    """The capture's body once it is final, or (``until="logging"``) once it logs."""
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = client.get(f"/api/v1/captures/{cid}").json()
        if until == "logging" and body["phase"].startswith("logging every statement"):
            return body
        if body["status"] not in ("queued", "running"):
            if until == "logging":
                raise AssertionError(f"capture {cid} ended before logging: {body}")
            return body
        time.sleep(0.2)
    raise AssertionError(f"capture {cid} did not get there in {timeout:g} s: {body}")


# What a server needs for a capture: its stderr log in files the collector writes.
LOGGING = {
    "logging_collector": "on",
    "log_directory": "log",
    "log_filename": "postgresql-%Y%m%d-%H%M%S.log",
}
PGSS = {"shared_preload_libraries": "pg_stat_statements"}


def logging_sandbox(
    *, pgss: bool = True, database: str = BENCH_DB, limits: Limits | None = None
) -> Sandbox:
    """A sandbox (in ``limits``' cgroup, if any) whose log a capture can read; with
    ``pgss``, pg_stat_statements loaded and installed in ``database``: the benchmark
    database, or one made for the benchmark role (its owner) that an application uses."""
    sb = Sandbox.create(settings=LOGGING | (PGSS if pgss else {}), limits=limits)
    try:
        if database != BENCH_DB:
            with psycopg.connect(sb.dsn, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(database), sql.Identifier(BENCH_ROLE)
                    )
                )
        if pgss:
            # the superuser installs it in the workload's database
            with psycopg.connect(make_conninfo(sb.dsn, dbname=database), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION pg_stat_statements")
    except BaseException:
        sb.destroy()
        raise
    return sb


def file_settings(dsn: str) -> list[tuple[Any, ...]]:
    """The target's configuration files as the server reads them: what 'restored' means."""
    # A timeout: fault tests read targets that may be down.
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        return conn.execute(
            "SELECT sourcefile, name, setting, applied, error FROM pg_file_settings "
            "ORDER BY sourcefile, seqno"
        ).fetchall()


class ServiceProcess:
    """`knobtune serve` in a subprocess on a free loopback port, SQLite metadata in ``tmp``."""

    def __init__(self, tmp: Path, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "KNOBTUNE_DATABASE_URL": f"sqlite:///{tmp / 'meta.db'}",
            "KNOBTUNE_WORK_DIR": str(tmp),
            # the tests' own sandboxes, on this host: the operator allows them (issue 40)
            "KNOBTUNE_TARGET_HOSTS": f"*,127.0.0.1/32,{tempfile.gettempdir()},/tmp",
            **env,
        }
        self.log_path = tmp / "service.log"
        self._log: IO[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60) -> None:
        self._log = self.log_path.open("ab")
        argv = [sys.executable, "-m", "app.cli", "serve", "--port", str(self.port)]
        self.proc = subprocess.Popen(
            [*argv, "--log-level", "warning"],
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,  # this checkout's code, whatever the caller's directory
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited: {self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()  # never leave a half-started service behind
        raise RuntimeError(f"the service did not start: {self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind, as in a crash."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self._log is not None:
            self._log.close()
            self._log = None


def _cgroups_missing() -> str | None:
    """Why this host cannot cap a sandbox (None: it can)."""
    if os.geteuid() != 0:
        return "needs root to write cgroups"
    try:
        Host.detect()
    except CgroupUnavailable as exc:
        return str(exc)
    return None


def assert_in_cgroup(sb: Sandbox, dsn: str | None = None) -> None:
    """The postmaster and all its children are in each controller's part of the
    sandbox's cgroup (a child still being forked is read again: Sandbox.outside); with
    ``dsn``, a backend forked now is inside too."""
    cg = sb.cgroup
    assert cg is not None
    assert sb.postmaster_pids()
    for f in cg.procs_files():
        outside = sb.outside(
            sb.postmaster_pids(), lambda f=f: {int(x) for x in f.read_text().split()}
        )
        assert not outside, f"{outside} outside {f}"
    if dsn is None:
        return
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        assert int(row[0]) in cg.pids()


NO_CGROUPS = _cgroups_missing()
# Tests of real limits: skipped only where the host genuinely has no writable cgroups.
needs_cgroups = pytest.mark.skipif(
    NO_CGROUPS is not None, reason=f"host lacks cgroups: {NO_CGROUPS}"
)


HOST_ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"


@contextmanager
def metadata_db(prefix: str) -> Iterator[str]:
    """A PostgreSQL metadata DB of the caller's own on the host's server, as a SQLAlchemy
    URL; dropped after (connections and all)."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(HOST_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(HOST_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
