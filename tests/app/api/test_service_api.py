"""The REST service end to end: real sandbox target, real pgbench, 2 s runs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.postgres.sandbox import Sandbox, free_port
from app.settings import Settings
from tests.helpers import file_settings

QUICK_WORKLOAD = {
    "builtin": "tpcb-like",
    "scale": 1,
    "clients": 2,
    "jobs": 1,
    "duration_s": 2,
    "warmup_s": 1,
    "protocol": "prepared",
    # pgbench -R: these tests are about the lifecycle, not throughput; a full-speed TPC-B
    # run keeps both CPUs busy
    "rate": 100,
}


def wait_for(
    client: TestClient, sid: int, statuses: set[str], timeout: float = 180
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body: dict[str, Any] = client.get(f"/api/v1/sessions/{sid}").json()
        if body["status"] in statuses:
            return body
        time.sleep(0.5)
    raise AssertionError(f"session {sid} did not reach {statuses}: {body}")


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox.create() as sb:
        # An entry that exists before any session: it must survive every revert.
        with psycopg.connect(sb.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET checkpoint_completion_target = '0.8'")
            conn.execute("SELECT pg_reload_conf()")
        sb.set_password("hunter2-secret")  # a password the tests look for in every answer
        yield sb


@pytest.fixture(scope="module")
def target_id(client: TestClient, sandbox: Sandbox) -> int:
    r = client.post(
        "/api/v1/targets",
        json={
            "name": "sb",
            "dsn": sandbox.dsn,
            "data_dir": str(sandbox.data_dir),
        },
    )
    assert r.status_code == 201, r.text
    assert r.headers["Location"] == f"/api/v1/targets/{r.json()['id']}"
    return int(r.json()["id"])


def test_target_is_listed_with_password_masked(client: TestClient, target_id: int) -> None:
    listing = client.get("/api/v1/targets").text
    one = client.get(f"/api/v1/targets/{target_id}").json()
    assert "hunter2-secret" not in listing
    assert "password=***" in one["dsn"]
    assert one["server_version"].startswith("PostgreSQL")


def test_unreachable_target_is_422_with_driver_message(client: TestClient) -> None:
    r = client.post(
        "/api/v1/targets",
        json={
            "name": "nowhere",
            "dsn": f"host=127.0.0.1 port={free_port()} user=postgres password=pw-xyz",
        },
    )
    assert r.status_code == 422
    assert "cannot connect" in r.json()["detail"]
    assert "pw-xyz" not in r.text


def test_target_without_alter_system_privilege_is_422(client: TestClient, sandbox: Sandbox) -> None:
    with psycopg.connect(sandbox.dsn, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS weakling")
        conn.execute(f"CREATE ROLE weakling LOGIN PASSWORD '{sandbox.password}'")
    r = client.post(
        "/api/v1/targets",
        json={"name": "weak", "dsn": sandbox.dsn.replace("user=postgres", "user=weakling")},
    )
    assert r.status_code == 422
    assert "ALTER SYSTEM" in r.json()["detail"]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"knobs": ["work_mem", "no_such_knob"]}, "no_such_knob"),
        ({"knobs": [{"name": "work_mem", "min": "1kB", "max": "64MB"}]}, "work_mem"),
        ({"knobs": [{"name": "work_mem", "min": "64MB", "max": "4MB"}]}, "above max"),
        ({"knobs": ["synchronous_commit"]}, "allow_unsafe"),
        ({"workload": {**QUICK_WORKLOAD, "duration_s": 0}}, "duration_s"),
        ({"workload": {**QUICK_WORKLOAD, "clients": 0}}, "clients"),
        (
            {"workload": {**QUICK_WORKLOAD, "jobs": 3, "clients": 2}},
            "jobs (3) must not exceed clients (2): pgbench runs at most one thread per "
            "client; give jobs 2 or less, or more clients",
        ),
        (
            {"workload": {**QUICK_WORKLOAD, "builtin": None, "scripts": [{"sql": "  "}]}},
            "script is empty",
        ),
        ({"target_id": 999_999}, "unknown target_id"),
    ],
)
def test_bad_session_requests_are_422(
    client: TestClient, target_id: int, change: dict[str, Any], needle: str
) -> None:
    body = {"target_id": target_id, "knobs": ["work_mem"], "workload": QUICK_WORKLOAD, **change}
    r = client.post("/api/v1/sessions", json=body)
    assert r.status_code == 422, r.text
    assert needle in r.text


def test_complete_session_restores_target_and_exports_a_loadable_config(
    client: TestClient, sandbox: Sandbox, target_id: int
) -> None:
    before = file_settings(sandbox.dsn)
    r = client.post(
        "/api/v1/sessions",
        json={
            "target_id": target_id,
            "knobs": ["work_mem", "max_wal_size"],
            "workload": QUICK_WORKLOAD,
            "max_trials": 11,
            "seed": 7,
            # 2 s runs: without a time budget the checkpoint rule may judge max_wal_size on
            # 5-minute runs (a CI run waited 180 s on one); this test is about the
            # lifecycle, restore and export, not about where max_wal_size is judged
            "checkpoint_rule": False,
        },
    )
    assert r.status_code == 202, r.text
    sid = r.json()["id"]
    assert r.headers["Location"] == f"/api/v1/sessions/{sid}"
    seen_running = wait_for(client, sid, {"running", "succeeded", "failed"})
    assert seen_running["status"] in {"running", "succeeded"}
    final = wait_for(client, sid, {"succeeded", "failed", "cancelled"})
    assert final["status"] == "succeeded", final
    done = final["progress"]["trials_done"]
    assert 5 <= done <= 11
    assert final["progress"]["trials_planned"] == done  # the estimate follows the session
    # a finished session's claim was checked side by side, or nothing was kept
    assert final["gain_status"] in {"none", "confirmed", "not-credible", "no-change"}, final
    assert final["baseline_tps"] is not None
    assert final["baseline_tps"] > 0
    assert set(final["best_config"]) == {"work_mem", "max_wal_size"}

    trials = client.get(f"/api/v1/sessions/{sid}/trials").json()
    assert [t["index"] for t in trials] == list(range(1, done + 1))
    if final["gain_status"] != "none":
        # The final check ends the session, interleaved A B B A A B; a keep late in an
        # 11-trial budget gets the part of it the budget still holds, at least A B.
        roles = [t["role"] for t in trials]
        check = [r for r in roles if r.startswith("final-")]
        assert roles[-len(check) :] == check
        first, second = check[:2]
        assert {first, second} == {"final-baseline", "final-incumbent"}
        assert check == [first, second, second, first, first, second][: len(check)]
        assert len(check) == 6 or done == 11
    assert trials[0]["role"] == "baseline"
    assert all(t["samples"]["median_tps"] > 0 for t in trials)
    assert all("xact_commit" in t["metrics"] for t in trials)
    # Candidates change the config: one knob, or the PGTune-style hints together.
    candidates = [t for t in trials if t["role"] == "candidate"]
    assert candidates
    assert all(t["config"] != trials[0]["config"] for t in candidates)
    assert all(
        t["knob"] in {"work_mem", "max_wal_size"} or t["value"].startswith("hints:")
        for t in candidates
    )

    # The target is back exactly as it was, including the pre-existing entry.
    assert file_settings(sandbox.dsn) == before

    conf = client.get(f"/api/v1/sessions/{sid}/config")
    assert conf.status_code == 200
    assert conf.headers["content-type"].startswith("text/plain")
    sql = client.get(f"/api/v1/sessions/{sid}/config", params={"format": "sql"}).text
    for name, value in final["best_config"].items():
        if trials[0]["config"][name] != value:
            assert f"ALTER SYSTEM SET {name}" in sql
            assert f"{name} = " in conf.text
        else:
            # unchanged: no credible gain, or set aside (a checkpoint knob on short runs)
            assert name in conf.text.split("# unchanged", 1)[1], conf.text
    as_json = client.get(f"/api/v1/sessions/{sid}/config", params={"format": "json"}).json()
    assert as_json

    # PostgreSQL itself accepts the exported fragment.
    with Sandbox.create() as fresh:
        frag = fresh.data_dir / "knobtune.conf"
        frag.write_text(conf.text)
        _chown_like(frag, fresh.data_dir)
        with (fresh.data_dir / "postgresql.conf").open("a") as f:
            f.write("\ninclude 'knobtune.conf'\n")
        fresh.restart()
        with psycopg.connect(fresh.dsn, autocommit=True) as conn:
            errors = conn.execute(
                "SELECT name, error FROM pg_file_settings WHERE error IS NOT NULL"
            ).fetchall()
            assert errors == []
            for name, value in final["best_config"].items():
                got = conn.execute(
                    "SELECT setting::numeric * CASE unit WHEN '8kB' THEN 8192 WHEN 'kB' THEN 1024 "
                    "WHEN 'MB' THEN 1048576 ELSE 1 END FROM pg_settings WHERE name = %s",
                    (name,),
                ).fetchone()
                want = conn.execute("SELECT pg_size_bytes(%s)", (value,)).fetchone()
                assert got is not None
                assert want is not None
                assert int(got[0]) == int(want[0]), (name, value)


def _chown_like(path: Path, like: Path) -> None:
    import os

    st = like.stat()
    os.chown(path, st.st_uid, st.st_gid)


def test_busy_target_409_then_cancel_restores(
    client: TestClient, sandbox: Sandbox, target_id: int
) -> None:
    before = file_settings(sandbox.dsn)
    body = {
        "target_id": target_id,
        "knobs": ["work_mem"],
        "workload": {**QUICK_WORKLOAD, "duration_s": 60, "warmup_s": 1},
        "max_trials": 5,
        "final_check_runs": 0,
    }
    first = client.post("/api/v1/sessions", json=body)
    assert first.status_code == 202
    sid = first.json()["id"]
    second = client.post("/api/v1/sessions", json=body)
    assert second.status_code == 409
    assert f"session {sid}" in second.json()["detail"]

    # Wait until a benchmark is really running, then cancel.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        s = client.get(f"/api/v1/sessions/{sid}").json()
        if s["live_tps"]:
            break
        time.sleep(0.3)
    assert s["live_tps"], s
    t0 = time.monotonic()
    assert client.post(f"/api/v1/sessions/{sid}/cancel").status_code == 202
    final = wait_for(client, sid, {"cancelled", "failed", "succeeded"}, timeout=60)
    assert final["status"] == "cancelled", final
    assert time.monotonic() - t0 < 20  # the 60 s benchmark was stopped, not waited out
    assert file_settings(sandbox.dsn) == before
    assert client.post(f"/api/v1/sessions/{sid}/cancel").status_code == 409


def walk_routes(routes: list[Any]) -> Iterator[Any]:
    """All leaf routes, also inside included routers (FastAPI >= 0.16x wraps those)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from walk_routes(inner.routes)
        else:
            yield route


def test_every_api_route_requires_the_token(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'm.db'}",
        work_dir=tmp_path,
        api_token="tok-123",
        run_scheduler=False,
    )
    app = create_app(settings)
    with TestClient(app) as c:
        checked = 0
        routes = list(walk_routes(app.routes))
        # Every path of the OpenAPI schema is among the walked routes.
        assert set(app.openapi()["paths"]) <= {getattr(r, "path", "") for r in routes}
        for route in routes:
            path = getattr(route, "path", "")
            if not path.startswith("/api"):
                continue
            url = (
                path.replace("{target_id}", "1")
                .replace("{session_id}", "1")
                .replace("{schedule_id}", "1")
            )
            for method in getattr(route, "methods", set()) - {"HEAD", "OPTIONS"}:
                for headers in (
                    {},
                    {"Authorization": "Bearer wrong"},
                    {"Authorization": "Basic tok-123"},
                ):
                    r = c.request(method, url, headers=headers, json={})
                    assert r.status_code == 401, (method, url, headers, r.status_code)
                ok = c.request(method, url, headers={"Authorization": "Bearer tok-123"}, json={})
                assert ok.status_code != 401
                checked += 1
        assert checked >= 12
        assert c.get("/healthz").status_code == 200
