"""Issue 40, least-privileged workloads: a client's scripts, the preflight and replays ran
as the DSN's user, usually a superuser (ALTER SYSTEM needs one), so ``COPY ... TO
PROGRAM`` ran on the server's host.

Now a DSN target's workload runs as a separate role (``workload_dsn``; a sandbox's
``knobtune_bench``), and a role that is superuser, has CREATEROLE before PostgreSQL 16,
or is a member of pg_execute_server_program, pg_read_server_files or
pg_write_server_files is refused at registration and again before each run. The server
is a disposable trust cluster on loopback (tests/security/local_servers.py), allowed
through KNOBTUNE_TARGET_HOSTS as an operator would.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.postgres.sandbox import Sandbox
from app.settings import Settings
from tests.helpers import wait_done
from tests.security.conftest import session_body
from tests.security.local_servers import settings_for, trust_cluster, trust_dsn

ALLOW = {"target_hosts": ["*", "127.0.0.1/32"]}


@pytest.fixture(scope="module")
def trusting() -> Iterator[Sandbox]:
    with trust_cluster() as sb:
        yield sb


def _settings(tmp: Path, **more: Any) -> Settings:
    return settings_for(tmp, poll_seconds=0.2, **ALLOW, **more)


def _register(api: TestClient, sb: Sandbox, workload: str | None) -> Any:
    body: dict[str, Any] = {"name": f"t-{workload}", "dsn": trust_dsn(sb)}
    if workload is not None:
        body["workload_dsn"] = trust_dsn(sb, user=workload)
    return api.post("/api/v1/targets", json=body)


def test_a_privileged_workload_role_is_refused_at_registration(
    trusting: Sandbox, tmp_path: Path
) -> None:
    with TestClient(create_app(_settings(tmp_path, run_scheduler=False))) as api:
        for workload, why in (
            (None, "'postgres', a superuser"),  # the DSN's own user
            ("postgres", "'postgres', a superuser"),
            ("reader", "a member of pg_read_server_files"),
            ("runner", "a member of pg_execute_server_program"),
            ("maker", "CREATEROLE"),  # PostgreSQL 15: it may grant itself those roles
        ):
            r = _register(api, trusting, workload)
            assert r.status_code == 422, r.text
            assert why in r.json()["detail"], r.json()["detail"]
            assert "workload_dsn" in r.json()["detail"]  # what to give instead
        ok = _register(api, trusting, "app")
        assert ok.status_code == 201, ok.text
        assert "user=app" in ok.json()["workload_dsn"]
        assert api.delete(f"/api/v1/targets/{ok.json()['id']}").status_code == 204


def test_the_preflight_and_a_queued_session_are_checked_again_before_they_run(
    trusting: Sandbox, tmp_path: Path, marker: Path
) -> None:
    """A role granted more after registration: the preflight refuses it, and a session
    stored before the grant fails when it would start, with nothing run."""
    settings = _settings(tmp_path, run_scheduler=False)
    with TestClient(create_app(settings)) as api:
        tid = _register(api, trusting, "app").json()["id"]
        copy = f"COPY (SELECT 1) TO PROGRAM 'id > {marker}';"
        r = api.post("/api/v1/sessions", json=session_body(tid, copy))
        assert r.status_code == 422  # as app: no program
        assert "pg_execute_server_program" in r.json()["detail"]
        queued = api.post("/api/v1/sessions", json=session_body(tid, "SELECT 1;"))
        assert queued.status_code == 202, queued.text
        with psycopg.connect(trust_dsn(trusting), autocommit=True) as conn:
            conn.execute("GRANT pg_execute_server_program TO app")
        try:
            # the scheduler starts the queued session now: refused before any benchmark
            running = settings.model_copy(update={"run_scheduler": True})
            with TestClient(create_app(running)) as run:
                done = wait_done(run, queued.json()["id"], timeout=60)
            assert done["status"] == "failed", done
            assert "a member of pg_execute_server_program" in done["error"]
        finally:
            with psycopg.connect(trust_dsn(trusting), autocommit=True) as conn:
                conn.execute("REVOKE pg_execute_server_program FROM app")
    assert not marker.exists()


def test_a_sandbox_dsn_runs_its_workload_as_the_benchmark_role(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """A sandbox's superuser DSN (here one this process made): its knobtune_bench runs
    the workload, so a script that reads the server's files is refused by the server."""
    with TestClient(create_app(settings_for(tmp_path, run_scheduler=False))) as api:
        r = api.post("/api/v1/targets", json={"name": "sb", "dsn": sandbox.dsn})
        assert r.status_code == 201, r.text
        assert "user=knobtune_bench" in r.json()["workload_dsn"]
        assert "password=***" in r.json()["workload_dsn"]
        got = api.post(
            "/api/v1/sessions",
            json=session_body(r.json()["id"], "SELECT pg_read_file('/etc/hostname');"),
        )
        assert got.status_code == 422
        assert "permission denied" in got.json()["detail"]
        assert api.delete(f"/api/v1/targets/{r.json()['id']}").status_code == 204
