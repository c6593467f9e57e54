"""Probing the target: its version, the settings knobtune asks about (pg_settings rows),
whether its user may ALTER SYSTEM them, which server it is, and the memory and CPUs the
server may really use (its host's, or its cgroup's when that is smaller).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from app.postgres import cgroups
from app.postgres.dsn import password_of
from app.postgres.errors import primary_message
from app.postgres.target.conf_files import ConfFiles, _read, show_data_directory
from app.postgres.target.connection import Conn, Connector, _one, _pg_message
from app.postgres.target.errors import TargetError
from optimizer.knobs import SettingRow

log = logging.getLogger(__name__)

_SETTINGS_SQL = (
    "SELECT name, setting, unit, vartype, context, min_val, max_val, enumvals, reset_val,"
    " boot_val, pending_restart FROM pg_settings WHERE name = ANY(%s)"
)


MIN_STATEMENT_TIMEOUT_MS = 1000
_TIMEOUT_SQL = "SELECT setting::int FROM pg_settings WHERE name = 'statement_timeout'"
_TOO_SHORT = (
    "the target cancels knobtune's queries ({said}): a statement_timeout from the DSN's "
    "options or the role's settings is too short; remove options='-c statement_timeout=...' "
    "from the DSN (or ALTER ROLE ... RESET statement_timeout)"
)


@dataclass
class Probe:
    version_num: int
    version: str
    is_superuser: bool
    can_alter_system: bool
    settings: dict[str, SettingRow]
    ram_bytes: int | None
    cpus: int | None
    local: bool
    data_directory: str | None
    missing: list[str] = field(default_factory=list)  # asked-for names the server lacks
    alter_system_denied: list[str] = field(default_factory=list)
    server_id: str | None = None  # see server_identity()
    # where ram_bytes/cpus came from when a cgroup limit made them smaller than the host's
    hardware_note: str | None = None


def _row(r: Sequence[Any]) -> SettingRow:
    return SettingRow(
        name=r[0],
        setting=r[1],
        unit=r[2],
        vartype=r[3],
        context=r[4],
        min_val=r[5],
        max_val=r[6],
        enumvals=tuple(r[7]) if r[7] is not None else None,
        reset_val=r[8],
        boot_val=r[9],
        pending_restart=bool(r[10]),
    )


def setting_rows(conn: Conn, names: Sequence[str]) -> dict[str, SettingRow]:
    rows = conn.execute(_SETTINGS_SQL, [list(names)]).fetchall()
    return {r[0]: _row(r) for r in rows}


def pending_restart(conn: Conn, names: Sequence[str]) -> list[str]:
    rows = conn.execute(
        "SELECT name FROM pg_settings WHERE pending_restart AND name = ANY(%s)", [list(names)]
    ).fetchall()
    return [str(r[0]) for r in rows]


class Prober:
    """Reads what one target is and has (see :class:`Probe`)."""

    def __init__(self, db: Connector, files: ConfFiles) -> None:
        self._db = db
        self._files = files

    def probe(self, names: Sequence[str]) -> Probe:
        try:
            return self._probe(names)
        except pg_errors.QueryCanceled:
            said = "57014 canceling statement due to statement timeout"
            raise TargetError(_TOO_SHORT.format(said=said)) from None
        except psycopg.Error as exc:
            said = primary_message(str(exc), [password_of(self._db.dsn) or ""])
            raise TargetError(
                f"reading the target's settings failed ({exc.sqlstate or 'no SQLSTATE'}: "
                f"{said}); check the DSN's options and the user's privileges"
            ) from None

    def _probe(self, names: Sequence[str]) -> Probe:
        names = [n.strip().lower() for n in names]
        with self._db.connect() as conn:
            # A timeout under a second cancels knobtune's own statements (ALTER SYSTEM, a
            # workload's reset) at random: refused whether or not this probe's are quick.
            timeout_ms = int(_one(conn, _TIMEOUT_SQL))
            if 0 < timeout_ms < MIN_STATEMENT_TIMEOUT_MS:
                raise TargetError(_TOO_SHORT.format(said=f"statement_timeout {timeout_ms} ms"))
            version_num = int(_one(conn, "SHOW server_version_num"))
            version = str(_one(conn, "SELECT version()"))  # "PostgreSQL 15.2 on ..."
            is_superuser = str(_one(conn, "SELECT current_setting('is_superuser')")) == "on"
            rows = setting_rows(conn, names)
            denied: list[str] = []
            if not is_superuser:
                if version_num >= 150000 and rows:
                    res = conn.execute(
                        "SELECT n FROM unnest(%s::text[]) n "
                        "WHERE NOT has_parameter_privilege(n, 'ALTER SYSTEM')",
                        [list(rows)],
                    ).fetchall()
                    denied = sorted(r[0] for r in res)
                else:
                    denied = sorted(rows)
            data_directory = show_data_directory(conn)
            self._files.resolve_data_dir(conn)
            server_id = server_identity(conn)
            ram, cpus, hw_note = self._hardware(conn, is_superuser)
        return Probe(
            version_num=version_num,
            version=version,
            is_superuser=is_superuser,
            can_alter_system=is_superuser or (bool(rows) and not denied),
            settings=rows,
            ram_bytes=ram,
            cpus=cpus,
            local=self._db.local,
            data_directory=data_directory,
            missing=[n for n in names if n not in rows],
            alter_system_denied=denied,
            server_id=server_id,
            hardware_note=hw_note,
        )

    # -- the hardware the server really has -------------------------------------------
    def _hardware(
        self, conn: Conn, is_superuser: bool
    ) -> tuple[int | None, int | None, str | None]:
        """Memory and CPUs the server may use: the smaller of its host's and its cgroup's.

        Local: the postmaster's cgroup, read from /proc and /sys/fs/cgroup. Another host
        (or a local server in another PID namespace, e.g. a container): the server's own
        /proc/meminfo and cgroup files through pg_read_file, when the role may read server
        files; otherwise nothing (the caller requires ram_bytes and cpus).
        """
        ram: int | None = None
        cpus: int | None = None
        found: cgroups.Detected | None = None
        if self._db.local:
            ram, cpus = _host_facts()
            pid = postmaster_pid(conn, self._files.data_dir)
            if pid is not None:
                found = cgroups.limits_of_pid(pid)
        if found is None and _may_read_files(conn, is_superuser):
            host_ram, host_cpus, found = _read_server_files(conn)
            ram, cpus = cgroups.smaller(ram, host_ram), cgroups.smaller(cpus, host_cpus)
        if found is None:
            return ram, cpus, None
        note = None
        mem, ncpu = cgroups.smaller(ram, found.memory_bytes), cgroups.smaller(cpus, found.cpus)
        if (mem, ncpu) != (ram, cpus):
            note = (
                f"cgroup limits: {(mem or 0) / 2**30:.2f} GiB of memory and {ncpu} CPU(s) "
                f"(the host has {(ram or 0) / 2**30:.1f} GiB and {cpus}); "
                f"read from {found.source or 'the CPU affinity'}"
            )
        return mem, ncpu, note

    def server_id(self) -> str | None:
        """The server's identity (:func:`server_identity`), read now."""
        with self._db.connect() as conn:
            return server_identity(conn)


def postmaster_pid(conn: Conn, data_dir: Path | None) -> int | None:
    """The postmaster's pid in this host's /proc: the parent of our backend, checked
    to be a PostgreSQL process (else another PID namespace: None), or postmaster.pid
    (in ``data_dir``, the verified data directory)."""
    try:
        backend = int(_one(conn, "SELECT pg_backend_pid()"))
    except (psycopg.Error, TargetError, ValueError):
        return None
    proc = Path("/proc")
    try:
        cmdline = (proc / str(backend) / "cmdline").read_bytes()
        stat = (proc / str(backend) / "stat").read_text()
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parent = (proc / str(ppid) / "comm").read_text().strip()
    except (OSError, ValueError, IndexError):
        cmdline, ppid, parent = b"", 0, ""
    if cmdline.startswith(b"postgres:") and parent in ("postgres", "postmaster"):
        return ppid
    if data_dir is not None:
        try:
            lock = _read(data_dir / "postmaster.pid", data_dir, limit=4096)
            pid = int(lock.split("\n", 1)[0])
            comm = (proc / str(pid) / "comm").read_text().strip()
        except (OSError, ValueError):
            return None
        if comm in ("postgres", "postmaster"):
            return pid
    return None


def _may_read_files(conn: Conn, is_superuser: bool) -> bool:
    if is_superuser:
        return True
    # Outside the data directory pg_read_file needs both: the role's membership and the
    # EXECUTE privilege on the function (revoked from PUBLIC by default).
    try:
        return bool(
            _one(
                conn,
                "SELECT pg_has_role(current_user, 'pg_read_server_files', 'MEMBER') AND "
                "has_function_privilege('pg_read_file(text, bigint, bigint, boolean)', "
                "'EXECUTE')",
            )
        )
    except (psycopg.Error, TargetError):
        return False


def _server_file(conn: Conn, path: str) -> str | None:
    """A file of the server's host through pg_read_file (None: missing or refused)."""
    try:
        row = conn.execute("SELECT pg_read_file(%s, 0, 1048576, true)", [path]).fetchone()
    except psycopg.Error:
        return None
    return str(row[0]) if row and row[0] is not None else None


def _read_server_files(conn: Conn) -> tuple[int | None, int | None, cgroups.Detected]:
    """The server host's memory and CPUs, and the limits of the backend's cgroup, as the
    server sees them (its /proc, its /sys/fs/cgroup: right in a container too)."""
    ram = cgroups.meminfo_total(_server_file(conn, "/proc/meminfo"))
    status = _server_file(conn, "/proc/self/status") or ""
    m = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M)
    cpus = cgroups.cpu_list_len(m.group(1)) if m else 0
    found = cgroups.limits_from_files(
        _server_file(conn, "/proc/self/cgroup") or "", lambda p: _server_file(conn, p)
    )
    return ram, cpus or None, found


def _host_facts() -> tuple[int | None, int | None]:
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        ram = None
    return ram, os.cpu_count()


def server_identity(conn: Conn) -> str | None:
    """Which server a connection reached: its system identifier and port (None: unknown).

    Two DSNs (socket or TCP, another database or user) reach the same server when these
    match. The system identifier alone is not enough: copies of one cluster (sandboxes
    made from one template, a physical replica) share it; the port (``SHOW port``, which
    any role may read, unlike data_directory) tells copies on one host apart. A server
    that hides pg_control_system() from this role has no identity here.
    """
    try:
        sysid = _one(conn, "SELECT system_identifier FROM pg_control_system()")
        port = _one(conn, "SELECT current_setting('port')")
    except psycopg.Error as exc:
        log.warning("cannot tell which server this is: %s", _pg_message(exc))
        return None
    return f"{sysid}:{port}"
