"""Restarting the target and getting it back: running its restart method and waiting for
connections, recovering when a restart with new settings fails (previous entries back,
restarted again), starting a server that a restart of ours left down, and clearing the lock
files of a postmaster that died as a zombie.

app/postgres/restart.py is the level below: the operator's restart methods (pg_ctl,
systemd, a container, a command) and how one is run. This module decides when to run the
target's method, and what to do when it fails.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from app.postgres import safefile
from app.postgres.privilege import PrivilegeError as PrivilegeError_
from app.postgres.restart import RestartFailed, RestartMethod
from app.postgres.restart import run as run_restart
from app.postgres.target.conf_files import (
    _AUTO_CONF,
    ConfFiles,
    _read,
    render_auto_conf,
    write_auto_conf,
)
from app.postgres.target.connection import Connector
from app.postgres.target.errors import ApplyError, RestartUnavailable, TargetError
from app.postgres.target.probe import pending_restart


class _RestartFailed(Exception):
    pass


class Restarter:
    """Restarts one target with its restart method (app/postgres/restart.py: pg_ctl,
    systemd, container or a named argv command, run without a shell), or a sandbox's own;
    never a command from an API client. ``no_restart_reason`` says why there is none."""

    def __init__(
        self,
        db: Connector,
        files: ConfFiles,
        *,
        restart: RestartMethod | None = None,
        no_restart_reason: str | None = None,
        restart_timeout_s: float | None = None,
        log_path: Path | None = None,
    ) -> None:
        self._db = db
        self._files = files
        self.restart = restart
        self.no_restart_reason = no_restart_reason or "the target has no restart method"
        self.restart_timeout_s = restart_timeout_s or (restart.timeout_s if restart else 120.0)
        self.log_path = log_path

    @property
    def can_restart(self) -> bool:
        return self.restart is not None

    def run(self) -> None:
        """Run the restart method, then wait for connections; raises _RestartFailed."""
        assert self.restart is not None
        t0 = time.monotonic()
        try:
            run_restart(self.restart)
        except (RestartFailed, PrivilegeError_) as exc:
            raise _RestartFailed(f"{self._db.scrub(str(exc))}{self._log_tail()}") from None
        remaining = max(5.0, self.restart_timeout_s - (time.monotonic() - t0))
        if not self._db.wait_until_up(remaining):
            raise _RestartFailed(
                f"the server did not accept connections within {remaining:.0f} s after the restart"
                f"{self._log_tail()}"
            )

    def _log_tail(self, lines: int = 8) -> str:
        if self.log_path is None:
            return ""
        try:
            # its last 64 KiB at most, never through a link (app/postgres/safefile.py)
            owner = safefile.dir_owner(self._files.data_dir or self.log_path.parent)
            tail = safefile.tail_lines(self.log_path, lines, owner=owner).splitlines()
        except safefile.UnsafeFile as exc:
            return f"\nserver log not read: {exc.strerror}"
        except OSError:
            return ""
        return "\nserver log:\n" + "\n".join(tail) if tail else ""

    def restart_or_recover(
        self,
        before: Mapping[str, str],
        names: Sequence[str],
        what: str,
        on_restart: Callable[[], None] | None = None,
    ) -> None:
        """Validate, restart; on failure restore ``names`` as in ``before`` and restart again."""
        problem = self._files.validate_pending(names)
        if problem:
            with self._db.connect() as conn:
                self._files.restore_entries(conn, before, names)
                self._files.reload(conn)
            raise ApplyError(
                f"{what} was not applied: the configuration would not start ({problem}); "
                "previous entries restored, the server was not restarted"
            )
        if on_restart is not None:
            on_restart()
        try:
            self.run()
        except _RestartFailed as exc:
            recovery = self._recover(before, names)
            raise ApplyError(f"{what} was not applied: restart failed: {exc}\n{recovery}") from None

    def _recover(self, before: Mapping[str, str], names: Sequence[str]) -> str:
        steps: list[str] = []
        if self._db.is_up():
            with self._db.connect() as conn:
                self._files.restore_entries(conn, before, names)
                self._files.reload(conn)
            with self._db.connect() as fresh:
                pending = pending_restart(fresh, names)
            steps.append("previous entries restored with ALTER SYSTEM")
            if not pending:
                return "Recovery: " + "; ".join(steps) + "; the server is up."
        else:
            data_dir = self._files.data_dir
            path = data_dir / _AUTO_CONF if data_dir else None
            if path is None:
                steps.append(
                    "the server is down and its data directory is not on this host: "
                    "previous entries could NOT be restored"
                )
            else:
                try:
                    write_auto_conf(path, before, names)
                    steps.append(f"previous entries written back to {path}")
                except OSError as exc:
                    steps.append(f"could not write {path}: {exc}")
        try:
            self.run()
            steps.append("the server was restarted and accepts connections")
        except _RestartFailed as exc:
            steps.append(f"the restart after restoring failed too ({exc}); manual action needed")
        return "Recovery: " + "; ".join(steps) + "."

    def recover_offline(self, auto_conf: Mapping[str, str]) -> str:
        """Bring back a server that a restart of ours left down, with ``auto_conf``'s entries
        (a snapshot's: see TargetController.recover_offline)."""
        if self._db.is_up():
            return "the server is up; nothing to recover"
        if self.restart is None:
            raise RestartUnavailable(f"the server is down and {self.no_restart_reason}")
        data_dir = self._files.data_dir or self._files.given_data_dir
        path = data_dir / _AUTO_CONF if data_dir is not None else None
        steps: list[str] = []
        if path is not None and path.is_file():
            try:
                # in place: keeps owner and mode; never through a link
                safefile.rewrite_in_place(
                    path,
                    render_auto_conf(auto_conf),
                    owner=safefile.dir_owner(path.parent),
                )
                steps.append(f"the snapshot's entries were written to {path}")
            except OSError as exc:
                steps.append(f"could not write {path}: {exc}")
        else:
            steps.append("the data directory is not on this host: entries left as they are")
        if data_dir is not None:
            cleared = clear_dead_postmaster(data_dir)
            if cleared:
                steps.append(cleared)
        try:
            self.run()
        except _RestartFailed as exc:
            raise TargetError(
                f"the server is down and did not start: {exc} ({'; '.join(steps)})"
            ) from None
        steps.append("the server was started and accepts connections")
        return "; ".join(steps)


def _pid_state(pid: int) -> str | None:
    """The process's state letter from /proc (``Z``: a zombie), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0]


def _users_of(data_dir: Path) -> list[int]:
    """Live processes whose working directory is ``data_dir`` (every PostgreSQL backend's)."""
    target = data_dir.resolve()
    out: list[int] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if Path(os.readlink(proc / "cwd")) == target and _pid_state(int(proc.name)) != "Z":
                out.append(int(proc.name))
        except OSError:
            continue
    return out


def clear_dead_postmaster(data_dir: Path, wait_s: float = 10.0) -> str | None:
    """Remove the lock file of a postmaster that died as a zombie nobody reaps.

    A SIGKILLed postmaster (the OOM killer) is reaped by init; in a container whose first
    process does not reap, it stays a zombie, so ``kill(pid, 0)`` still finds it and both
    pg_ctl and postgres refuse to start ("server does not shut down", "lock file already
    exists"). Once its orphan backends have exited (no live process has the data
    directory as working directory, waited for up to ``wait_s``), its postmaster.pid is
    stale and is removed. Returns what was done, or None when there was nothing to do or
    it could not be shown to be safe.
    """
    lock = data_dir / "postmaster.pid"
    try:
        lines = _read(lock, data_dir, limit=4096).split("\n")
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        return None
    # its socket's lock file names it too (lines 4 and 5: port, first socket directory)
    sockets = []
    if len(lines) > 4 and lines[3].strip().isdigit() and lines[4].strip():
        sockets.append(Path(lines[4].strip()) / f".s.PGSQL.{lines[3].strip()}.lock")
    if _pid_state(pid) != "Z":
        return None  # alive (not ours to touch) or gone (pg_ctl handles a stale file)
    if not os.access("/proc/1/cwd", os.R_OK) and os.geteuid() != 0:
        return None  # cannot see other users' processes: cannot show it is safe
    deadline = time.monotonic() + wait_s
    while _users_of(data_dir):
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)
    try:
        for sock in sockets:
            with contextlib.suppress(OSError):
                # a path the lock file names: only a file of the data directory's owner
                if _read(sock, data_dir, limit=4096).split("\n", 1)[0].strip() == str(pid):
                    sock.unlink()
        lock.unlink()
    except OSError:
        return None
    return f"the dead postmaster's lock files (PID {pid}, a zombie) were removed"
