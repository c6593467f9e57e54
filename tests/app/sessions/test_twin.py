"""A managed database tuned through a twin, end to end on real servers.

The managed server is stood in for by a sandbox reached as a role without ALTER SYSTEM
(as on RDS, Cloud SQL, Azure): it registers recommend-only, and everything that would
change or load it is refused with the way in. The twin: an RDS-style log (RDS's default
log_line_prefix) imported, a sandbox with the db.t4g.micro profile, a short replay
session on one knob, and the result exported as an RDS parameter-group file and a
CloudNativePG YAML, each checked against what PostgreSQL itself reports for the values.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import yaml
from fastapi.testclient import TestClient
from psycopg.conninfo import make_conninfo

from app.db import Database
from app.models import Target
from app.postgres.sandbox import Sandbox
from tests.helpers import WORK_MEM_SQL, file_settings, needs_cgroups, wait_done

GZIP = {"Content-Type": "application/gzip"}
T0 = datetime(2026, 11, 20, 9, 30, 0, tzinfo=UTC)


def rds_log(per_session: list[list[tuple[float, str]]], *, database: str = "shop") -> str:
    """A log as RDS writes it: '%t:%r:%u@%d:[%p]:', whole seconds, sessions by pid."""
    lines: list[tuple[float, int, str]] = []

    def ts(t: float) -> str:
        return (T0 + timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S") + " UTC"

    def add(t: float, pid: int, body: str, who: str = f"app@{database}") -> None:
        lines.append((t, len(lines), f"{ts(t)}:10.0.1.5({40000 + pid}):{who}:[{pid}]:{body}"))

    lines.append((0.0, 0, f"{ts(0)}::@:[99]:LOG:  checkpoint starting: time"))
    for i, stmts in enumerate(per_session):
        pid = 4000 + i
        start = stmts[0][0]
        add(start, pid, "LOG:  connection received: host=10.0.1.5 port=1", "[unknown]@[unknown]")
        add(start, pid, f"LOG:  connection authorized: user=app database={database}")
        for t, sql in stmts:
            add(t, pid, f"LOG:  statement: {sql}")
        add(stmts[-1][0] + 0.5, pid, "LOG:  disconnection: session time: 0:00:09.000 user=app")
    return "\n".join(line for _, _, line in sorted(lines)) + "\n"


def _row(client: TestClient, target_id: int) -> Target:
    db: Database = client.app.state.db  # type: ignore[attr-defined]
    with db.session() as s:
        row = s.get(Target, target_id)
        assert row is not None
        s.expunge(row)
        return row


@pytest.fixture(scope="module")
def managed(client: TestClient) -> Iterator[tuple[Sandbox, int]]:
    """The "managed server": a sandbox registered through its role without ALTER SYSTEM."""
    with Sandbox.create() as sb:
        r = client.post("/api/v1/targets", json={"name": "rds-prod", "dsn": sb.bench_dsn})
        assert r.status_code == 422, r.text  # as on RDS today: no ALTER SYSTEM, no target
        assert "recommend_only" in r.json()["detail"]
        r = client.post(
            "/api/v1/targets",
            json={
                "name": "rds-prod",
                "dsn": sb.bench_dsn,
                "recommend_only": True,
            },
        )
        assert r.status_code == 201, r.text
        t = r.json()
        assert t["recommend_only"] is True
        assert t["restart_method"] is None
        yield sb, t["id"]
        client.delete(f"/api/v1/targets/{t['id']}", params={"history": "drop"})


def test_a_recommend_only_target_is_never_changed(
    client: TestClient, managed: tuple[Sandbox, int]
) -> None:
    sb, tid = managed
    before = file_settings(sb.dsn)
    attempts = [
        ("/api/v1/sessions", {"target_id": tid, "knobs": ["work_mem"]}, "run a session"),
        (
            "/api/v1/comparisons",
            {"target_id": tid, "configs": [{"name": "current"}, {"name": "default"}]},
            "run a comparison",
        ),
        (f"/api/v1/targets/{tid}/sweeps", {"clients": [1, 2]}, "run a client sweep"),
        ("/api/v1/captures", {"target_id": tid, "name": "live1", "seconds": 10}, "captured live"),
        (
            "/api/v1/schedules",
            {"interval_s": 3600, "session": {"target_id": tid, "knobs": ["work_mem"]}},
            "run a session",
        ),
    ]
    for path, body, says in attempts:
        r = client.post(path, json=body)
        assert r.status_code == 409, (path, r.text)
        detail = r.json()["detail"]
        assert "recommend-only" in detail, detail
        assert says in detail, detail
        assert "tune a twin" in detail
        assert "--format rds" in detail
    assert client.get("/api/v1/sessions").json() == []
    # what PostgreSQL reports: no ALTER SYSTEM entry, no setting changed from a file
    assert file_settings(sb.dsn) == before
    with psycopg.connect(sb.dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_file_settings WHERE sourcefile LIKE '%auto.conf'"
        ).fetchone()
    assert row == (0,)


@pytest.mark.parametrize(
    "extra",
    [{"sandbox": True}, {"restart_method": "x"}, {"workload_dsn": "dbname=x"}],
)
def test_a_recommend_only_target_takes_nothing_that_changes_it(
    client: TestClient, extra: dict[str, Any]
) -> None:
    body = {"name": "rds-bad", "recommend_only": True, "cpus": 1, **extra}
    if "sandbox" not in extra:
        body["dsn"] = "host=/nonexistent dbname=x"
    r = client.post("/api/v1/targets", json=body)
    assert r.status_code == 422, r.text
    assert "recommend-only target is never changed" in r.json()["detail"]


def test_an_import_refuses_hostile_logs_with_a_clear_4xx(client: TestClient) -> None:
    cases: list[tuple[dict[str, str], bytes, int, str]] = [
        ({"name": "junk"}, bytes(range(256)) * 64, 422, "not a PostgreSQL log line"),
        ({"name": "huge"}, b"x" * (4 << 20) + b"\n", 422, "not a PostgreSQL log line"),
        ({"name": "../../etc/passwd"}, b"x\n", 422, ""),
        ({"name": "bomb"}, b"\x1f\x8bnot gzip at all", 422, "not valid gzip"),
    ]
    for params, body, status, says in cases:
        r = client.post(
            "/api/v1/captures/import",
            params=params,
            content=body,
            headers={"Content-Type": "application/octet-stream"},
        )
        assert r.status_code == status, (params, r.text[:300])
        assert says in r.text
    # a huge statement line in an otherwise good RDS log: stored, unparsed, no crash
    log = rds_log([[(0.0, "SELECT 1"), (1.0, "SELECT '" + "a" * 2_000_000 + "'")]])
    r = client.post(
        "/api/v1/captures/import",
        params={"name": "hugeline"},
        content=gzip.compress(log.encode()),
        headers=GZIP,
    )
    assert r.status_code == 201, r.text[:300]
    assert r.json()["summary"]["statements"] == 2
    assert client.delete(f"/api/v1/captures/{r.json()['id']}").status_code == 204


@needs_cgroups
def test_a_twin_session_from_an_rds_log_to_rds_and_cnpg_exports(client: TestClient) -> None:
    # 1. the managed server's log, as downloaded from RDS: two clients running a query
    #    whose time depends on work_mem (32 ms at 4MB or less, 2 ms above), 8 s long. 50
    #    a second each: more than 4MB can keep up with, so each run is busy throughout
    #    (a paced replay that runs ahead is idle between RDS's whole-second time stamps)
    per = [[(0.02 * k + 0.01 * i, WORK_MEM_SQL) for k in range(400)] for i in range(2)]
    r = client.post(
        "/api/v1/captures/import",
        params={"name": "rds-day"},
        content=gzip.compress(rds_log(per).encode()),
        headers=GZIP,
    )
    assert r.status_code == 201, r.text
    cap = r.json()
    assert cap["database"] == "shop"
    assert cap["summary"]["statements"] == 800
    # 2. the twin: a sandbox with the instance's profile
    r = client.post(
        "/api/v1/targets", json={"name": "twin", "sandbox": {"profile": "db.t4g.micro"}}
    )
    assert r.status_code == 201, r.text
    twin = r.json()
    try:
        assert twin["sandbox_limits"]["profile"] == "db.t4g.micro"
        assert twin["sandbox_limits"]["memory_bytes"] == 1 << 30
        assert twin["sandbox_limits"]["disk_iops"] == 3000
        row = _row(client, twin["id"])
        # the data the capture started from (a restored dump, here made by hand)
        with psycopg.connect(row.dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE shop OWNER knobtune_bench")
        # 3. replay the capture and tune work_mem on the twin
        body = {
            "target_id": twin["id"],
            "knobs": ["work_mem"],
            "workload": {"replay": cap["id"], "duration_s": 3, "warmup_s": 1},
            "max_trials": 5,
            "final_check_runs": 0,
        }
        r = client.post("/api/v1/sessions", json=body)
        assert r.status_code == 202, r.text
        sess = wait_done(client, r.json()["id"], timeout=150)
        assert sess["status"] == "succeeded", sess
        start, best = sess["start_config"], sess["best_config"]
        changed = {k: v for k, v in best.items() if start.get(k) != v}
        # 4. exports in the services' forms
        r = client.get(f"/api/v1/sessions/{sess['id']}/config", params={"format": "rds"})
        assert r.status_code == 200, r.text
        assert "rds-parameters.json" in r.headers["content-disposition"]
        params = json.loads(r.text)
        r = client.get(f"/api/v1/sessions/{sess['id']}/config", params={"format": "cnpg"})
        assert r.status_code == 200, r.text
        cnpg = yaml.safe_load(r.text)
        assert cnpg["apiVersion"] == "postgresql.cnpg.io/v1"
        assert cnpg["kind"] == "Cluster"
        yaml_params = cnpg["spec"]["postgresql"]["parameters"]
        # a query that takes 32 ms at work_mem 4MB or less and 2 ms above: the session
        # keeps a larger work_mem, and both files carry it and nothing else
        assert list(changed) == ["work_mem"], (sess["gain_status"], sess["notes"])
        assert list(yaml_params) == ["work_mem"]
        assert [p["ParameterName"] for p in params] == ["work_mem"]
        # each value as PostgreSQL itself reports it in pg_settings' unit, and its apply
        # method from its context: what RDS's parameter group holds
        with psycopg.connect(make_conninfo(row.dsn, dbname="postgres")) as conn:
            for p in params:
                name = p["ParameterName"]
                seen = []
                for value in (changed[name], yaml_params[name]):
                    conn.execute("SELECT set_config(%s, %s, true)", [name, value])
                    got = conn.execute(
                        "SELECT setting, unit, context FROM pg_settings WHERE name = %s", [name]
                    ).fetchone()
                    assert got is not None
                    seen.append(got)
                # the YAML's value is the session's, and RDS's is pg_settings' number (kB)
                assert seen[0] == seen[1], seen
                assert p["ParameterValue"] == seen[0][0], (p, seen)
                assert seen[0][1] == "kB"
                assert int(p["ParameterValue"]) > 4096  # above the 4MB the query slows at
                assert p["ApplyMethod"] == (
                    "pending-reboot" if seen[0][2] == "postmaster" else "immediate"
                )
    finally:
        client.delete(f"/api/v1/targets/{twin['id']}", params={"history": "drop"})
        client.delete(f"/api/v1/captures/{cap['id']}")


def test_the_dashboard_registers_and_shows_a_recommend_only_target(
    client: TestClient, managed: tuple[Sandbox, int]
) -> None:
    page = client.get("/").text
    assert 'name="recommend_only"' in page
    # listed with its tag, offered to no session and to no sweep
    rows = [r.split("</tr>")[0] for r in page.split('<tr class="target-row">')[1:]]
    (row,) = [r for r in rows if "rds-prod" in r]
    assert "recommend-only" in row
    assert "sweep clients" not in row
    select = page[page.index('<select name="target_id">') :].split("</select>")[0]
    assert "rds-prod" not in select
    with Sandbox.create() as other:
        form = {"name": "rds-web", "dsn": other.bench_dsn, "ram_gib": "4", "cpus": "1"}
        # without the box ticked, refused, saying what to tick
        r = client.post("/targets", data=form)
        assert r.status_code == 422
        assert "recommend_only" in r.text
        r = client.post("/targets", data={**form, "recommend_only": "on"}, follow_redirects=False)
        assert r.status_code == 303, r.text
        t = next(t for t in client.get("/api/v1/targets").json() if t["name"] == "rds-web")
        assert t["recommend_only"] is True
        assert (t["ram_bytes"], t["cpus"]) == (4 * 2**30, 1)
        r = client.delete(f"/api/v1/targets/{t['id']}", params={"history": "drop"})
        assert r.status_code == 204
