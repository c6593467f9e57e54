"""Finding 3 of issue 40: the root service acted on files and pids the postgres OS user
controls.

As ``postgres`` (any sandbox superuser gets there), an attacker changed ``socket_dir`` in
a sandbox's ``sandbox.json`` and ``DELETE /api/v1/targets/{id}`` removed that directory
as root. The files of a data directory were written through links planted there,
``server.log`` was read into error messages through one, and ``destroy()`` SIGKILLed
whatever pid ``postmaster.pid`` named.

Now the record is the service's user's alone (its root directory too), an earlier
version's sandbox is taken back with the DSN the metadata DB holds, files in a data
directory are opened with O_NOFOLLOW on a directory descriptor (app/postgres/safefile.py),
and a pid is signalled only once /proc shows it is that data directory's postgres.
Every attack here is made as the postgres OS user (runuser), as a real one would be.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.postgres import safefile
from app.postgres.sandbox import as_postgres
from app.postgres.target import TargetController
from tests.conftest import SandboxFactory
from tests.security.exec_helpers import client_for, service_dir, settings_for, stored_targets

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the attacks are made as the postgres OS user by a root service"
)

SECRET = "root-only: the line an attacker wants\n"


def _as_postgres(script: str, cwd: Path) -> bool:
    """Run ``script`` with sh as the postgres OS user; whether it succeeded."""
    argv = as_postgres(["sh", "-c", f"cd {shlex.quote(str(cwd))} && {script}"])
    return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0


def _retarget_socket_dir(root: Path, victim: Path) -> bool:
    """As postgres: point sandbox.json's socket_dir at ``victim`` (a new file moved over)."""
    sed = f's#"socket_dir": "[^"]*"#"socket_dir": "{victim}"#'
    return _as_postgres(
        f"sed {shlex.quote(sed)} sandbox.json > sandbox.json.new && "
        "mv -f sandbox.json.new sandbox.json",
        root,
    )


@contextlib.contextmanager
def _victim_dir() -> Iterator[Path]:
    """A root-owned directory (with a file) that nothing of knobtune's may remove."""
    victim = Path(tempfile.mkdtemp(prefix="knobtune-victim-"))
    victim.chmod(0o755)
    (victim / "keep").write_text(SECRET)
    try:
        yield victim
    finally:
        shutil.rmtree(victim, ignore_errors=True)


def _sandbox_target(api: Any) -> int:
    r = api.post("/api/v1/targets", json={"name": "box", "sandbox": True})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def test_a_changed_socket_dir_in_sandbox_json_never_makes_root_remove_a_directory() -> None:
    with _victim_dir() as victim, service_dir() as base:
        settings = settings_for(base)
        with client_for(settings) as api:
            tid = _sandbox_target(api)
            [box] = stored_targets(settings.database_url)
            root = Path(str(box.sandbox_dir))
            tampered = _retarget_socket_dir(root, victim)
            deleted = api.delete(f"/api/v1/targets/{tid}")
        survived = (victim / "keep").is_file()
    assert survived, "DELETE of the target removed the directory sandbox.json named, as root"
    assert deleted.status_code == 204, deleted.text
    assert not tampered, "the postgres OS user could rewrite the sandbox's record"
    assert not root.exists()


def test_an_earlier_versions_sandbox_is_taken_back_with_the_stored_dsn() -> None:
    """Made when the root and sandbox.json were the postgres user's: at the service's
    next start, the socket directory comes from the metadata DB's DSN, not the file, and
    the root becomes the service's user's."""
    pg = pwd.getpwnam("postgres")
    with _victim_dir() as victim, service_dir() as base:
        settings = settings_for(base)
        with client_for(settings) as api:
            tid = _sandbox_target(api)
        [box] = stored_targets(settings.database_url)
        root = Path(str(box.sandbox_dir))
        os.chown(root, pg.pw_uid, pg.pw_gid)  # as an earlier version left it
        root.chmod(0o700)
        (root / "sandbox.json").chmod(0o644)
        assert _retarget_socket_dir(root, victim)
        with client_for(settings) as api:
            owner = root.stat().st_uid
            shown = api.get(f"/api/v1/targets/{tid}").json()
            deleted = api.delete(f"/api/v1/targets/{tid}")
        survived = (victim / "keep").is_file()
    assert survived, "the service trusted an earlier version's sandbox.json"
    assert owner == 0
    assert shown["sandbox"] is True  # started again, not retired
    assert deleted.status_code == 204, deleted.text


@pytest.fixture
def victim_file() -> Iterator[Path]:
    """A root-owned file a link in a data directory may point at (0644: postgres may read
    it, as it may read /etc/passwd, but never write it)."""
    with _victim_dir() as d:
        path = d / "keep"
        path.chmod(0o644)
        yield path


def _untouched(path: Path) -> bool:
    st = path.stat()
    return path.read_text() == SECRET and st.st_uid == 0


def test_conf_files_are_never_written_through_a_planted_link(
    sandbox_factory: SandboxFactory, victim_file: Path
) -> None:
    sb = sandbox_factory()
    assert _as_postgres(f"ln -sf {victim_file} knobtune_sandbox.conf", sb.data_dir)
    sb.move_to(sb.port)  # rewrites knobtune_sandbox.conf and the record
    assert _untouched(victim_file), "knobtune_sandbox.conf was written through the link"
    assert not (sb.data_dir / "knobtune_sandbox.conf").is_symlink()  # replaced by a file

    assert _as_postgres(f"ln -sf {victim_file} postgresql.conf", sb.data_dir)
    with pytest.raises(OSError, match="is a symbolic link"):
        sb.move_to(sb.port)  # appends its include to postgresql.conf if it lacks it
    assert _untouched(victim_file), "postgresql.conf was written through the link"


def test_postgresql_auto_conf_is_never_written_through_a_planted_link(
    sandbox_factory: SandboxFactory, victim_file: Path
) -> None:
    """recover_offline() rewrites postgresql.auto.conf of a server that is down."""
    sb = sandbox_factory()
    ctl = TargetController.for_sandbox(sb)
    snapshot = ctl.snapshot(["work_mem"])
    sb.stop()
    victim_file.write_text("# " + SECRET)
    assert _as_postgres(f"ln -sf {victim_file} postgresql.auto.conf", sb.data_dir)
    said = ctl.recover_offline(snapshot)  # the server starts again with the link in place
    assert victim_file.read_text() == "# " + SECRET, "auto.conf was written through the link"
    assert victim_file.stat().st_uid == 0
    assert "is a symbolic link" in said, said


def test_the_server_log_is_never_read_through_a_link(
    sandbox_factory: SandboxFactory, victim_file: Path
) -> None:
    sb = sandbox_factory()
    victim_file.chmod(0o600)  # as /etc/shadow: root's alone
    planted = _as_postgres(f"ln -sf {victim_file} server.log", sb.root)
    shown_after_attack = sb.log_tail()
    # the same link as an earlier version's layout let postgres plant it (made as root)
    sb.log_path.unlink(missing_ok=True)
    sb.log_path.symlink_to(victim_file)
    shown = sb.log_tail()
    assert SECRET.strip() not in shown_after_attack
    assert not planted, "the postgres OS user could replace server.log"
    assert SECRET.strip() not in shown
    assert "is a symbolic link" in shown, shown
    with pytest.raises(safefile.UnsafeFile, match="is a symbolic link"):
        safefile.read_text(sb.log_path)


def test_destroy_signals_no_pid_but_its_own_servers(
    sandbox_factory: SandboxFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """postmaster.pid names a root process: destroy() must not SIGKILL it."""
    sb = sandbox_factory()
    real = sb._postmaster_pid()
    assert real is not None
    decoy = subprocess.Popen(["sleep", "120"])
    try:
        assert _as_postgres(f"sed -i '1s/.*/{decoy.pid}/' postmaster.pid", sb.data_dir)
        with caplog.at_level(logging.WARNING, logger="app.postgres.sandbox"):
            sb.destroy()
        alive = decoy.poll() is None
    finally:
        decoy.kill()
        decoy.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(real, signal.SIGKILL)  # the real server, left running by the refusal
    assert alive, "destroy() SIGKILLed the pid postmaster.pid named"
    assert f"not killing pid {decoy.pid}" in caplog.text
    assert "not postgres" in caplog.text
