"""Disposable local PostgreSQL clusters: initdb, own port and socket dir, start/stop/destroy.

Used by tests, the demo and anyone trying knobtune without a server of their own.
initdb, pg_ctl and postgres refuse to run as root, so as root they run as the
``postgres`` OS user through ``runuser``; the sandbox directory is owned by it.

No connection is trusted: every one, over TCP or the unix socket, authenticates with
scram-sha-256. Each sandbox gets two random passwords, set before it first starts: the
superuser's (``postgres``, for the service's ALTER SYSTEM) and that of ``knobtune_bench``,
the role clients' workloads run as (``bench_dsn``): not superuser, no
pg_read_server_files or pg_execute_server_program, so a script cannot reach the host's
files or programs; no CREATEDB, and it does not own the benchmark database ``knobtune``
(the superuser does; the role may create tables in its schema ``public``), so it cannot
``ALTER DATABASE knobtune SET work_mem`` over the knob being tuned. (It can still ALTER
ROLE itself SET, as every role may: a session clears such settings of a sandbox's role
before it starts, app/sessions/runner.py.) A replayed capture's per-run copy of a database
is made by the superuser (app/workloads/replay.py). The passwords live in this object
and, encrypted, in the service's metadata DB; never on disk in the sandbox.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import hashlib
import hmac
import itertools
import json
import logging
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from psycopg.conninfo import conninfo_to_dict

from app.postgres import live, privilege, safefile

# re-exported: callers have always found these in the sandbox manager
from app.postgres.binaries import (
    BINDIR_ENV as BINDIR_ENV,
)
from app.postgres.binaries import (
    INSTALL_HINT as INSTALL_HINT,
)
from app.postgres.binaries import (
    PostgresNotInstalled as PostgresNotInstalled,
)
from app.postgres.binaries import (
    _has_server_binaries,
)
from app.postgres.binaries import (
    find_bindir as find_bindir,
)
from app.postgres.binaries import (
    server_version as server_version,
)
from app.postgres.cgroups import (
    Cgroup,
    CgroupUnavailable,
    Limits,
    launcher_argv,
    sandbox_cgroup_name,
)

if TYPE_CHECKING:
    from app.postgres.restart import PgCtlMethod

log = logging.getLogger(__name__)

_PG_CTL_TIMEOUT_S = 60
# Unix socket paths are limited to ~107 bytes: longer roots get their socket under /tmp.
_MAX_ROOT_LEN = 80
_META = "sandbox.json"
SUPERUSER = "postgres"
BENCH_ROLE = "knobtune_bench"
BENCH_DB = "knobtune"
# The benchmark role's privileges (sandbox.json's "bench_role"): 1 had CREATEDB and owned
# its database; 2 (issue 40) neither. restrict_bench_role() takes a sandbox from 1 to 2.
BENCH_ROLE_VERSION = 2
_RESTRICT = [  # in database postgres, in single-user mode
    f"ALTER ROLE {BENCH_ROLE} NOSUPERUSER NOCREATEDB NOCREATEROLE",
    f"ALTER DATABASE {BENCH_DB} OWNER TO {SUPERUSER}",
    # whatever it set over the tuned knobs while it could
    f"ALTER DATABASE {BENCH_DB} RESET ALL",
    f"ALTER ROLE {BENCH_ROLE} RESET ALL",
    f"ALTER ROLE {BENCH_ROLE} IN DATABASE {BENCH_DB} RESET ALL",
]
_GRANT = [f"GRANT CREATE, USAGE ON SCHEMA public TO {BENCH_ROLE}"]  # in database knobtune
# Every connection authenticates; nothing is trusted, not even the unix socket.
_HBA = """# written by knobtune's sandbox manager: every connection needs a password
local   all   all                 scram-sha-256
host    all   all   127.0.0.1/32  scram-sha-256
host    all   all   ::1/128       scram-sha-256
"""


class SandboxError(RuntimeError):
    """A sandbox operation failed; the message includes the server log's tail."""


def as_postgres(argv: Sequence[str]) -> list[str]:
    """``argv`` run as the postgres OS user when we are root (the server binaries refuse root)."""
    if os.geteuid() != 0:
        return list(argv)
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresNotInstalled(
            "running as root needs a 'postgres' OS user to own the cluster "
            f"(it comes with: {INSTALL_HINT}), or run knobtune as a non-root user"
        ) from None
    runuser = shutil.which("runuser") or "/sbin/runuser"
    return [runuser, "-u", "postgres", "--", *argv]


def _owner_ids() -> tuple[int, int]:
    """uid/gid that must own sandbox files: postgres when root, else ourselves."""
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        return pw.pw_uid, pw.pw_gid
    return os.getuid(), os.getgid()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _quote_conf(value: str) -> str:
    """A postgresql.conf string literal (quotes and backslashes doubled, as ALTER SYSTEM does)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _run(
    argv: Sequence[str], timeout: float = 120, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    if stdin is not None:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, input=stdin
        )
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def scram_verifier(password: str, iterations: int = 4096) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (RFC 5802/7677).

    ALTER ROLE ... PASSWORD takes it as is, so the password itself never reaches the
    server (nor a log line of a failed statement).
    """
    salt = os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()

    def b64(b: bytes) -> str:
        return base64.b64encode(b).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def new_password() -> str:
    return secrets.token_urlsafe(24)


def _single_user(
    bindir: Path, data_dir: Path, statements: Sequence[str], database: str = "postgres"
) -> None:
    """Run statements in single-user mode (the server is down): before it ever listens."""
    argv = as_postgres([str(bindir / "postgres"), "--single", "-D", str(data_dir), database])
    res = _run(argv, timeout=120, stdin="".join(f"{st}\n" for st in statements))
    errors = [ln for ln in res.stderr.splitlines() if "ERROR" in ln or "FATAL" in ln]
    if res.returncode != 0 or errors:
        said = "; ".join(errors) or res.stderr.strip()[-500:]
        raise SandboxError(f"setting up the sandbox's roles failed (exit {res.returncode}): {said}")


def _write_hba(data_dir: Path) -> None:
    # postgres owns the directory: a link planted as pg_hba.conf is replaced, not followed
    uid, gid = _owner_ids()
    safefile.replace_text(data_dir / "pg_hba.conf", _HBA, owner=uid, chown=(uid, gid))


# One initdb per process and binary directory; later sandboxes copy it (~0.1 s
# instead of ~1 s). The template is never started, so copies are clean clusters.
_template_lock = threading.Lock()
_templates: dict[Path, Path] = {}


def _template_for(bindir: Path) -> Path:
    with _template_lock:
        tpl = _templates.get(bindir)
        if tpl is not None and (tpl / "PG_VERSION").exists():
            return tpl
        root = Path(tempfile.mkdtemp(prefix=f"{TEMPLATE_PREFIX}{os.getpid()}-", dir=_short_tmp()))
        uid, gid = _owner_ids()
        os.chown(root, uid, gid)
        tpl = root / "data"
        _initdb(bindir, tpl)
        _templates[bindir] = tpl
        return tpl


TEMPLATE_PREFIX = "knobtune-tpl-"  # then the pid of the process that made it


def remove_orphan_templates(where: Path | None = None) -> int:
    """Remove initdb templates (46 MB each) of processes that are gone: removed at exit,
    but a killed process leaves its own. How many went."""
    try:
        owner = _owner_ids()[0]
    except KeyError:  # root on a host without a postgres user: no sandbox, no template
        return 0
    place = where if where is not None else Path(_short_tmp())
    return privilege.remove_orphans(TEMPLATE_PREFIX, place, {owner})


def _initdb(bindir: Path, data_dir: Path) -> None:
    # --no-sync: a sandbox that loses power is simply recreated; saves seconds.
    argv = [
        str(bindir / "initdb"),
        "-D",
        str(data_dir),
        "-U",
        "postgres",
        # Replaced by _HBA below, before any start; never trust, not even for a moment.
        "--auth-local=peer",
        "--auth-host=reject",
        "--no-sync",
        "-E",
        "UTF8",
        "--locale=C",
    ]
    res = _run(as_postgres(argv))
    if res.returncode != 0:
        raise SandboxError(
            f"initdb failed (exit {res.returncode}): {(res.stderr or res.stdout)[-2000:]}"
        )
    _write_hba(data_dir)
    # The benchmark's role may make tables in its database, and nothing else.
    _single_user(
        bindir,
        data_dir,
        [
            f"CREATE ROLE {BENCH_ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE",
            f"CREATE DATABASE {BENCH_DB}",
        ],
    )
    _single_user(bindir, data_dir, _GRANT, database=BENCH_DB)


def _own_dir(root: Path) -> None:
    """``root`` becomes the service's user's, 0711: the postgres user passes through to its
    data directory but may make, rename or replace nothing in it."""
    with safefile.open_dir(root, owner=_owner_ids()[0]) as fd:
        os.fchown(fd, os.geteuid(), os.getegid())
        os.fchmod(fd, 0o711)


def _short_tmp() -> str:
    tmp = tempfile.gettempdir()
    return tmp if len(tmp) <= _MAX_ROOT_LEN - 30 else "/tmp"  # noqa: S108 - socket path length


_SOCKET_PREFIX = "knobtune-sock-"
_SOCKET_NAME = re.compile(re.escape(_SOCKET_PREFIX) + r"[A-Za-z0-9_]+")


def _socket_dir_ok(path: Path, root: Path) -> bool:
    """Whether ``path`` is a socket directory create() makes: ``<tmp>/knobtune-sock-*``
    (mkdtemp's name) or ``<root>/sock``. The service makes, chowns and removes it as root,
    so it is never taken from a file the postgres user can write, and never anything else."""
    if path == root / "sock":
        return True
    parents = {Path(tempfile.gettempdir()), Path("/tmp")}  # noqa: S108 - _short_tmp()'s
    return (
        path.is_absolute()
        and ".." not in path.parts
        and path.parent in parents
        and _SOCKET_NAME.fullmatch(path.name) is not None
    )


class _Untrusted(Exception):
    """The sandbox's record (or its directory) is writable by the postgres OS user."""


def _read_record(root: Path) -> dict[str, object]:
    """The sandbox's record, from a file only the service's user may write in a directory
    only it may write; _Untrusted otherwise, SandboxError when there is none."""
    try:
        st = os.lstat(root)
    except OSError as exc:
        raise SandboxError(f"{root} is not a knobtune sandbox: {exc}") from None
    mine = st.st_uid == os.geteuid() and stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o022
    if not mine:
        raise _Untrusted
    try:
        meta = json.loads(safefile.read_text(root / _META, limit=64 << 10))
    except safefile.UnsafeFile:
        raise _Untrusted from None
    except (OSError, ValueError) as exc:
        raise SandboxError(f"{root} is not a knobtune sandbox: {exc}") from None
    if not isinstance(meta, dict):
        raise SandboxError(f"{root} is not a knobtune sandbox: its {_META} is not an object")
    return meta


def _is_postmaster_of(pid: int, data_dir: Path) -> str | None:
    """None when ``pid`` is a PostgreSQL server of ``data_dir`` (its program is postgres,
    its working directory or its -D that directory), else what it is instead: a pid read
    from postmaster.pid, which the postgres user can write, is never signalled unchecked."""
    proc = Path(f"/proc/{pid}")
    try:
        exe = os.readlink(proc / "exe").removesuffix(" (deleted)")
    except OSError as exc:
        return f"its program cannot be read ({exc.strerror or exc})"
    if Path(exe).name not in ("postgres", "postmaster"):
        return f"its program is {exe}, not postgres"
    want = {str(data_dir), os.path.realpath(data_dir)}
    with contextlib.suppress(OSError):
        if os.readlink(proc / "cwd") in want:
            return None
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        argv = []
    for flag, value in itertools.pairwise(argv):
        if flag == b"-D" and os.fsdecode(value) in want:
            return None
    return f"it is not the server of {data_dir}"


def remove_socket_dir(dsn: str) -> None:
    """Remove the socket directory a sandbox's DSN names, when it is one of ours and empty:
    a sandbox whose files were deleted by hand leaves it behind in /tmp otherwise."""
    path = Path(str(conninfo_to_dict(dsn).get("host") or ""))
    if path.is_absolute() and path.name.startswith(_SOCKET_PREFIX):
        with contextlib.suppress(OSError):
            path.rmdir()  # fails on anything but an empty directory


@atexit.register
def _cleanup() -> None:
    for sb in live.snapshot():
        with contextlib.suppress(Exception):
            sb.destroy()
    for tpl in list(_templates.values()):
        shutil.rmtree(tpl.parent, ignore_errors=True)
    _templates.clear()


def _sandbox_settings(data_dir: Path) -> dict[str, str]:
    """The extra settings create() wrote into knobtune_sandbox.conf (port etc. excluded)."""
    own = {"port", "listen_addresses", "unix_socket_directories"}
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        text = safefile.read_text(data_dir / "knobtune_sandbox.conf", owner=_owner_ids()[0])
        for line in text.splitlines():
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_.]*) = '((?:[^']|'')*)'", line.strip())
            if m and m.group(1) not in own:
                out[m.group(1)] = m.group(2).replace("''", "'").replace("\\\\", "\\")
    return out


def drop_cgroup(root: Path) -> None:
    """Remove the cgroup of the sandbox in ``root``, if there is one; processes left in it
    (only that server's) are killed first."""
    try:
        cg = Cgroup.for_sandbox(root)
    except CgroupUnavailable:
        return
    if not cg.exists():
        return
    for pid in cg.pids():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if not cg.remove():
        log.warning("cgroup %s of sandbox %s could not be removed", cg.name, root)


class Sandbox:
    """A local cluster in its own directory: ``data/``, ``server.log``, ``sandbox.json``.

    The root and ``sandbox.json`` (port, socket directory, binaries, limits: what the
    service acts on as root) belong to the service's user (0711 and 0600); ``data/``
    (0700) and ``server.log`` (0600) to the cluster's OS user, who may write nothing else
    there. The socket directory is a short directory under /tmp that anyone may reach
    (pgbench runs as an unprivileged user); the socket is guarded by scram-sha-256 like
    TCP. ``password``/``bench_password`` are known to the process that created the
    sandbox (None after :meth:`open`).
    """

    def __init__(
        self,
        root: Path,
        *,
        port: int,
        bindir: Path,
        owns_root: bool,
        socket_dir: Path | None = None,
        password: str | None = None,
        bench_password: str | None = None,
        limits: Limits | None = None,
        bench_role: int = BENCH_ROLE_VERSION,
    ) -> None:
        self.root = root
        self.bench_role = bench_role  # BENCH_ROLE_VERSION of its benchmark role
        # A hardware profile (app/postgres/cgroups.py): the server runs in its own cgroup.
        self.limits = limits if limits is not None and not limits.empty else None
        self.password = password
        self.bench_password = bench_password
        self.port = port
        self.bindir = bindir
        self.data_dir = root / "data"
        self.socket_dir = socket_dir or root / "sock"
        if not _socket_dir_ok(self.socket_dir, root):
            raise SandboxError(
                f"{self.socket_dir} is not a socket directory knobtune makes "
                f"({Path(_short_tmp()) / _SOCKET_PREFIX}* or {root / 'sock'}); not using it"
            )
        self.log_path = root / "server.log"
        self._owns_root = owns_root
        self._destroyed = False

    # -- creation --------------------------------------------------------------
    @classmethod
    def create(
        cls,
        root: Path | None = None,
        *,
        port: int | None = None,
        settings: Mapping[str, str] | None = None,
        limits: Limits | None = None,
        version: int | None = None,
    ) -> Sandbox:
        """initdb (a copy of a per-process template) and start; raises SandboxError.

        ``version``: a PostgreSQL major version installed here (find_bindir), else the
        default binaries ($KNOBTUNE_PG_BINDIR, else the system's: find_bindir).

        Without ``root`` a temporary directory is used. A ``root`` that did not
        exist is removed by destroy(); an existing one keeps everything but our files.
        With ``limits`` the server runs in a cgroup of its own from its first start;
        CgroupUnavailable (nothing left behind) when this host cannot make one.
        """
        bindir = find_bindir(version)
        as_postgres([])  # fail early and clearly when root has no postgres user
        uid, gid = _owner_ids()
        if root is None:
            root = Path(tempfile.mkdtemp(prefix="knobtune-sb-", dir=_short_tmp()))
            owns_root = True
        else:
            root = root.absolute()
            owns_root = not root.exists()
            root.mkdir(parents=True, exist_ok=True)
            if (root / "data").exists():
                raise SandboxError(f"{root / 'data'} already exists; give an empty root")
        _own_dir(root)
        socket_dir = Path(tempfile.mkdtemp(prefix=_SOCKET_PREFIX, dir=_short_tmp()))
        os.chown(socket_dir, uid, gid)
        # reachable by pgbench's unprivileged user; the socket itself needs a password
        os.chmod(socket_dir, 0o755)  # noqa: S103
        sb = cls(
            root,
            port=port or free_port(),
            bindir=bindir,
            owns_root=owns_root,
            socket_dir=socket_dir,
            password=new_password(),
            bench_password=new_password(),
            limits=limits,
        )
        try:
            sb._check_access()
            sb.ensure_cgroup()  # before anything is copied: a host without cgroups fails fast
            tpl = _template_for(bindir)
            # the root stays ours: postgres gets its data directory and its log file only
            sb.data_dir.mkdir(mode=0o700)
            os.chown(sb.data_dir, uid, gid)
            res = _run(as_postgres(["cp", "-a", f"{tpl}/.", f"{sb.data_dir}/"]))
            if res.returncode != 0:
                raise SandboxError(f"copying the initdb template failed: {res.stderr.strip()}")
            # Before the sandbox's own settings: single-user mode must not trip on them
            # (a bad one is reported by the start below, with the server's log).
            sb._set_passwords()
            sb._write_conf(settings or {})
            live.add(sb)
            for attempt in range(3):
                try:
                    sb.start()
                    break
                except SandboxError:
                    # Someone took the free port between our check and the bind: try another.
                    if port is not None or attempt == 2 or "could not bind" not in sb.log_tail(50):
                        raise
                    sb.port = free_port()
                    sb._write_conf(settings or {})
        except BaseException:
            sb.destroy()
            raise
        return sb

    @classmethod
    def open(cls, root: Path, *, dsn: str | None = None) -> Sandbox:
        """Reattach to a sandbox made by create() (e.g. after the service restarted).

        What the service acts on as root (the socket directory it makes and removes, the
        port, the binaries) comes from ``sandbox.json`` only when that file and the root
        are the service's user's alone. Earlier versions gave both to the postgres OS
        user: such a sandbox is reopened only with ``dsn``, the service's own stored DSN
        of it (the metadata DB), whose socket directory and port are used; the root and
        the record are then taken back (:meth:`_take_back`). Without it, SandboxError.
        """
        root = root.absolute()
        try:
            meta = _read_record(root)
        except _Untrusted:
            if dsn is None:
                raise SandboxError(
                    f"{root} is writable by the postgres OS user (made by an earlier "
                    "knobtune): its sandbox.json is not trusted; start the service, which "
                    "takes it back using the target's stored DSN"
                ) from None
            return cls._reopen_legacy(root, dsn)
        try:
            port = int(str(meta["port"]))
            socket_dir = Path(str(meta["socket_dir"]))
            owns_root = bool(meta["owns_root"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SandboxError(f"{root} is not a knobtune sandbox: {exc!r}") from None
        bindir = Path(str(meta.get("bindir") or ""))
        if not _has_server_binaries(bindir):
            bindir = find_bindir()  # PostgreSQL was upgraded or moved since
        raw_limits = meta.get("limits")
        limits = Limits.from_json(raw_limits if isinstance(raw_limits, dict) else None)
        version = meta.get("bench_role")
        return cls(
            root,
            port=port,
            bindir=bindir,
            owns_root=owns_root,
            socket_dir=socket_dir,
            limits=limits,
            bench_role=version if isinstance(version, int) else 1,
        )

    @classmethod
    def _reopen_legacy(cls, root: Path, dsn: str) -> Sandbox:
        """A sandbox whose root the postgres user owned: its facts from the service's DSN."""
        try:
            params = conninfo_to_dict(dsn)
            socket_dir, port = Path(str(params["host"])), int(str(params["port"]))
        except Exception:
            raise SandboxError(
                f"{root}: the stored DSN names no socket directory and port"
            ) from None
        # the service made its root (create(root) of a new directory); limits come from
        # the metadata DB (start_sandboxes), binaries from this host
        sb = cls(
            root,
            port=port,
            bindir=find_bindir(),
            owns_root=True,
            socket_dir=socket_dir,
            bench_role=1,
        )
        sb._take_back()
        return sb

    def _take_back(self) -> None:
        """Make an earlier version's sandbox directory the service's user's again (0711):
        postgres keeps ``data/`` and ``server.log``, and the record is written anew."""
        uid = _owner_ids()[0]
        with safefile.open_dir(self.root, owner=uid) as fd:
            os.fchown(fd, os.geteuid(), os.getegid())
            os.fchmod(fd, 0o711)
        st = os.lstat(self.data_dir)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            raise SandboxError(
                f"{self.data_dir} is not a directory of the postgres OS user (a link?); "
                "not using this sandbox"
            )
        self._ensure_log()
        self._write_record()
        log.info("sandbox %s: its directory and record belong to the service now", self.root)

    def _set_passwords(self) -> None:
        """Both roles' passwords, in single-user mode: set before the server first listens."""
        assert self.password is not None
        assert self.bench_password is not None
        _single_user(
            self.bindir,
            self.data_dir,
            [
                f"ALTER ROLE {SUPERUSER} PASSWORD '{scram_verifier(self.password)}'",
                f"ALTER ROLE {BENCH_ROLE} PASSWORD '{scram_verifier(self.bench_password)}'",
            ],
        )

    def set_password(self, password: str) -> None:
        """Give the superuser another password (the server is running); ``dsn`` follows."""
        from app.postgres.connect import connect_target

        with connect_target(self.dsn, autocommit=True) as conn:
            conn.execute(f"ALTER ROLE {SUPERUSER} PASSWORD '{scram_verifier(password)}'")
        self.password = password

    def is_hardened(self) -> bool:
        """Whether the cluster has the password-only pg_hba.conf and the benchmark role.

        Sandboxes made before this version trusted every local connection.
        """
        try:
            hba = safefile.read_text(self.data_dir / "pg_hba.conf", owner=_owner_ids()[0])
        except OSError:
            return False
        return hba == _HBA

    def harden(self) -> None:
        """Give an old (trust) sandbox fresh passwords, the benchmark role and database.

        The server is stopped for it and started again; ``password`` and
        ``bench_password`` hold the new passwords afterwards.
        """
        was_running = self.is_running()
        self.stop()
        self.password, self.bench_password = new_password(), new_password()
        statements = [
            f"ALTER ROLE {SUPERUSER} PASSWORD '{scram_verifier(self.password)}'",
            f"CREATE ROLE {BENCH_ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
            f"PASSWORD '{scram_verifier(self.bench_password)}'",
            f"CREATE DATABASE {BENCH_DB}",
        ]
        try:
            existing = self._single_user_query(
                f"SELECT 1 FROM pg_roles WHERE rolname = '{BENCH_ROLE}'"
            )
        except SandboxError:
            existing = False
        if existing:  # a half-done earlier attempt: the role (and maybe the database) exist
            statements[1] = (
                f"ALTER ROLE {BENCH_ROLE} PASSWORD '{scram_verifier(self.bench_password)}'"
            )
            if self._single_user_query(f"SELECT 1 FROM pg_database WHERE datname = '{BENCH_DB}'"):
                statements.pop(2)
        _single_user(self.bindir, self.data_dir, [*statements, *_RESTRICT])
        _single_user(self.bindir, self.data_dir, _GRANT, database=BENCH_DB)
        _write_hba(self.data_dir)
        self.bench_role = BENCH_ROLE_VERSION
        self._write_record()
        if was_running:
            self.start()

    def restrict_bench_role(self) -> None:
        """Take CREATEDB and its database from the benchmark role of a sandbox made before
        issue 40 (and drop the settings it made per role or database); the server is
        stopped for it and started again."""
        was_running = self.is_running()
        self.stop()
        _single_user(self.bindir, self.data_dir, _RESTRICT)
        _single_user(self.bindir, self.data_dir, _GRANT, database=BENCH_DB)
        self.bench_role = BENCH_ROLE_VERSION
        self._write_record()
        log.info("sandbox %s: its benchmark role has no CREATEDB nor database now", self.root)
        if was_running:
            self.start()

    def _single_user_query(self, query: str) -> bool:
        """Whether ``query`` returns a row, in single-user mode (the server is down)."""
        argv = as_postgres(
            [str(self.bindir / "postgres"), "--single", "-D", str(self.data_dir), "postgres"]
        )
        res = _run(argv, timeout=60, stdin=query + "\n")
        if res.returncode != 0:
            raise SandboxError(f"single-user query failed: {res.stderr.strip()[-300:]}")
        return '?column? = "1"' in res.stdout

    def _check_access(self) -> None:
        if os.geteuid() != 0:
            return
        res = _run(as_postgres(["test", "-x", str(self.root)]))
        if res.returncode != 0:
            raise SandboxError(
                f"the postgres OS user cannot use {self.root}: it or a directory above it "
                "is private (mode 0700, as /root is); put the sandbox in a directory that "
                "user can enter (under /var/tmp or /tmp)"
            )

    def _write_conf(self, settings: Mapping[str, str]) -> None:
        """Sandbox settings live in a file included by postgresql.conf, rewritten on retries."""
        lines = [
            "# written by knobtune's sandbox manager",
            f"port = {self.port}",
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = {_quote_conf(str(self.socket_dir))}",
        ]
        for name, value in settings.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", name):
                raise SandboxError(f"invalid setting name {name!r}")
            lines.append(f"{name} = {_quote_conf(str(value))}")
        uid, gid = _owner_ids()
        path = self.data_dir / "knobtune_sandbox.conf"
        safefile.replace_text(path, "\n".join(lines) + "\n", owner=uid, chown=(uid, gid))
        self._write_record()
        main = self.data_dir / "postgresql.conf"
        include = "include = 'knobtune_sandbox.conf'\n"
        text = safefile.read_text(main, owner=uid, limit=16 << 20, whole=True)
        if include not in text:
            safefile.rewrite_in_place(main, text + include, owner=uid)

    def _write_record(self) -> None:
        """sandbox.json: the service's user's alone (0600 in its 0711 root), see :meth:`open`."""
        meta = {
            "port": self.port,
            "socket_dir": str(self.socket_dir),
            "owns_root": self._owns_root,
            "bindir": str(self.bindir),
            "limits": self.limits.to_json() if self.limits else None,
            "bench_role": self.bench_role,
        }
        safefile.replace_text(self.root / _META, json.dumps(meta, indent=2) + "\n")

    def _ensure_log(self) -> None:
        """server.log, the postgres user's file in our root (pg_ctl -l appends to it)."""
        safefile.create_file(self.log_path, chown=_owner_ids())

    # -- connection facts -------------------------------------------------------
    def _conninfo(self, host: str, user: str, password: str | None, dbname: str) -> str:
        pw = f" password={password}" if password else ""  # token_urlsafe: nothing to quote
        return f"host={host} port={self.port} user={user} dbname={dbname}{pw}"

    @property
    def dsn(self) -> str:
        """The superuser's DSN (the service's controller: ALTER SYSTEM, reload)."""
        return self._conninfo(str(self.socket_dir), SUPERUSER, self.password, "postgres")

    @property
    def tcp_dsn(self) -> str:
        return self._conninfo("127.0.0.1", SUPERUSER, self.password, "postgres")

    @property
    def bench_dsn(self) -> str:
        """The benchmark role's DSN: where clients' workloads run (not a superuser)."""
        return self._conninfo(str(self.socket_dir), BENCH_ROLE, self.bench_password, BENCH_DB)

    def _pg_ctl(self, *args: str) -> list[str]:
        return as_postgres([str(self.bindir / "pg_ctl"), *args, "-D", str(self.data_dir)])

    # -- hardware profile (cgroup) ------------------------------------------------
    @property
    def cgroup(self) -> Cgroup | None:
        """This sandbox's cgroup when it has limits (raises CgroupUnavailable without cgroups)."""
        if self.limits is None:
            return None
        return Cgroup.for_sandbox(self.root)

    def ensure_cgroup(self) -> None:
        """Make the cgroup with the limits (again: after a reboot it is gone); idempotent."""
        cg = self.cgroup
        if cg is not None and self.limits is not None:
            cg.create(self.limits, self.data_dir if self.data_dir.exists() else self.root)

    def set_limits(self, limits: Limits | None) -> None:
        """Take ``limits`` (the service's record of them) from the next start on."""
        self.limits = limits if limits is not None and not limits.empty else None
        if self.data_dir.exists():
            self._write_conf(_sandbox_settings(self.data_dir))

    def _in_cgroup(self, argv: list[str]) -> list[str]:
        """``argv`` started inside the sandbox's cgroup (unchanged without limits)."""
        cg = self.cgroup
        if cg is None:
            return argv
        self.ensure_cgroup()
        procs = cg.procs_files()
        if not procs:
            raise SandboxError(f"the sandbox's cgroup {cg.name} could not be made")
        return launcher_argv(procs, argv)

    def postmaster_pids(self) -> set[int]:
        """The postmaster and its children (backends, background processes)."""
        pm = self._checked_postmaster()
        if pm is None:
            return set()
        out = {pm}
        for proc_stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                # pid (comm) state ppid ...: comm may hold spaces, so split after ')'
                fields = proc_stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pm:
                    out.add(int(proc_stat.parent.name))
        return out

    def outside(
        self, listed: set[int], read_inside: Callable[[], set[int]], settle_s: float = 0.5
    ) -> set[int]:
        """Of ``listed`` (:meth:`postmaster_pids`), those not in the cgroup ``read_inside``
        reads (after the listing) that are still the server's now. A child that exited
        between the reads (a short-lived backend) is gone, not outside; one being forked
        is in /proc before the kernel links it into its parent's cgroup (on a busy host
        for a while), so a missing pid is read again after ``settle_s`` before it counts."""
        missing = (listed - read_inside()) & self.postmaster_pids()
        if missing:
            time.sleep(settle_s)
            missing = (missing - read_inside()) & self.postmaster_pids()
        return missing

    def adopt(self) -> int:
        """Move a running server that is outside its cgroup into it (started by hand, or
        by a version without profiles); returns how many processes moved."""
        cg = self.cgroup
        if cg is None or not self.is_running():
            return 0
        self.ensure_cgroup()
        inside = cg.pids()
        moved = 0
        for pid in sorted(self.postmaster_pids() - inside):
            for f in cg.procs_files():
                with contextlib.suppress(OSError):
                    f.write_text(str(pid))
            moved += 1
        return moved

    @property
    def restart_method(self) -> PgCtlMethod:
        """This cluster's own restart (pg_ctl as its OS user); never one a client can name."""
        from app.postgres.restart import PgCtlMethod

        return PgCtlMethod(
            kind="pg_ctl",
            data_dir=str(self.data_dir),
            bindir=str(self.bindir),
            log_file=str(self.log_path),
            timeout_s=2 * _PG_CTL_TIMEOUT_S + 10,
            cgroup=sandbox_cgroup_name(self.root) if self.limits else None,
        )

    def _restart_argv(self) -> list[str]:
        return self._pg_ctl(
            "restart",
            "-w",
            "-s",
            "-m",
            "fast",
            "-t",
            str(_PG_CTL_TIMEOUT_S),
            "-l",
            str(self.log_path),
        )

    # -- lifecycle ---------------------------------------------------------------
    def keep(self) -> None:
        """Outlive this process: the caller (the service) now owns the cluster's lifecycle.

        Without this, the exit handler destroys the cluster when the process ends, even
        on a clean SIGTERM, and a service started again finds its sandbox gone.
        """
        live.discard(self)

    def move_to(self, port: int) -> None:
        """Listen on another port from the next start (the old one was taken meanwhile)."""
        self.port = port
        self._write_conf(_sandbox_settings(self.data_dir))

    def start(self) -> None:
        if self.is_running():
            return
        if not self.data_dir.is_dir():
            # removed through another handle: making its socket directory again would
            # leave an empty one behind in /tmp
            raise SandboxError(f"{self.data_dir} is gone: the sandbox was removed; make a new one")
        self._socket_dir()
        self._ensure_log()
        argv = self._pg_ctl(
            "start", "-w", "-s", "-t", str(_PG_CTL_TIMEOUT_S), "-l", str(self.log_path)
        )
        try:
            argv = self._in_cgroup(argv)
        except CgroupUnavailable as exc:
            raise SandboxError(f"the sandbox has limits ({self.limits}) but {exc}") from None
        res = _run(argv, timeout=_PG_CTL_TIMEOUT_S + 10)
        if res.returncode != 0:
            raise SandboxError(self._failure("start", res))

    def _socket_dir(self) -> None:
        """The socket directory, made again when gone (a reboot empties /tmp). Never
        through a link: the postgres user may replace its own directory in /tmp."""
        try:
            st = os.lstat(self.socket_dir)
        except FileNotFoundError:
            self.socket_dir.mkdir(mode=0o755)  # fails on a link planted meanwhile
            with safefile.open_dir(self.socket_dir) as fd:  # ours, not a link
                os.fchown(fd, *_owner_ids())
                os.fchmod(fd, 0o755)  # pgbench's user reaches the socket
            return
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise SandboxError(
                f"{self.socket_dir} is not a directory (a link?); remove it and start again"
            )
        if st.st_uid not in (os.geteuid(), _owner_ids()[0]):
            raise SandboxError(
                f"{self.socket_dir} belongs to another user (made by someone else while the "
                "sandbox was down?); remove it and start again"
            )

    def stop(self) -> None:
        if not self.is_running():
            return
        res = _run(
            self._pg_ctl("stop", "-w", "-s", "-m", "fast", "-t", str(_PG_CTL_TIMEOUT_S)),
            timeout=_PG_CTL_TIMEOUT_S + 10,
        )
        if res.returncode != 0 and self.is_running():
            raise SandboxError(self._failure("stop", res))

    def restart(self) -> None:
        try:
            argv = self._in_cgroup(self._restart_argv())
        except CgroupUnavailable as exc:
            raise SandboxError(f"the sandbox has limits ({self.limits}) but {exc}") from None
        res = _run(argv, timeout=2 * _PG_CTL_TIMEOUT_S + 10)
        if res.returncode != 0:
            raise SandboxError(self._failure("restart", res))

    def destroy(self) -> None:
        """Stop the server (fast, then immediate, then SIGKILL) and delete its files."""
        if self._destroyed:
            return
        if self.data_dir.exists() and self.is_running():
            for mode in ("fast", "immediate"):
                with contextlib.suppress(subprocess.SubprocessError, OSError):
                    _run(self._pg_ctl("stop", "-w", "-s", "-m", mode, "-t", "20"), timeout=30)
                if not self.is_running():
                    break
            pid = self._postmaster_pid()
            if pid is not None and self.is_running():
                not_ours = _is_postmaster_of(pid, self.data_dir)
                if not_ours is None:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                    time.sleep(0.2)
                else:
                    log.warning(
                        "sandbox %s: not killing pid %d from postmaster.pid: %s",
                        self.root,
                        pid,
                        not_ours,
                    )
        self._remove_cgroup()
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        if self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            for path in (self.log_path, self.root / _META):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        self._destroyed = True
        live.discard(self)

    def _remove_cgroup(self) -> None:
        drop_cgroup(self.root)

    def _postmaster_pid(self) -> int | None:
        """The pid postmaster.pid names: the postgres user's word (see _checked_postmaster)."""
        try:
            text = safefile.read_text(
                self.data_dir / "postmaster.pid", owner=_owner_ids()[0], limit=4096
            )
            return int(text.split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def _checked_postmaster(self) -> int | None:
        """The postmaster's pid, when it really is this sandbox's server (see
        :func:`_is_postmaster_of`); None (and a log line) otherwise."""
        pid = self._postmaster_pid()
        if pid is None or not self.is_running():
            return None
        not_ours = _is_postmaster_of(pid, self.data_dir)
        if not_ours is not None:
            log.warning("sandbox %s: pid %d of postmaster.pid: %s", self.root, pid, not_ours)
            return None
        return pid

    def is_running(self) -> bool:
        pid = self._postmaster_pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of server.log (of its last 64 KiB), never through a link."""
        try:
            return safefile.tail_lines(self.log_path, lines, owner=_owner_ids()[0])
        except safefile.UnsafeFile as exc:
            return f"(server log not read: {exc.strerror})"
        except OSError:
            return ""

    def _failure(self, what: str, res: subprocess.CompletedProcess[str]) -> str:
        out = (res.stderr or res.stdout).strip()
        return (
            f"pg_ctl {what} of the sandbox in {self.data_dir} failed (exit {res.returncode}): "
            f"{out}\nserver log:\n{self.log_tail()}"
        )

    # -- context manager ---------------------------------------------------------
    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return f"Sandbox(port={self.port}, data_dir={str(self.data_dir)!r})"
