"""TPC-C on a real sandbox at 1 warehouse: loader, transactions, the pgbench mix."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import psycopg
import pytest

from app.postgres.pgbench import BenchResult, run_bench
from app.postgres.sandbox import Sandbox
from app.workloads.base import Stream, WorkloadError
from app.workloads.stream_run import bench_spec
from app.workloads.tpcc import MARKER, TRANSACTION_MIX, Tpcc, loaded_warehouses, tpm_c
from tests.app.workloads.tpcc_db import TEMPLATE, ch_template_fixture, copy_of_template, one  # noqa: F401


@pytest.fixture(scope="module")
def dsn(sandbox: Sandbox, ch_template: str) -> Iterator[str]:
    """This module's copy of the session's 1-warehouse load (tests/app/workloads/tpcc_db.py)."""
    yield from copy_of_template(sandbox, "knobtune_tpcc_test")


def _bench(dsn: str, stream: Stream, seconds: int) -> BenchResult:
    """One run of the stream, as the runner runs it."""
    return run_bench(dsn, bench_spec(stream, duration_s=seconds, warmup_s=0))


def test_loader_follows_the_spec_cardinalities(dsn: str) -> None:
    counts = {
        t: one(dsn, f"SELECT count(*) FROM {t}")
        for t in ("item", "warehouse", "district", "customer", "history", "stock", "orders")
    }
    assert counts == {
        "item": 100_000,
        "warehouse": 1,
        "district": 10,
        "customer": 30_000,
        "history": 30_000,
        "stock": 100_000,
        "orders": 30_000,
    }
    assert one(dsn, "SELECT count(*) FROM new_order") == 9_000
    assert one(dsn, "SELECT min(no_o_id) FROM new_order") == 2101
    lines = one(dsn, "SELECT count(*) FROM order_line")
    assert isinstance(lines, int)
    assert 290_000 < lines < 310_000  # 5..15 per order, 10 on average
    assert one(dsn, "SELECT sum(o_ol_cnt) FROM orders") == lines
    # every customer of a district has exactly one order (a permutation)
    assert one(dsn, "SELECT count(DISTINCT (o_d_id, o_c_id)) FROM orders") == 30_000
    # the first 1000 customers of a district carry the 1000 last names in order
    assert one(dsn, "SELECT c_last FROM customer WHERE c_d_id = 1 AND c_id = 1") == "BARBARBAR"
    assert (
        one(dsn, "SELECT c_last FROM customer WHERE c_d_id = 1 AND c_id = 372") == "PRICALLYOUGHT"
    )
    names = one(dsn, "SELECT count(DISTINCT c_last) FROM customer WHERE c_d_id = 1")
    assert names == 1000
    # ~10% ORIGINAL in item and stock data, ~10% bad credit
    for sql in (
        "SELECT avg((i_data LIKE '%ORIGINAL%')::int) FROM item",
        "SELECT avg((s_data LIKE '%ORIGINAL%')::int) FROM stock",
        "SELECT avg((c_credit = 'BC')::int) FROM customer",
    ):
        share = float(str(one(dsn, sql)))
        assert 0.08 < share < 0.12, sql
    # NURand skews the non-sequential last names: the most common one is far above 1/1000
    top = one(
        dsn,
        "SELECT max(n) FROM (SELECT count(*) n FROM customer WHERE c_id > 1000 GROUP BY c_last) t",
    )
    assert isinstance(top, int)
    assert top > 3 * 20_000 / 1000


def test_second_prepare_reuses_only_a_finished_load_of_that_size(dsn: str) -> None:
    assert Tpcc(warehouses=1).prepare(dsn) == "TPC-C 1 warehouse re-used"
    with psycopg.connect(dsn) as conn:
        assert loaded_warehouses(conn, MARKER) == 1
        # the marker row is written by the load's own transaction: without it (a load
        # that did not commit) or with another count, prepare() loads afresh
        conn.execute(f"DELETE FROM {MARKER}")
        assert loaded_warehouses(conn, MARKER) is None
        conn.rollback()
        conn.execute(f"ALTER TABLE {MARKER} RENAME TO knobtune_tpcc_gone")
        assert loaded_warehouses(conn, MARKER) is None
        conn.rollback()
    with pytest.raises(WorkloadError, match="warehouses must be >= 1"):
        Tpcc(warehouses=0)
    with pytest.raises(WorkloadError, match="protocol"):
        Tpcc(protocol="fast")


def test_new_order_commits_and_rolls_back_on_an_unused_item(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        before = conn.execute("SELECT d_next_o_id FROM district WHERE d_id = 3").fetchone()
        assert before is not None
        ok = conn.execute("SELECT tpcc_new_order(1, 3, 42, 7, 1, 1)").fetchone()
        assert ok == (0,)  # rbk = 1: the last item is unused
        conn.rollback()
        after = conn.execute("SELECT d_next_o_id FROM district WHERE d_id = 3").fetchone()
        assert after == before
        ok = conn.execute("SELECT tpcc_new_order(1, 3, 42, 7, 50, 1)").fetchone()
        assert ok == (1,)
        conn.commit()
        o_id = before[0]
        row = conn.execute(
            "SELECT o_c_id, o_ol_cnt, (SELECT count(*) FROM order_line WHERE ol_d_id = 3 "
            "AND ol_o_id = %s), (SELECT count(*) FROM new_order WHERE no_d_id = 3 "
            "AND no_o_id = %s) FROM orders WHERE o_d_id = 3 AND o_id = %s",
            (o_id, o_id, o_id),
        ).fetchone()
        assert row == (42, 7, 7, 1)


def test_delivery_delivers_the_oldest_order_of_each_district(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        oldest = conn.execute(
            "SELECT no_d_id, min(no_o_id) FROM new_order GROUP BY no_d_id ORDER BY 1"
        ).fetchall()
        assert conn.execute("SELECT tpcc_delivery(1, 7)").fetchone() == (10,)
        conn.commit()
        for d, o in oldest:
            row = conn.execute(
                "SELECT o_carrier_id, (SELECT count(*) FROM new_order WHERE no_d_id = %s "
                "AND no_o_id = %s), (SELECT bool_and(ol_delivery_d IS NOT NULL) FROM "
                "order_line WHERE ol_d_id = %s AND ol_o_id = %s) FROM orders "
                "WHERE o_d_id = %s AND o_id = %s",
                (d, o, d, o, d, o),
            ).fetchone()
            assert row == (7, 0, True)


def test_a_short_run_follows_the_mix_and_commits(dsn: str) -> None:
    stream = Tpcc(clients=4, protocol="prepared").streams()[0]
    assert [s.name for s in stream.scripts] == list(TRANSACTION_MIX)
    orders = one(dsn, "SELECT count(*) FROM orders")
    res = _bench(dsn, stream, seconds=6)
    assert res.ok, res.error
    assert res.failed_transactions == 0
    assert res.tx is not None
    n = len(res.tx)
    assert n > 300
    counts = np.bincount(res.tx.script, minlength=5)
    for i, (name, p) in enumerate(stream.design_weights().items()):
        # binomial: 4.5 standard deviations, so a correct mix fails ~1 run in 100,000
        tol = 4.5 * math.sqrt(p * (1 - p) / n)
        assert abs(counts[i] / n - p) < tol, (name, counts[i] / n, p)
    # every new-order committed its order except the ~1% rolled back on an unused item
    new_orders = int(counts[0])
    added = one(dsn, "SELECT count(*) FROM orders")
    assert isinstance(orders, int)
    assert isinstance(added, int)
    assert 0.9 * new_orders <= added - orders <= new_orders
    assert tpm_c(new_orders, 6.0) == pytest.approx(new_orders * 10)


def test_reset_brings_the_data_back_to_the_loaded_state(sandbox: Sandbox, dsn: str) -> None:
    """After runs that added and delivered orders, reset gives the template's figures."""
    res = _bench(dsn, Tpcc(clients=4).streams()[0], seconds=5)
    assert res.ok, res.error
    figures = (
        "SELECT count(*), max(o_id), count(o_carrier_id) FROM orders",
        "SELECT count(*), sum(ol_o_id), count(ol_delivery_d) FROM order_line",
        "SELECT count(*), min(no_o_id), max(no_o_id) FROM new_order",
        "SELECT count(*) FROM history",
        "SELECT min(d_next_o_id), max(d_next_o_id) FROM district",
    )
    template = sandbox.dsn.replace("dbname=postgres", f"dbname={TEMPLATE}")

    def rows(db: str) -> list[tuple[object, ...]]:
        with psycopg.connect(db) as conn:
            return [tuple(conn.execute(sql).fetchone() or ()) for sql in figures]

    assert rows(dsn) != rows(template)  # the runs changed them
    Tpcc().reset(dsn)
    assert rows(dsn) == rows(template)
    # and the next run starts as from a fresh load: new orders numbered from 3001 again
    assert _bench(dsn, Tpcc(clients=2).streams()[0], seconds=2).ok
    assert one(dsn, "SELECT min(o_id) FROM orders WHERE o_id > 3000") == 3001


def test_serializable_with_retries_counts_failures_and_goes_on(dsn: str) -> None:
    stream = Tpcc(clients=4, isolation="serializable", max_tries=5).streams()[0]
    res = _bench(dsn, stream, seconds=4)
    assert res.ok, res.error
    assert res.summary is not None
    assert res.transactions > 100
    # payments all update warehouse 1: concurrent ones conflict under serializable
    retried = res.summary.retried or 0
    assert retried + res.failed_transactions > 0


def test_tpm_c_rejects_bad_input() -> None:
    assert tpm_c(1200, 120.0) == 600.0
    with pytest.raises(ValueError, match="seconds must be > 0"):
        tpm_c(10, 0)
