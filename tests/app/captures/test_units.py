"""The capture side's pieces without a server: the log reader's entries, the summary and
its masking, the upload's decoding, the scheduler's separate capacity for captures."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.captures import store
from app.captures import summary as summaries
from app.db import Database, upgrade, utcnow
from app.jobs.scheduler import Scheduler
from app.models import Capture, Target, TuningSession
from app.postgres.serverlog import LogPoint, LogReader
from app.settings import Settings

T0 = "2026-11-27 10:00:00.000"


def line(ms: int, db: str = "shop", session: str = "6b0a0000.1f00", msg: str = "x") -> bytes:
    return (
        f"2026-11-27 10:00:{ms // 1000:02d}.{ms % 1000:03d} UTC|app|{db}|{session}|{msg}\n".encode()
    )


def reader(limit: int = 10_000, own: set[str] | None = None) -> LogReader:
    start = LogPoint(
        file="log/a.log", offset=0, at=T0, at_utc=datetime(2026, 11, 27, 10, tzinfo=UTC)
    )
    return LogReader(start, database="shop", limit=limit, own_sessions=own or set())


def test_the_reader_keeps_whole_entries_of_its_database_window_and_others_sessions() -> None:
    r = reader(own={"6b0a0000.ffff"})
    r._until = b"2026-11-27 10:00:05.000"
    data = b"".join(
        [
            b"2026-11-27 09:59:59.999 UTC|app|shop|6b0a0000.1f00|LOG:  before the window\n",
            line(100, msg="LOG:  statement: SELECT 1,"),
            b"\t2 AS continued\n",
            line(200, db="other", msg="LOG:  statement: SELECT 'other db'"),
            b"\tother db continued\n",
            b"some program's own output on stderr\n",
            line(300, session="6b0a0000.ffff", msg="LOG:  statement: SELECT pg_read_file"),
            line(400, msg="LOG:  statement: SELECT 3"),
            line(6000, msg="LOG:  statement: SELECT 'after the window'"),
        ]
    )
    # fed in small pieces: lines and entries cross the reads
    for i in range(0, len(data), 7):
        r._feed(data[i : i + 7])
    r._end_of_file()
    text = r.text()
    assert text == (
        line(100, msg="LOG:  statement: SELECT 1,").decode()
        + "\t2 AS continued\n"
        + line(400, msg="LOG:  statement: SELECT 3").decode()
    )
    assert r.entries == 2
    assert r.dropped_lines == 5


def test_the_reader_stops_at_its_limit_without_cutting_an_entry() -> None:
    one = line(100, msg="LOG:  statement: SELECT 1") + b"\tcontinued\n"
    r = reader(limit=len(one) * 2 + 5)
    r._feed(one * 3 + line(900))
    r._end_of_file()
    assert r.truncated
    assert r.entries == 2
    assert r.text().encode() == one * 2


def test_an_unfinished_last_line_waits_until_the_log_is_complete() -> None:
    r = reader()
    r._feed(line(100)[:-1])  # no newline yet
    assert r.entries == 0
    r._end_of_file()
    assert r.entries == 1


def _parsed() -> SimpleNamespace:
    S = SimpleNamespace
    sessions = [S(start_s=0.0, end_s=5.0), S(start_s=1.0, end_s=2.0), S(start_s=2.0, end_s=None)]
    labels = [
        S(text="SELECT * FROM a WHERE id = $1", kind="read", calls=3, failed_in_capture=0),
        S(
            text="UPDATE a SET v = 'leaked' WHERE id = $1",
            kind="write",
            calls=1,
            failed_in_capture=1,
        ),
        S(text="BEGIN", kind="other", calls=1, failed_in_capture=0),
    ]
    statements = [
        S(label=0, sql="SELECT * FROM a WHERE id = 1", failed_in_capture=False),
        S(label=0, sql="SELECT * FROM a WHERE id = 2", failed_in_capture=False),
        S(label=1, sql="UPDATE a SET v = 'x' WHERE id = 3", failed_in_capture=True),
        S(label=0, sql="SELECT * FROM a WHERE id = 4", failed_in_capture=False),
        S(label=2, sql="BEGIN", failed_in_capture=False),
    ]
    return S(
        started_at=datetime(2026, 11, 27, 10, tzinfo=UTC),
        duration_s=6.0,
        sessions=sessions,
        statements=statements,
        labels=labels,
        ignored_lines=4,
        unparsed_statements=1,
    )


def test_the_summary_counts_shares_peak_and_pg_stat_statements_times() -> None:
    timing = summaries.timing_from(
        [
            ("SELECT * FROM a WHERE id = $1", 30, 60.0),  # matched by fingerprint
            ("UPDATE a SET v = $1 WHERE id = $2", 10, 40.0),
            ("SELECT unrelated", 5, 100.0),
        ]
    )
    s = summaries.build(_parsed(), timing, window_s=10.0)
    assert s["duration_s"] == 10.0
    assert s["sessions"] == 3
    assert s["peak_concurrency"] == 2  # one ends at 2 s as another starts
    assert s["statements"] == 5
    assert s["failed_statements"] == 1
    assert s["kinds"]["read"] == {"statements": 3, "share": 0.6}
    assert s["ignored_lines"] == 4
    top = s["top"]
    assert [q["calls"] for q in top] == [3, 1, 1]
    assert top[0]["mean_ms"] == pytest.approx(2.0)
    assert top[0]["share_time"] == pytest.approx(0.3)
    assert top[1]["query"] == "BEGIN"
    update = top[2]
    assert update["query"] == "UPDATE a SET v = ? WHERE id = $1"  # a missed literal, masked
    assert update["mean_ms"] == pytest.approx(4.0)
    text = summaries.render(s)
    assert "3 sessions, at most 2 open at once" in text
    assert "reads 3 (60.0%), writes 1 (20.0%), other 1 (20.0%)" in text
    assert "leaked" not in text
    without = summaries.build(
        _parsed(), summaries.not_measured("pg_stat_statements is not installed")
    )
    assert "mean times: not measured: pg_stat_statements is not installed" in summaries.render(
        without
    )
    assert without["top"][0]["mean_ms"] is None


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("SELECT * FROM t WHERE a = $1 AND b = $2", "SELECT * FROM t WHERE a = $1 AND b = $2"),
        ("SELECT 'x', 42, 4.2, B'1', X'ff', E'\\n' -- tail", "SELECT ?, ?, ?, ?, ?, ?"),
        ("INSERT INTO t VALUES ('cut off by the 120 charact", "INSERT INTO t VALUES ( …"),
        ("\\! rm -rf /", "(not SQL: text withheld)"),
    ],
)
def test_what_a_summary_shows_carries_no_literal(text: str, shown: str) -> None:
    assert summaries.mask_literals(text) == shown


def test_an_upload_is_text_or_gzip_members_within_the_limit() -> None:
    assert store.decode_upload(b"plain", 10) == "plain"
    assert store.decode_upload(gzip.compress(b"ab") + gzip.compress(b"cd"), 10) == "abcd"
    with pytest.raises(store.CaptureTooLarge):
        store.decode_upload(gzip.compress(b"x" * 11), 10)
    with pytest.raises(ValueError, match="not valid gzip"):
        store.decode_upload(b"\x1f\x8b" + b"junk" * 10, 100)
    with pytest.raises(ValueError, match="truncated"):
        store.decode_upload(gzip.compress(b"x" * 1000)[:20], 10_000)


def test_captures_have_their_own_capacity_beside_benchmarks(tmp_path: Path) -> None:
    """A capture is claimed while the sessions' slots are full, and takes none of them."""
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    upgrade(url)
    db = Database(url)
    now = utcnow()
    with db.session() as s:
        for i in range(3):
            t = Target(name=f"t{i}", dsn="host=/nowhere", probe={}, created_at=now)
            s.add(t)
            s.flush()
            if i < 2:
                s.add(
                    TuningSession(
                        target_id=t.id,
                        status="queued",
                        phase="queued",
                        request={},
                        seed=1,
                        benchmark_s=0.0,
                        notes=[],
                        cancel_requested=False,
                        attempts=0,
                        created_at=now,
                    )
                )
            else:
                s.add(
                    Capture(
                        name="c",
                        target_id=t.id,
                        source="live",
                        database="d",
                        status="queued",
                        phase="queued",
                        request={"seconds": 10},
                        truncated=False,
                        notes=[],
                        cancel_requested=False,
                        attempts=0,
                        created_at=now,
                    )
                )
    settings = Settings(database_url=url, work_dir=tmp_path, max_parallel_sessions=1)
    sched = Scheduler(db, settings)
    try:
        sessions = sched.claim()
        assert len(sessions) == 1  # one benchmark at a time
        assert sched.claimed_captures == [1]  # the capture all the same
        assert sched.running_captures() == {1}
        assert sched.claim() == []  # the slots are full: the second session waits
        (job,) = [j for j in sched.scheduler.get_jobs() if j.id.startswith("capture-1-run")]
        assert job.executor == "captures"
    finally:
        sched.shutdown()
        db.dispose()


def test_tune_replay_builds_the_replay_workload() -> None:
    from app.cli import build_parser
    from app.cli.captures import capture_name_for
    from app.cli.sessions import _session_body

    args = build_parser().parse_args(
        ["tune", "--target", "t", "--replay", "shop-peak", "--speed", "2", "--replay-database",
         "shop"]
    )  # fmt: skip
    args.replay_id = 7  # what find_capture resolved the name to
    body = _session_body(args, 3)
    assert body["workload"] == {"replay": 7, "speed": 2.0, "replay_database": "shop"}
    plain = build_parser().parse_args(["tune", "--target", "t"])
    assert "replay" not in _session_body(plain, 3)["workload"]
    name = capture_name_for("10.0.0.5 prod/db")
    assert name.startswith("capture-10.0.0.5-prod-db-")
