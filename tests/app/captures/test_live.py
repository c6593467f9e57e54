"""Live captures on real sandboxes: the statements of the window are kept, rotation is
followed, every setting the capture changed is put back (also after a cancel), and a
target that cannot be captured is refused with what to change."""

from __future__ import annotations

import os
import stat
import time
import uuid

import psycopg
import pytest
from fastapi.testclient import TestClient

from app.captures.store import path_for, read_log
from app.postgres.sandbox import Sandbox
from app.postgres.serverlog import access_problems
from app.settings import Settings
from tests.app.captures.conftest import log_setting, server_state, work_dir
from tests.helpers import wait_capture


def _target(client: TestClient, sb: Sandbox, name: str) -> int:
    r = client.post("/api/v1/targets", json={"name": name, "dsn": sb.dsn})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


@pytest.mark.timeout(180)
def test_a_capture_keeps_its_window_follows_rotation_and_restores_every_setting(
    svc: tuple[TestClient, Settings], logsb: Sandbox
) -> None:
    client, settings = svc
    tid = _known(client, "live") or _target(client, logsb, "live")
    tag = uuid.uuid4().hex[:8]
    before = server_state(logsb)
    with psycopg.connect(logsb.bench_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS acc (id int PRIMARY KEY, note text)")
        conn.execute("TRUNCATE acc")
        conn.execute(f"SELECT 'before-{tag}'")  # before the window: not captured
    r = client.post(
        "/api/v1/captures",
        json={"target_id": tid, "name": "live-window", "seconds": 10, "database": "knobtune"},
    )
    assert r.status_code == 202, r.text
    cid = r.json()["id"]
    assert r.json()["status"] == "queued"
    wait_capture(client, cid, until="logging")
    assert log_setting(logsb) == "all"  # the capture's settings are in force
    # the target is held: no session, sweep or second capture meanwhile
    again = client.post(
        "/api/v1/captures",
        json={"target_id": tid, "name": "live-again", "seconds": 10, "database": "knobtune"},
    )
    assert again.status_code == 409, again.text
    assert "capture" in again.json()["detail"]
    with psycopg.connect(logsb.bench_dsn, autocommit=True) as conn:
        for i in range(5):
            conn.execute("INSERT INTO acc VALUES (%s, %s)", [i, f"in-window-{tag}-{i}"])
            conn.execute("SELECT note FROM acc WHERE id = %s", [i])
        with psycopg.connect(logsb.dsn, autocommit=True) as other:
            other.execute(f"SELECT 'otherdb-{tag}'")  # another database: not kept
            other.execute("SELECT pg_rotate_logfile()")  # a new log file from here on
        time.sleep(1.5)
        for i in range(5, 10):
            conn.execute("INSERT INTO acc VALUES (%s, %s)", [i, f"after-rotation-{tag}-{i}"])
        conn.execute(f"SELECT 'multi\nline-{tag}'")
    body = wait_capture(client, cid)
    with psycopg.connect(logsb.bench_dsn, autocommit=True) as conn:
        conn.execute(f"SELECT 'after-{tag}'")  # after the window: not captured
    assert body["status"] == "succeeded", body
    assert body["error"] is None
    assert any(n.startswith("logging settings restored at") for n in body["notes"]), body
    # every setting the capture changed is back: the file and the server's values
    assert server_state(logsb) == before
    text = read_log(work_dir(settings), cid)
    for i in range(5):
        assert f"in-window-{tag}-{i}" in text
    for i in range(5, 10):
        assert f"after-rotation-{tag}-{i}" in text
    assert f"multi\n\tline-{tag}" in text  # a statement's continuation lines come along
    assert f"before-{tag}" not in text
    assert f"after-{tag}'" not in text
    assert f"otherdb-{tag}" not in text
    assert "pg_read_binary_file" not in text  # the service's own reading is left out
    assert all("|knobtune|" in line for line in text.splitlines() if not line.startswith("\t"))
    # the summary, with mean times from pg_stat_statements
    s = body["summary"]
    assert s["statements"] == 16  # 10 inserts, 5 selects, the two-line select
    assert s["sessions"] >= 1
    assert s["timing"]["measured"], s["timing"]
    inserts = [q for q in s["top"] if q["query"].startswith("INSERT INTO acc")]
    assert inserts
    assert inserts[0]["calls"] == 10
    assert inserts[0]["mean_ms"] is not None
    assert inserts[0]["share_time"] is not None
    assert inserts[0]["kind"] == "write"
    assert tag not in str(body)  # no captured value in the response
    # at rest: 0600, encrypted
    path = path_for(work_dir(settings), cid)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert tag.encode() not in path.read_bytes()
    assert body["raw_bytes"] == len(text.encode())
    assert body["stored_bytes"] > 0


@pytest.mark.timeout(180)
def test_a_cancel_restores_the_settings_and_keeps_what_was_logged(
    svc: tuple[TestClient, Settings], logsb: Sandbox
) -> None:
    client, settings = svc
    tid = _known(client, "live") or _target(client, logsb, "live")
    tag = uuid.uuid4().hex[:8]
    before = server_state(logsb)
    r = client.post(
        "/api/v1/captures",
        json={"target_id": tid, "name": "live-cancel", "seconds": 600, "database": "knobtune"},
    )
    assert r.status_code == 202, r.text
    cid = r.json()["id"]
    wait_capture(client, cid, until="logging")
    with psycopg.connect(logsb.bench_dsn, autocommit=True) as conn:
        conn.execute(f"SELECT 'partial-{tag}'")
    # a running capture cannot be deleted
    refused = client.delete(f"/api/v1/captures/{cid}")
    assert refused.status_code == 409
    assert "cancel it first" in refused.json()["detail"]
    t0 = time.monotonic()
    assert client.post(f"/api/v1/captures/{cid}/cancel").status_code == 202
    body = wait_capture(client, cid)
    assert time.monotonic() - t0 < 30
    assert body["status"] == "cancelled", body
    assert any("cancelled after" in n and "restored" in n for n in body["notes"]), body
    assert server_state(logsb) == before
    assert f"partial-{tag}" in read_log(work_dir(settings), cid)
    # a finished capture is deleted with its file
    assert client.delete(f"/api/v1/captures/{cid}").status_code == 204
    assert not path_for(work_dir(settings), cid).exists()
    assert client.get(f"/api/v1/captures/{cid}").status_code == 404


def _known(client: TestClient, name: str) -> int:
    for t in client.get("/api/v1/targets").json():
        if t["name"] == name:
            return int(t["id"])
    return 0


def test_a_target_without_the_logging_collector_is_refused_with_what_to_change(
    svc: tuple[TestClient, Settings], sandbox: Sandbox
) -> None:
    client, _settings = svc
    tid = _target(client, sandbox, "no-collector")
    r = client.post("/api/v1/captures", json={"target_id": tid, "name": "nope", "seconds": 10})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "logging_collector is off" in detail
    assert "set logging_collector = on" in detail
    assert "POST /api/v1/captures/import" in detail  # the other way in
    assert client.get("/api/v1/captures").json() == [] or all(
        c["name"] != "nope" for c in client.get("/api/v1/captures").json()
    )


def test_a_role_without_the_privileges_hears_each_grant(logsb: Sandbox) -> None:
    with psycopg.connect(logsb.bench_dsn, autocommit=True) as conn:
        problems = access_problems(conn, database="knobtune")
    text = " ".join(problems)
    assert "may not ALTER SYSTEM log_statement" in text
    assert "GRANT ALTER SYSTEM ON PARAMETER" in text
    assert "GRANT pg_monitor TO knobtune_bench" in text
    assert "GRANT pg_read_server_files TO knobtune_bench" in text
    assert "GRANT SELECT ON pg_file_settings TO knobtune_bench" in text
    with psycopg.connect(logsb.dsn, autocommit=True) as conn:
        assert access_problems(conn, database="knobtune") == []
        missing = access_problems(conn, database="no_such_db")
    assert missing == ["the server has no database 'no_such_db': give an existing one"]
