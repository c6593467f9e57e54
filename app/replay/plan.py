"""What a replay runs, as the player reads it on its stdin (stdlib only).

A plan is JSON lines, one array per line, UTF-8:

* ``["P", 1]``: the header (format version);
* ``["S", client, start_s, end_s | null]``: a captured session. ``client`` is its index in
  the parsed log (pgbench's client_id in the per-statement log); times are capture seconds
  since the window's start (the player divides them by its speed);
* ``["Q", sql]``: a SQL text, referred to by its position among the ``Q`` lines (a
  statement the log shows many times, as the extended protocol does, is sent once);
* ``["X", client, at_s, q, script, params | null, failed, name | null]``: a statement of
  that session, in the session's order. ``script`` is the label's number in the stream
  (pgbench's script_no); ``params`` null: the simple protocol, as captured (``statement:``),
  else the extended protocol with these text parameters (``execute``); ``name`` the
  captured prepared statement's name (the player prepares it once per session), null for
  the unnamed statement; ``failed`` 1 when it failed in the capture.

The plan holds the user's statements and their values: it travels on the player's stdin
and is never written to disk (app/postgres/pgbench.py). Its ``repr`` shows sizes only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

VERSION = 1
# where a replay's statements run: the per-run copy of the replay database
# (app/workloads/replay.py), the one database knobtune ever drops
REPLAY_DATABASE = "knobtune_replay"


class PlanError(ValueError):
    """A plan the player cannot read; the message names the line (never its content)."""


class PlanStatement(NamedTuple):
    """One statement of a session (a tuple: a plan holds hundreds of thousands)."""

    at_s: float  # capture seconds since the window's start
    sql: str
    script: int  # the label's number in the replay stream (pgbench's script_no)
    params: tuple[str | None, ...] | None = None  # None: simple protocol
    name: str | None = None  # a named prepared statement (extended protocol)
    failed_in_capture: bool = False

    def __repr__(self) -> str:  # the SQL and its values are the user's data
        return f"PlanStatement(at_s={self.at_s:.3f}, script={self.script})"


@dataclass(frozen=True)
class PlanSession:
    client: int
    start_s: float
    end_s: float | None
    statements: tuple[PlanStatement, ...] = ()

    def __repr__(self) -> str:
        return (
            f"PlanSession(client={self.client}, start_s={self.start_s:.3f}, "
            f"statements={len(self.statements)})"
        )


@dataclass(frozen=True)
class Plan:
    sessions: tuple[PlanSession, ...] = ()

    @property
    def statements(self) -> int:
        return sum(len(s.statements) for s in self.sessions)

    def __repr__(self) -> str:
        return f"Plan(sessions={len(self.sessions)}, statements={self.statements})"


@dataclass(frozen=True, repr=False)
class ReplayRun:
    """What a stream carries to run a replay instead of pgbench (app/workloads/replay.py).

    ``source``: :func:`encode` of the window to replay, or a function that makes it when
    a run first needs it (a stream's names are wanted long before: a session's request
    is checked with them); it is the user's data: stdin only, never a file, never a log
    line. ``speed``: 2.0 replays twice as fast; ``database``: where the statements run
    (the per-run copy).
    """

    source: bytes | Callable[[], bytes] = field(compare=False)
    speed: float
    database: str
    _made: list[bytes] = field(default_factory=list, compare=False)

    @property
    def plan(self) -> bytes:
        if isinstance(self.source, bytes):
            return self.source
        if not self._made:
            self._made.append(self.source())
        return self._made[0]

    def __repr__(self) -> str:
        size = f"{len(self._made[0])} bytes" if self._made else "not made yet"
        if isinstance(self.source, bytes):
            size = f"{len(self.source)} bytes"
        return f"ReplayRun(plan=<{size}>, speed={self.speed:g}, database={self.database!r})"


def _line(obj: Sequence[object]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def encode(sessions: Iterable[PlanSession]) -> bytes:
    """The plan's bytes (see the module docstring)."""
    out = [_line(["P", VERSION])]
    texts: dict[str, int] = {}
    dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    for s in sessions:
        out.append(_line(["S", s.client, round(s.start_s, 6), _opt(s.end_s)]))
        for st in s.statements:
            q = texts.get(st.sql)
            if q is None:
                q = texts[st.sql] = len(texts)
                out.append(_line(["Q", st.sql]))
            params = None if st.params is None else list(st.params)
            failed = 1 if st.failed_in_capture else 0
            row = ["X", s.client, round(st.at_s, 6), q, st.script, params, failed, st.name]
            out.append(dumps(row).encode() + b"\n")
    return b"".join(out)


def _opt(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def decode(data: bytes) -> Plan:
    """The inverse of :func:`encode`. Raises PlanError naming the line number."""
    texts: list[str] = []
    order: list[int] = []
    heads: dict[int, tuple[float, float | None]] = {}
    stmts: dict[int, list[PlanStatement]] = {}
    seen_header = False
    loads = json.JSONDecoder().decode
    # "\n" only: a JSON string may hold U+2028 or NEL, which str.splitlines() splits at
    for no, raw in enumerate(data.decode("utf-8", "replace").split("\n"), start=1):
        if not raw:
            continue
        try:
            row = loads(raw)
            kind = row[0]
            if not seen_header:
                if kind != "P" or row[1] != VERSION:
                    raise PlanError(f"plan line {no}: not a replay plan of version {VERSION}")
                seen_header = True
            elif kind == "S":
                client = int(row[1])
                if client in heads:
                    raise PlanError(f"plan line {no}: session {client} given twice")
                heads[client] = (float(row[2]), None if row[3] is None else float(row[3]))
                order.append(client)
                stmts[client] = []
            elif kind == "Q":
                if not isinstance(row[1], str):
                    raise PlanError(f"plan line {no}: a SQL text must be a string")
                texts.append(row[1])
            elif kind == "X":
                client = int(row[1])
                params = row[5]
                if params is not None and not all(p is None or isinstance(p, str) for p in params):
                    raise PlanError(f"plan line {no}: parameters must be text or null")
                name = row[7]
                if name is not None and not isinstance(name, str):
                    raise PlanError(f"plan line {no}: a statement name must be text")
                stmts[client].append(
                    PlanStatement(
                        at_s=float(row[2]),
                        sql=texts[int(row[3])],
                        script=int(row[4]),
                        params=None if params is None else tuple(params),
                        name=name,
                        failed_in_capture=bool(row[6]),
                    )
                )
            else:
                raise PlanError(f"plan line {no}: unknown entry")
        except PlanError:
            raise
        except (ValueError, TypeError, IndexError, KeyError):
            # json's own message quotes the line: never shown (it is the user's data)
            raise PlanError(f"plan line {no}: not a valid plan entry") from None
    if not seen_header:
        raise PlanError("the plan is empty")
    return Plan(tuple(PlanSession(c, heads[c][0], heads[c][1], tuple(stmts[c])) for c in order))
