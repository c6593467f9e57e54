"""Parsing a captured log (app/captures/logparse.py): a real server's log, written with the
capture's settings after psql and psycopg work, in both formats (stderr and csvlog)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from app.captures.logparse import (
    LABEL_MAX,
    LogFormatError,
    ParsedLog,
    label_text,
    parse_log,
    parse_params,
    plan_bytes,
    statement_kind,
    window,
)
from app.postgres.connect import libpq_env
from app.postgres.sandbox import Sandbox
from app.replay.plan import decode
from tests.app.replay.logs import stderr_log

# what a knobtune capture switches on (pgreplay's convention), both formats at once
CAPTURE = {
    "log_statement": "all",
    "log_connections": "on",
    "log_disconnections": "on",
    "log_line_prefix": "%m|%u|%d|%c|",
    "lc_messages": "C",
    "logging_collector": "on",
    "log_destination": "stderr,csvlog",
    "log_directory": "log",
    "log_filename": "capture",
}
SECRETS = ("alice@example.com", "4242", "hunter2", "multi-line secret", "o'brien")
MULTI_LINE = "SELECT n,\n       'alice@example.com' AS who\nFROM items\nWHERE n > 4242\nORDER BY n;"


def _psql(sb: Sandbox, sql: str, tmp: Path) -> None:
    script = tmp / "work.sql"
    script.write_text(sql)
    psql = sb.bindir / "psql"
    env = {**os.environ, **libpq_env(sb.bench_dsn)}
    subprocess.run(
        [str(psql), "-X", "-q", "-v", "ON_ERROR_STOP=0", "-f", str(script)],
        env=env,
        check=True,
        capture_output=True,
    )


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(stderr log, csvlog) of a sandbox after psql and psycopg work."""
    tmp = tmp_path_factory.mktemp("capture")
    with Sandbox.create(settings=CAPTURE) as sb:
        with psycopg.connect(sb.bench_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE items (n int PRIMARY KEY, who text)")
        _psql(
            sb,
            "INSERT INTO items VALUES (4242, 'alice@example.com');\n"
            + MULTI_LINE
            + "\nSELECT * FROM no_such_table WHERE who = 'hunter2';\n"
            "BEGIN;\nSELECT * FROM items WHERE n = 4242 FOR UPDATE;\n"
            "UPDATE items SET who = 'o''brien' WHERE n = 4242;\nCOMMIT;\n",
            tmp,
        )
        with psycopg.connect(sb.bench_dsn, autocommit=True) as conn:
            q = "INSERT INTO items (n, who) VALUES (%s, %s)"
            conn.execute(q, (1, "multi-line secret\nsecond line"), prepare=True)
            conn.execute(q, (2, None), prepare=True)
            conn.execute("SELECT count(*) FROM items WHERE who = %s", ("o'brien",))
            # two statements in one simple query string
            conn.execute("SELECT 1; SELECT 'hunter2'")
        with psycopg.connect(sb.dsn, autocommit=True) as conn:  # another database
            conn.execute("SELECT 'postgres database' AS other")
        log_dir = sb.data_dir / "log"
        deadline = time.monotonic() + 20
        while True:  # the collector writes on its own time: wait for the last disconnection
            text = (log_dir / "capture").read_text(errors="replace")
            csv = (log_dir / "capture.csv").read_text(errors="replace")
            if text.count("disconnection:") >= 4 and csv.count("disconnection:") >= 4:
                break
            assert time.monotonic() < deadline, "the server did not log the disconnections"
            time.sleep(0.2)
        yield text, csv


def _bench(parsed: ParsedLog) -> list[str]:
    return [st.sql for st in parsed.statements]


def test_sessions_and_statements_in_order(logs: tuple[str, str]) -> None:
    text, _ = logs
    parsed = parse_log(text, database="knobtune")
    assert parsed.format == "stderr"
    assert {s.database for s in parsed.sessions} == {"knobtune"}
    assert {s.user for s in parsed.sessions} == {"knobtune_bench"}
    assert len(parsed.sessions) == 3  # CREATE TABLE, psql, psycopg
    assert all(s.end_s is not None and s.end_s >= s.start_s for s in parsed.sessions)
    sqls = _bench(parsed)
    assert sqls[0].startswith("CREATE TABLE items")
    # psql sends the multi-line statement as it is: its lines come back intact
    assert MULTI_LINE in sqls
    i = sqls.index("SELECT * FROM no_such_table WHERE who = 'hunter2';")
    assert sqls[i + 1 : i + 5] == [
        "BEGIN;",
        "SELECT * FROM items WHERE n = 4242 FOR UPDATE;",
        "UPDATE items SET who = 'o''brien' WHERE n = 4242;",
        "COMMIT;",
    ]
    # the capture's failure: that statement, and only it
    failed = [st.sql for st in parsed.statements if st.failed_in_capture]
    assert failed == ["SELECT * FROM no_such_table WHERE who = 'hunter2';"]
    assert [st.at_s for st in parsed.statements] == sorted(st.at_s for st in parsed.statements)
    assert parsed.statements[0].at_s >= 0
    assert parsed.duration_s >= parsed.statements[-1].at_s
    assert parsed.ignored_lines > 0  # connection received, authenticated, the other db ...
    assert parsed.unparsed_statements == 0


def test_extended_protocol_statements_carry_their_parameters(logs: tuple[str, str]) -> None:
    parsed = parse_log(logs[0], database="knobtune")
    ext = [st for st in parsed.statements if st.extended]
    inserts = [st for st in ext if st.sql.startswith("INSERT INTO items (n, who)")]
    assert [st.params for st in inserts] == [("1", "multi-line secret\nsecond line"), ("2", None)]
    assert {st.name for st in inserts} == {"_pg3_0"}  # psycopg's prepared statement
    (count,) = [st for st in ext if st.sql.startswith("SELECT count(*)")]
    assert count.params == ("o'brien",)
    assert count.name is None  # the unnamed statement
    assert inserts[0].label == inserts[1].label


def test_labels_group_by_shape_and_never_show_a_literal(logs: tuple[str, str]) -> None:
    parsed = parse_log(logs[0], database="knobtune")
    texts = [lb.text for lb in parsed.labels]
    for t in texts:
        assert len(t) <= LABEL_MAX
        for secret in SECRETS:
            assert secret not in t, t
    assert len(set(texts)) == len(texts)
    by = {lb.text: lb for lb in parsed.labels}
    assert by["SELECT n, $1 AS who FROM items WHERE n > $2 ORDER BY n"].kind == "read"
    assert by["SELECT * FROM items WHERE n = $1 FOR UPDATE"].kind == "read"
    assert by["UPDATE items SET who = $1 WHERE n = $2"].kind == "write"
    assert by["INSERT INTO items (n, who) VALUES ($1, $2)"].kind == "write"
    assert by["INSERT INTO items (n, who) VALUES ($1, $2)"].calls == 2
    assert by["BEGIN"].kind == "other"
    assert by["SELECT * FROM no_such_table WHERE who = $1"].failed_in_capture == 1
    assert by["SELECT $1; SELECT $2"].calls == 1
    # ordered by calls, most first
    calls = [lb.calls for lb in parsed.labels]
    assert calls == sorted(calls, reverse=True)
    # every statement points at its label
    for st in parsed.statements:
        assert 0 <= st.label < len(parsed.labels)


def test_csvlog_gives_what_the_stderr_log_gives(logs: tuple[str, str]) -> None:
    text, csv = logs
    a = parse_log(text, database="knobtune")
    b = parse_log(csv, database="knobtune")
    assert b.format == "csvlog"
    assert [(st.sql, st.params, st.failed_in_capture, st.extended) for st in b.statements] == [
        (st.sql, st.params, st.failed_in_capture, st.extended) for st in a.statements
    ]
    assert [lb.text for lb in b.labels] == [lb.text for lb in a.labels]
    assert [(s.key, s.user) for s in b.sessions] == [(s.key, s.user) for s in a.sessions]
    assert b.started_at == a.started_at


def test_the_database_filter(logs: tuple[str, str]) -> None:
    everything = parse_log(logs[0])
    assert {s.database for s in everything.sessions} == {"knobtune", "postgres"}
    assert any("postgres database" in st.sql for st in everything.statements)
    only = parse_log(logs[0], database="knobtune")
    assert not any("postgres database" in st.sql for st in only.statements)
    assert everything.databases()[0] == "knobtune"


def test_garbage_is_a_line_numbered_error_that_never_quotes_the_log() -> None:
    with pytest.raises(LogFormatError, match=r"^line 1: ") as exc:
        parse_log("SELECT secret_value FROM t\n")
    assert "secret_value" not in str(exc.value)
    good = stderr_log([[(0.0, "SELECT 1")]])
    with pytest.raises(LogFormatError, match=r"^line 3: ") as exc:
        parse_log("\n\n2026-11-20 09:30:00.000 UTC [123] LOG:  statement: SELECT 1\n" + good)
    with pytest.raises(LogFormatError, match="empty"):
        parse_log("\n\n")
    # a csvlog row with a column set no PostgreSQL writes, on line 2
    row = '2026-11-20 09:30:00.000 UTC,"app","shop",1,"[local]",6b1e.1,1,"idle",' + ",".join(
        ['""'] * 18
    )
    assert len(row.split(",")) == 26
    with pytest.raises(LogFormatError, match=r"^line 2: a csvlog row of 5 columns"):
        parse_log(row + "\n" + 'a,b,c,d,"secret"\n')
    # after the first good line, lines of other programs are ignored and counted
    parsed = parse_log(good + "sh: 1: archive_command failed\n")
    assert parsed.ignored_lines >= 2
    assert len(parsed.statements) == 1


def test_statements_the_parser_rejects_get_a_label_of_their_own() -> None:
    text = stderr_log([[(0.0, "SELEKT 'x' FROM t"), (0.1, "SELEKT 'y' FROM t"), (0.2, "SELECT 1")]])
    parsed = parse_log(text)
    assert parsed.unparsed_statements == 2
    (bad,) = [lb for lb in parsed.labels if lb.text.startswith("unparsed statement ")]
    assert bad.calls == 2
    assert len(bad.text) == len("unparsed statement ") + 8
    assert bad.kind == "other"


def test_labels_that_would_clash_when_cut_are_told_apart() -> None:
    cols = ", ".join(f"column_{i}" for i in range(30))
    a = f"SELECT {cols}, a FROM t WHERE x = 1"
    b = f"SELECT {cols}, b FROM t WHERE x = 2"
    parsed = parse_log(stderr_log([[(0.0, a), (0.1, b), (0.2, b)]]))
    texts = [lb.text for lb in parsed.labels]
    assert len(texts) == 2
    assert texts[0].endswith("...")
    assert texts[1].endswith("... #2")
    assert all(len(t) <= LABEL_MAX for t in texts)


def test_label_text_and_kinds() -> None:
    assert label_text("EXECUTE f(1, 'secret', 2.5) -- note 'x'") == "EXECUTE f($1, $2, $3)"
    assert label_text("select  *\n from t /* who */ where a = 'é' ") == (
        "select * from t where a = $1"
    )
    assert statement_kind("WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x") == "write"
    assert statement_kind("WITH x AS (SELECT 1) SELECT * FROM x") == "read"
    assert statement_kind("EXPLAIN SELECT 1") == "read"
    assert statement_kind("EXPLAIN ANALYZE DELETE FROM t") == "write"
    assert statement_kind("SELECT * INTO t2 FROM t") == "write"
    assert statement_kind("SHOW work_mem") == "read"
    assert statement_kind("SET work_mem = '64MB'") == "other"
    assert statement_kind("COPY t FROM STDIN") == "write"
    assert statement_kind("CREATE INDEX ON t (a)") == "write"
    assert statement_kind("VALUES (1)") == "read"
    assert parse_params("$1 = '7', $2 = NULL, $3 = 'a, $4 = ''b'''") == ("7", None, "a, $4 = 'b'")
    assert parse_params("nonsense") is None


def test_the_plan_of_a_window(logs: tuple[str, str]) -> None:
    parsed = parse_log(logs[0], database="knobtune")
    start = parsed.statements[0].at_s
    end = parsed.duration_s + 1
    win = window(parsed, start_s=start, end_s=end)
    assert win.statements == len(parsed.statements)
    assert list(win.labels) == sorted(win.labels)
    plan = decode(plan_bytes(parsed, start_s=start, end_s=end))
    assert [s.client for s in plan.sessions] == list(range(len(parsed.sessions)))
    got = [st.sql for s in plan.sessions for st in s.statements]
    assert sorted(got) == sorted(st.sql for st in parsed.statements)
    ext = [st for s in plan.sessions for st in s.statements if st.params is not None]
    assert ("2", None) in [st.params for st in ext]
    assert any(st.failed_in_capture for s in plan.sessions for st in s.statements)
    assert "alice@example.com" not in repr(plan)


def test_a_large_log_parses_in_seconds() -> None:
    # 36,000 statements (about 4.6 MB) of an OLTP-like mix; the literals differ each time
    sessions = [
        [
            (
                k * 0.01,
                f"SELECT abalance FROM pgbench_accounts WHERE aid = {k * 7 + i}"
                if k % 3
                else f"UPDATE pgbench_accounts SET abalance = abalance + {k - 500} "
                f"WHERE aid = {k + i}",
            )
            for k in range(3000)
        ]
        for i in range(12)
    ]
    text = stderr_log(sessions)
    assert len(text) > 4_000_000
    t = time.perf_counter()
    parsed = parse_log(text)
    took = time.perf_counter() - t
    assert len(parsed.statements) == 36_000
    assert len(parsed.labels) == 2
    assert took < 10, took  # ~1.5 s on the 2-core host, niced, beside a benchmark
