"""Built-in workloads (TPC-H, CH-benCHmark) tuned through the REST API on real sandboxes.

What a user posts: ``{"builtin": "tpch", "scale": ...}`` or ``{"builtin": "chbench", ...}``;
the service loads the data, runs every stream at once and judges per query / transaction.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.postgres.sandbox import Sandbox
from tests.app.workloads.tpcc_db import ch_template_fixture, copy_of_template, one  # noqa: F401
from tests.conftest import SandboxFactory
from tests.helpers import wait_done


def register(client: TestClient, sandbox_factory: SandboxFactory, name: str) -> int:
    sb = sandbox_factory()
    r = client.post("/api/v1/targets", json={"name": name, "dsn": sb.dsn})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def tune(
    client: TestClient, target: int, workload: dict[str, Any], **fields: Any
) -> dict[str, Any]:
    """A short session on ``workload`` (work_mem only, 3 s runs, 2 s measured, unless the
    workload says otherwise), run to its end: the fewest runs a session takes (a baseline
    of 2, one evaluation of 3, no final check: the per-stream and per-query figures then
    come from the start's and the best's runs; a final check of stream workloads runs in
    tests/app/workloads/test_streams.py)."""
    body = {
        "target_id": target,
        "knobs": ["work_mem"],
        "workload": {"duration_s": 3, "warmup_s": 1, **workload},
        "max_trials": 5,
        "final_check_runs": 0,
        "seed": 1,
        **fields,
    }
    r = client.post("/api/v1/sessions", json=body)
    assert r.status_code == 202, r.text
    s = wait_done(client, r.json()["id"])
    assert s["status"] == "succeeded", s["error"]
    return s


def test_tpch_session_judges_queries_and_reports_them(
    client: TestClient, sandbox_factory: SandboxFactory
) -> None:
    target = register(client, sandbox_factory, "tpch")
    # 2 s runs, 1 s measured: dozens of each query at SF 0.01
    tpch = {
        "builtin": "tpch",
        "scale": 0.01,
        "queries": ["Q1", "Q3", "Q6"],
        "duration_s": 2,
        "warmup_s": 1,
    }
    s = tune(client, target, tpch, workload_kind="analytics", objective="query_time_geomean")
    assert any("TPC-H SF 0.01" in str(n) for n in s["notes"]), s["notes"]
    trials = client.get(f"/api/v1/sessions/{s['id']}/trials").json()
    measured = [t for t in trials if t["streams"]]
    assert measured
    assert {st["stream"] for t in measured for st in t["streams"]} == {"tpch"}
    assert {row["label"] for row in s["per_label"]} == {"Q1", "Q3", "Q6"}
    assert s["gain_text"] is None or "query time" in s["gain_text"]
    conf = client.get(f"/api/v1/sessions/{s['id']}/config").text
    assert "Q1" in conf  # per-query before/after in the export's header


@pytest.fixture
def ch_dsn(sandbox: Sandbox, ch_template: str) -> Iterator[str]:
    """A copy of the session's one CH load (the service finds it loaded and re-uses it)."""
    yield from copy_of_template(sandbox, "knobtune_ch_session")


def test_chbench_runs_an_oltp_and_an_olap_stream_measured_apart(
    client: TestClient, ch_dsn: str
) -> None:
    r = client.post("/api/v1/targets", json={"name": "chbench", "dsn": ch_dsn})
    assert r.status_code == 201, r.text
    target = int(r.json()["id"])
    # one client a stream, not throttled: under -R each stream gets the rate, and the
    # OLAP stream's queries (~50 ms) fell behind its schedule into the warm-up (none measured)
    ch = {"builtin": "chbench", "scale": 1, "clients": 1, "olap_clients": 1}
    s = tune(
        client,
        target,
        {**ch, "queries": ["Q1", "Q6"]},
        objective_stream="oltp",
        p95_limits={"olap": 0.5},
    )
    trials = client.get(f"/api/v1/sessions/{s['id']}/trials").json()
    first = next(t for t in trials if t["streams"])
    by_name = {st["stream"]: st for st in first["streams"]}
    assert set(by_name) == {"oltp", "olap"}
    # TPC-C transactions take milliseconds, CH queries far longer: measured apart
    assert by_name["oltp"]["transactions"] > by_name["olap"]["transactions"]
    assert {row["stream"] for row in s["per_stream"]} == {"oltp", "olap"}
    olap_labels = {row["label"] for row in s["per_label"] if row["stream"] == "olap"}
    assert olap_labels <= {"Q1", "Q6"}
    assert olap_labels
    oltp_labels = {row["label"] for row in s["per_label"] if row["stream"] == "oltp"}
    assert {"new-order", "payment"} <= oltp_labels
    # every measured run started from the loaded data: what is left is one run's orders
    measured = [t for t in trials if t["streams"]]
    assert len(measured) >= 3
    assert all("reset_s" in t["timings"] for t in measured)
    added = one(ch_dsn, "SELECT count(*) FROM orders WHERE o_id > 3000")
    assert isinstance(added, int)
    one_run = max(
        st["transactions"] for t in measured for st in t["streams"] if st["stream"] == "oltp"
    )
    assert 0 < added <= one_run


@pytest.mark.parametrize(
    ("workload", "says"),
    [
        ({"builtin": "tpcc", "scale": 1.5}, "whole number"),
        ({"builtin": "tpcb-like", "scale": 0.5}, "whole number"),
        ({"builtin": "tpch", "scale": 0.1, "scripts": [{"sql": "SELECT 1;"}]}, "own scripts"),
        ({"builtin": "tpch", "scale": 0.1, "clients": "auto"}, "auto"),
        ({"builtin": "tpch", "scale": 0.1, "queries": ["Q23"]}, "Q22"),
        ({"builtin": "tpch", "scale": 0.1, "mode": "power", "clients": 2}, "power"),
        ({"builtin": "chbench", "scale": 1, "queries": ["Q2"]}, "Q2"),
    ],
)
def test_bad_builtin_workloads_are_422_saying_what_to_change(
    client: TestClient, sandbox_factory: SandboxFactory, workload: dict[str, Any], says: str
) -> None:
    targets = client.get("/api/v1/targets").json()
    target = targets[0]["id"] if targets else register(client, sandbox_factory, "bad")
    body = {"target_id": target, "workload": {**workload, "duration_s": 5, "warmup_s": 1}}
    r = client.post("/api/v1/sessions", json=body)
    assert r.status_code == 422, r.text
    assert says in r.text
