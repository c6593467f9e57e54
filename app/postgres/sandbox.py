"""Disposable local PostgreSQL clusters: initdb, own port and socket dir, start/stop/destroy.

Used by tests, the demo and anyone trying knobtune without a server of their own.
initdb, pg_ctl and postgres refuse to run as root, so as root they run as the
``postgres`` OS user through ``runuser``; the sandbox directory is owned by it.

No connection is trusted: every one, over TCP or the unix socket, authenticates with
scram-sha-256. Each sandbox gets two random passwords, set before it first starts: the
superuser's (``postgres``, for the service's ALTER SYSTEM) and that of ``knobtune_bench``,
a role that owns the benchmark database ``knobtune`` and nothing else: not superuser,
no pg_read_server_files or pg_execute_server_program. Clients' workloads run as that
role (``bench_dsn``), so a script cannot reach the host's files or programs. It may
create databases (CREATEDB): a replayed capture copies the database its user restored
before every run (app/workloads/replay.py), and that copy needs nothing more. The
passwords live in this object and, encrypted, in the service's metadata DB; never on disk
in the sandbox.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import hashlib
import hmac
import json
import logging
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from psycopg.conninfo import conninfo_to_dict

from app.postgres import privilege

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


def _single_user(bindir: Path, data_dir: Path, statements: Sequence[str]) -> None:
    """Run statements in single-user mode (the server is down): before it ever listens."""
    argv = as_postgres([str(bindir / "postgres"), "--single", "-D", str(data_dir), "postgres"])
    res = _run(argv, timeout=120, stdin="".join(f"{st}\n" for st in statements))
    errors = [ln for ln in res.stderr.splitlines() if "ERROR" in ln or "FATAL" in ln]
    if res.returncode != 0 or errors:
        said = "; ".join(errors) or res.stderr.strip()[-500:]
        raise SandboxError(f"setting up the sandbox's roles failed (exit {res.returncode}): {said}")


def _write_hba(data_dir: Path) -> None:
    path = data_dir / "pg_hba.conf"
    path.write_text(_HBA)
    os.chown(path, *_owner_ids())
    os.chmod(path, 0o600)


# One initdb per process and binary directory; later sandboxes copy it (~0.1 s
# instead of ~1 s). The template is never started, so copies are clean clusters.
_template_lock = threading.Lock()
_templates: dict[Path, Path] = {}
_live: set[Sandbox] = set()


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
    # The benchmark's role owns its database and nothing else.
    _single_user(
        bindir,
        data_dir,
        [
            f"CREATE ROLE {BENCH_ROLE} LOGIN NOSUPERUSER CREATEDB NOCREATEROLE",
            f"CREATE DATABASE {BENCH_DB} OWNER {BENCH_ROLE}",
        ],
    )


def _short_tmp() -> str:
    tmp = tempfile.gettempdir()
    return tmp if len(tmp) <= _MAX_ROOT_LEN - 30 else "/tmp"  # noqa: S108 - socket path length


_SOCKET_PREFIX = "knobtune-sock-"


def remove_socket_dir(dsn: str) -> None:
    """Remove the socket directory a sandbox's DSN names, when it is one of ours and empty:
    a sandbox whose files were deleted by hand leaves it behind in /tmp otherwise."""
    path = Path(str(conninfo_to_dict(dsn).get("host") or ""))
    if path.is_absolute() and path.name.startswith(_SOCKET_PREFIX):
        with contextlib.suppress(OSError):
            path.rmdir()  # fails on anything but an empty directory


@atexit.register
def _cleanup() -> None:
    for sb in list(_live):
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
        for line in (data_dir / "knobtune_sandbox.conf").read_text().splitlines():
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

    The root is private to the cluster's OS user (0700). The socket directory is a short
    directory under /tmp that anyone may reach (pgbench runs as an unprivileged user);
    the socket is guarded by scram-sha-256 like TCP. ``password``/``bench_password`` are
    known to the process that created the sandbox (None after :meth:`open`).
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
    ) -> None:
        self.root = root
        # A hardware profile (app/postgres/cgroups.py): the server runs in its own cgroup.
        self.limits = limits if limits is not None and not limits.empty else None
        self.password = password
        self.bench_password = bench_password
        self.port = port
        self.bindir = bindir
        self.data_dir = root / "data"
        self.socket_dir = socket_dir or root / "sock"
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
    ) -> Sandbox:
        """initdb (a copy of a per-process template) and start; raises SandboxError.

        Without ``root`` a temporary directory is used. A ``root`` that did not
        exist is removed by destroy(); an existing one keeps everything but our files.
        With ``limits`` the server runs in a cgroup of its own from its first start;
        CgroupUnavailable (nothing left behind) when this host cannot make one.
        """
        bindir = find_bindir()
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
        os.chown(root, uid, gid)
        os.chmod(root, 0o700)
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
            res = _run(as_postgres(["cp", "-a", str(tpl), str(sb.data_dir)]))
            if res.returncode != 0:
                raise SandboxError(f"copying the initdb template failed: {res.stderr.strip()}")
            # Before the sandbox's own settings: single-user mode must not trip on them
            # (a bad one is reported by the start below, with the server's log).
            sb._set_passwords()
            sb._write_conf(settings or {})
            _live.add(sb)
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
    def open(cls, root: Path) -> Sandbox:
        """Reattach to a sandbox made by create() (e.g. after the service restarted)."""
        try:
            meta = json.loads((root / _META).read_text())
            port = int(meta["port"])
            socket_dir = Path(meta["socket_dir"])
            owns_root = bool(meta["owns_root"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SandboxError(f"{root} is not a knobtune sandbox: {exc}") from None
        bindir = Path(meta.get("bindir") or "")
        if not _has_server_binaries(bindir):
            bindir = find_bindir()  # PostgreSQL was upgraded or moved since
        limits = Limits.from_json(meta.get("limits"))
        return cls(
            root,
            port=port,
            bindir=bindir,
            owns_root=owns_root,
            socket_dir=socket_dir,
            limits=limits,
        )

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
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"ALTER ROLE {SUPERUSER} PASSWORD '{scram_verifier(password)}'")
        self.password = password

    def is_hardened(self) -> bool:
        """Whether the cluster has the password-only pg_hba.conf and the benchmark role.

        Sandboxes made before this version trusted every local connection.
        """
        try:
            hba = (self.data_dir / "pg_hba.conf").read_text()
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
            f"CREATE ROLE {BENCH_ROLE} LOGIN NOSUPERUSER CREATEDB NOCREATEROLE "
            f"PASSWORD '{scram_verifier(self.bench_password)}'",
            f"CREATE DATABASE {BENCH_DB} OWNER {BENCH_ROLE}",
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
        _single_user(self.bindir, self.data_dir, statements)
        _write_hba(self.data_dir)
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
        res = _run(as_postgres(["test", "-w", str(self.root), "-a", "-x", str(self.root)]))
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
        path = self.data_dir / "knobtune_sandbox.conf"
        path.write_text("\n".join(lines) + "\n")
        uid, gid = _owner_ids()
        os.chown(path, uid, gid)
        meta = {
            "port": self.port,
            "socket_dir": str(self.socket_dir),
            "owns_root": self._owns_root,
            "bindir": str(self.bindir),
            "limits": self.limits.to_json() if self.limits else None,
        }
        (self.root / _META).write_text(json.dumps(meta, indent=2) + "\n")
        main = self.data_dir / "postgresql.conf"
        include = "include = 'knobtune_sandbox.conf'\n"
        if include not in main.read_text():
            with main.open("a") as f:
                f.write(include)

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
        pm = self._postmaster_pid()
        if pm is None or not self.is_running():
            return set()
        out = {pm}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                # pid (comm) state ppid ...: comm may hold spaces, so split after ')'
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pm:
                    out.add(int(stat.parent.name))
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
        _live.discard(self)

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
        if not self.socket_dir.exists():
            # A socket directory under /tmp does not survive a reboot of the host.
            self.socket_dir.mkdir(parents=True, mode=0o755)
            os.chown(self.socket_dir, *_owner_ids())
        elif self.socket_dir.stat().st_uid not in (os.geteuid(), _owner_ids()[0]):
            raise SandboxError(
                f"{self.socket_dir} belongs to another user (made by someone else while the "
                "sandbox was down?); remove it and start again"
            )
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
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                time.sleep(0.2)
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
        _live.discard(self)

    def _remove_cgroup(self) -> None:
        drop_cgroup(self.root)

    def _postmaster_pid(self) -> int | None:
        try:
            first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
            return int(first)
        except (OSError, ValueError):
            return None

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
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

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
