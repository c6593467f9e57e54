"""Sandbox clusters: lifecycle on real PostgreSQL binaries."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from app.postgres import sandbox as sandbox_mod
from app.postgres.restart import run as run_restart
from app.postgres.sandbox import (
    TEMPLATE_PREFIX,
    PostgresNotInstalled,
    Sandbox,
    SandboxError,
    find_bindir,
    free_port,
    remove_orphan_templates,
)
from tests.conftest import SandboxFactory


def _started(dsn: str) -> object:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    assert row is not None
    return row[0]


def _show(dsn: str, name: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SHOW {name}").fetchone()
    assert row is not None
    return str(row[0])


def test_find_bindir_has_server_binaries() -> None:
    bindir = find_bindir()
    for name in ("initdb", "pg_ctl", "postgres"):
        assert (bindir / name).exists()


def test_missing_postgres_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KNOBTUNE_PG_BINDIR", str(tmp_path))
    with pytest.raises(PostgresNotInstalled, match="apt-get install postgresql postgresql-contrib"):
        find_bindir()
    with pytest.raises(PostgresNotInstalled):
        Sandbox.create()


def test_lifecycle() -> None:
    t0 = time.monotonic()
    sb = Sandbox.create()
    created = time.monotonic() - t0
    try:
        assert sb.is_running()
        assert sb.data_dir.is_dir()
        assert sb.socket_dir.is_dir()
        assert _show(sb.dsn, "port") == str(sb.port)
        assert _show(sb.tcp_dsn, "listen_addresses") == "127.0.0.1"
        assert str(sb.socket_dir) in sb.dsn
        assert "database system is ready" in sb.log_tail(50)

        sb.stop()
        assert not sb.is_running()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(sb.dsn, connect_timeout=2)
        sb.stop()  # idempotent
        sb.start()
        assert sb.is_running()

        t0 = time.monotonic()
        sb.restart()
        restarted = time.monotonic() - t0
        assert _show(sb.dsn, "server_version_num")

        # Its restart method (argv, no shell, as the cluster's OS user) restarts it too.
        started = _started(sb.dsn)
        run_restart(sb.restart_method)
        assert sb.is_running()
        assert _started(sb.dsn) != started
        print(f"sandbox create {created:.2f} s, restart {restarted:.2f} s")
    finally:
        sb.destroy()
    assert not sb.root.exists()
    assert not sb.is_running()
    sb.destroy()  # idempotent


def test_context_manager_and_settings() -> None:
    with Sandbox.create(settings={"work_mem": "8MB", "application_name": "it's"}) as sb:
        assert _show(sb.dsn, "work_mem") == "8MB"
        assert _show(sb.dsn, "application_name") == "it's"
        # Sandbox settings live in postgresql.conf (via an include), not postgresql.auto.conf.
        assert "work_mem" not in (sb.data_dir / "postgresql.auto.conf").read_text()
        root = sb.root
    assert not root.exists()


def test_explicit_root_and_port(sandbox_factory: SandboxFactory) -> None:
    root = Path(tempfile.mkdtemp(prefix="kt-root-"))
    root.chmod(0o755)  # mkdtemp makes it private; the postgres user must get through
    try:
        port = free_port()
        sb = sandbox_factory(root, port=port)
        assert sb.port == port
        assert sb.data_dir == root / "data"
        assert _show(sb.dsn, "port") == str(port)
        sb.destroy()
        assert not sb.data_dir.exists()
        assert root.exists()  # an existing root is kept, only our files go
        assert list(root.iterdir()) == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_long_root_and_reopen() -> None:
    base = Path(tempfile.mkdtemp(prefix="kt-long-"))
    base.chmod(0o755)
    try:
        root = base / ("a-rather-long-directory-name-" * 3) / "sandbox"
        sb = Sandbox.create(root)
        try:
            # Too long for a unix socket path inside the root: the socket lives in /tmp.
            assert not sb.socket_dir.is_relative_to(root)
            again = Sandbox.open(root)
            # The passwords are not on disk: a reopened sandbox has none.
            assert (again.port, again.data_dir, again.restart_method) == (
                sb.port,
                sb.data_dir,
                sb.restart_method,
            )
            assert again.password is None
            again.stop()
            assert not sb.is_running()
            again.start()
            assert _show(sb.dsn, "port") == str(sb.port)
            again.destroy()
            assert not root.exists()  # it did not exist before create()
            assert not sb.socket_dir.exists()
            # the first handle cannot start it again, nor leave a socket directory behind
            with pytest.raises(SandboxError, match="is gone"):
                sb.start()
            assert not sb.socket_dir.exists()
        finally:
            sb.destroy()
        with pytest.raises(SandboxError, match="not a knobtune sandbox"):
            Sandbox.open(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the cluster to the postgres user")
def test_root_inaccessible_to_postgres_is_a_clear_error() -> None:
    private = Path(tempfile.mkdtemp(prefix="kt-private-"))  # 0700, like pytest's tmp_path
    try:
        with pytest.raises(SandboxError, match="postgres OS user cannot use"):
            Sandbox.create(private / "sb")
    finally:
        shutil.rmtree(private, ignore_errors=True)


def test_bad_setting_keeps_log_in_error() -> None:
    with pytest.raises(SandboxError) as err:
        Sandbox.create(settings={"shared_buffers": "banana"})
    assert "shared_buffers" in str(err.value)


def test_templates_of_killed_processes_are_removed_and_ours_stays(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """Each process initdbs one template (46 MB) and removes it at exit; a killed one
    leaves it, and the service's next start removes it: named for a pid no longer running,
    owned by the sandboxes' user. This process's own template is named for it and stays."""
    ours = [t.parent for t in sandbox_mod._templates.values()]
    assert ours
    assert all(p.name.startswith(f"{TEMPLATE_PREFIX}{os.getpid()}-") for p in ours)
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = tmp_path / f"{TEMPLATE_PREFIX}{gone.pid}-x"
    (dead / "data").mkdir(parents=True)
    uid, gid = sandbox_mod._owner_ids()
    for p in (dead, dead / "data"):
        os.chown(p, uid, gid)
    assert remove_orphan_templates(tmp_path) == 1
    assert not dead.exists()
    remove_orphan_templates()  # the real temp directory: ours untouched
    assert all(p.is_dir() for p in ours)


def test_the_template_sweep_needs_no_postgres_user(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A root service on a host without a postgres user (remote targets only) starts:
    the sweep at its start finds nothing to own rather than failing."""

    def no_postgres() -> tuple[int, int]:
        raise KeyError("getpwnam(): name not found: 'postgres'")

    monkeypatch.setattr(sandbox_mod, "_owner_ids", no_postgres)
    assert remove_orphan_templates(tmp_path) == 0
