"""SIGKILL the service mid-capture: the next process puts the logging settings back first,
then collects what was logged up to then and finishes with a note (app/captures/runner.py).

The service is `knobtune serve` in a subprocess (tests/helpers.py ServiceProcess); it dies
with no cleanup of any kind while the target logs every statement.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from app import vault
from app.captures.store import read_log
from app.postgres.sandbox import Sandbox
from tests.app.captures.conftest import log_setting, server_state
from tests.helpers import ServiceProcess, logging_sandbox, wait_capture

LEASE_S = 3.0
POLL_S = 0.5


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    svc = ServiceProcess(
        tmp_path,
        KNOBTUNE_LEASE_SECONDS=str(LEASE_S),
        KNOBTUNE_POLL_SECONDS=str(POLL_S),
    )
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


@pytest.mark.timeout(240)
def test_sigkill_mid_capture_then_the_next_process_restores_and_collects(
    service: ServiceProcess, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    sb: Sandbox = logging_sandbox(pgss=False)
    try:
        before = server_state(sb)
        api = httpx.Client(base_url=service.url, timeout=30)
        body = {"name": "killed", "dsn": sb.dsn, "workload_dsn": sb.bench_dsn}
        target = api.post("/api/v1/targets", json=body).json()
        r = api.post(
            "/api/v1/captures",
            json={
                "target_id": target["id"],
                "name": "killed",
                "seconds": 600,
                "database": "knobtune",
            },
        )
        assert r.status_code == 202, r.text
        cid = r.json()["id"]
        wait_capture(api, cid, until="logging")
        with psycopg.connect(sb.bench_dsn, autocommit=True) as conn:
            conn.execute(f"SELECT 'before-the-kill-{tag}'")
        service.kill()
        # the target is left in the capture's logging state: nobody restored it
        assert log_setting(sb) == "all"
        with psycopg.connect(sb.bench_dsn, autocommit=True) as conn:
            conn.execute(f"SELECT 'while-down-{tag}'")  # still logged, up to the restore

        service.start()
        body = wait_capture(api, cid, timeout=60)
        assert body["status"] == "succeeded", body
        notes = " ".join(body["notes"])
        assert "the service stopped during the capture; logging restored at" in notes
        assert "the capture holds the statements until then" in notes
        assert body["summary"]["statements"] == 2, body["summary"]
        # every setting the capture changed is back
        assert server_state(sb) == before
        assert log_setting(sb) == before_setting(before)
        vault.configure(None, tmp_path)  # the service's generated key, to read the file here
        text = read_log(tmp_path, cid)
        assert f"before-the-kill-{tag}" in text
        assert f"while-down-{tag}" in text
        with psycopg.connect(sb.bench_dsn, autocommit=True) as conn:
            conn.execute(f"SELECT 'after-{tag}'")
        time.sleep(0.5)
        assert f"after-{tag}" not in read_log(tmp_path, cid)
        api.close()
    finally:
        sb.destroy()


def before_setting(state: dict[str, object]) -> str:
    rows = state["settings"]
    assert isinstance(rows, list)
    return next(str(r[1]) for r in rows if r[0] == "log_statement")
