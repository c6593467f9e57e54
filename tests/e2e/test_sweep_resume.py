"""SIGKILL the service mid-sweep; the restarted process resumes the sweep within a lease.

A sweep is claimed under a lease and kept alive by a heartbeat, like a session
(app/sweeps/runner.py). The process dies with no cleanup of any kind; the new one claims
the sweep as soon as its lease has run out, keeps the runs measured before the crash,
measures the rest of the plan and finishes it, all on the real service and a real
sandbox with real pgbench.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.db import Database
from app.models import Sweep
from app.postgres.sandbox import Sandbox
from tests.helpers import ServiceProcess

LEASE_S = 3.0
POLL_S = 0.5


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    # Short lease: the restarted process takes the orphaned sweep over quickly.
    svc = ServiceProcess(
        tmp_path, KNOBTUNE_LEASE_SECONDS=str(LEASE_S), KNOBTUNE_POLL_SECONDS=str(POLL_S)
    )
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


def _row(db: Database, wid: int) -> dict[str, Any]:
    with db.session() as s:
        sw = s.get(Sweep, wid)
        assert sw is not None
        return {"attempts": sw.attempts, "owner": sw.lease_owner, "status": sw.status}


def test_sigkill_mid_sweep_then_the_sweep_is_resumed_and_finished(
    service: ServiceProcess, tmp_path: Path
) -> None:
    db = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    with Sandbox.create() as sandbox:
        api = httpx.Client(base_url=service.url, timeout=30)
        body = {"name": "sweep", "dsn": sandbox.dsn, "workload_dsn": sandbox.bench_dsn}
        target = api.post("/api/v1/targets", json=body).json()
        r = api.post(
            f"/api/v1/targets/{target['id']}/sweeps",
            # the user's own script, 10 ms of sleep a transaction: the resume is what is
            # checked, and pgbench's runs at 1 and 2 clients hardly use the CPU
            json={
                "builtin": None,
                "scripts": [{"sql": "SELECT pg_sleep(0.01);"}],
                "init": False,
                "clients": [1, 2],
                "repeats": 2,
                "duration_s": 2,
                "warmup_s": 1,
                "connect_cost": False,
            },
        )
        assert r.status_code == 202, r.text
        wid = r.json()["id"]
        # Kill while a run after the first one is under way.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            sw = api.get(f"/api/v1/sweeps/{wid}").json()
            if 1 <= sw["runs_done"] < 3 and sw["phase"].startswith("run "):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the sweep never got going: {sw}")
        before = sw["runs"]
        first_owner = _row(db, wid)["owner"]
        service.kill()
        with pytest.raises(httpx.HTTPError):  # gone: nothing answers until the restart
            api.get(f"/api/v1/sweeps/{wid}", timeout=2)

        service.start()
        started = time.monotonic()
        # resumed within one lease period of the restart (the dead lease expires, the
        # next claim takes it)
        while time.monotonic() - started < LEASE_S + 5 * POLL_S + 2:
            row = _row(db, wid)
            if row["attempts"] == 2:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"not resumed within a lease period: {_row(db, wid)}")
        resumed_after = time.monotonic() - started
        assert row["owner"] != first_owner  # the new process holds it
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            sw = api.get(f"/api/v1/sweeps/{wid}").json()
            if sw["status"] not in ("queued", "running"):
                break
            time.sleep(0.5)
        assert sw["status"] == "succeeded", sw
        assert sw["error"] is None
        # the runs measured before the crash are kept, the rest of the plan was measured
        assert sw["runs"][: len(before)] == before
        assert [r["clients"] for r in sw["runs"]] == [1, 2, 2, 1]  # the up-down order
        assert sw["runs_done"] == sw["runs_planned"] == 4
        assert len(before) < 4  # some runs were measured after the restart
        assert sw["knee_clients"] in (1, 2)
        assert _row(db, wid)["owner"] is None  # the lease is released
        assert resumed_after <= LEASE_S + 5 * POLL_S + 2
        # the target is free again: a session or another sweep may have it
        again = api.post(f"/api/v1/targets/{target['id']}/sweeps", json={"clients": [1]})
        assert again.status_code == 202, again.text
        api.post(f"/api/v1/sweeps/{again.json()['id']}/cancel")
    db.dispose()
