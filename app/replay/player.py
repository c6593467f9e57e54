"""The replay player: runs a captured workload's plan and reports as pgbench does.

    python -m app.replay.player -T SECONDS --database DB --log-prefix PATH [--speed X]
        [--sampling-rate R] < plan

The plan (app/replay/plan.py) comes on stdin and is never written anywhere. Connection
parameters come from libpq's environment (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGAPPNAME,
PGOPTIONS ...), as pgbench gets them; the database from ``--database``.

How it replays. Each captured session is one connection and one thread: it connects at
its captured start / speed and runs its statements in order, each not before its
captured offset / speed; a statement that is due while the previous one still runs
starts at once, and how late it started is its *lag*. Statements run in autocommit mode,
so the captured BEGIN/COMMIT drive transactions as they did; ``statement:`` lines go as
one simple query (several statements in one string included), ``execute`` lines by the
extended protocol with their parameters as text (a named prepared statement is prepared
once per session, so the plan cache behaves as it did). The run ends at ``-T`` seconds
as pgbench's does (statements in flight finish, the rest are not started, connections
close) or when every statement has run. SIGINT/SIGTERM end it at once: statements in
flight are cancelled.

What it writes, in pgbench 15's formats, so that app/postgres/pgbench.py reads it as it
reads pgbench:

* every second on stderr: ``progress: 3.0 s, 812.4 tps, lat 1.234 ms stddev 0.456,
  0 failed, lag 0.012 ms`` (tps: statements completed in that second);
* a per-statement log ``<log-prefix>.<pid>``, one line per statement: ``client_id
  transaction_no time_us script_no time_epoch time_us`` (client_id: the captured
  session's index; transaction_no from 1 per session; script_no: the statement's label in
  the stream; the time stamp is when it ended). A failed statement is logged as pgbench
  15 logs a failed transaction: ``failed`` in place of its time;
* at the end on stdout: pgbench's summary (statements processed, failed, latency
  average, tps).

Its messages never carry a statement, a parameter or a server message about one (those
hold the user's data): a failed statement shows only as a count and its SQLSTATE.

Stdlib and psycopg only: it starts once per benchmark run, as the unprivileged user.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

from psycopg import pq
from psycopg.conninfo import make_conninfo
from psycopg.pq.abc import PGcancel, PGconn, PGresult

from app.replay.plan import Plan, PlanError, PlanSession, PlanStatement, decode

_OK = {pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK, pq.ExecStatus.EMPTY_QUERY}
_TICK_S = 0.05  # how often the main thread looks at the clock, launches, and reports
_IDLE_POLL_S = 0.1
_CANCEL_GRACE_S = 1.0  # after a stop signal: how long statements cancelled may take to end


class _Tally:
    """Counters of completed statements: per progress interval and in all."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.n = 0
        self.lat = 0.0
        self.lat2 = 0.0
        self.failed = 0
        self.lag = 0.0
        self.lagged = 0
        self.total_n = 0
        self.total_lat = 0.0
        self.total_lat2 = 0.0
        self.total_failed = 0
        self.connects = 0
        self.connect_s = 0.0
        self.connect_failures = 0
        self.aborted = 0  # sessions that lost their connection
        self.sqlstates: dict[str, int] = {}

    def add(self, latency_s: float | None, lag_s: float, sqlstate: str | None = None) -> None:
        with self.lock:
            self.lag += lag_s
            self.lagged += 1
            if latency_s is None:
                self.failed += 1
                self.total_failed += 1
                key = sqlstate or "-----"
                self.sqlstates[key] = self.sqlstates.get(key, 0) + 1
                return
            ms = latency_s * 1000.0
            self.n += 1
            self.lat += ms
            self.lat2 += ms * ms
            self.total_n += 1
            self.total_lat += ms
            self.total_lat2 += ms * ms

    def interval(self) -> tuple[int, float, float, int, float]:
        """(completed, mean ms, stddev ms, failed, mean lag ms) since the last call."""
        with self.lock:
            n, lat, lat2, failed, lag, lagged = (
                self.n,
                self.lat,
                self.lat2,
                self.failed,
                self.lag,
                self.lagged,
            )
            self.n, self.lat, self.lat2, self.failed, self.lag, self.lagged = 0, 0.0, 0.0, 0, 0.0, 0
        mean, sd = _mean_sd(n, lat, lat2)
        return n, mean, sd, failed, (lag * 1000.0 / lagged if lagged else 0.0)


def _mean_sd(n: int, total: float, total2: float) -> tuple[float, float]:
    if n == 0:
        return 0.0, 0.0
    mean = total / n
    return mean, math.sqrt(max(0.0, total2 / n - mean * mean))


class _Player:
    def __init__(
        self,
        plan: Plan,
        *,
        duration_s: float,
        speed: float,
        database: str,
        sampling: float,
    ) -> None:
        self.plan = plan
        self.speed = speed
        self.conninfo = make_conninfo("", dbname=database).encode()
        self.sampling = sampling
        self.duration_s = duration_s
        self.tally = _Tally()
        self.halt = threading.Event()  # no statement starts any more (-T, or a signal)
        self.exhausted = threading.Event()  # every session ran its last statement
        self.signalled: int | None = None
        self.t0 = 0.0
        self.deadline = 0.0
        self._left_lock = threading.Lock()
        self._left = sum(1 for s in plan.sessions if s.statements)
        self.threads: list[_Client] = []
        self.go = threading.Event()  # the clock has started (sessions connected early wait)
        self._early_left = 0
        self._early_done = threading.Event()

    def connected_early(self) -> None:
        with self._left_lock:
            self._early_left -= 1
            if self._early_left <= 0:
                self._early_done.set()

    # -- the clock ---------------------------------------------------------------------
    def due(self, at_s: float) -> float:
        return self.t0 + at_s / self.speed

    def wait_until(self, t: float) -> bool:
        """Sleep until ``t``; False when no statement may start any more."""
        while True:
            if self.halt.is_set():
                return False
            now = time.monotonic()
            if now >= self.deadline:
                return False
            if now >= t:
                return True
            self.halt.wait(min(t, self.deadline) - now)

    def hold_until(self, t: float | None) -> None:
        """An idle connection stays open until ``t`` (its captured end), the run's end,
        or the last statement of the whole plan."""
        while not self.halt.is_set() and not self.exhausted.is_set():
            now = time.monotonic()
            end = self.deadline if t is None else min(t, self.deadline)
            if now >= end:
                return
            self.halt.wait(min(end - now, _IDLE_POLL_S))

    def finished_statements(self) -> None:
        with self._left_lock:
            self._left -= 1
            if self._left <= 0:
                self.exhausted.set()

    # -- the run -----------------------------------------------------------------------
    def run(self) -> int:
        # Sessions open when the window starts were connected in the capture already:
        # they connect first, as pgbench's clients do, and the clock starts once they
        # are (a connection costs ms of CPU: 200 at once took ~2 s here, all of it lag
        # had they connected on the clock). Later sessions connect on their schedule.
        ordered = sorted(self.plan.sessions, key=lambda s: s.start_s)
        early = [s for s in ordered if s.start_s <= 0]
        pending = ordered[len(early) :]
        self._early_left = len(early)
        if not early:
            self._early_done.set()
        for s in early:
            c = _Client(self, s, early=True)
            self.threads.append(c)
            c.start()
        while not self._early_done.wait(_TICK_S):
            if self.signalled is not None:
                break
        self.t0 = time.monotonic()
        self.deadline = self.t0 + self.duration_s
        self.go.set()
        if self._left == 0:
            self.exhausted.set()
        k = 0  # next session to launch
        reported = 0
        while True:
            now = time.monotonic()
            if self.signalled is not None:
                self.halt.set()
                self._cancel_all()
                break
            if now >= self.deadline:
                self.halt.set()
            while k < len(pending) and not self.halt.is_set():
                s = pending[k]
                if self.due(s.start_s) > now + _TICK_S:
                    break
                c = _Client(self, s)
                self.threads.append(c)
                c.start()
                k += 1
            if self.halt.is_set() and k < len(pending):
                for s in pending[k:]:  # never launched: nothing of theirs runs
                    if s.statements:
                        self.finished_statements()
                k = len(pending)
            while now - self.t0 >= reported + 1.0:
                reported += 1
                self._progress(float(reported))
            if k == len(pending) and not any(t.is_alive() for t in self.threads):
                break
            time.sleep(_TICK_S)
        if self.signalled is not None:
            end = time.monotonic() + _CANCEL_GRACE_S
            for t in self.threads:
                t.join(timeout=max(0.0, end - time.monotonic()))
            return 128 + self.signalled
        # a plan that ended before -T: its last, partial second is reported too (pgbench
        # never ends early, so it never has one)
        now = time.monotonic() - self.t0
        if now - reported >= 0.05:
            self._progress(round(now, 1), now - reported)
        return 0

    def _cancel_all(self) -> None:
        for t in self.threads:
            t.cancel()

    def _progress(self, at: float, seconds: float = 1.0) -> None:
        n, mean, sd, failed, lag = self.tally.interval()
        # pgbench 15's line; with -R it adds the lag (how late statements started)
        print(
            f"progress: {at:.1f} s, {n / seconds:.1f} tps, lat {mean:.3f} ms stddev {sd:.3f}, "
            f"{failed} failed, lag {lag:.3f} ms",
            file=sys.stderr,
            flush=True,
        )

    # -- the end -----------------------------------------------------------------------
    def write_log(self, prefix: str) -> None:
        rows: list[tuple[float, int, int, int | None, int]] = []
        for t in self.threads:
            rows.extend(t.logged)
        rows.sort(key=lambda r: r[0])
        with open(f"{prefix}.{os.getpid()}", "w") as f:
            for end, client, txno, lat_us, script in rows:
                sec = int(end)
                usec = min(999_999, round((end - sec) * 1e6))
                took = "failed" if lat_us is None else str(lat_us)
                f.write(f"{client} {txno} {took} {script} {sec} {usec}\n")

    def summary(self, elapsed_s: float) -> str:
        t = self.tally
        done = t.total_n + t.total_failed
        mean, sd = _mean_sd(t.total_n, t.total_lat, t.total_lat2)
        pct = 100.0 * t.total_failed / done if done else 0.0
        conn_ms = 1000.0 * t.connect_s / t.connects if t.connects else 0.0
        tps = t.total_n / elapsed_s if elapsed_s > 0 else 0.0
        clients = len(self.plan.sessions)
        return "\n".join(
            [
                "transaction type: replay of a captured workload",
                "scaling factor: 1",
                "query mode: simple",
                f"number of clients: {clients}",
                f"number of threads: {clients}",
                "maximum number of tries: 1",
                f"duration: {round(self.duration_s)} s",
                f"number of transactions actually processed: {t.total_n}",
                f"number of failed transactions: {t.total_failed} ({pct:.3f}%)",
                f"latency average = {mean:.3f} ms",
                f"latency stddev = {sd:.3f} ms",
                f"initial connection time = {conn_ms:.3f} ms",
                f"tps = {tps:.6f} (without initial connection time)",
            ]
        )


class _Client(threading.Thread):
    """One captured session: one connection, its statements in order."""

    def __init__(self, player: _Player, session: PlanSession, *, early: bool = False) -> None:
        super().__init__(name=f"replay-{session.client}", daemon=True)
        self.p = player
        self.s = session
        self.early = early  # open before the window: connected before the clock starts
        self.logged: list[tuple[float, int, int, int | None, int]] = []
        self._cancel: PGcancel | None = None
        self._txno = 0
        self._counted = False

    def cancel(self) -> None:
        c = self._cancel
        if c is not None:
            with contextlib.suppress(Exception):  # the connection is gone already
                c.cancel()

    def _record(
        self, script: int, latency_s: float | None, lag_s: float, state: str | None
    ) -> None:
        self._txno += 1
        self.p.tally.add(latency_s, lag_s, state)
        if self.p.sampling < 1.0 and random.random() >= self.p.sampling:  # noqa: S311
            return
        lat_us = None if latency_s is None else round(latency_s * 1e6)
        self.logged.append((time.time(), self.s.client, self._txno, lat_us, script))

    def run(self) -> None:
        p, s = self.p, self.s
        try:
            if self.early:
                conn = self._connect()
                p.connected_early()
                p.go.wait()
            elif p.wait_until(p.due(s.start_s)):
                conn = self._connect()
            else:
                return
            if conn is None:
                self._connect_failed()
                return
            try:
                conn.notice_handler = _ignore  # NOTICEs would carry the user's data to stderr
                self._cancel = conn.get_cancel()
                self._statements(conn)
                self._ran_all()
                p.hold_until(None if s.end_s is None else p.due(s.end_s))
            finally:
                self._cancel = None
                conn.finish()
        finally:
            self._ran_all()

    def _ran_all(self) -> None:
        """This session has no statement left to start (counted once)."""
        if self.s.statements and not self._counted:
            self._counted = True
            self.p.finished_statements()

    def _statements(self, conn: PGconn) -> None:
        p = self.p
        prepared: dict[tuple[str, str], bytes] = {}
        for st in self.s.statements:
            due = p.due(st.at_s)
            if not p.wait_until(due):
                return
            start = time.monotonic()
            state = _execute(conn, st, prepared)
            took = time.monotonic() - start
            if state is not None and p.signalled is not None:
                return  # cancelled by the stop: not a failure of the config
            self._record(
                st.script, None if state is not None else took, max(0.0, start - due), state
            )
            if conn.status != pq.ConnStatus.OK:
                # the server ended the connection (crashed, or terminated it): as pgbench
                # aborts a client that lost its connection, the run is marked aborted
                with p.tally.lock:
                    p.tally.aborted += 1
                return

    def _connect(self) -> PGconn | None:
        p = self.p
        t = time.monotonic()
        conn = pq.PGconn.connect(p.conninfo)
        if conn.status != pq.ConnStatus.OK:
            message = conn.get_error_message()
            conn.finish()
            with p.tally.lock:
                p.tally.connect_failures += 1
                first = p.tally.connect_failures == 1
            if first:
                # libpq's message: host, port, user and the server's reason; no password
                text = " ".join(str(message).split())[:300]
                print(f"replay: error: connection failed: {text}", file=sys.stderr, flush=True)
            return None
        with p.tally.lock:
            p.tally.connects += 1
            p.tally.connect_s += time.monotonic() - t
        return conn

    def _connect_failed(self) -> None:
        """Its statements could not run: each counts as failed (pgbench would abort the
        client; a replay goes on with the other sessions, and says so)."""
        p = self.p
        for st in self.s.statements:
            if p.due(st.at_s) >= p.deadline:
                break
            self._record(st.script, None, 0.0, "08006")


def _ignore(_res: PGresult) -> None:
    return None


def _state(res: PGresult) -> str:
    raw = res.error_field(pq.DiagnosticField.SQLSTATE)
    return raw.decode("ascii", "replace") if raw else "-----"


def _execute(conn: PGconn, st: PlanStatement, prepared: dict[tuple[str, str], bytes]) -> str | None:
    """Run one statement; None when it succeeded, else its SQLSTATE."""
    sql = st.sql.encode()
    if st.params is None:
        res = conn.exec_(sql)
    else:
        values = [None if v is None else v.encode() for v in st.params]
        if st.name is None:
            res = conn.exec_params(sql, values)
        else:
            key = (st.name, st.sql)
            name = prepared.get(key)
            if name is None:
                name = f"knobtune_{len(prepared)}".encode()
                made = conn.prepare(name, sql)
                if made.status != pq.ExecStatus.COMMAND_OK:
                    return _state(made)
                prepared[key] = name
            res = conn.exec_prepared(name, values)  # type: ignore[arg-type]  # None: NULL
    return _outcome(conn, res)


def _outcome(conn: PGconn, res: PGresult) -> str | None:
    """None when ``res`` (and what a COPY brings after it) succeeded, else the SQLSTATE."""
    status = res.status
    if status == pq.ExecStatus.COPY_OUT:
        while conn.get_copy_data(0)[0] >= 0:
            pass
    elif status == pq.ExecStatus.COPY_IN:
        # the rows a COPY FROM STDIN sent are not in the log: it cannot be replayed
        conn.put_copy_end(b"knobtune: the captured COPY data is not in the log")
    else:
        return None if status in _OK else _state(res)
    state: str | None = None
    while (more := conn.get_result()) is not None:
        if more.status not in _OK and state is None:
            state = _state(more)
    return state


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m app.replay.player",
        description="Replay a captured workload's plan (on stdin) in pgbench's formats.",
    )
    ap.add_argument("-T", dest="duration", type=float, required=True, help="seconds to run")
    ap.add_argument("--speed", type=float, default=1.0, help="2 replays twice as fast")
    ap.add_argument("--database", required=True, help="where the statements run")
    ap.add_argument("--log-prefix", required=True, help="the per-statement log's prefix")
    ap.add_argument("--sampling-rate", type=float, default=1.0, help="fraction logged")
    args = ap.parse_args(argv)
    if not (math.isfinite(args.duration) and args.duration > 0):
        ap.error("-T must be > 0")
    if not (math.isfinite(args.speed) and 0 < args.speed <= 1000):
        ap.error("--speed must be in (0, 1000]")
    if not 0 < args.sampling_rate <= 1:
        ap.error("--sampling-rate must be in (0, 1]")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _args(argv)
    try:
        plan = decode(sys.stdin.buffer.read())
    except PlanError as exc:
        print(f"replay: error: {exc}", file=sys.stderr, flush=True)
        return 1
    if plan.statements == 0:
        print("replay: error: the plan holds no statement", file=sys.stderr, flush=True)
        return 1
    player = _Player(
        plan,
        duration_s=args.duration,
        speed=args.speed,
        database=args.database,
        sampling=args.sampling_rate,
    )

    def stop(signum: int, _frame: FrameType | None) -> None:
        player.signalled = signum
        player.halt.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    t = time.monotonic()
    code = player.run()
    elapsed = time.monotonic() - t
    player.write_log(args.log_prefix)
    tally = player.tally
    if tally.sqlstates:
        said = ", ".join(f"{k} x{v}" for k, v in sorted(tally.sqlstates.items()))
        print(f"replay: {tally.total_failed} statement(s) failed: {said}", file=sys.stderr)
    if tally.connects == 0 and tally.connect_failures and code == 0:
        print("replay: error: no session could connect", file=sys.stderr, flush=True)
        code = 1
    if tally.aborted and code == 0:
        print(
            f"replay: error: {tally.aborted} session(s) lost their connection\n"
            "Run was aborted; the above results are incomplete.",
            file=sys.stderr,
            flush=True,
        )
        code = 2
    print(player.summary(elapsed), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
