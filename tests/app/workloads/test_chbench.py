"""CH-benCHmark on a real sandbox at 1 warehouse: extra tables, queries, the olap stream."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator

import numpy as np
import psycopg
import pytest

from app.postgres.pgbench import run_bench, run_streams
from app.postgres.sandbox import Sandbox
from app.workloads.base import Script, WorkloadError, in_turn_script
from app.workloads.chbench import QUERIES, Chbench
from app.workloads.stream_run import bench_spec
from tests.app.workloads.tpcc_db import ch_template_fixture, copy_of_template, one  # noqa: F401


@pytest.fixture(scope="module")
def dsn(sandbox: Sandbox, ch_template: str) -> Iterator[str]:
    """This module's copy of the session's 1-warehouse load (tests/app/workloads/tpcc_db.py)."""
    yield from copy_of_template(sandbox, "knobtune_chbench_test")


def test_one_load_says_what_it_loaded(ch_template: str) -> None:
    assert re.fullmatch(
        r"CH-benCHmark: TPC-C 1 warehouse loaded: [\d,]+ rows in \d+ s; "
        r"CH tables loaded in \d+ s",
        ch_template,
    ), ch_template


def test_extra_tables_and_the_supplier_mapping(dsn: str) -> None:
    assert one(dsn, "SELECT count(*) FROM supplier") == 10_000
    assert one(dsn, "SELECT count(*) FROM nation") == 62
    assert one(dsn, "SELECT count(*) FROM region") == 5
    mapped = "SELECT count(*) FROM stock WHERE s_su_suppkey <> mod(s_w_id * s_i_id, 10000)"
    assert one(dsn, mapped) == 0
    # every stock row finds its supplier, every supplier and customer its nation
    for orphans in (
        "stock LEFT JOIN supplier ON s_su_suppkey = su_suppkey WHERE su_suppkey IS NULL",
        "supplier LEFT JOIN nation ON su_nationkey = n_nationkey WHERE n_nationkey IS NULL",
        "customer LEFT JOIN nation ON ascii(substr(c_state, 1, 1)) = n_nationkey "
        "WHERE n_nationkey IS NULL",
    ):
        assert one(dsn, f"SELECT count(*) FROM {orphans}") == 0, orphans
    europe = "SELECT count(*) FROM nation JOIN region ON n_regionkey = r_regionkey"
    assert one(dsn, f"{europe} WHERE r_name = 'Europe'") == 20


def test_second_prepare_reuses_everything(dsn: str) -> None:
    note = Chbench().prepare(dsn)
    assert note == "CH-benCHmark: TPC-C 1 warehouse re-used; CH tables re-used"


def test_bad_configurations_say_what_to_change() -> None:
    with pytest.raises(WorkloadError, match="unknown CH-benCHmark queries Q99; choose from Q1"):
        Chbench(queries=("Q1", "Q99"))
    with pytest.raises(WorkloadError, match="queries is empty"):
        Chbench(queries=())
    with pytest.raises(WorkloadError, match="oltp_clients or olap_clients"):
        Chbench(oltp_clients=0, olap_clients=0)
    with pytest.raises(WorkloadError, match="warehouses must be >= 1"):
        Chbench(warehouses=0)


def test_every_query_runs_on_the_loaded_schema(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        for name, sql in QUERIES.items():
            # pgbench would take ':word' inside a literal for a variable
            assert not re.search(r"(?<!:):[A-Za-z0-9_]", sql), name
            rows = conn.execute(sql).fetchall()
            assert rows, name  # each selects something from the loaded data
    # the queries that group by line count see the spec's 5..15 lines per order
    with psycopg.connect(dsn) as conn:
        got = conn.execute(QUERIES["Q4"]).fetchall()
    assert [r[0] for r in got] == list(range(5, 16))


def test_streams_describe_the_mixed_run() -> None:
    ch = Chbench(oltp_clients=3, olap_clients=2, queries=("Q1", "Q6", "Q14"), protocol="prepared")
    oltp, olap = ch.streams()
    assert (oltp.name, oltp.clients, oltp.protocol) == ("oltp", 3, "prepared")
    assert [s.name for s in oltp.scripts] == [
        "new-order",
        "payment",
        "order-status",
        "delivery",
        "stock-level",
    ]
    assert (olap.name, olap.clients, olap.sequence, olap.stride) == (
        "olap",
        2,
        ("Q1", "Q6", "Q14"),
        1,
    )
    assert olap.defines == {"n": "0"}
    assert [s.name for s in Chbench(oltp_clients=0).streams()] == ["olap"]
    assert [s.name for s in Chbench(olap_clients=0).streams()] == ["oltp"]


def test_olap_labels_match_the_queries_that_ran(dsn: str) -> None:
    """Q6 made slow (a 1.2 s sleep): exactly the transactions labelled Q6 are slow.

    The other queries take 50-600 ms here with both clients on a busy 2-core machine.
    """
    seq = ("Q1", "Q6", "Q13", "Q19")
    stream = Chbench(oltp_clients=0, olap_clients=2, queries=seq).streams()[0]
    slow = [(q, ("SELECT pg_sleep(1.2);\n" if q == "Q6" else "") + QUERIES[q]) for q in seq]
    stream = dataclasses.replace(
        stream, scripts=(Script("queries", in_turn_script(slow, stream.stride)),)
    )
    t0 = time.monotonic()
    res = run_bench(dsn, bench_spec(stream, duration_s=4, warmup_s=0))
    assert res.ok, res.error
    assert time.monotonic() - t0 < 30
    assert res.tx is not None
    labels = np.array(
        [
            stream.label(int(c), int(t), int(s))
            for c, t, s in zip(res.tx.client, res.tx.txno, res.tx.script, strict=True)
        ]
    )
    assert set(labels) == set(seq)
    slow_ms = res.tx.latency_ms[labels == "Q6"]
    fast_ms = res.tx.latency_ms[labels != "Q6"]
    assert slow_ms.size >= 2
    assert fast_ms.size >= 4
    assert slow_ms.min() >= 1200
    assert fast_ms.max() < 1200


def test_oltp_and_olap_streams_run_together(dsn: str) -> None:
    """Both streams at once, as the runner starts them: each completes its own work."""
    streams = Chbench(oltp_clients=2, olap_clients=1, queries=("Q1", "Q6")).streams()
    assert [s.name for s in streams] == ["oltp", "olap"]
    t0 = time.monotonic()
    results = run_streams(dsn, [bench_spec(s, duration_s=3, warmup_s=0) for s in streams])
    wall = time.monotonic() - t0
    for stream, res in zip(streams, results, strict=True):
        assert res.ok, (stream.name, res.error)
        assert not res.stopped, stream.name
        assert res.transactions > 2, stream.name
    # side by side: one after the other would take at least the sum of the two pgbench runs
    assert wall < sum(r.duration_s for r in results), (wall, [r.duration_s for r in results])
