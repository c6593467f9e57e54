"""The service as users run it, over restarts and crashes, on its default settings.

`knobtune serve` starts in a fresh directory with no KNOBTUNE_* variable: the metadata DB
and work files land there (relative defaults, resolved once at start-up).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx

from tests.acceptance.conftest import UserService, wait_session
from tests.helpers import file_settings

# pgbench -R 100: what is followed is the service's lifecycle, not a level; a throttled
# run keeps the builtin path and leaves the CPUs to the suite's other workers
QUICK = {
    "builtin": "tpcb-like",
    "rate": 100,
    "scale": 1,
    "clients": 2,
    "jobs": 1,
    "duration_s": 3,
    "warmup_s": 1,
}


def _session(api: httpx.Client, target_id: int, **extra: Any) -> int:
    # the shortest session that runs: the baseline, a first evaluation, no final check
    # (what these tests follow is the service's lifecycle, not a verdict)
    body = {
        "target_id": target_id,
        "knobs": ["work_mem"],
        "max_trials": 5,
        "final_check_runs": 0,
        "workload": QUICK,
    }
    r = api.post("/api/v1/sessions", json={**body, **extra})
    assert r.status_code == 202, r.text
    return int(r.json()["id"])


def _trial_indexes(api: httpx.Client, sid: int) -> list[int]:
    return [t["index"] for t in api.get(f"/api/v1/sessions/{sid}/trials").json()]


def stored_dsn(user_dir: Path, target_id: int) -> str:
    """A target's DSN as the service in ``user_dir`` stores it: decrypted with its key."""
    from app import vault

    vault.configure(None, user_dir / ".knobtune")  # the key the service generated there
    with sqlite3.connect(user_dir / "knobtune.db") as conn:
        [(value,)] = conn.execute("SELECT dsn FROM targets WHERE id = ?", (target_id,))
    return vault.decrypt(value)


def test_a_sandbox_target_survives_a_restart_and_a_sigkill_mid_benchmark(user_dir: Path) -> None:
    """One service and one sandbox target through both: a session, a clean restart
    (SIGTERM), then a session killed mid-benchmark (SIGKILL) that the next start resumes
    and finishes. (Two tests of their own each made the service, the sandbox and its data
    again, and ran a session more.)"""
    svc = UserService(user_dir)
    svc.start()
    try:
        api = httpx.Client(base_url=svc.url, timeout=60)
        r = api.post("/api/v1/targets", json={"name": "try-me", "sandbox": True})
        assert r.status_code == 201, r.text
        tid = r.json()["id"]
        dsn = stored_dsn(user_dir, tid)  # the API shows it with the password masked
        before = file_settings(dsn)
        first = wait_session(api, _session(api, tid), {"succeeded", "failed", "cancelled"})
        assert first["status"] == "succeeded", first
        assert file_settings(dsn) == before  # restored at the end

        svc.stop()  # SIGTERM, as Ctrl-C or systemd would
        svc.start()
        api = httpx.Client(base_url=svc.url, timeout=60)
        listed = [t for t in api.get("/api/v1/targets").json() if t["id"] == tid]
        assert listed, "the sandbox target vanished from the list"

        # a session after the restart, killed while the third or a later trial's benchmark
        # is producing samples
        sid = _session(api, tid, seed=3, workload={**QUICK, "duration_s": 4})
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            s = api.get(f"/api/v1/sessions/{sid}").json()
            if s["status"] in ("succeeded", "failed", "cancelled") or (
                s["progress"]["trials_done"] >= 2
                and s["live_tps"]
                and s["phase"].startswith(("measuring", "re-"))
            ):
                break
            time.sleep(0.3)
        assert s["status"] == "running", s
        done_before = s["progress"]["trials_done"]
        svc.kill()

        svc.start()  # same directory, same defaults: it must find and resume the session
        api = httpx.Client(base_url=svc.url, timeout=60)
        final = wait_session(api, sid, {"succeeded", "failed", "cancelled"}, timeout=500)
        assert final["status"] == "succeeded", final
        assert final["error"] is None
        assert final["attempts"] == 2
        indexes = _trial_indexes(api, sid)
        assert indexes == list(range(1, len(indexes) + 1))  # none lost, none twice
        assert len(indexes) > done_before
        assert file_settings(dsn) == before  # restored at the end

        sandbox_dirs = list((user_dir / ".knobtune" / "sandboxes").iterdir())
        assert len(sandbox_dirs) == 1
        assert api.delete(f"/api/v1/targets/{tid}?history=drop").status_code == 204
        assert not sandbox_dirs[0].exists()
    finally:
        svc.stop()
