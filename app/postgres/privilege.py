"""Who the service's child processes run as, and what they inherit.

When the service runs as root, nothing it starts on a client's behalf may keep root:
pgbench (a client's scripts run inside it), ``pgbench -i`` and the restart methods run
as an unprivileged OS user (``KNOBTUNE_RUN_AS_USER``, default ``nobody``; a dedicated
user is better: processes of the same user can read each other's environment, and
pgbench's carries the target's password). Not as ``postgres``: peer authentication
would make that user the superuser of the host's own PostgreSQL. The switch happens in
the forked child (subprocess's ``user``/``group``/``extra_groups``), without a shell
or a helper binary.

Children also get a minimal environment, never the service's own: that holds the API
token, the secret key and the metadata DB's URL.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUN_AS_ENV = "KNOBTUNE_RUN_AS_USER"
DEFAULT_RUN_AS = "nobody"
# What a child may inherit from the service's environment: locale, time zone, PATH.
_PASSED = ("PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR")

_configured: str | None = None


class PrivilegeError(RuntimeError):
    """The configured unprivileged user cannot be used; the message says what to change."""


def configure(user: str | None) -> None:
    """The user children run as (from Settings.run_as_user); None: the environment's."""
    global _configured
    _configured = user


@dataclass(frozen=True)
class Identity:
    """An OS user a child process switches to (only when the service is root)."""

    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[int, ...] = ()  # supplementary groups; none for pgbench

    def popen_kwargs(self) -> dict[str, Any]:
        if os.geteuid() != 0:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}


def dropping() -> bool:
    """Whether children switch user: only a root service has anything to drop."""
    return os.geteuid() == 0


def lookup(name: str, *, with_groups: bool = False) -> Identity:
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise PrivilegeError(
            f"the OS user {name!r} does not exist: create it (e.g. useradd --system "
            f"--no-create-home --shell /usr/sbin/nologin {name}) or set {RUN_AS_ENV} to another"
        ) from None
    groups: tuple[int, ...] = ()
    if with_groups:
        groups = tuple(g for g in os.getgrouplist(pw.pw_name, pw.pw_gid) if g != pw.pw_gid)
    return Identity(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir, groups)


def child_identity() -> Identity:
    """The unprivileged user for pgbench and the like (never root, never postgres)."""
    name = _configured or os.environ.get(RUN_AS_ENV) or DEFAULT_RUN_AS
    ident = lookup(name)
    if dropping() and (ident.uid == 0 or ident.name == "postgres"):
        raise PrivilegeError(
            f"{RUN_AS_ENV}={name}: children must not run as root or as postgres "
            "(peer authentication would make them superuser of the host's PostgreSQL); "
            "name an unprivileged user"
        )
    return ident


def child_kwargs() -> dict[str, Any]:
    """Popen keyword arguments that make the child the unprivileged user (as root)."""
    if not dropping():
        return {}
    return child_identity().popen_kwargs()


def child_env(extra: dict[str, str] | None = None, *, home: str | None = None) -> dict[str, str]:
    """A minimal environment: locale, PATH, and a HOME that is the child's own."""
    env = {k: v for k, v in os.environ.items() if k in _PASSED or k.startswith("LC_")}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    if dropping():
        env["HOME"] = home or child_identity().home
    elif "HOME" in os.environ:
        env["HOME"] = os.environ["HOME"]
    env.update(extra or {})
    return env


def child_dir(prefix: str, parent: Path | None = None) -> Path:
    """A fresh directory the child may write (mode 0700, owned by it when we are root).

    As root it is made under the system's temp directory, not under ``parent``: the
    service's work directory is private to the service, and the child must reach
    nothing of it.
    """
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)  # the caller's work directory must exist
    if dropping():
        ident = child_identity()
        path = Path(tempfile.mkdtemp(prefix=prefix))
        try:
            os.chown(path, ident.uid, ident.gid)
        except OSError:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return path
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def hand_over(path: Path) -> None:
    """Give a directory the service made (mode 0700) to the child user, when we are root."""
    if dropping():
        ident = child_identity()
        os.chown(path, ident.uid, ident.gid)


def remove_orphans(prefix: str, where: Path, owners: set[int]) -> int:
    """Remove the directories ``where/PREFIX<pid>-*`` whose process is gone; how many went.

    A process removes what it made in the temp directory when it ends, but one killed
    (SIGKILL, the OOM killer, a power cut) leaves it there for good. Only a real directory
    (not a symlink) owned by one of ``owners`` is touched, so another user's look-alike
    in a shared /tmp stays, and never one of a process that still runs.
    """
    removed = 0
    for path in where.glob(f"{prefix}*-*"):
        pid = path.name[len(prefix) :].split("-", 1)[0]
        if not pid.isdigit() or _running(int(pid)):
            continue
        try:
            st = path.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in owners:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True
