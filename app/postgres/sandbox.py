"""Disposable local PostgreSQL clusters: initdb, own port and socket dir, start/stop/destroy.

Used by tests, the demo and anyone trying knobtune without a server of their own.
initdb, pg_ctl and postgres refuse to run as root, so as root they run as the
``postgres`` OS user through ``runuser``; the sandbox directory is owned by it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

INSTALL_HINT = "apt-get install postgresql postgresql-contrib"
BINDIR_ENV = "KNOBTUNE_PG_BINDIR"
_SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")
_PG_CTL_TIMEOUT_S = 60
# Unix socket paths are limited to ~107 bytes: longer roots get their socket under /tmp.
_MAX_ROOT_LEN = 80
_META = "sandbox.json"


class PostgresNotInstalled(RuntimeError):
    """PostgreSQL server binaries are missing; the message says what to install."""


class SandboxError(RuntimeError):
    """A sandbox operation failed; the message includes the server log's tail."""


def find_bindir() -> Path:
    """Directory holding initdb, pg_ctl and postgres.

    Order: $KNOBTUNE_PG_BINDIR (must be valid when set), ``pg_config --bindir``,
    the newest /usr/lib/postgresql/<ver>/bin, then initdb on PATH.
    """
    explicit = os.environ.get(BINDIR_ENV)
    if explicit:
        path = Path(explicit)
        if _has_server_binaries(path):
            return path
        raise PostgresNotInstalled(
            f"{BINDIR_ENV}={explicit} does not contain {', '.join(_SERVER_BINARIES)}; "
            f"point it at PostgreSQL's bin directory or install the server: {INSTALL_HINT}"
        )
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            if out:
                candidates.append(Path(out))
    candidates.extend(_debian_bindirs())
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    for path in candidates:
        if _has_server_binaries(path):
            return path
    raise PostgresNotInstalled(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found "
        "(looked at pg_config --bindir, /usr/lib/postgresql/<version>/bin and PATH). "
        f"Install them with: {INSTALL_HINT} (or set {BINDIR_ENV} to their directory)"
    )


def _has_server_binaries(path: Path) -> bool:
    return all(os.access(path / name, os.X_OK) for name in _SERVER_BINARIES)


def _debian_bindirs() -> list[Path]:
    base = Path("/usr/lib/postgresql")
    found: list[tuple[float, Path]] = []
    if base.is_dir():
        for d in base.iterdir():
            with contextlib.suppress(ValueError):
                found.append((float(d.name), d / "bin"))
    return [p for _, p in sorted(found, reverse=True)]


def server_version(bindir: Path) -> int:
    """Major version of the binaries in ``bindir`` (e.g. 15), from ``postgres --version``."""
    out = subprocess.run(
        [str(bindir / "postgres"), "--version"], capture_output=True, text=True, timeout=10
    ).stdout
    m = re.search(r"(\d+)(?:\.\d+)?", out)
    if not m:
        raise PostgresNotInstalled(f"cannot read the version of {bindir / 'postgres'}: {out!r}")
    return int(m.group(1))


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


def _run(argv: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


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
        root = Path(tempfile.mkdtemp(prefix="knobtune-tpl-", dir=_short_tmp()))
        uid, gid = _owner_ids()
        os.chown(root, uid, gid)
        tpl = root / "data"
        _initdb(bindir, tpl)
        _templates[bindir] = tpl
        return tpl


def _initdb(bindir: Path, data_dir: Path) -> None:
    # --no-sync: a sandbox that loses power is simply recreated; saves seconds.
    argv = [
        str(bindir / "initdb"),
        "-D",
        str(data_dir),
        "-U",
        "postgres",
        "-A",
        "trust",
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


def _short_tmp() -> str:
    tmp = tempfile.gettempdir()
    return tmp if len(tmp) <= _MAX_ROOT_LEN - 30 else "/tmp"  # noqa: S108 - socket path length


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


class Sandbox:
    """A local cluster in its own directory: ``data/``, ``sock/``, ``server.log``, ``sandbox.json``.

    The socket directory lives in the root unless the root's path is too long for
    a unix socket path; then it is a short directory under /tmp.
    """

    def __init__(
        self,
        root: Path,
        *,
        port: int,
        bindir: Path,
        owns_root: bool,
        socket_dir: Path | None = None,
    ) -> None:
        self.root = root
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
    ) -> Sandbox:
        """initdb (a copy of a per-process template) and start; raises SandboxError.

        Without ``root`` a temporary directory is used. A ``root`` that did not
        exist is removed by destroy(); an existing one keeps everything but our files.
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
        socket_dir = None
        if len(str(root)) > _MAX_ROOT_LEN:
            socket_dir = Path(tempfile.mkdtemp(prefix="knobtune-sock-", dir=_short_tmp()))
        sb = cls(
            root,
            port=port or free_port(),
            bindir=bindir,
            owns_root=owns_root,
            socket_dir=socket_dir,
        )
        try:
            sb._check_access()
            sb.socket_dir.mkdir(exist_ok=True)
            os.chown(sb.socket_dir, uid, gid)
            tpl = _template_for(bindir)
            res = _run(as_postgres(["cp", "-a", str(tpl), str(sb.data_dir)]))
            if res.returncode != 0:
                raise SandboxError(f"copying the initdb template failed: {res.stderr.strip()}")
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
        return cls(root, port=port, bindir=bindir, owns_root=owns_root, socket_dir=socket_dir)

    def _check_access(self) -> None:
        if os.geteuid() != 0:
            return
        res = _run(as_postgres(["test", "-w", str(self.root), "-a", "-x", str(self.root)]))
        if res.returncode != 0:
            raise SandboxError(
                f"the postgres OS user cannot use {self.root}: a parent directory is not "
                "accessible to it (e.g. pytest's tmp_path is private to root); "
                "choose a root under /tmp or let Sandbox.create pick one"
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
        }
        (self.root / _META).write_text(json.dumps(meta, indent=2) + "\n")
        main = self.data_dir / "postgresql.conf"
        include = "include = 'knobtune_sandbox.conf'\n"
        if include not in main.read_text():
            with main.open("a") as f:
                f.write(include)

    # -- connection facts -------------------------------------------------------
    @property
    def dsn(self) -> str:
        return f"host={self.socket_dir} port={self.port} user=postgres dbname=postgres"

    @property
    def tcp_dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _pg_ctl(self, *args: str) -> list[str]:
        return as_postgres([str(self.bindir / "pg_ctl"), *args, "-D", str(self.data_dir)])

    @property
    def restart_command(self) -> str:
        """Shell command that restarts this cluster and returns when it accepts connections."""
        argv = self._pg_ctl(
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
        return shlex.join(argv)

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
        if not self.socket_dir.exists():
            # A socket directory under /tmp does not survive a reboot of the host.
            self.socket_dir.mkdir(parents=True)
            os.chown(self.socket_dir, *_owner_ids())
        res = _run(
            self._pg_ctl(
                "start", "-w", "-s", "-t", str(_PG_CTL_TIMEOUT_S), "-l", str(self.log_path)
            ),
            timeout=_PG_CTL_TIMEOUT_S + 10,
        )
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
        res = _run(shlex.split(self.restart_command), timeout=2 * _PG_CTL_TIMEOUT_S + 10)
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
