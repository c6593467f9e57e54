"""Finding 5 of issue 25: two targets for one server bypassed "one session per target".

A server is its system identifier and port. A second target for it is a 409 naming the
first; and a session or a sweep checks the server, not the target row (rows from before
the check, registered twice, exist).
"""

from __future__ import annotations

import json
import sqlite3

from tests.conftest import SandboxFactory
from tests.security.exec_helpers import QUICK, client_for, service_dir, settings_for


def test_a_second_target_for_the_same_server_is_409_naming_the_first(
    sandbox_factory: SandboxFactory,
) -> None:
    sb = sandbox_factory()
    with service_dir() as base, client_for(settings_for(base, run_scheduler=False)) as api:
        first = api.post("/api/v1/targets", json={"name": "first", "dsn": sb.dsn})
        assert first.status_code == 201, first.text
        # The same server through TCP instead of the socket, and another database.
        other_spelling = sb.tcp_dsn.replace("dbname=postgres", "dbname=template1")
        second = api.post("/api/v1/targets", json={"name": "second", "dsn": other_spelling})
        assert second.status_code == 409, second.text
        assert "'first'" in second.json()["detail"]
        assert [t["name"] for t in api.get("/api/v1/targets").json()] == ["first"]
        # Another server is welcome, and deleting a target frees its server.
        assert (
            api.post("/api/v1/targets", json={"name": "other", "dsn": sandbox_factory().dsn})
        ).status_code == 201
        assert api.delete(f"/api/v1/targets/{first.json()['id']}").status_code == 204
        again = api.post("/api/v1/targets", json={"name": "second", "dsn": other_spelling})
        assert again.status_code == 201, again.text


def test_sessions_and_sweeps_check_the_server_not_the_target_row(
    sandbox_factory: SandboxFactory,
) -> None:
    sb = sandbox_factory()
    with service_dir() as base:
        # No scheduler: a queued session holds its server as a running one does.
        settings = settings_for(base, run_scheduler=False)
        with client_for(settings) as api:
            a = api.post("/api/v1/targets", json={"name": "a", "dsn": sb.dsn}).json()
        # A second row for the same server, as an older version let one register it.
        with sqlite3.connect(base / "knobtune.db") as conn:
            conn.execute(
                "INSERT INTO targets (name, dsn, data_dir, ram_bytes, cpus, probe, created_at) "
                "SELECT 'b', dsn, data_dir, ram_bytes, cpus, probe, created_at FROM targets "
                "WHERE id = ?",
                (a["id"],),
            )
            [(b_id,)] = conn.execute("SELECT id FROM targets WHERE name = 'b'").fetchall()
        body = {"knobs": ["work_mem"], "max_trials": 6, "final_check_runs": 0, "workload": QUICK}
        with client_for(settings) as api:
            s1 = api.post("/api/v1/sessions", json={"target_id": a["id"], **body})
            assert s1.status_code == 202, s1.text
            s2 = api.post("/api/v1/sessions", json={"target_id": b_id, **body})
            sweep = api.post(f"/api/v1/targets/{b_id}/sweeps", json={"clients": [1]})
            api.post(f"/api/v1/sessions/{s1.json()['id']}/cancel")
            if s2.status_code == 202:
                api.post(f"/api/v1/sessions/{s2.json()['id']}/cancel")
        assert s2.status_code == 409, s2.text
        detail = s2.json()["detail"]
        assert "same server" in detail
        assert "'a'" in detail or "'b'" in detail
        assert sweep.status_code == 409, json.dumps(sweep.json())
