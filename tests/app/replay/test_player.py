"""The replay player on a real sandbox, driven as pgbench is (app/postgres/pgbench.py):
order, labels, failures, speed, a stop, and a plan that never touches the disk."""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from app.captures.logparse import parse_log, plan_bytes, window
from app.postgres import privilege
from app.postgres.pgbench import BenchResult, run_bench
from app.postgres.sandbox import Sandbox
from app.replay.plan import ReplayRun
from app.workloads.base import Script, Stream
from app.workloads.stream_run import bench_spec, stream_stat
from tests.app.replay.logs import stderr_log

DB = "replay_player"
SECRET = "s3cr3t-literal-7f1e"  # a value of the user's: never on disk, never in a label


@pytest.fixture(scope="module")
def dsn(sandbox: Sandbox) -> Iterator[str]:
    """The bench role's DSN on a database of its own (made for it by the superuser: the
    role may not create databases)."""
    with psycopg.connect(sandbox.dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB}")
        conn.execute(f"CREATE DATABASE {DB} OWNER knobtune_bench")
    out = sandbox.bench_dsn.replace("dbname=knobtune", f"dbname={DB}")
    with psycopg.connect(out, autocommit=True) as conn:
        conn.execute("CREATE TABLE seen (id serial PRIMARY KEY, who text, n int, v text)")
    yield out
    with psycopg.connect(sandbox.dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


@pytest.fixture
def empty(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE seen RESTART IDENTITY")
    return dsn


def replay_stream(text: str, *, speed: float = 1.0, duration_s: float = 30.0) -> Stream:
    """The stream of a whole log (labels as scripts, every call a weight)."""
    parsed = parse_log(text)
    start = min(st.at_s for st in parsed.statements)
    end = start + duration_s * speed
    win = window(parsed, start_s=start, end_s=end)
    return Stream(
        name="replay",
        scripts=tuple(
            Script(parsed.labels[i].text, parsed.labels[i].text, max(1, c))
            for i, c in zip(win.labels, win.calls, strict=True)
        ),
        clients=win.peak_sessions,
        replay=ReplayRun(plan_bytes(parsed, start_s=start, end_s=end), speed, DB),
    )


def run(dsn: str, stream: Stream, *, duration_s: int = 5, **kw: Any) -> BenchResult:
    spec = bench_spec(stream, duration_s=duration_s, warmup_s=0)
    return run_bench(dsn, spec, **kw)


def _player_uids() -> set[int]:
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"app.replay.player" in cmd:
                status = Path(f"/proc/{pid}/status").read_text()
                m = re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE)
                if m:
                    out.add(int(m.group(1)))
        except OSError:
            continue
    return out


def test_statements_run_in_session_order_with_labels_and_failures(empty: str) -> None:
    # two sessions interleaved 60 ms apart; b's third statement fails (no such table)
    a = [(0.06 * k * 2, f"INSERT INTO seen (who, n) VALUES ('a', {k})") for k in range(5)]
    b = [(0.06 * (k * 2 + 1), f"INSERT INTO seen (who, n) VALUES ('b', {k})") for k in range(5)]
    b[2] = (b[2][0], "SELECT * FROM no_such_table")
    text = stderr_log([a, b])
    stream = replay_stream(text)
    uids: set[int] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            uids.update(_player_uids())
            time.sleep(0.01)

    w = threading.Thread(target=watch)
    w.start()
    try:
        r = run(empty, stream)
    finally:
        done.set()
        w.join()
    assert r.ok, r.error
    with psycopg.connect(empty) as conn:
        rows = conn.execute("SELECT who, n FROM seen ORDER BY id").fetchall()
    assert [n for w, n in rows if w == "a"] == [0, 1, 2, 3, 4]
    assert [n for w, n in rows if w == "b"] == [0, 1, 3, 4]
    # the captured schedule interleaves them: a0 b0 a1 b1 a2 a3 b3 a4 b4
    assert [w for w, _ in rows] == list("ababaabab")
    # pgbench's summary and per-statement log, read by pgbench.py's own parsers
    assert r.summary is not None
    assert r.summary.transactions == 9
    assert r.failed_transactions == 1
    assert r.tx is not None
    assert sorted(set(r.tx.client.tolist())) == [0, 1]
    for client in (0, 1):
        mine = r.tx.txno[r.tx.client == client].tolist()
        # transaction numbers from 1 per session (b's failed third has no latency line)
        assert sorted(mine) == ([1, 2, 3, 4, 5] if client == 0 else [1, 2, 4, 5])
    stat = stream_stat(stream, r, 0.0)
    assert stat is not None
    by = {s.label: s for s in stat.scripts}
    insert = by["INSERT INTO seen (who, n) VALUES ($1, $2)"]
    assert insert.n == 9
    assert insert.failed == 0
    assert by["SELECT * FROM no_such_table"].failed == 1
    assert by["SELECT * FROM no_such_table"].n == 0
    # as the unprivileged run-as user, when the service is root (as pgbench runs)
    if privilege.dropping():
        assert uids == {pwd.getpwnam(privilege.child_identity().name).pw_uid}


def test_extended_protocol_statements_run_with_their_parameters(empty: str) -> None:
    sql = "INSERT INTO seen (who, n, v) VALUES ($1, $2::int, $3)"
    s = [
        (0.0, sql, ["x", "1", "it's"], "S_1"),
        (0.05, sql, ["x", "2", None], "S_1"),
        (0.1, sql, ["y", "3", "multi\nline"], None),
        (0.15, "SELECT $1::int / 0", ["1"], None),  # fails: division by zero
    ]
    stream = replay_stream(stderr_log([s]))
    r = run(empty, stream)
    assert r.ok, r.error
    with psycopg.connect(empty) as conn:
        rows = conn.execute("SELECT who, n, v FROM seen ORDER BY id").fetchall()
    assert rows == [("x", 1, "it's"), ("x", 2, None), ("y", 3, "multi\nline")]
    assert r.failed_transactions == 1
    # the server's message about the failed statement is not passed on, only its SQLSTATE
    assert r.error is None


@pytest.mark.parametrize("speed", [1.0, 2.0])
def test_the_speed_factor_is_respected(empty: str, speed: float) -> None:
    # a 2 s capture: one statement every 0.1 s in each of two sessions
    s = [[(0.1 * k, f"SELECT {i}") for k in range(21)] for i in range(2)]
    stream = replay_stream(stderr_log(s), speed=speed)
    r = run(empty, stream)
    assert r.ok, r.error
    assert r.tx is not None
    span = float(r.tx.start_s.max() - r.tx.start_s.min())
    assert span == pytest.approx(2.0 / speed, abs=0.15)
    # the run ends when the plan is done, not at -T
    assert r.duration_s < 2.0 / speed + 2.5
    # behind schedule by less than a few ms on average (the player's lag)
    lags = [p.lag_ms for p in r.progress if p.lag_ms is not None and p.tps > 0]
    assert lags
    assert max(lags) < 50


def test_a_stop_ends_the_replay_promptly(empty: str) -> None:
    s = [[(float(k), "SELECT pg_sleep(5)") for k in range(10)] for _ in range(2)]
    stream = replay_stream(stderr_log(s))
    stop = threading.Event()
    threading.Timer(1.5, stop.set).start()
    t0 = time.monotonic()
    r = run(empty, stream, duration_s=20, stop=stop)
    took = time.monotonic() - t0
    assert r.stopped
    assert not r.ok
    assert took < 5.0  # not the 5 s sleeps, let alone the 20 s run
    with psycopg.connect(empty) as conn:  # the sleeps were cancelled, not left running
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(5)'"
            ).fetchone()
            if row and row[0] == 0:
                break
            time.sleep(0.1)
        assert row is not None
        assert row[0] == 0


def test_the_plan_never_reaches_the_disk(empty: str, tmp_path: Path) -> None:
    s = [[(0.05 * k, f"INSERT INTO seen (who, v) VALUES ('p', '{SECRET}')") for k in range(40)]]
    stream = replay_stream(stderr_log(s))
    assert stream.replay is not None
    assert SECRET.encode() in stream.replay.plan
    assert SECRET not in repr(stream)  # nor in a log line that prints the stream
    assert all(SECRET not in sc.name for sc in stream.scripts)
    found: list[str] = []
    seen_files: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for root, _, files in os.walk(tmp_path):
                for f in files:
                    path = os.path.join(root, f)
                    seen_files.add(f)
                    try:
                        if SECRET.encode() in Path(path).read_bytes():
                            found.append(path)
                    except OSError:
                        pass
            time.sleep(0.02)

    w = threading.Thread(target=watch)
    w.start()
    try:
        r = run(empty, stream, workdir=tmp_path)
    finally:
        done.set()
        w.join()
    assert r.ok, r.error
    assert r.summary is not None
    assert r.summary.transactions == 40
    assert not found
    # the plan is not on the player's command line either
    with psycopg.connect(empty) as conn:
        row = conn.execute("SELECT count(*) FROM seen WHERE v = %s", [SECRET]).fetchone()
    assert row == (40,)


def test_the_player_imports_nothing_heavy() -> None:
    code = "import sys, app.replay.player; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    loaded = {m.split(".")[0] for m in out}
    assert "psycopg" in loaded
    for heavy in ("fastapi", "sqlalchemy", "pglast", "numpy", "pydantic", "scipy", "optimizer"):
        assert heavy not in loaded, heavy
    assert not [m for m in out if m.startswith("app.") and not m.startswith("app.replay")]
