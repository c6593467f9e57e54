"""A replayed capture as the workload (app/workloads/replay.py) on a real sandbox: every run
on a fresh copy of the user's database, which is never written; what prepare asks for;
and trials of a session measured from the replayed statements."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from app.postgres.pgbench import run_bench
from app.postgres.sandbox import Sandbox
from app.postgres.target import TargetController
from app.sessions.schemas import SessionIn
from app.sessions.trial import TrialExecutor
from app.workloads import set_capture_loader, workload_for
from app.workloads.base import WorkloadError
from app.workloads.replay import MARK, CaptureSource, Replay
from app.workloads.schemas import WorkloadIn
from app.workloads.stream_run import bench_spec, stream_stat
from optimizer.descent import Candidate
from optimizer.evidence import run_level, stream_level
from tests.app.replay.logs import stderr_log

DB = "shop"
COPY = "knobtune_replay"
SORT = "SELECT n FROM sortme ORDER BY pad OFFSET 99999"
SORT_LABEL = "SELECT n FROM sortme ORDER BY pad OFFSET $1"


@pytest.fixture(scope="module")
def sb() -> Iterator[Sandbox]:
    """A sandbox of this module's own (its config changes), with the user's database
    restored as the benchmark role. Its role is given CREATEDB here, as an operator gives
    a DSN target's workload role (a sandbox's has none: its superuser copies, see
    test_bench_role.py); it owns what it makes."""
    with Sandbox.create() as sandbox:
        with psycopg.connect(sandbox.dsn, autocommit=True) as conn:
            conn.execute("ALTER ROLE knobtune_bench CREATEDB")
        with psycopg.connect(sandbox.bench_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DB}")
        with psycopg.connect(_db(sandbox.bench_dsn, DB), autocommit=True) as conn:
            conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int)")
            conn.execute("INSERT INTO accounts SELECT g, g * 10 FROM generate_series(1, 1000) g")
            conn.execute(
                "CREATE TABLE sortme AS SELECT g AS n, md5(g::text) AS pad"
                " FROM generate_series(1, 100000) g"
            )
            conn.execute("VACUUM ANALYZE")
        yield sandbox


def _db(dsn: str, name: str) -> str:
    return make_conninfo(dsn, dbname=name)


def _fingerprint(dsn: str) -> tuple[object, ...]:
    with psycopg.connect(_db(dsn, DB)) as conn:
        row = conn.execute(
            "SELECT count(*), sum(balance), (SELECT count(*) FROM sortme) FROM accounts"
        ).fetchone()
    assert row is not None
    return tuple(row)


def _count(dsn: str, db: str) -> int:
    with psycopg.connect(_db(dsn, db)) as conn:
        row = conn.execute("SELECT count(*) FROM accounts").fetchone()
    assert row is not None
    return int(row[0])


def test_every_run_starts_from_the_same_data_and_the_users_database_is_untouched(
    sb: Sandbox,
) -> None:
    before = _fingerprint(sb.bench_dsn)
    # each run deletes 100 accounts: from 1,000 to 900 when it starts from the same data
    deleting = [
        (0.0, "SELECT count(*) FROM accounts"),
        (0.2, "DELETE FROM accounts WHERE id IN (SELECT id FROM accounts ORDER BY id LIMIT 100)"),
        (0.4, "SELECT sum(balance) FROM accounts"),
    ]
    wl = Replay(stderr_log([deleting]), duration_s=2, warmup_s=0, replay_database=DB)
    note = wl.prepare(sb.bench_dsn)
    assert note is not None
    assert "replaying 3 statements of 1 sessions" in note
    assert f"fresh copy of {DB} ({COPY})" in note
    assert "replayed as knobtune_bench" in note  # captured as "app"
    spec = bench_spec(wl.streams()[0], duration_s=2, warmup_s=0)
    for _ in range(2):
        wl.reset(sb.bench_dsn)
        assert _count(sb.bench_dsn, COPY) == 1000
        r = run_bench(sb.bench_dsn, spec)
        assert r.ok, r.error
        assert r.summary is not None
        assert r.summary.transactions == 3
        assert _count(sb.bench_dsn, COPY) == 900  # the run's delete, in the copy
    assert _fingerprint(sb.bench_dsn) == before
    with psycopg.connect(sb.dsn) as conn:
        row = conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
            [COPY],
        ).fetchone()
    assert row == (MARK,)
    # the counters of a run are the copy's (the statements ran there)
    assert r.db_metrics.get("xact_commit", 0) >= 3


def test_prepare_says_what_to_restore_or_grant(sb: Sandbox) -> None:
    text = stderr_log([[(0.0, "SELECT 1"), (0.5, "SELECT 2")]])
    missing = Replay(text, duration_s=2, warmup_s=0, replay_database="nosuchdb")
    with pytest.raises(WorkloadError, match="restore the dump taken before the capture") as e:
        missing.prepare(sb.bench_dsn)
    assert "pg_restore -d nosuchdb" in str(e.value)
    with psycopg.connect(sb.dsn, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS plain")
        conn.execute("DROP ROLE IF EXISTS creator")
        conn.execute("CREATE ROLE plain LOGIN PASSWORD 'pw-plain-1'")
        conn.execute("CREATE ROLE creator LOGIN CREATEDB PASSWORD 'pw-creator-1'")
    wl = Replay(text, duration_s=2, warmup_s=0, replay_database=DB)
    plain = make_conninfo(sb.bench_dsn, user="plain", password="pw-plain-1", dbname="postgres")
    with pytest.raises(WorkloadError, match="ALTER ROLE plain CREATEDB"):
        wl.prepare(plain)
    creator = make_conninfo(plain, user="creator", password="pw-creator-1")
    with pytest.raises(WorkloadError, match=f"ALTER DATABASE {DB} OWNER TO creator"):
        wl.prepare(creator)
    # a knobtune_replay that knobtune did not make is never dropped
    with psycopg.connect(sb.dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {COPY} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {COPY}")
    try:
        with pytest.raises(WorkloadError, match="that knobtune did not make"):
            wl.prepare(sb.bench_dsn)
        with psycopg.connect(sb.dsn) as conn:
            assert conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [COPY]
            ).fetchone() == (1,)
    finally:
        with psycopg.connect(sb.dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {COPY}")
    # someone connected to the user's database: refused, saying who and what to do
    with psycopg.connect(_db(sb.bench_dsn, DB)):
        t = time.monotonic()
        with pytest.raises(WorkloadError, match=f"database {DB} is in use by 1 session"):
            wl.reset(sb.bench_dsn)
        assert time.monotonic() - t < 10


def test_prepare_names_tables_restored_without_planner_statistics(sb: Sandbox) -> None:
    """A restored dump has no statistics until ANALYZE (autovacuum is off here, so it
    cannot get there first): the note says which tables and what to run."""
    with psycopg.connect(sb.bench_dsn, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS restored")
        conn.execute("CREATE DATABASE restored")
    with psycopg.connect(_db(sb.bench_dsn, "restored"), autocommit=True) as conn:
        conn.execute("CREATE TABLE lines (id int) WITH (autovacuum_enabled = off)")
        conn.execute("INSERT INTO lines SELECT generate_series(1, 5000)")
        conn.execute("CREATE TABLE empty (id int)")
    text = stderr_log([[(0.0, "SELECT count(*) FROM lines")]])
    wl = Replay(text, duration_s=2, warmup_s=0, replay_database="restored")
    note = wl.prepare(sb.bench_dsn)
    assert note is not None
    assert "1 table(s) of restored that hold data have no planner statistics" in note
    assert "(public.lines)" in note  # not the empty one
    assert "ANALYZE database restored" in note
    with psycopg.connect(_db(sb.bench_dsn, "restored"), autocommit=True) as conn:
        conn.execute("ANALYZE")
    note = wl.prepare(sb.bench_dsn)
    assert note is not None
    assert "planner statistics" not in note


def test_the_stream_is_the_labels_of_the_window_weighted_by_calls() -> None:
    a = [(0.1 * k, f"SELECT balance FROM accounts WHERE id = {k}") for k in range(40)]
    b = [(1.0, "BEGIN"), (1.1, "UPDATE accounts SET balance = 0 WHERE id = 3"), (1.2, "COMMIT")]
    late = [(30.0, "SELECT 'after the window'")]
    failing = [(1.15, "SELECT * FROM nosuch"), (2.5, "SELECT * FROM nosuch")]
    text = stderr_log([a, b, late, failing], failed=[(3, 0), (3, 1)])
    wl = Replay(text, duration_s=4, warmup_s=1, speed=1.0, replay_database=DB)
    (stream,) = wl.streams()
    assert stream.name == "replay"
    assert stream.replay is not None
    assert stream.replay.database == COPY
    names = [s.name for s in stream.scripts]
    assert "SELECT $1" not in names  # the late statement is outside the window
    weights = {s.name: s.weight for s in stream.scripts}
    # measured: statements after the 1 s warm-up; failed in the capture: no share
    assert weights["SELECT balance FROM accounts WHERE id = $1"] == 30
    assert weights["SELECT * FROM nosuch"] == 0
    shares = stream.design_weights()
    assert shares["BEGIN"] == pytest.approx(1 / 33)
    # most sessions open at once: a, b and the failing one overlap at 1.15-1.2 s
    assert stream.clients == 3
    # at speed 2, a run of 4 s replays 8 s of the capture
    fast = Replay(text, duration_s=4, warmup_s=1, speed=2.0, replay_database=DB)
    assert fast.window()[2] - fast.window()[0] == pytest.approx(8.0)
    # through workload_for, with the capture store's loader
    set_capture_loader(lambda cid: CaptureSource(text, "shop") if cid == 7 else "")
    try:
        wl2 = workload_for(WorkloadIn(replay=7, duration_s=4, warmup_s=1))
        assert isinstance(wl2, Replay)
        assert [s.name for s in wl2.streams()[0].scripts] == names
        assert wl2.database == "shop"  # the capture's, by default
        body = SessionIn.model_validate({"target_id": 1, "workload": {"replay": 7}})
        assert body.objective == "latency_mean"
        assert body.workload.builtin is None
        chosen = SessionIn.model_validate(
            {"target_id": 1, "workload": {"replay": 7}, "objective": "throughput"}
        )
        assert chosen.objective == "throughput"
        # a stored request (every field) is read back as it was, replay or not
        for stored in (body, SessionIn.model_validate({"target_id": 1})):
            again = SessionIn.model_validate(stored.model_dump(mode="json"))
            assert again == stored
    finally:
        set_capture_loader(None)
    with pytest.raises(WorkloadError, match="no capture store"):
        workload_for(WorkloadIn(replay=7))
    with pytest.raises(ValueError, match="drop scripts"):
        WorkloadIn.model_validate({"replay": 7, "scripts": [{"sql": "SELECT 1"}]})
    with pytest.raises(ValueError, match="knobtune makes before every run"):
        WorkloadIn.model_validate({"replay": 7, "replay_database": COPY})


def test_trials_of_a_session_measure_the_replayed_statements(sb: Sandbox) -> None:
    # 5 s of capture: a report sorting 100,000 rows every 0.25 s, point reads beside it
    report = [(0.25 * k, SORT) for k in range(20)]
    reads = [
        (0.05 * k, f"SELECT balance FROM accounts WHERE id = {k % 1000 + 1}") for k in range(100)
    ]
    wl = Replay(stderr_log([report, reads]), duration_s=4, warmup_s=1, replay_database=DB)
    assert wl.prepare(sb.bench_dsn) is not None
    ctl = TargetController.for_sandbox(sb)
    snap = ctl.snapshot(["work_mem"])
    executor = TrialExecutor(ctl, sb.bench_dsn, wl, duration_s=4, warmup_s=1)
    small, large = {"work_mem": "64kB"}, {"work_mem": "32MB"}
    plan = [(small, "baseline"), (large, "candidate")]
    try:
        outs = []
        for i, (config, role) in enumerate(plan):
            by_knob = "work_mem" if config is large else None
            cand = Candidate(i, config, by_knob, config["work_mem"], role)
            out = executor.run(cand, incumbent=small)
            assert out.error is None, out.error
            assert out.rejected is None, out.rejected
            outs.append(out)
    finally:
        ctl.revert(snap)
    for out, (config, _role) in zip(outs, plan, strict=True):
        (stat,) = out.measurement.streams
        assert stat.name == "replay"
        by = {s.label: s for s in stat.scripts}
        sort = by[SORT_LABEL]
        read = by["SELECT balance FROM accounts WHERE id = $1"]
        # statements that started after the 1 s warm-up, to the 4 s end: about 12 and 60
        assert 9 <= sort.n <= 13, sort
        assert 50 <= read.n <= 61, read
        assert sort.failed == read.failed == 0
        assert sort.share == pytest.approx(12 / 72, abs=0.02)
        assert sort.mean_ms is not None
        level = run_level(out.measurement.streams, "latency_mean")
        lv, _ = stream_level(stat, "latency_mean")
        assert level.centre == pytest.approx(lv)
        assert level.seconds == stat.transactions  # the level comes from transactions
        # the config reached the replayed statements: in the run's counters (of the replay's
        # copy), every sort spilled at 64kB and none at 32MB. Their times are not compared:
        # in memory this sort is only 1.1-1.2x faster here, and on a loaded CI host the
        # direct timing twice put the two in the other order (the fidelity bench compares
        # effects: docs/results/replay-fidelity.md)
        assert out.result is not None
        assert out.result.db_metrics is not None
        temp_files = out.result.db_metrics["temp_files"]
        if config is small:
            # all but the last second's: a backend reports its counters at most once a
            # second, and the run's may be read before its last report (CI once: 11 of 12)
            assert temp_files >= sort.n - 4, (temp_files, sort)
        else:
            assert temp_files == 0, temp_files
    # and the trial's per-label stats agree with stream_stat on the same run
    assert outs[1].result is not None
    again = stream_stat(executor.streams[0], outs[1].result, 1.0)
    assert again is not None
    assert {s.label for s in again.scripts} == {
        s.label for s in outs[1].measurement.streams[0].scripts
    }
