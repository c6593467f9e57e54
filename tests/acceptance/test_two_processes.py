"""Two service processes as docs/configuration.md deploys them: one PostgreSQL metadata DB,
one secret key file, a work directory each. The process driving a session is killed
(SIGKILL) mid-session: the other takes the session over, finishes it, and the target ends
with its own settings (pg_settings, pg_file_settings).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, text

from app.postgres.pgbench import init_data
from tests.acceptance.conftest import wait_session
from tests.conftest import SandboxFactory
from tests.helpers import ServiceProcess, file_settings, metadata_db

# pgbench -R 100: the test is about the lease and the resume, not a level; a throttled
# run leaves the CPUs to the suite's other workers
QUICK = {
    "builtin": "tpcb-like",
    "scale": 1,
    "clients": 2,
    "jobs": 1,
    "duration_s": 3,
    "rate": 100,
}


@pytest.fixture
def pg_url() -> Iterator[str]:
    """The shared metadata DB: a database of this test's own on the host's server."""
    with metadata_db("knobtune_2p") as url:
        yield url


def lease_owner(url: str, sid: int) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            owner = conn.execute(
                text("SELECT lease_owner FROM sessions WHERE id = :i"), {"i": sid}
            ).scalar()
            return str(owner) if owner is not None else None
    finally:
        engine.dispose()


def work_mem(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SELECT setting FROM pg_settings WHERE name = 'work_mem'").fetchone()
        assert row is not None
        return str(row[0])


@pytest.mark.timeout(300)
def test_the_survivor_finishes_a_killed_process_s_session_and_restores_the_target(
    pg_url: str, tmp_path: Path, sandbox_factory: SandboxFactory
) -> None:
    sb = sandbox_factory()
    init_data(sb.bench_dsn, 1)  # the client's data, where the workload runs
    before, before_mem = file_settings(sb.dsn), work_mem(sb.dsn)
    key = tmp_path / "knobtune.key"  # one key, copied to every host
    key.write_text(Fernet.generate_key().decode() + "\n")
    key.chmod(0o600)
    shared = {
        "KNOBTUNE_DATABASE_URL": pg_url,
        "KNOBTUNE_SECRET_KEY_FILE": str(key),
        # a dead process's session is taken over within seconds, not half a minute
        "KNOBTUNE_LEASE_SECONDS": "4",
        "KNOBTUNE_POLL_SECONDS": "0.5",
    }
    procs: dict[str, ServiceProcess] = {}
    for name in ("host-a", "host-b"):
        (tmp_path / name).mkdir()
        procs[name] = ServiceProcess(tmp_path / name, **shared, KNOBTUNE_INSTANCE_ID=name)
    try:
        for p in procs.values():
            p.start()
        api = httpx.Client(base_url=procs["host-a"].url, timeout=60)
        r = api.post(
            "/api/v1/targets", json={"name": "shop", "dsn": sb.dsn, "workload_dsn": sb.bench_dsn}
        )
        assert r.status_code == 201, r.text
        body = {
            "target_id": r.json()["id"],
            "knobs": ["work_mem"],
            "max_trials": 5,
            "final_check_runs": 0,
            "seed": 3,
            "workload": QUICK,
        }
        r = api.post("/api/v1/sessions", json=body)
        assert r.status_code == 202, r.text
        sid = int(r.json()["id"])

        # whichever process claimed it is killed while a candidate's run is under way
        deadline = time.monotonic() + 120
        s: dict[str, Any] = {}
        while time.monotonic() < deadline:
            s = api.get(f"/api/v1/sessions/{sid}").json()
            phase = str(s["phase"])
            if s["status"] != "running" and s["status"] != "queued":
                break
            if s["progress"]["trials_done"] >= 2 and phase.startswith(("measuring", "re-")):
                break
            time.sleep(0.2)
        assert s["status"] == "running", s
        owner = lease_owner(pg_url, sid)
        assert owner in procs, owner
        survivor = next(n for n in procs if n != owner)
        procs[owner].kill()

        api = httpx.Client(base_url=procs[survivor].url, timeout=60)
        final = wait_session(api, sid, {"succeeded", "failed", "cancelled"}, timeout=180)
        assert final["status"] == "succeeded", (final, procs[survivor].log_tail())
        assert final["attempts"] == 2  # the killed process's start, and the survivor's
        assert "runner crashed" not in " ".join(final["notes"])
        trials = [t["index"] for t in api.get(f"/api/v1/sessions/{sid}/trials").json()]
        assert trials == list(range(1, len(trials) + 1))  # none lost, none twice
        assert file_settings(sb.dsn) == before  # the target's own configuration again
        assert work_mem(sb.dsn) == before_mem
    finally:
        for p in procs.values():
            p.stop()
