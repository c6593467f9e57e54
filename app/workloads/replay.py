"""A captured workload replayed as the benchmark (issue 28).

The user's own statements, sessions and pacing, from their server's log
(app/captures/logparse.py), replayed by the replay player (app/replay/player.py) instead
of pgbench running scripts. One stream, "replay":

* its **scripts are the labels**, the captured statements grouped by normalized text
  (PostgreSQL's parser: constants as ``$n``): a label's name is that text, its weight its
  calls in the measured window, so ``Stream.design_weights`` gives each label's share of
  calls. Statements that failed in the capture are left out of the shares (they are
  expected to fail again) but counted and shown. A label with no statement in the window
  gets no script;
* its **clients** are the most sessions the window holds at once;
* a run replays the capture's first ``duration_s * speed`` seconds from its first
  statement, the first ``warmup_s * speed`` of them discarded like pgbench's warm-up;
* its objective is ``latency_mean`` by default (app/sessions/schemas.py): a replay runs on
  the capture's schedule, so its throughput is set by the capture, not by the config.

The data. Every measured run starts from the same data without ever writing the user's
database: :meth:`Replay.reset` drops ``knobtune_replay`` (only that name, and only when
knobtune made it: its comment says so) and creates it again as a copy of the replay
database (``CREATE DATABASE ... TEMPLATE ... STRATEGY FILE_COPY`` on 15+). The replay
database is the one that holds the data the capture started from (the user restores the
dump taken before the capture into it); it is read by the copy, never connected to. A
restored dump carries no planner statistics (PostgreSQL dumps none before 18): until
ANALYZE runs on it, or autovacuum gets to it, copies plan without them, so
:meth:`Replay.prepare`'s note names the tables of the first copy that hold data but no
statistics.

Privileges. The workload's role makes the copy, so it needs CREATEDB and must own the
replay database (or be superuser): :meth:`Replay.prepare` says exactly what to grant;
the least privilege that works, rather than giving the workload the superuser's DSN for
its resets. A sandbox's benchmark role has no CREATEDB (issue 40: it could make
databases and override tuned knobs in them), so on knobtune's own sandbox a session or
a comparison gives ``admin_dsn`` (app.targets.access.admin_dsn_for), the sandbox's
superuser, which makes the copy (knobtune's fixed statements only), owned by the
workload's role; the replay database must still be that role's. Statements run as the
workload's role, not as the captured users (whose passwords knobtune never has).

What a copy costs: FILE_COPY checkpoints and copies the files (seconds for a few hundred
MB on this host); the copy is a new database, so its pages are not in shared_buffers at
the start of a run (they are in the OS cache, just written).
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from app.captures.logparse import LogFormatError, ParsedLog, parse_log, plan_bytes, window
from app.postgres.connect import connect_target
from app.postgres.dsn import scrub
from app.replay.plan import REPLAY_DATABASE, ReplayRun
from app.workloads.base import Isolation, Script, Stream, WorkloadError

STREAM = "replay"
# the comment on knobtune's copy: a knobtune_replay without it is not knobtune's to drop
MARK = "knobtune replay copy: dropped and made again before every benchmark run"


@dataclass(frozen=True, repr=False)
class CaptureSource:
    """A capture's log as its store gives it: the text and the database it captured."""

    text: str
    database: str | None = None

    def __repr__(self) -> str:  # the log is the user's data
        return f"CaptureSource(<{len(self.text)} characters>, database={self.database!r})"


LogArg = str | CaptureSource | Callable[[], "str | CaptureSource"]


class Replay:
    """A :class:`~app.workloads.base.Workload` that replays a captured log."""

    def __init__(
        self,
        log: LogArg,
        *,
        duration_s: int,
        warmup_s: int,
        speed: float = 1.0,
        replay_database: str | None = None,
        capture_database: str | None = None,
        isolation: Isolation | None = None,
        admin_dsn: str | None = None,
    ) -> None:
        if not 0.1 <= speed <= 100:
            raise WorkloadError(f"speed must be between 0.1 and 100, not {speed:g}")
        if not 0 <= warmup_s < duration_s:
            raise WorkloadError("warmup_s must be >= 0 and less than duration_s")
        if replay_database == REPLAY_DATABASE:
            raise WorkloadError(
                f"{REPLAY_DATABASE} is the copy knobtune makes before every run: name the "
                "database that holds the capture's starting data"
            )
        self._log = log
        self.duration_s, self.warmup_s, self.speed = duration_s, warmup_s, speed
        self._replay_database = replay_database
        self._capture_database = capture_database
        self.isolation = isolation
        # knobtune's own sandbox: its superuser makes the copies (module docstring)
        self.admin_dsn = admin_dsn
        self._parsed: ParsedLog | None = None
        self._stream: Stream | None = None

    def __repr__(self) -> str:
        return (
            f"Replay(speed={self.speed:g}, duration_s={self.duration_s}, "
            f"database={self._replay_database!r})"
        )

    # -- the capture -----------------------------------------------------------------
    @property
    def parsed(self) -> ParsedLog:
        """The capture, parsed once (seconds for a 50 MB log)."""
        if self._parsed is None:
            src = self._log() if callable(self._log) else self._log
            if isinstance(src, CaptureSource):
                text, database = src.text, self._capture_database or src.database
            else:
                text, database = src, self._capture_database
            parsed = _parse(text, database)
            dbs = parsed.databases()
            if database is None and len(dbs) > 1:
                raise WorkloadError(
                    f"the capture holds sessions of {len(dbs)} databases "
                    f"({', '.join(dbs[:5])}): a replay runs one; capture one database"
                )
            self._capture_database = database or (dbs[0] if dbs else None)
            self._parsed = parsed
        return self._parsed

    @property
    def database(self) -> str:
        """The replay database: the data the capture started from (copied, never written)."""
        db = self._replay_database
        if db is None:
            self.parsed  # noqa: B018 - parsing settles the capture's database
            db = self._capture_database
        if not db:
            raise WorkloadError(
                "the capture names no database: give replay_database (the database on the "
                "target that holds the data the capture started from)"
            )
        return db

    def window(self) -> tuple[float, float, float]:
        """(start, measured from, end) in capture seconds: from the first statement."""
        p = self.parsed
        if not p.statements:
            raise WorkloadError(
                "the capture holds no statement to replay (it needs log_statement = 'all' "
                "and lc_messages = 'C' while capturing)"
            )
        start = min(st.at_s for st in p.statements)
        return (
            start,
            start + self.warmup_s * self.speed,
            start + self.duration_s * self.speed,
        )

    # -- the Workload protocol -------------------------------------------------------
    def streams(self) -> list[Stream]:
        if self._stream is None:
            self._stream = self._make_stream()
        return [self._stream]

    def _make_stream(self) -> Stream:
        p = self.parsed
        start, measured, end = self.window()
        win = window(p, start_s=start, end_s=end)
        meas = window(p, start_s=measured, end_s=end)
        weight = dict(zip(meas.labels, meas.calls, strict=True))
        scripts = tuple(
            Script(name=p.labels[i].text, sql=p.labels[i].text, weight=weight.get(i, 0))
            for i in win.labels
        )
        if not any(s.weight for s in scripts):
            raise WorkloadError(
                f"nothing to measure: after the warm-up ({self.warmup_s} s at speed "
                f"{self.speed:g}) the replayed window holds no statement that succeeded in "
                "the capture; lengthen duration_s or shorten warmup_s"
            )
        return Stream(
            name=STREAM,
            scripts=scripts,
            clients=max(1, win.peak_sessions),
            jobs=max(1, win.peak_sessions),
            isolation=self.isolation,
            replay=ReplayRun(
                # made when a run first needs it (seconds for a large capture)
                functools.partial(plan_bytes, p, start_s=start, end_s=end),
                speed=self.speed,
                database=REPLAY_DATABASE,
            ),
        )

    def prepare(self, dsn: str) -> str | None:
        """Check the replay database and the role's privileges, make the first copy, and
        say what will be replayed. Raises WorkloadError saying what to grant or restore."""
        stream = self.streams()[0]
        db = self.database
        with _admin(self.admin_dsn or dsn, avoid=(db,)) as conn:
            role, superuser, createdb = _role(conn)
            if self.admin_dsn is not None:  # the superuser copies, for the workload's role
                role, superuser, createdb = _workload_role(dsn), False, True
            row = conn.execute(
                "SELECT pg_get_userbyid(datdba), datistemplate FROM pg_database WHERE datname = %s",
                [db],
            ).fetchone()
            if row is None:
                raise WorkloadError(
                    f"database {db} does not exist on this server: restore the dump taken "
                    f"before the capture into database {db} on this server (createdb {db}; "
                    f"pg_restore -d {db} dump.file), or give replay_database"
                )
            owner, is_template = str(row[0]), bool(row[1])
            if not (superuser or createdb):
                raise WorkloadError(
                    f"role {role} may not create databases, and a replay copies {db} into "
                    f"{REPLAY_DATABASE} before every run: ALTER ROLE {role} CREATEDB (as a "
                    "superuser), or connect as a role that may"
                )
            if not (superuser or owner == role or is_template):
                raise WorkloadError(
                    f"role {role} may not copy database {db} (its owner is {owner}): "
                    f"ALTER DATABASE {db} OWNER TO {role}, or connect as {owner} or a superuser"
                )
            _ours_or_absent(conn)
        self.reset(dsn)  # the first copy: proves that the next ones work
        return self._note(stream, db, role, _without_statistics(dsn))

    def _note(self, stream: Stream, db: str, role: str, unanalyzed: list[str]) -> str:
        p = self.parsed
        start, _, end = self.window()
        win = window(p, start_s=start, end_s=end)
        span = min(end, p.duration_s) - start
        failed = sum(win.failed)
        parts = [
            f"replaying {win.statements} statements of {len(win.sessions)} sessions "
            f"({span / 60:.1f} min of the capture at speed {self.speed:g}: "
            f"{span / self.speed:.0f} s per run, the first {self.warmup_s} s a warm-up), "
            f"{len(stream.scripts)} distinct queries, up to {stream.clients} sessions at once",
            f"every run on a fresh copy of {db} ({REPLAY_DATABASE}), as role {role}",
        ]
        if failed:
            parts.append(f"{failed} statements failed in the capture: counted, not judged")
        if p.unparsed_statements:
            parts.append(f"{p.unparsed_statements} statements PostgreSQL's parser rejected")
        if p.duration_s - start < self.duration_s * self.speed:
            parts.append(
                f"the capture is shorter than a run ({p.duration_s - start:.0f} s of "
                f"statements): each run ends when it has been replayed"
            )
        users = sorted({p.sessions[i].user for i in win.sessions} - {role})
        if users:
            parts.append(f"captured as {', '.join(users[:3])}; replayed as {role}")
        if unanalyzed:
            named = ", ".join(unanalyzed[:3]) + (", ..." if len(unanalyzed) > 3 else "")
            parts.append(
                f"{len(unanalyzed)} table(s) of {db} that hold data have no planner statistics "
                f"({named}): a restore brings none, and autovacuum analyzes them when it "
                f"gets to it, so runs copied before and after would plan differently; "
                f"ANALYZE database {db} (vacuumdb --analyze-only) before tuning"
            )
        return "; ".join(parts)

    def reset(self, dsn: str) -> None:
        """A fresh copy of the replay database as knobtune_replay (see the module
        docstring); the user's database is only read. Raises WorkloadError."""
        db = self.database
        owner = _workload_role(dsn) if self.admin_dsn is not None else None
        try:
            with _admin(self.admin_dsn or dsn, avoid=(db,)) as conn:
                _ours_or_absent(conn)
                _drop_copy(conn)
                _copy(conn, db, owner)
        except psycopg.Error as exc:
            raise WorkloadError(
                f"making {REPLAY_DATABASE} (a copy of {db}) failed: "
                f"{scrub(str(exc).strip().splitlines()[0] if str(exc).strip() else '', dsn)}"
            ) from None


# -- parsing, once per capture ------------------------------------------------------------
_last: tuple[tuple[str, str | None], ParsedLog] | None = None
_last_lock = threading.Lock()


def _parse(text: str, database: str | None) -> ParsedLog:
    """The parsed log; the latest one is kept (a session's request is checked, then run,
    on the same capture: a 50 MB log takes seconds to parse)."""
    global _last
    key = (hashlib.sha256(text.encode()).hexdigest(), database)
    with _last_lock:
        if _last is not None and _last[0] == key:
            return _last[1]
    try:
        parsed = parse_log(text, database=database)
    except LogFormatError as exc:
        raise WorkloadError(f"the capture's log cannot be read: {exc}") from None
    with _last_lock:
        _last = (key, parsed)
    return parsed


# -- the copy ------------------------------------------------------------------------------
def _admin(dsn: str, *, avoid: tuple[str, ...]) -> psycopg.Connection[Any]:
    """A connection for CREATE/DROP DATABASE: never to the replay database (a template
    must have no other session) nor to the copy (it is dropped)."""
    own = conninfo_to_dict(dsn).get("dbname")
    tried: list[str] = []
    last: psycopg.Error | None = None
    for name in (own, "postgres", "template1"):
        if not name or str(name) in avoid or name == REPLAY_DATABASE or str(name) in tried:
            continue
        tried.append(str(name))
        try:
            conn = connect_target(
                make_conninfo(dsn, dbname=str(name)), autocommit=True, connect_timeout=10
            )
        except psycopg.OperationalError as exc:
            last = exc
            continue
        if conn.info.dbname in avoid:  # libpq's default database: the user's name
            conn.close()
            continue
        return conn
    said = scrub(str(last).strip(), dsn) if last is not None else "no database to connect to"
    raise WorkloadError(
        f"cannot connect to the target to copy the replay database (tried "
        f"{', '.join(tried) or 'none'}): {said}"
    )


def _without_statistics(dsn: str) -> list[str]:
    """Tables of the copy (as of the replay database) that hold data but no planner
    statistics: a database restored from a dump has none until ANALYZE runs on it (issue
    28's fidelity bench: autovacuum got to a restored TPC-C about 90 s later). Only tables
    the role may read count (it cannot see the others' statistics). A check only: []
    when it cannot be made."""
    try:
        with connect_target(
            make_conninfo(dsn, dbname=REPLAY_DATABASE), autocommit=True, connect_timeout=10
        ) as conn:
            rows = conn.execute(
                "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.relkind IN ('r', 'm') AND n.nspname <> 'information_schema'"
                " AND n.nspname NOT LIKE 'pg\\_%' AND has_table_privilege(c.oid, 'SELECT')"
                " AND pg_relation_size(c.oid) > 0"
                " AND NOT EXISTS (SELECT 1 FROM pg_stats s"
                "  WHERE s.schemaname = n.nspname AND s.tablename = c.relname)"
                " ORDER BY pg_relation_size(c.oid) DESC, 1"
            ).fetchall()
    except psycopg.Error:
        return []
    return [str(r[0]) for r in rows]


def _role(conn: psycopg.Connection[Any]) -> tuple[str, bool, bool]:
    row = conn.execute(
        "SELECT current_user, rolsuper, rolcreatedb FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    assert row is not None
    return str(row[0]), bool(row[1]), bool(row[2])


def _ours_or_absent(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute(
        "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
        [REPLAY_DATABASE],
    ).fetchone()
    if row is not None and row[0] != MARK:
        raise WorkloadError(
            f"a database {REPLAY_DATABASE} exists on the target that knobtune did not make "
            "(knobtune drops only its own copy): drop or rename it"
        )


def _drop_copy(conn: psycopg.Connection[Any]) -> None:
    name = sql.Identifier(REPLAY_DATABASE)
    if conn.info.server_version >= 130000:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        return
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
        [REPLAY_DATABASE],
    )
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(name))


def _workload_role(dsn: str) -> str:
    user = conninfo_to_dict(dsn).get("user")
    if not user:
        raise WorkloadError("the workload's DSN names no user: give user=...")
    return str(user)


def _copy(conn: psycopg.Connection[Any], db: str, owner: str | None = None) -> None:
    strategy = sql.SQL(" STRATEGY FILE_COPY") if conn.info.server_version >= 150000 else sql.SQL("")
    owned = sql.SQL(" OWNER {}").format(sql.Identifier(owner)) if owner else sql.SQL("")
    create = sql.SQL("CREATE DATABASE {} TEMPLATE {}{}{}").format(
        sql.Identifier(REPLAY_DATABASE), sql.Identifier(db), owned, strategy
    )
    try:
        # PostgreSQL itself waits up to 5 s for the template's other sessions to go
        conn.execute(create)
    except psycopg.errors.ObjectInUse:
        raise WorkloadError(_in_use(conn, db)) from None
    conn.execute(
        sql.SQL("COMMENT ON DATABASE {} IS {}").format(
            sql.Identifier(REPLAY_DATABASE), sql.Literal(MARK)
        )
    )


def _in_use(conn: psycopg.Connection[Any], db: str) -> str:
    rows = conn.execute(
        "SELECT coalesce(usename, '?'), coalesce(application_name, '') FROM pg_stat_activity"
        " WHERE datname = %s AND pid <> pg_backend_pid()",
        [db],
    ).fetchall()
    who = sorted({f"{u}" + (f" ({a})" if a else "") for u, a in rows})
    return (
        f"database {db} is in use by {len(rows) or 'other'} session(s)"
        + (f" of {', '.join(who[:5])}" if who else "")
        + f", and PostgreSQL copies a database only while nobody is connected to it: close "
        f"them (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
        f"'{db}'), or restore the capture's starting data into a database only knobtune uses"
    )
