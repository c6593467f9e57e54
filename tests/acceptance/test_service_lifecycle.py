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


def _kill_mid_benchmark(api: httpx.Client, sid: int) -> dict[str, Any]:
    """Wait until the session's second or a later trial's benchmark produces samples."""
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
    return s  # type: ignore[no-any-return]


def _auto_conf(user_dir: Path) -> str:
    """The sandbox's postgresql.auto.conf, read from disk (the sandbox is down)."""
    [path] = (user_dir / ".knobtune" / "sandboxes").glob("*/**/postgresql.auto.conf")
    return path.read_text()


def _session_row(user_dir: Path, sid: int) -> tuple[Any, ...]:
    with sqlite3.connect(user_dir / "knobtune.db") as conn:
        [row] = conn.execute("SELECT status, lease_owner, phase FROM sessions WHERE id = ?", (sid,))
    return tuple(row)


def test_a_sandbox_target_survives_a_sigterm_and_a_sigkill_mid_benchmark(user_dir: Path) -> None:
    """One service and one sandbox target through both: a session stopped mid-benchmark
    (SIGTERM, as Ctrl-C or systemd stop) puts the target back before the service ends and
    resumes at the next start; a session killed mid-benchmark (SIGKILL) is resumed and
    finished by the next start. (Two tests of their own each made the service, the sandbox
    and its data again, and ran a session more.)"""
    svc = UserService(user_dir)
    svc.start()
    try:
        api = httpx.Client(base_url=svc.url, timeout=60)
        r = api.post("/api/v1/targets", json={"name": "try-me", "sandbox": True})
        assert r.status_code == 201, r.text
        tid = r.json()["id"]
        dsn = stored_dsn(user_dir, tid)  # the API shows it with the password masked
        before = file_settings(dsn)
        auto_before = _auto_conf(user_dir)

        sid = _session(api, tid, workload={**QUICK, "duration_s": 4})
        _kill_mid_benchmark(api, sid)
        began = time.monotonic()
        svc.stop()  # SIGTERM
        assert svc.proc is not None
        assert svc.proc.returncode == 0, svc.log_tail()
        assert time.monotonic() - began < 40, "the stop waited out its grace"
        # the trial's work_mem is gone from the file before the sandbox stopped, and the
        # session waits, released, for the next start
        assert _auto_conf(user_dir) == auto_before
        status, owner, phase = _session_row(user_dir, sid)
        assert (status, owner) == ("running", None)
        assert phase.startswith("paused: the service stopped"), phase

        svc.start()
        api = httpx.Client(base_url=svc.url, timeout=60)
        listed = [t for t in api.get("/api/v1/targets").json() if t["id"] == tid]
        assert listed, "the sandbox target vanished from the list"
        first = wait_session(api, sid, {"succeeded", "failed", "cancelled"}, timeout=300)
        assert first["status"] == "succeeded", first
        assert first["attempts"] == 2
        assert file_settings(dsn) == before  # restored at the end

        # a session killed while the third or a later trial's benchmark produces samples
        sid = _session(api, tid, seed=3, workload={**QUICK, "duration_s": 4})
        done_before = _kill_mid_benchmark(api, sid)["progress"]["trials_done"]
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
