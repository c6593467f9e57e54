"""A server's statement log, read through SQL: what a capture needs, where it starts, its lines.

A capture (issue 28) turns on statement logging for a while and reads what the server
logged. The log is read through SQL (``pg_ls_logdir``, ``pg_read_binary_file``), never
from the service's own disk: the server may be on another host, and nothing a client
names is ever opened here. That needs ``logging_collector = on`` and a stderr log file.

While it runs, the capture's logging settings (:data:`CAPTURE_SETTINGS`) write every
statement with pgreplay's line prefix ``%m|%u|%d|%c|`` (time, user, database, session).
:class:`LogReader` reads from the capture's start (:class:`LogPoint`), follows rotation to
newer files, and keeps whole entries (a prefixed line and its tab-indented continuation
lines) that have the capture's prefix shape, its database and a time inside its window;
the service's own connections are left out by their session id.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import TupleRow

Conn = psycopg.Connection[TupleRow]

# pgreplay's convention: time with milliseconds, user, database, session id
LOG_PREFIX = "%m|%u|%d|%c|"
# What a capture sets while it runs (ALTER SYSTEM, verified, then always put back).
CAPTURE_SETTINGS: dict[str, str] = {
    "log_statement": "all",
    "log_connections": "on",
    "log_disconnections": "on",
    "log_line_prefix": LOG_PREFIX,
    "lc_messages": "C",
    # a failed statement is logged with its ERROR and STATEMENT lines
    "log_min_error_statement": "error",
    "log_min_messages": "warning",
}
LOGGING_SETTINGS: tuple[str, ...] = tuple(CAPTURE_SETTINGS)

# A line that starts an entry with the capture's prefix: %m is "2026-11-27 10:00:00.123 UTC"
# (the zone as log_timezone writes it), then user, database and the session id (hex.hex).
ENTRY = re.compile(
    rb"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})(?: [^|\n]*)?\|([^|\n]*)\|([^|\n]*)\|"
    rb"([0-9a-f]+\.[0-9a-f]+)\|"
)
TIME_TEXT = "YYYY-MM-DD HH24:MI:SS.MS"  # to_char() of %m's time, without the zone
CHUNK = 4 * 1024 * 1024  # bytes per pg_read_binary_file call
OTHER_FORMATS = (".csv", ".json")  # csvlog and jsonlog files share the directory

# %c of the current backend: its start time (seconds, hex) and PID (hex)
SESSION_ID_SQL = (
    "SELECT to_hex(floor(extract(epoch FROM backend_start))::bigint) || '.' || to_hex(pid) "
    "FROM pg_stat_activity WHERE pid = pg_backend_pid()"
)


class LogAccessError(Exception):
    """The server's log cannot be read as a capture needs; the message says what to change."""


@dataclass(frozen=True)
class LogPoint:
    """A place in the server's stderr log: a file, a byte offset in it, and the time then."""

    file: str  # pg_current_logfile('stderr'): log_directory/name
    offset: int
    at: str  # the server's clock then, in log_timezone, as %m writes it (no zone)
    at_utc: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "offset": self.offset,
            "at": self.at,
            "at_utc": self.at_utc.isoformat(),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LogPoint:
        return cls(
            file=str(d["file"]),
            offset=int(d["offset"]),
            at=str(d["at"]),
            at_utc=datetime.fromisoformat(str(d["at_utc"])),
        )


def _one(conn: Conn, query: Any, params: Sequence[Any] | None = None) -> Any:
    row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def access_problems(conn: Conn, *, database: str) -> list[str]:
    """What stops a capture through this connection; each problem says what to change.

    Empty: the role may ALTER SYSTEM the logging settings, the server writes a stderr log
    file (logging_collector), and the role may list and read it; ``database`` exists.
    """
    problems: list[str] = []
    version = int(_one(conn, "SHOW server_version_num"))
    superuser = str(_one(conn, "SELECT current_setting('is_superuser')")) == "on"
    role = str(_one(conn, "SELECT current_user"))
    if not superuser:
        if version >= 150000:
            denied = [
                str(r[0])
                for r in conn.execute(
                    "SELECT n FROM unnest(%s::text[]) n "
                    "WHERE NOT has_parameter_privilege(n, 'ALTER SYSTEM')",
                    [list(LOGGING_SETTINGS)],
                ).fetchall()
            ]
            if denied:
                problems.append(
                    f"the role {role} may not ALTER SYSTEM {', '.join(denied)}: connect as a "
                    f"superuser, or GRANT ALTER SYSTEM ON PARAMETER {', '.join(denied)} "
                    f"TO {role}"
                )
        else:
            problems.append(
                f"the role {role} may not ALTER SYSTEM the logging settings (before "
                "PostgreSQL 15 only a superuser may): connect as a superuser"
            )
        readable = _one(
            conn,
            "SELECT has_table_privilege('pg_file_settings', 'SELECT') AND "
            "has_function_privilege('pg_show_all_file_settings()', 'EXECUTE')",
        )
        if not readable:
            problems.append(
                f"the role {role} may not read the server's ALTER SYSTEM entries (to put them "
                f"back exactly): GRANT SELECT ON pg_file_settings TO {role} and GRANT EXECUTE "
                f"ON FUNCTION pg_show_all_file_settings() TO {role}"
            )
    if str(_one(conn, "SELECT current_setting('logging_collector')")) != "on":
        problems.append(
            "logging_collector is off, so the server's log cannot be read through SQL: set "
            "logging_collector = on in postgresql.conf and restart the server"
        )
    else:
        dest = str(_one(conn, "SELECT current_setting('log_destination')"))
        if "stderr" not in [d.strip() for d in dest.split(",")]:
            problems.append(
                f"log_destination is {dest!r}: the capture reads the stderr log; add stderr "
                f"(ALTER SYSTEM SET log_destination = 'stderr,{dest}', then "
                "SELECT pg_reload_conf())"
            )
    may = {
        "current": superuser or _may_execute(conn, "pg_current_logfile(text)"),
        "list": superuser or _may_execute(conn, "pg_ls_logdir()"),
        "read": superuser
        or (
            _may_execute(conn, "pg_read_binary_file(text, bigint, bigint, boolean)")
            and bool(
                _one(conn, "SELECT pg_has_role(current_user, 'pg_read_server_files', 'MEMBER')")
            )
        ),
    }
    if not may["list"] or not may["current"]:
        problems.append(
            f"the role {role} may not list the server's log files (pg_ls_logdir, "
            f"pg_current_logfile): GRANT pg_monitor TO {role}"
        )
    if not may["read"]:
        problems.append(
            f"the role {role} may not read the server's log: connect as a superuser, or GRANT "
            f"pg_read_server_files TO {role} and GRANT EXECUTE ON FUNCTION "
            f"pg_read_binary_file(text, bigint, bigint, boolean) TO {role}"
        )
    if (
        may["current"]
        and not problems
        and _one(conn, "SELECT pg_current_logfile('stderr')") is None
    ):
        problems.append(
            "the server reports no current stderr log file (pg_current_logfile('stderr') "
            "is null): check logging_collector and log_destination, and that the "
            "server was restarted since logging_collector was turned on"
        )
    if _one(conn, "SELECT 1 FROM pg_database WHERE datname = %s", [database]) is None:
        problems.append(f"the server has no database {database!r}: give an existing one")
    elif not _one(conn, "SELECT has_database_privilege(%s, 'CONNECT')", [database]):
        problems.append(
            f"the role {role} may not connect to database {database!r} (to read "
            f"pg_stat_statements there): GRANT CONNECT ON DATABASE {database} TO {role}"
        )
    return problems


def _may_execute(conn: Conn, signature: str) -> bool:
    try:
        return bool(_one(conn, "SELECT has_function_privilege(%s, 'EXECUTE')", [signature]))
    except psycopg.Error:
        return False


def session_id(conn: Conn) -> str:
    """This connection's session id as %c writes it (to leave our own lines out)."""
    return str(_one(conn, SESSION_ID_SQL))


def position(conn: Conn) -> LogPoint:
    """The end of the current stderr log file now, and the server's clock."""
    row = conn.execute(
        "SELECT pg_current_logfile('stderr'), "
        f"to_char(clock_timestamp() AT TIME ZONE current_setting('log_timezone'), "
        f"'{TIME_TEXT}'), clock_timestamp()"
    ).fetchone()
    if row is None or row[0] is None:
        raise LogAccessError(
            "the server reports no current stderr log file (pg_current_logfile('stderr') is "
            "null): logging_collector and a stderr log_destination are needed"
        )
    file = str(row[0])
    sizes = {name: size for name, size, _mod in _listing(conn)}
    return LogPoint(
        file=file, offset=sizes.get(posixpath.basename(file), 0), at=str(row[1]), at_utc=row[2]
    )


def clock(conn: Conn) -> tuple[str, datetime]:
    """The server's clock now: as %m writes it (log_timezone, no zone), and as a timestamp."""
    row = conn.execute(
        f"SELECT to_char(clock_timestamp() AT TIME ZONE current_setting('log_timezone'), "
        f"'{TIME_TEXT}'), clock_timestamp()"
    ).fetchone()
    assert row is not None
    return str(row[0]), row[1]


def _listing(conn: Conn) -> list[tuple[str, int, datetime]]:
    return [
        (str(r[0]), int(r[1]), r[2])
        for r in conn.execute("SELECT name, size, modification FROM pg_ls_logdir()").fetchall()
    ]


def log_files(conn: Conn, start: LogPoint) -> list[tuple[str, int]]:
    """The stderr log files from ``start`` on, oldest first, with their sizes now: the
    start's file, then the files modified since the start (rotation), by modification."""
    folder = posixpath.dirname(start.file)
    first = posixpath.basename(start.file)
    rows = _listing(conn)
    out = [(start.file, size) for name, size, _mod in rows if name == first]
    later = sorted(
        (mod, name, size)
        for name, size, mod in rows
        if name != first
        and not name.endswith(OTHER_FORMATS)
        and not name.startswith(".")
        and mod >= start.at_utc.replace(microsecond=0)
    )
    out += [(posixpath.join(folder, name) if folder else name, size) for _m, name, size in later]
    return out


@dataclass
class LogReader:
    """Reads a capture's entries from ``start`` on, as often as asked (:meth:`poll`).

    Keeps whole entries whose prefix is the capture's, whose database is ``database``, whose
    time is at or after the start (and at or before ``until`` once given), and whose session
    is not one of ``own_sessions`` (the service's connections), up to ``limit`` bytes;
    ``truncated`` is set when an entry would not fit. Bytes in, bytes kept: the text is
    decoded once, at the end.
    """

    start: LogPoint
    database: str
    limit: int
    own_sessions: set[str] = field(default_factory=set)
    chunk: int = CHUNK
    kept: list[bytes] = field(default_factory=list)
    kept_bytes: int = 0
    entries: int = 0
    dropped_lines: int = 0  # lines of other databases, prefixes or times
    truncated: bool = False
    missing: list[str] = field(default_factory=list)  # files gone before they were read
    read_bytes: int = 0
    _consumed: dict[str, int] = field(default_factory=dict)
    _current: str | None = None
    _carry: bytes = b""
    _entry: list[bytes] = field(default_factory=list)
    _keep_entry: bool = False

    def __post_init__(self) -> None:
        self._consumed.setdefault(self.start.file, self.start.offset)
        self._db = self.database.encode()
        self._since = self.start.at.encode()
        self._until: bytes | None = None

    def poll(self, conn: Conn, *, until: str | None = None, final: bool = False) -> None:
        """Read what the server logged since the last poll. ``until``: the window's end (as
        %m writes it); ``final``: the log is complete, an unfinished last line included."""
        if until is not None:
            self._until = until.encode()
        for path, size in log_files(conn, self.start):
            if self.truncated:
                return
            if path != self._current:
                self._end_of_file()
                self._current = path
            pos = self._consumed.get(path, 0)
            if size < pos:  # the file was truncated and written again (a reused name)
                pos = 0
            while pos < size and not self.truncated:
                data = _one(
                    conn,
                    "SELECT pg_read_binary_file(%s, %s, %s, true)",
                    [path, pos, min(self.chunk, size - pos)],
                )
                if data is None:
                    self.missing.append(posixpath.basename(path))
                    break
                data = bytes(data)
                if not data:
                    break
                pos += len(data)
                self.read_bytes += len(data)
                self._feed(data)
            self._consumed[path] = pos
        if final:
            self._end_of_file()

    def text(self) -> str:
        """The kept entries as text (undecodable bytes replaced)."""
        return b"".join(self.kept).decode("utf-8", errors="replace")

    # -- entries ------------------------------------------------------------------------
    def _end_of_file(self) -> None:
        if self._carry:
            self._line(self._carry + b"\n")
            self._carry = b""
        self._commit()

    def _feed(self, data: bytes) -> None:
        lines = (self._carry + data).split(b"\n")
        self._carry = lines.pop()  # an unfinished line waits for the next read
        for line in lines:
            self._line(line + b"\n")
            if self.truncated:
                return

    def _line(self, line: bytes) -> None:
        if line.startswith(b"\t"):  # a continuation line of the entry before
            if self._keep_entry:
                self._entry.append(line)
            return
        self._commit()
        m = ENTRY.match(line)
        if m is None:
            self.dropped_lines += 1  # another prefix, or a program's own output
            return
        at, _user, db, session = m.groups()
        keep = (
            db == self._db
            and at >= self._since
            and (self._until is None or at <= self._until)
            and session.decode() not in self.own_sessions
        )
        if keep:
            self._entry = [line]
            self._keep_entry = True
        else:
            self.dropped_lines += 1

    def _commit(self) -> None:
        if self._keep_entry and self._entry:
            size = sum(len(x) for x in self._entry)
            if self.kept_bytes + size > self.limit:
                self.truncated = True
            else:
                self.kept.extend(self._entry)
                self.kept_bytes += size
                self.entries += 1
        self._entry = []
        self._keep_entry = False


# -- pg_stat_statements ----------------------------------------------------------------------
Counters = dict[int, tuple[int, float]]  # queryid -> calls, total execution time (ms)
PGSS_SQL = (
    "SELECT queryid, sum(calls)::bigint, sum(total_exec_time)::float8, min(query) "
    "FROM pg_stat_statements WHERE queryid IS NOT NULL AND dbid = "
    "(SELECT oid FROM pg_database WHERE datname = current_database()) GROUP BY queryid"
)


def pgss_counters(conn: Conn, *, with_text: bool = False) -> tuple[Counters, dict[int, str]] | str:
    """pg_stat_statements' calls and execution time per query of the connection's database
    (and the normalized query texts with ``with_text``), or why they cannot be measured."""
    if _one(conn, "SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'") is None:
        return "pg_stat_statements is not installed"
    if int(_one(conn, "SHOW server_version_num")) < 130000:
        return "pg_stat_statements' total_exec_time needs PostgreSQL 13 or later"
    try:
        rows = conn.execute(PGSS_SQL).fetchall()
    except psycopg.Error as exc:
        if exc.sqlstate == "55000":  # object_not_in_prerequisite_state
            return (
                "pg_stat_statements is installed but not loaded (add it to "
                "shared_preload_libraries and restart the server)"
            )
        return f"pg_stat_statements could not be read ({exc.sqlstate or 'error'})"
    counters = {int(r[0]): (int(r[1]), float(r[2] or 0.0)) for r in rows}
    texts = {int(r[0]): str(r[3]) for r in rows} if with_text else {}
    return counters, texts


def deltas(
    before: Counters, after: Counters, texts: dict[int, str]
) -> Iterable[tuple[str, int, float]]:
    """(query text, calls, ms) of the queries that ran between the two readings."""
    for qid, (calls, ms) in after.items():
        c0, m0 = before.get(qid, (0, 0.0))
        if calls - c0 > 0 and qid in texts:
            yield texts[qid], calls - c0, max(0.0, ms - m0)
