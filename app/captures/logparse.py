"""A captured workload from PostgreSQL's log: sessions, statements in order, and labels.

What a capture switches on (pgreplay's convention): ``log_statement = 'all'``,
``log_connections`` and ``log_disconnections`` on, ``log_line_prefix = '%m|%u|%d|%c|'``
and ``lc_messages = 'C'``. Two formats are read:

* **stderr**: ``2026-11-26 11:49:53.787 UTC|user|db|6b081ce1.6191|LOG:  statement: ...``;
  the further lines of a multi-line message start with a TAB;
* **csvlog**: PostgreSQL 12 (23 columns), 13 (24) and 14-17 (26), told apart by the count;
* **rds**: a log downloaded from Amazon RDS or Aurora with their default
  ``log_line_prefix = '%t:%r:%u@%d:[%p]:'``
  (``2026-11-26 11:49:53 UTC:10.0.1.5(53422):app@shop:[4242]:LOG:  statement: ...``);
* **cloudsql**: a log from Cloud SQL, whose prefix is ``'%m [%p]: [%l-1] db=%d,user=%u '``
  (``2026-11-26 11:49:53.787 UTC [4242]: [3-1] db=shop,user=app LOG:  statement: ...``).

The managed services' prefixes carry no session id (%c): a session is the backend's pid,
and a pid seen again after its ``disconnection:`` is a new session. ``%t`` has whole
seconds only, so an RDS capture's statements within one second keep their order but not
their spacing. The prefix is matched on a line's first ``PREFIX_SCAN`` characters only: a
huge line costs no more to recognise than a short one.

Messages understood (everything else is ignored and counted in ``ignored_lines``):

* ``connection authorized: ...``: a session starts; ``disconnection: ...``: it ends;
* ``statement: SQL``: a statement of the simple protocol (replayed as one query string,
  several statements in it included);
* ``execute <name>: SQL`` and the session's next ``DETAIL:  parameters: $1 = '7', $2 =
  NULL``: a statement of the extended protocol with its parameters as text (``execute
  fetch from``, a portal's next rows, is not a new statement);
* ``ERROR:`` then ``STATEMENT:`` (csvlog: an ERROR row with its query): the session's
  previous statement failed in the capture.

Labels: statements are grouped by ``pglast.parser.fingerprint`` (libpg_query, PostgreSQL's
own parser), and a label's text is the first statement's normalized SQL
(``pglast.parser.normalize``, pg_stat_statements' form) with every literal left as a
constant replaced by ``$n`` too (normalize keeps those of utility statements such as
``EXECUTE f(1, 'x')``) and comments dropped: a label never shows the user's values.
Statements pglast cannot parse get one label per fingerprint of a crude normalization,
"unparsed statement <8 hex>", and are counted. The parser is C: a long statement is
parsed in a worker process, and one that crashes it or is too long is unparsed
(app/captures/sqlparse.py), so no captured statement can take the service down.

Speed: the log is read line by line; statements that differ only in their literals share
one call to the parser (a cache on the crude normalization), so a 50 MB log of ~300,000
statements parses in seconds.

Errors (:class:`LogFormatError`) name a line number, never a line's content: the log is
the user's data.
"""

from __future__ import annotations

import calendar
import csv
import hashlib
import io
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Literal

from app.captures import sqlparse
from app.captures.sqlparse import LABEL_MAX, Kind
from app.captures.sqlparse import label_text as label_text
from app.replay.plan import PlanSession, PlanStatement, encode

PREFIX = "%m|%u|%d|%c|"
RDS_PREFIX = "%t:%r:%u@%d:[%p]:"
CLOUDSQL_PREFIX = "%m [%p]: [%l-1] db=%d,user=%u "
PREFIX_SCAN = 1024  # characters of a line a managed service's prefix must lie in
LogFormat = Literal["stderr", "csvlog", "rds", "cloudsql"]
CSV_COLUMNS = {23: "PostgreSQL 12", 24: "PostgreSQL 13", 26: "PostgreSQL 14-17"}


class LogFormatError(ValueError):
    """The text is not a log knobtune can read; the message names the line number."""


@dataclass(frozen=True)
class Session:
    key: str  # PostgreSQL's session id (%c)
    user: str
    database: str
    start_s: float  # 0.0 when its connection came before the capture
    end_s: float | None  # None: still connected when the capture ended


@dataclass(frozen=True, repr=False)
class Statement:
    at_s: float
    session: int  # index in ParsedLog.sessions
    sql: str  # as captured (the user's data)
    params: tuple[str | None, ...]  # extended protocol's parameters as text
    label: int  # index in ParsedLog.labels
    failed_in_capture: bool
    extended: bool = False  # captured as ``execute`` (extended protocol), else ``statement``
    name: str | None = None  # the prepared statement's name (extended; None: unnamed)

    def __repr__(self) -> str:  # never the SQL or its values
        return f"Statement(at_s={self.at_s:.3f}, session={self.session}, label={self.label})"


@dataclass(frozen=True)
class Label:
    text: str  # normalized SQL, constants as $n, at most LABEL_MAX characters; unique
    kind: Kind
    calls: int  # statements with this label (those that failed in the capture included)
    failed_in_capture: int


@dataclass(frozen=True)
class ParsedLog:
    started_at: datetime  # the first kept line's time (aware when the log's zone is known)
    duration_s: float  # from the first kept line to the last
    sessions: tuple[Session, ...]
    statements: tuple[Statement, ...]
    labels: tuple[Label, ...]
    ignored_lines: int
    unparsed_statements: int
    format: LogFormat = "stderr"

    def databases(self) -> list[str]:
        """The databases of its sessions, most sessions first."""
        count: dict[str, int] = {}
        for s in self.sessions:
            count[s.database] = count.get(s.database, 0) + 1
        return sorted(count, key=lambda d: -count[d])


# -- timestamps --------------------------------------------------------------------------
_TS = re.compile(
    r"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(\.\d+)?"
    r"(?: ([A-Za-z][A-Za-z0-9_/+-]*|[+-]\d\d(?::?\d\d)?))?\Z"
)
_OFFSET = re.compile(r"([+-])(\d\d)(?::?(\d\d))?\Z")


def _zone(name: str | None) -> timezone | None:
    """UTC, GMT or a numeric offset; None for an abbreviation (CET ...): local wall time."""
    if name in ("UTC", "GMT", "Z"):
        return UTC
    m = _OFFSET.match(name or "")
    if not m:
        return None
    delta = timedelta(hours=int(m.group(2)), minutes=int(m.group(3) or 0))
    return timezone(-delta if m.group(1) == "-" else delta)


class _Clock:
    """``%m`` timestamps as seconds (the wall clock of the log's zone, offsets applied)."""

    def __init__(self) -> None:
        self._bases: dict[str, float] = {}
        self.first: tuple[datetime, timezone | None] | None = None

    def seconds(self, ts: str) -> float | None:
        m = _TS.match(ts)
        if m is None:
            return None
        head = ts[:19] + (m.group(8) or "")
        base = self._bases.get(head)
        if base is None:
            y, mo, d, h, mi, s = (int(m.group(i)) for i in range(1, 7))
            try:
                base = float(calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)))
                datetime(y, mo, d, h, mi, s)  # a range check only
            except ValueError:
                return None
            zone = _zone(m.group(8))
            if zone is not None:
                offset = zone.utcoffset(None)
                base -= offset.total_seconds() if offset is not None else 0.0
            if len(self._bases) > 4096:
                self._bases.clear()
            self._bases[head] = base
        frac = m.group(7)
        return base + (float(frac) if frac else 0.0)

    @staticmethod
    def when(ts: str) -> datetime:
        m = _TS.match(ts)
        assert m is not None
        y, mo, d, h, mi, s = (int(m.group(i)) for i in range(1, 7))
        us = round(float(m.group(7) or 0) * 1e6)
        zone = _zone(m.group(8))
        return datetime(y, mo, d, h, mi, s, min(us, 999_999), tzinfo=zone)


# -- labels ------------------------------------------------------------------------------
_LITERALS = re.compile(r"'[^']*(?:''[^']*)*'|(?<![\w$])[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?")


def _crude(sql: str) -> str:
    """Literals and runs of white space replaced: a cache key, and the unparsed label's."""
    return " ".join(_LITERALS.sub("?", sql).split())


def _suffixed(text: str, suffix: str) -> str:
    """``text`` with `` #2`` (...) within LABEL_MAX characters, still marked as cut."""
    if len(text) + len(suffix) <= LABEL_MAX:
        return text + suffix
    base = text[:-3] if text.endswith("...") else text
    return base[: LABEL_MAX - len(suffix) - 3].rstrip() + "..." + suffix


def statement_kind(sql: str) -> Kind:
    """read, write or other (SELECT ... FOR UPDATE reads); other when it cannot be parsed
    (app/captures/sqlparse.py: a long statement is parsed in a worker process)."""
    described = sqlparse.describe(sql)
    return described[1] if described is not None else "other"


# -- parameters --------------------------------------------------------------------------
_PARAM = re.compile(r"\$(\d+) = (?:NULL|'([^']*(?:''[^']*)*)')")


def parse_params(text: str) -> tuple[str | None, ...] | None:
    """``$1 = '7', $2 = NULL`` -> ("7", None); None when the text is not that."""
    values: dict[int, str | None] = {}
    pos, end = 0, len(text)
    while pos < end:
        m = _PARAM.match(text, pos)
        if m is None:
            return None
        values[int(m.group(1))] = None if m.group(2) is None else m.group(2).replace("''", "'")
        pos = m.end()
        if text.startswith(", ", pos):
            pos += 2
        elif pos != end:
            return None
    if not values:
        return ()
    return tuple(values.get(i) for i in range(1, max(values) + 1))


# -- the parser --------------------------------------------------------------------------
@dataclass
class _Msg:
    line: int  # where it starts
    lines: int  # physical lines it spans
    ts: str
    user: str
    db: str
    sid: str
    severity: str
    text: str
    detail: str = ""  # csvlog's detail column
    query: str = ""  # csvlog's query column (the failed statement of an ERROR)


@dataclass
class _Sess:
    index: int
    key: str
    user: str
    database: str
    start: float | None = None
    end: float | None = None
    last: int = -1  # its latest statement (index into the statement lists)
    awaiting_params: bool = False
    error: bool = False  # an ERROR waits for its STATEMENT


@dataclass
class _Acc:
    """What the messages add up to, before labelling."""

    database: str | None
    t0: float | None = None
    t_last: float = 0.0
    first_ts: str = ""
    sessions: dict[str, _Sess] = field(default_factory=dict)
    # statements as parallel lists: (time, session, sql, params, extended, name, failed)
    at: list[float] = field(default_factory=list)
    sess: list[int] = field(default_factory=list)
    sql: list[str] = field(default_factory=list)
    params: list[tuple[str | None, ...]] = field(default_factory=list)
    extended: list[bool] = field(default_factory=list)
    name: list[str | None] = field(default_factory=list)
    failed: list[bool] = field(default_factory=list)
    ignored: int = 0
    clock: _Clock = field(default_factory=_Clock)

    def handle(self, m: _Msg) -> None:
        if self.database is not None and m.db != self.database:
            self.ignored += m.lines
            return
        t = self.clock.seconds(m.ts)
        if t is None:
            raise LogFormatError(f"line {m.line}: its time stamp is not %m's")
        if not self._use(m, t):
            self.ignored += m.lines

    def _session(self, m: _Msg) -> _Sess:
        s = self.sessions.get(m.sid)
        if s is None:
            s = self.sessions[m.sid] = _Sess(len(self.sessions), m.sid, m.user, m.db)
        return s

    def _keep(self, t: float, ts: str) -> None:
        if self.t0 is None:
            self.t0, self.first_ts = t, ts
        self.t_last = max(self.t_last, t)

    def _use(self, m: _Msg, t: float) -> bool:
        sev, text = m.severity, m.text
        if sev == "LOG":
            if text.startswith("statement: "):
                self._statement(m, t, text[11:], extended=False, name=None)
                return True
            if text.startswith("execute ") and not text.startswith("execute fetch from "):
                i = text.find(": ", 8)
                if i < 0:
                    return False
                name = text[8:i]
                self._statement(
                    m, t, text[i + 2 :], extended=True, name=None if name == "<unnamed>" else name
                )
                if m.detail:  # csvlog: the parameters are in the same row
                    self._params(self.sessions[m.sid], m.detail)
                return True
            if text.startswith("connection authorized: "):
                if not m.sid or m.db in ("", "[unknown]"):
                    return False
                self._keep(t, m.ts)
                s = self._session(m)
                if s.start is None and s.last < 0:
                    s.start = t
                return True
            if text.startswith("disconnection: "):
                s0 = self.sessions.get(m.sid)
                if s0 is None:
                    return False
                self._keep(t, m.ts)
                s0.end = t
                return True
            return False
        s1 = self.sessions.get(m.sid)
        if s1 is None:
            return False
        if sev == "DETAIL":
            if s1.awaiting_params and text[:12].lower() == "parameters: ":
                self._params(s1, text)
                return True
            return False
        if sev == "ERROR":
            if m.query:  # csvlog: the failed statement is in the same row
                self._failed(s1)
            else:
                s1.error = True
            return True
        if sev == "STATEMENT":
            if s1.error:
                self._failed(s1)
                return True
            return False
        return False

    def _statement(self, m: _Msg, t: float, sql: str, *, extended: bool, name: str | None) -> None:
        if not m.sid:
            return
        self._keep(t, m.ts)
        s = self._session(m)
        s.last = len(self.at)
        s.awaiting_params = extended
        s.error = False
        self.at.append(t)
        self.sess.append(s.index)
        self.sql.append(sql)
        self.params.append(())
        self.extended.append(extended)
        self.name.append(name)
        self.failed.append(False)

    def _params(self, s: _Sess, text: str) -> None:
        s.awaiting_params = False
        got = parse_params(text[12:]) if text[:12].lower() == "parameters: " else None
        if got is not None and s.last >= 0:
            self.params[s.last] = got

    def _failed(self, s: _Sess) -> None:
        s.error = False
        if s.last >= 0:
            self.failed[s.last] = True


_SEVERITIES = {
    "LOG",
    "ERROR",
    "DETAIL",
    "STATEMENT",
    "HINT",
    "CONTEXT",
    "FATAL",
    "PANIC",
    "WARNING",
    "NOTICE",
    "INFO",
    "DEBUG",
    "DEBUG1",
    "DEBUG2",
    "DEBUG3",
    "DEBUG4",
    "DEBUG5",
    "QUERY",
    "LOCATION",
}
_CSV_START = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?(?: [^,|]*)?,")


def _lines(
    text: str, acc: _Acc, head: Callable[[int, str], _Msg | None], expected: str
) -> Iterator[_Msg]:
    """Messages of a stderr log: a line ``head`` reads as a message's first (its prefix
    and severity), and the tab-indented lines after it. Raises LogFormatError, naming
    ``expected``, when the first non-blank line is not one."""
    cur: _Msg | None = None
    more: list[str] = []
    seen = False
    for no, raw in enumerate(io.StringIO(text), start=1):
        line = raw[:-1] if raw.endswith("\n") else raw
        if line.startswith("\t"):
            if cur is not None:
                more.append(line[1:])
                cur.lines += 1
            else:
                acc.ignored += 1  # the tail of a message cut off by the capture's start
            continue
        if cur is not None:
            if more:
                cur.text = "\n".join([cur.text, *more])
                more = []
            yield cur
            cur = None
        cur = head(no, line)
        if cur is not None:
            seen = True
            continue
        if not seen and line.strip():
            raise LogFormatError(f"line {no}: not a PostgreSQL log line with {expected}")
        acc.ignored += 1
    if cur is not None:
        if more:
            cur.text = "\n".join([cur.text, *more])
        yield cur


def _stderr(text: str, acc: _Acc) -> Iterator[_Msg]:
    def head(no: int, line: str) -> _Msg | None:
        parts = line.split("|", 4)
        if len(parts) == 5:
            i = parts[4].find(":  ")
            severity = parts[4][:i] if i > 0 else ""
            if severity in _SEVERITIES and _TS.match(parts[0]):
                return _Msg(
                    no, 1, parts[0], parts[1], parts[2], parts[3], severity, parts[4][i + 3 :]
                )
        return None

    expected = (
        f"log_line_prefix = '{PREFIX}', RDS's '{RDS_PREFIX}' or Cloud SQL's "
        f"'{CLOUDSQL_PREFIX}' (and lc_messages = 'C'), nor csvlog"
    )
    return _lines(text, acc, head, expected)


_TS_PART = (
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?(?: [A-Za-z][A-Za-z0-9_/+-]*| [+-]\d\d(?::?\d\d)?)?"
)
_SEV_PART = r"(?P<sev>[A-Z][A-Z0-9]*):  "
# %r is "host(port)", "[local]", an IPv6 address with colons, or empty (background
# processes): lazily matched up to the ":user@db:[pid]:" that must follow it
_MANAGED = {
    "rds": re.compile(
        rf"(?P<ts>{_TS_PART}):(?P<host>[^@]*?):(?P<user>[^@:]*)@(?P<db>[^:]*):"
        rf"\[(?P<pid>\d+)\]:{_SEV_PART}"
    ),
    "cloudsql": re.compile(
        rf"(?P<ts>{_TS_PART}) \[(?P<pid>\d+)\]: \[\d+-\d+\] "
        rf"db=(?P<db>[^,]*),user=(?P<user>\S*) {_SEV_PART}"
    ),
}


def _managed_format(line: str) -> Literal["rds", "cloudsql"] | None:
    head = line[:PREFIX_SCAN]
    if _MANAGED["rds"].match(head):
        return "rds"
    if _MANAGED["cloudsql"].match(head):
        return "cloudsql"
    return None


def _managed(text: str, acc: _Acc, fmt: Literal["rds", "cloudsql"]) -> Iterator[_Msg]:
    """Messages of a managed service's stderr log; sessions keyed by pid and generation."""
    pattern = _MANAGED[fmt]
    prefix = RDS_PREFIX if fmt == "rds" else CLOUDSQL_PREFIX
    gen: dict[str, int] = {}
    ended: set[str] = set()

    def head(no: int, line: str) -> _Msg | None:
        m = pattern.match(line[:PREFIX_SCAN])
        if m is None or m.group("sev") not in _SEVERITIES:
            return None
        pid = m.group("pid")
        if pid in ended:  # the pid of a backend that has gone: another session
            ended.discard(pid)
            gen[pid] = gen.get(pid, 0) + 1
        body = line[m.end() :]
        if m.group("sev") == "LOG" and body.startswith("disconnection: "):
            ended.add(pid)
        sid = f"{pid}.{gen.get(pid, 0)}"
        return _Msg(no, 1, m.group("ts"), m.group("user"), m.group("db"), sid, m.group("sev"), body)

    return _lines(text, acc, head, f"log_line_prefix = '{prefix}' (and lc_messages = 'C')")


def _csvlog(text: str) -> Iterator[_Msg]:
    reader = csv.reader(io.StringIO(text))
    start = 1
    for row in reader:
        end = reader.line_num
        lines, no, start = end - start + 1, start, end + 1
        if not row:
            continue
        if len(row) not in CSV_COLUMNS:
            raise LogFormatError(
                f"line {no}: a csvlog row of {len(row)} columns; PostgreSQL 12-17 write "
                + ", ".join(f"{n} ({v})" for n, v in CSV_COLUMNS.items())
            )
        if not _TS.match(row[0]):
            raise LogFormatError(f"line {no}: a csvlog row without a time stamp")
        yield _Msg(
            line=no,
            lines=lines,
            ts=row[0],
            user=row[1],
            db=row[2],
            sid=row[5],
            severity=row[11],
            text=row[13],
            detail=row[14],
            query=row[19],
        )


def _first_line(text: str) -> str:
    for line in io.StringIO(text):
        if line.strip():
            return line
    return ""


def parse_log(text: str, *, database: str | None = None) -> ParsedLog:
    """Sessions, statements and labels of a captured log (see the module docstring).

    ``at_s``/``start_s`` are seconds since the first line kept. With ``database``, only
    sessions of that database are kept. Raises LogFormatError naming a line number.
    """
    first = _first_line(text)
    if not first:
        raise LogFormatError("line 1: the log is empty")
    acc = _Acc(database=database)
    # a managed prefix first: Cloud SQL's "... db=shop,user=app" would pass for a csvlog row
    managed = _managed_format(first)
    fmt: LogFormat = "csvlog" if managed is None and _CSV_START.match(first) else "stderr"
    try:
        if managed is not None:
            fmt = managed
            messages = _managed(text, acc, managed)
        else:
            messages = _csvlog(text) if fmt == "csvlog" else _stderr(text, acc)
        for m in messages:
            acc.handle(m)
    except csv.Error:
        raise LogFormatError("a csvlog row is malformed (an unclosed quote?)") from None
    return _finish(acc, fmt)


def _finish(acc: _Acc, fmt: LogFormat) -> ParsedLog:
    t0 = acc.t0 if acc.t0 is not None else 0.0
    started = _Clock.when(acc.first_ts) if acc.first_ts else datetime.fromtimestamp(0, UTC)
    sessions = tuple(
        Session(
            key=s.key,
            user=s.user,
            database=s.database,
            start_s=0.0 if s.start is None else round(s.start - t0, 6),
            end_s=None if s.end is None else round(s.end - t0, 6),
        )
        for s in acc.sessions.values()
    )
    labels, of, unparsed = _labels(acc.sql, acc.failed)
    statements = tuple(
        Statement(
            at_s=round(acc.at[i] - t0, 6),
            session=acc.sess[i],
            sql=acc.sql[i],
            params=acc.params[i],
            label=of[i],
            failed_in_capture=acc.failed[i],
            extended=acc.extended[i],
            name=acc.name[i],
        )
        for i in range(len(acc.at))
    )
    return ParsedLog(
        started_at=started,
        duration_s=round(acc.t_last - t0, 6) if acc.t0 is not None else 0.0,
        sessions=sessions,
        statements=statements,
        labels=labels,
        ignored_lines=acc.ignored,
        unparsed_statements=unparsed,
        format=fmt,
    )


@dataclass
class _Group:
    text: str
    sql: str  # the first statement's
    parsed: bool
    kind: Kind  # the first statement's
    calls: int = 0
    failed: int = 0


def _labels(
    sqls: Sequence[str], failed: Sequence[bool]
) -> tuple[tuple[Label, ...], list[int], int]:
    """(labels by calls descending, each statement's label, statements not parsed)."""
    by_crude: dict[str, int] = {}
    by_key: dict[str, int] = {}
    groups: list[_Group] = []
    of: list[int] = []
    unparsed = 0
    parser = sqlparse.Parser()  # never raises: a statement it cannot parse is unparsed
    for sql, bad in zip(sqls, failed, strict=True):
        crude = _crude(sql)
        g = by_crude.get(crude)
        if g is None:
            fp = parser.fingerprint(sql)
            described: tuple[str, Kind] | None = ("", "other")
            if fp is not None and "p" + fp not in by_key:
                described = parser.describe(sql)
            if fp is not None and described is not None:
                key, (text, kind), parsed = "p" + fp, described, True
            else:
                h = hashlib.sha256(crude.encode()).hexdigest()[:8]
                key, text, kind, parsed = "u" + h, f"unparsed statement {h}", "other", False
            g = by_key.get(key)
            if g is None:
                g = by_key[key] = len(groups)
                groups.append(_Group(text, sql, parsed, kind))
            by_crude[crude] = g
        grp = groups[g]
        grp.calls += 1
        grp.failed += bad
        unparsed += not grp.parsed
        of.append(g)
    order = sorted(range(len(groups)), key=lambda i: (-groups[i].calls, i))
    rank = {g: r for r, g in enumerate(order)}
    used: dict[str, int] = {}
    labels: list[Label] = []
    for g in order:
        grp = groups[g]
        text = grp.text
        if text in used:
            used[text] += 1
            text = _suffixed(text, f" #{used[text]}")
        else:
            used[text] = 1
        labels.append(Label(text, grp.kind, grp.calls, grp.failed))
    return tuple(labels), [rank[g] for g in of], unparsed


# -- the replay's window -----------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """What lies in ``[start_s, end_s)`` of a parsed log, as a replay stream sees it."""

    start_s: float
    end_s: float
    labels: tuple[int, ...]  # labels with a statement inside, in label order: script_no
    calls: tuple[int, ...]  # per such label: statements that did not fail in the capture
    failed: tuple[int, ...]  # per such label: statements that failed in the capture
    sessions: tuple[int, ...]  # sessions open during the window
    statements: int
    peak_sessions: int  # most sessions open at once


def window(parsed: ParsedLog, *, start_s: float, end_s: float) -> Window:
    """The labels, sessions and statements of ``[start_s, end_s)``."""
    calls: dict[int, list[int]] = {}
    n = 0
    busy: set[int] = set()
    for st in parsed.statements:
        if start_s <= st.at_s < end_s:
            n += 1
            busy.add(st.session)
            c = calls.setdefault(st.label, [0, 0])
            c[1 if st.failed_in_capture else 0] += 1
    sessions = [
        i
        for i, s in enumerate(parsed.sessions)
        if i in busy or (s.start_s < end_s and (s.end_s is None or s.end_s > start_s))
    ]
    events: list[tuple[float, int]] = []
    for i in sessions:
        s = parsed.sessions[i]
        events.append((max(s.start_s, start_s), 1))
        events.append((min(s.end_s, end_s) if s.end_s is not None else end_s, -1))
    peak = now = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        now += step
        peak = max(peak, now)
    labels = tuple(sorted(calls))
    return Window(
        start_s=start_s,
        end_s=end_s,
        labels=labels,
        calls=tuple(calls[x][0] for x in labels),
        failed=tuple(calls[x][1] for x in labels),
        sessions=tuple(sessions),
        statements=n,
        peak_sessions=max(peak, 1 if sessions else 0),
    )


def plan_sessions(parsed: ParsedLog, *, start_s: float, end_s: float) -> list[PlanSession]:
    """The window's sessions and statements, times relative to ``start_s``; a statement's
    script is its label's position in :func:`window`'s labels."""
    win = window(parsed, start_s=start_s, end_s=end_s)
    script = {label: i for i, label in enumerate(win.labels)}
    by_session: dict[int, list[PlanStatement]] = {i: [] for i in win.sessions}
    for st in parsed.statements:
        if start_s <= st.at_s < end_s:
            by_session[st.session].append(
                PlanStatement(
                    at_s=round(st.at_s - start_s, 6),
                    sql=st.sql,
                    script=script[st.label],
                    params=st.params if st.extended else None,
                    name=st.name,
                    failed_in_capture=st.failed_in_capture,
                )
            )
    out = []
    for i in win.sessions:
        s = parsed.sessions[i]
        out.append(
            PlanSession(
                client=i,
                start_s=max(0.0, round(s.start_s - start_s, 6)),
                end_s=None if s.end_s is None else round(s.end_s - start_s, 6),
                statements=tuple(by_session[i]),
            )
        )
    return out


def plan_bytes(parsed: ParsedLog, *, start_s: float, end_s: float) -> bytes:
    """The player's input for ``[start_s, end_s)`` of the capture (app/replay/plan.py)."""
    return encode(plan_sessions(parsed, start_s=start_s, end_s=end_s))


def labels_of(parsed: ParsedLog, indices: Iterable[int]) -> list[Label]:
    return [parsed.labels[i] for i in indices]
