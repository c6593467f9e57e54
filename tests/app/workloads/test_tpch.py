"""TPC-H against real sandboxes: load SF 0.01 (~5 s), run every query, pgbench labels."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import duckdb
import numpy as np
import psycopg
import pytest

from app.postgres.pgbench import run_bench
from app.postgres.sandbox import Sandbox
from app.workloads.base import Script, Stream, WorkloadError, in_turn_script
from app.workloads.stream_run import bench_spec
from app.workloads.tpch import (
    DEFAULT_QUERIES,
    MARKER,
    QUERY_NAMES,
    TABLES,
    Tpch,
    generated_counts,
    postgres_query,
    tpch_extension,
)
from app.workloads.tpch_queries import DUCKDB_QUERIES

SF = 0.01


@pytest.fixture(scope="module")
def loaded() -> Iterator[tuple[str, str]]:
    """A sandbox of its own holding TPC-H SF 0.01, and prepare()'s note."""
    with Sandbox.create() as sb:
        yield sb.dsn, Tpch(scale=SF).prepare(sb.dsn) or ""


def _duckdb() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(f"LOAD '{tpch_extension()}'")
    return con


def _counts(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return {
            t: int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0])  # type: ignore[index]
            for t in TABLES
        }


def _labelled(dsn: str, stream: Stream, seconds: int = 3) -> dict[str, list[float]]:
    """Each label's latencies from one run of the stream, as the runner runs it."""
    res = run_bench(dsn, bench_spec(stream, duration_s=seconds, warmup_s=0))
    assert res.ok, res.error
    assert res.failed_transactions == 0
    assert res.tx is not None
    out: dict[str, list[float]] = {}
    for c, k, s, lat in zip(
        res.tx.client, res.tx.txno, res.tx.script, res.tx.latency_ms, strict=True
    ):
        out.setdefault(stream.label(int(c), int(k), int(s)), []).append(float(lat))
    return out


def test_load_matches_duckdb_generation(loaded: tuple[str, str]) -> None:
    dsn, note = loaded
    expected = generated_counts(SF)
    assert _counts(dsn) == expected
    assert note.startswith(f"TPC-H SF {SF:g} loaded: {sum(expected.values()):,} rows")
    with psycopg.connect(dsn) as conn:
        marker = conn.execute(f"SELECT scale, state FROM {MARKER}").fetchall()
        analyzed = conn.execute(
            "SELECT count(*) FROM pg_stat_user_tables WHERE relname = ANY(%s) "
            "AND last_analyze IS NOT NULL",
            [list(TABLES)],
        ).fetchone()
        indexed = conn.execute(
            "SELECT count(*) FROM pg_indexes WHERE tablename = 'lineitem' "
            "AND indexdef LIKE '%(l_partkey, l_suppkey)%'"
        ).fetchone()
    assert marker == [(SF, "ready")]
    assert analyzed == (len(TABLES),)
    assert indexed == (1,)


def _lineitem_files(dsn: str) -> tuple[object, ...]:
    """What a reload would change: the table's file (TRUNCATE, DROP) and a row's xmin."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT pg_relation_filenode('lineitem'), (SELECT xmin::text FROM lineitem LIMIT 1)"
        ).fetchone()
    assert row is not None
    return tuple(row)


def test_second_prepare_reuses(loaded: tuple[str, str]) -> None:
    dsn, _ = loaded
    before = _lineitem_files(dsn)
    note = Tpch(scale=SF, mode="throughput", clients=2).prepare(dsn)
    # the data was not loaded again (PostgreSQL's word for it, not a time on a busy host)
    assert _lineitem_files(dsn) == before
    assert note is not None
    assert note.startswith(f"TPC-H SF {SF:g} re-used")


def test_every_query_runs_and_q1_has_its_four_groups(loaded: tuple[str, str]) -> None:
    dsn, _ = loaded
    with psycopg.connect(dsn) as conn:
        results = {q: conn.execute(postgres_query(q, SF)).fetchall() for q in QUERY_NAMES}
    q1 = [(flag, status, int(count)) for flag, status, *_, count in results["Q1"]]
    assert [(f, s) for f, s, _ in q1] == [("A", "F"), ("N", "F"), ("N", "O"), ("R", "F")]
    # the same questions to DuckDB over the same generated data: the same answers
    con = _duckdb()
    con.execute("CALL dbgen(sf = ?)", [SF])
    duck_q1 = con.execute(DUCKDB_QUERIES["Q1"]).fetchall()
    assert q1 == [(f, s, int(c)) for f, s, *_, c in duck_q1]
    assert results["Q6"] == con.execute(DUCKDB_QUERIES["Q6"]).fetchall()
    assert all(results[q] for q in DEFAULT_QUERIES)  # every query of the set answers something


def test_power_stream_runs_the_set_in_order(loaded: tuple[str, str]) -> None:
    dsn, _ = loaded
    wl = Tpch(scale=SF)
    (stream,) = wl.streams()
    assert (stream.clients, stream.sequence, stream.stride) == (1, DEFAULT_QUERIES, 0)
    per_label = _labelled(dsn, stream)
    # one client, in order: after a few passes every query of the set has run
    assert set(per_label) == set(DEFAULT_QUERIES)


def test_labels_are_what_ran(loaded: tuple[str, str]) -> None:
    """One body sleeps 50 ms, the other 2 ms: the per-label means tell them apart."""
    dsn, _ = loaded
    bodies = [("Q1", "SELECT pg_sleep(0.002);"), ("Q2", "SELECT pg_sleep(0.05);")]
    for wl in (Tpch(scale=SF, queries=("Q1", "Q2")), Tpch(SF, "throughput", 3, ("Q1", "Q2"))):
        (stream,) = wl.streams()
        sleepy = dataclasses.replace(
            stream, scripts=(Script("tpch", in_turn_script(bodies, stream.stride)),)
        )
        per_label = _labelled(dsn, sleepy, seconds=2)
        assert set(per_label) == {"Q1", "Q2"}
        assert float(np.mean(per_label["Q1"])) < 25.0
        assert float(np.mean(per_label["Q2"])) > 45.0
        # each client alternates: the two counts differ by at most one per client
        assert abs(len(per_label["Q1"]) - len(per_label["Q2"])) <= stream.clients


def test_throughput_clients_start_apart() -> None:
    (stream,) = Tpch(scale=SF, mode="throughput", clients=3).streams()
    n = len(DEFAULT_QUERIES)
    assert stream.stride == n // 3
    firsts = [stream.label(c, 1, 0) for c in range(3)]
    assert firsts == [DEFAULT_QUERIES[0], DEFAULT_QUERIES[n // 3], DEFAULT_QUERIES[2 * (n // 3)]]
    assert stream.defines == {"n": "0"}


def test_half_load_is_redone_and_another_scale_reloads(loaded: tuple[str, str]) -> None:
    """Runs after the tests that read the data: it reloads it twice (~10 s)."""
    dsn, _ = loaded
    expected = generated_counts(SF)
    for change in ("state = 'loaded'", "scale = 0.02"):  # VACUUM cut short; another scale
        with psycopg.connect(dsn) as conn:
            conn.execute(f"UPDATE {MARKER} SET {change}")
            conn.execute("DELETE FROM region")  # a reload must bring it back
        assert (Tpch(scale=SF).prepare(dsn) or "").startswith(f"TPC-H SF {SF:g} loaded")
        assert _counts(dsn) == expected


def test_foreign_tables_are_not_dropped(fresh_sandbox: Sandbox) -> None:
    with psycopg.connect(fresh_sandbox.dsn) as conn:
        conn.execute("CREATE TABLE orders (id int)")
    with pytest.raises(WorkloadError, match="orders exist but knobtune did not load them"):
        Tpch(scale=SF).prepare(fresh_sandbox.dsn)


def test_missing_privilege_says_what_to_change(loaded: tuple[str, str]) -> None:
    dsn, _ = loaded
    with psycopg.connect(dsn, autocommit=True) as conn:
        pw = psycopg.conninfo.conninfo_to_dict(dsn)["password"]
        conn.execute(f"CREATE ROLE tpch_reader LOGIN PASSWORD '{pw}'")
        conn.execute("CREATE DATABASE tpch_empty")
    reader = dsn.replace("user=postgres dbname=postgres", "user=tpch_reader dbname=tpch_empty")
    with pytest.raises(WorkloadError, match=r"cannot create the TPC-H tables.*GRANT CREATE"):
        Tpch(scale=SF).prepare(reader)


def test_bad_input_says_what_to_change() -> None:
    with pytest.raises(WorkloadError, match=r"unknown TPC-H queries 'Q23'.*Q1, Q2"):
        Tpch(queries=("Q1", "Q23"))
    with pytest.raises(WorkloadError, match="use mode='throughput'"):
        Tpch(clients=4)
    with pytest.raises(WorkloadError, match="scale must be in"):
        Tpch(scale=0.001)
    with pytest.raises(WorkloadError, match="unknown protocol"):
        Tpch(protocol="pipelined")
    with pytest.raises(WorkloadError, match="cannot connect"):
        Tpch(scale=SF).prepare("host=127.0.0.1 port=1 user=postgres password=pw dbname=x")


def test_queries_are_duckdbs_with_the_documented_adaptations() -> None:
    con = _duckdb()
    installed = {
        f"Q{n}": q.strip() for n, q in con.execute("SELECT * FROM tpch_queries()").fetchall()
    }
    assert installed == {k: v.strip() for k, v in DUCKDB_QUERIES.items()}
    for q in QUERY_NAMES:
        adapted = postgres_query(q, 1.0)
        assert adapted == DUCKDB_QUERIES[q].strip()  # at SF 1 nothing changes
        assert ":" not in adapted  # pgbench would take :name for a variable
    assert "0.0100000000" in postgres_query("Q11", 0.01)
