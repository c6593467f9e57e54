"""Runs one live capture under a lease, like a sweep: claimed, kept alive, cancelled, resumed.

The capture (issue 28):

1. checks the target again (it may have changed since the request was accepted);
2. snapshots the logging settings (:data:`app.postgres.serverlog.LOGGING_SETTINGS`) and
   commits the snapshot before the first ALTER SYSTEM;
3. applies the capture's settings (TargetController.apply: ALTER SYSTEM, reload,
   verified in pg_settings), notes where the stderr log ends and the server's clock,
   and pg_stat_statements' counters in the capture's database;
4. waits the asked seconds (cancel-able, the heartbeat renewing the lease), reading the
   new log lines every few seconds: a log that reaches KNOBTUNE_CAPTURE_MAX_BYTES stops
   the capture early, marked truncated;
5. ALWAYS puts the logging settings back (``finally``), whatever happened;
6. reads what was logged up to then, following rotation, stores it (compressed,
   encrypted: app/captures/store.py) and its summary.

A process that died mid-capture leaves a lease that runs out; the next claim puts the
stored snapshot back first (the target may still be logging every statement), then
collects what was logged up to then and finishes with a note, or fails with the reason
when nothing can be read. A cancel puts the settings back and keeps what was logged.

Only the capture's own settings are put back: an ALTER SYSTEM of another setting that a
DBA ran during a long capture is kept (the snapshot is merged with the entries of now).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import TupleRow

from app.captures import store
from app.captures import summary as summaries
from app.db import Database, utcnow
from app.lease import Heartbeat, LeasedRunner, LeaseLost
from app.models import Capture, Target
from app.postgres.connect import connect_target
from app.postgres.dsn import scrub
from app.postgres.serverlog import (
    CAPTURE_SETTINGS,
    LOG_PREFIX,
    LOGGING_SETTINGS,
    LogAccessError,
    LogPoint,
    LogReader,
    access_problems,
    clock,
    deltas,
    pgss_counters,
    position,
    session_id,
)
from app.postgres.target import Snapshot, TargetController, TargetError
from app.settings import Settings

log = logging.getLogger(__name__)

Conn = psycopg.Connection[TupleRow]
RESTORED = "logging settings restored"
POLL_S = 5.0  # how often the log is read while the capture runs
SETTLE_S = 0.5  # after a reload, for the logging collector to write what came before it
CONNECT_TIMEOUT_S = 10


class CaptureFailed(Exception):
    """The capture cannot go on; the message says why (no statement text in it)."""


class CaptureRunner(LeasedRunner[Capture]):
    """Runs one claimed capture in this process: heartbeat, cancel, always restore, resume."""

    def __init__(self, db: Database, settings: Settings, capture_id: int, owner: str) -> None:
        super().__init__(db, Capture, capture_id, owner, settings.lease_seconds)
        self.settings, self.capture_id = settings, capture_id
        self.notes: list[str] = []

    def finish(self, status: str, **values: Any) -> None:
        """As LeasedRunner's, with this run's notes after the row's."""
        with self.db.session() as s:
            cap = s.get(Capture, self.capture_id)
            notes = list(cap.notes or []) if cap is not None else []
        super().finish(status, notes=notes + self.notes, **values)

    # -- the job (LeasedRunner.run) -------------------------------------------------------
    def _run(self) -> None:
        with self.db.session() as s:
            cap = self.held(s)
            if cap is None:
                return
            target = s.get(Target, cap.target_id) if cap.target_id is not None else None
            dsn = target.dsn if target is not None else None
            database, seconds = cap.database, int(cap.request.get("seconds", 0))
            snapshot = Snapshot.from_json(cap.snapshot) if cap.snapshot else None
            collect = dict(cap.collect) if cap.collect else None
            resumed = cap.attempts > 0 and snapshot is not None
            cancel = cap.cancel_requested
        if dsn is None:
            self.finish("failed", error="its target was deleted: nothing was captured")
            return
        if cancel and snapshot is None:
            self.notes.append("cancelled before it started: nothing was changed")
            self.finish("cancelled")
            return
        self.start(resumed=resumed)
        with self.heartbeat() as hb:
            if resumed:
                assert snapshot is not None
                self._resume(hb, dsn, database, snapshot, collect)
            else:
                self._capture(hb, dsn, database, seconds)

    # -- a capture from the start -----------------------------------------------------------
    def _capture(self, hb: Heartbeat, dsn: str, database: str, seconds: int) -> None:
        ctl = TargetController(dsn)
        self.phase = "checking the target"
        try:
            with _connect(dsn) as conn:
                problems = access_problems(conn, database=database)
        except CaptureFailed as exc:
            self.finish("failed", error=f"{exc}; nothing was changed")
            return
        if problems:
            self.finish(
                "failed",
                error="the target can no longer be captured: "
                + "; ".join(problems)
                + "; nothing was changed",
            )
            return
        try:
            snapshot = ctl.snapshot(LOGGING_SETTINGS)
        except (TargetError, psycopg.Error) as exc:
            self.finish("failed", error=f"{_said(exc, dsn)}; nothing was changed")
            return
        # committed before the first ALTER SYSTEM: a crash from here on is put back
        self.write(snapshot=snapshot.to_json(), phase="turning statement logging on")
        reader: LogReader | None = None
        stop = "done"
        until: tuple[str, datetime] | None = None
        timing: dict[str, Any] | None = None
        restored = "the logging settings were not touched"
        t0 = time.monotonic()
        try:
            try:
                ctl.apply(CAPTURE_SETTINGS)
                _check_prefix(dsn)
                time.sleep(SETTLE_S)  # our own connections' last lines fall before the window
                with _connect(dsn) as log_conn, _connect(_in_db(dsn, database)) as db_conn:
                    own = {session_id(log_conn), session_id(db_conn)}
                    before = pgss_counters(db_conn)
                    start = position(log_conn)
                    reader = LogReader(
                        start,
                        database=database,
                        limit=self.settings.capture_max_bytes,
                        own_sessions=own,
                    )
                    collect: dict[str, Any] = {
                        "start": start.to_json(),
                        "own_sessions": sorted(own),
                    }
                    if isinstance(before, str):
                        collect["pgss_note"] = before
                    else:
                        collect["pgss_before"] = {str(k): list(v) for k, v in before[0].items()}
                    self.write(collect=collect)
                    t0 = time.monotonic()
                    stop = self._wait(hb, reader, log_conn, seconds, t0)
                    until = clock(log_conn)
                    timing = _timing(db_conn, collect)
            finally:
                self.phase = "putting the logging settings back"
                restored = self._restore(ctl, snapshot, dsn)
        except LeaseLost:
            raise
        except Exception as exc:
            if hb.lost.is_set():
                raise LeaseLost from None
            known = (TargetError, LogAccessError, CaptureFailed, psycopg.Error)
            if isinstance(exc, known):
                said = _said(exc, dsn)
            else:  # its message might quote the log: the type only, here and in the log
                log.error("capture %s failed: %s", self.capture_id, type(exc).__name__)
                said = f"internal error ({type(exc).__name__})"
            self.finish("failed", error=f"{said}; {restored}")
            return
        if hb.lost.is_set():
            raise LeaseLost
        assert reader is not None
        assert until is not None
        elapsed = time.monotonic() - t0
        if stop == "cancelled":
            self.notes.append(
                f"cancelled after {elapsed:.0f} s of {seconds} s: the logging settings were "
                "restored; the capture keeps the statements logged until then"
            )
        elif stop == "truncated":
            self.notes.append(
                f"the log reached KNOBTUNE_CAPTURE_MAX_BYTES ({self.settings.capture_max_bytes:,} "
                f"bytes) after {elapsed:.0f} s of {seconds} s: collection stopped there and the "
                "logging settings were restored"
            )
        if restored == RESTORED:
            self.notes.append(f"{RESTORED} at {_hhmm(utcnow())} UTC")
        else:
            self.notes.append(restored)
        self._collect(
            dsn,
            database,
            reader,
            until,
            timing,
            "cancelled" if stop == "cancelled" else None,
            ok=restored == RESTORED,
        )

    def _wait(self, hb: Heartbeat, reader: LogReader, conn: Conn, seconds: int, t0: float) -> str:
        """Until ``seconds`` have passed, a cancel, a lost lease or a full log: which one."""
        deadline = t0 + seconds
        while True:
            left = deadline - time.monotonic()
            self.phase = (
                f"logging every statement: {seconds - max(0.0, left):.0f} of {seconds} s, "
                f"{reader.kept_bytes / 1e6:.1f} MB so far"
            )
            if left <= 0:
                return "done"
            hb.stop_bench.wait(min(POLL_S, left))
            if hb.lost.is_set():
                return "lost"
            if hb.cancel.is_set():
                return "cancelled"
            reader.poll(conn)
            if reader.truncated:
                return "truncated"

    def _restore(self, ctl: TargetController, snapshot: Snapshot, dsn: str) -> str:
        """Put the logging settings back as the snapshot had them; what was done, in words.

        Only the capture's settings: other ALTER SYSTEM entries are taken as they are now.
        A target that went down is waited for (target_retry_s).
        """
        deadline = time.monotonic() + self.settings.target_retry_s
        while True:
            try:
                now = ctl.snapshot([]).auto_conf
                merged = {n: v for n, v in now.items() if n not in LOGGING_SETTINGS}
                merged |= {n: v for n, v in snapshot.auto_conf.items() if n in LOGGING_SETTINGS}
                ctl.revert(Snapshot(auto_conf=merged, effective=snapshot.effective))
                return RESTORED
            except (TargetError, psycopg.Error) as exc:
                if time.monotonic() < deadline and ctl.wait_until_up(
                    max(1.0, deadline - time.monotonic())
                ):
                    time.sleep(1.0)
                    if time.monotonic() < deadline:
                        continue
                log.error("capture %s: restoring the logging settings failed", self.capture_id)
                return (
                    f"the logging settings could NOT be restored ({_said(exc, dsn)}): run "
                    + "; ".join(_restore_sql(snapshot))
                    + "; SELECT pg_reload_conf()"
                )

    # -- after a crash of the process that ran it -------------------------------------------
    def _resume(
        self,
        hb: Heartbeat,
        dsn: str,
        database: str,
        snapshot: Snapshot,
        collect: dict[str, Any] | None,
    ) -> None:
        ctl = TargetController(dsn)
        self.phase = "the service stopped during the capture: putting the logging settings back"
        until: tuple[str, datetime] | None = None
        timing: dict[str, Any] | None = None
        try:
            with _connect(dsn) as conn:
                until = clock(conn)
            if collect is not None:
                with _connect(_in_db(dsn, database)) as db_conn:
                    timing = _timing(db_conn, collect)
        except CaptureFailed as exc:
            log.warning("capture %s: before the restore: %s", self.capture_id, exc)
        restored = self._restore(ctl, snapshot, dsn)
        if hb.lost.is_set():
            raise LeaseLost
        at = _hhmm(utcnow())
        if restored != RESTORED:
            self.finish("failed", error=f"the service stopped during the capture; {restored}")
            return
        if collect is None or "start" not in collect:
            self.finish(
                "failed",
                error=f"the service stopped before the capture's window began; logging "
                f"restored at {at} UTC; nothing was captured",
            )
            return
        if until is None:
            self.finish(
                "failed",
                error=f"the service stopped during the capture; logging restored at {at} UTC; "
                "the target could not be reached before that, so the capture's window is "
                "unknown and nothing was collected",
            )
            return
        self.notes.append(
            f"the service stopped during the capture; logging restored at {at} UTC; the "
            "capture holds the statements until then"
        )
        reader = LogReader(
            LogPoint.from_json(collect["start"]),
            database=database,
            limit=self.settings.capture_max_bytes,
            own_sessions=set(collect.get("own_sessions") or []),
        )
        self._collect(dsn, database, reader, until, timing, None, ok=True)

    # -- the log -------------------------------------------------------------------------------
    def _collect(
        self,
        dsn: str,
        database: str,
        reader: LogReader,
        until: tuple[str, datetime],
        timing: dict[str, Any] | None,
        status: str | None,
        *,
        ok: bool,
    ) -> None:
        """Read the rest of the window, store the log and its summary, finish the row.

        ``ok``: the settings were put back (else the capture fails, keeping what it read).
        """
        self.phase = "collecting the log"
        time.sleep(SETTLE_S)  # what was logged before the restore reaches the file
        try:
            with _connect(dsn) as conn:
                reader.own_sessions.add(session_id(conn))
                reader.poll(conn, until=until[0], final=True)
        except (CaptureFailed, LogAccessError, psycopg.Error) as exc:
            self.finish(
                "failed",
                error=f"the log could not be read ({_said(exc, dsn)})"
                + ("; the logging settings were restored" if ok else ""),
            )
            return
        if reader.missing:
            self.notes.append(
                f"log files removed before they could be read: {', '.join(reader.missing)}"
            )
        if reader.truncated and not any("MAX_BYTES" in n for n in self.notes):
            self.notes.append(
                "the log reached KNOBTUNE_CAPTURE_MAX_BYTES: later statements are not in it"
            )
        self.phase = "storing the log"
        text = reader.text()
        stored = store.write_log(self.settings.work_dir, self.capture_id, text)
        self.phase = "summarizing"
        if reader.entries == 0:
            self.notes.append(
                f"nothing was logged in database {database!r} during the capture: is it the "
                "database the application uses?"
            )
        window = (until[1] - reader.start.at_utc).total_seconds()
        result = self._summary(text, database, timing, reader.truncated, max(0.0, window))
        error = None
        if not ok:  # the log is kept, but the failure to restore must stand out
            status, error = "failed", next(n for n in self.notes if "could NOT" in n)
        self.finish(
            status or "succeeded",
            error=error,
            summary=result,
            raw_bytes=len(text.encode("utf-8")),
            stored_bytes=stored,
            truncated=reader.truncated,
        )

    def _summary(
        self,
        text: str,
        database: str,
        timing: dict[str, Any] | None,
        truncated: bool,
        window_s: float,
    ) -> dict[str, Any]:
        if not text:
            return {"unavailable": "the capture holds no statement"}
        try:
            parsed = summaries.parse(text, database)
            return summaries.build(
                parsed,
                timing or summaries.not_measured("no reading"),
                truncated=truncated,
                window_s=window_s,
            )
        except summaries.LogFormatProblem as exc:
            return {"unavailable": f"the log could not be parsed: {exc}"}
        except Exception as exc:  # its message may quote the log: the type only
            log.warning("capture %s: no summary (%s)", self.capture_id, type(exc).__name__)
            return {"unavailable": f"internal error ({type(exc).__name__})"}


# -- helpers -----------------------------------------------------------------------------------
@contextlib.contextmanager
def _connect(dsn: str) -> Iterator[Conn]:
    try:
        conn = connect_target(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        raise CaptureFailed(f"cannot connect to the target: {_said(exc, dsn)}") from None
    with conn:
        yield conn


def _in_db(dsn: str, database: str) -> str:
    return make_conninfo(dsn, dbname=database)


def _check_prefix(dsn: str) -> None:
    """apply() verifies typed values only: the prefix (a string) is checked here."""
    with _connect(dsn) as conn:
        row = conn.execute("SELECT current_setting('log_line_prefix')").fetchone()
    if row is None or row[0] != LOG_PREFIX:
        raise CaptureFailed(
            "log_line_prefix did not take effect (a per-database or per-role setting may "
            "override it)"
        )


def _timing(db_conn: Conn, collect: dict[str, Any]) -> dict[str, Any]:
    """pg_stat_statements over the capture, by fingerprint, or why it was not measured."""
    if "pgss_before" not in collect:
        return summaries.not_measured(str(collect.get("pgss_note") or "no reading"))
    after = pgss_counters(db_conn, with_text=True)
    if isinstance(after, str):
        return summaries.not_measured(after)
    before = {int(k): (int(v[0]), float(v[1])) for k, v in collect["pgss_before"].items()}
    return summaries.timing_from(deltas(before, after[0], after[1]))


def _restore_sql(snapshot: Snapshot) -> list[str]:
    out = []
    for name in LOGGING_SETTINGS:
        if name in snapshot.auto_conf:
            value = snapshot.auto_conf[name].replace("'", "''")
            out.append(f"ALTER SYSTEM SET {name} = '{value}'")
        else:
            out.append(f"ALTER SYSTEM RESET {name}")
    return out


def _said(exc: BaseException, dsn: str) -> str:
    """An error's first line, passwords masked, cut short (a driver error may quote SQL)."""
    if isinstance(exc, psycopg.Error):
        diag = exc.diag
        text = diag.message_primary or str(exc)
        return scrub(f"{exc.sqlstate or 'error'}: {' '.join(text.split())}", dsn)[:300]
    return scrub(" ".join(str(exc).split()), dsn)[:500]


def _hhmm(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%H:%M:%S")
