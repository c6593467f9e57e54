"""Memory measured, not assumed: the meter, the live guard and a session on a small cgroup.

Real sandboxes in memory cgroups (app/postgres/cgroups.py), as a small server runs:
* the meter reads the cgroup's own accounting (anon + shmem against its limit), or the
  postmaster tree's PSS where no cgroup limits the server;
* the live guard stops a run whose memory passes 90% of the limit, before the OOM killer
  acts, ends its backends, and leaves the server up;
* a session on a 512 MB server refuses, before applying it, a pool the server would not
  hold (90% of it), then applies and measures half of it (PGTune's rule would say 25%).
Asserted: what the code decides and what PostgreSQL and the kernel report; never which
config ran faster (that is bench/e2e.py's job, docs/results/memory.md).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from fastapi.testclient import TestClient

from app.db import Database
from app.models import Target
from app.postgres.cgroups import CgroupUnavailable, Limits
from app.postgres.sandbox import Sandbox
from app.postgres.target import TargetController
from app.sessions.trial import TrialExecutor
from app.settings import Settings
from app.targets.access import controller_for
from app.workloads import workload_for
from app.workloads.schemas import WorkloadIn
from optimizer.descent import Candidate
from tests.helpers import wait_done

MIB = 1024 * 1024
LIMIT = 320 * MIB


@pytest.fixture(scope="module")
def capped() -> Iterator[Sandbox]:
    try:
        sb = Sandbox.create(limits=Limits(memory_bytes=LIMIT))
    except CgroupUnavailable as exc:  # not root, or no memory controller: nothing to cap
        pytest.fail(f"this test needs cgroups (run as root): {exc}")
    with sb:
        yield sb


def test_the_meter_reads_the_cgroup_of_a_capped_server(capped: Sandbox) -> None:
    meter = TargetController.for_sandbox(capped).memory_meter()
    assert meter is not None
    reading = meter.read()
    assert reading is not None
    assert reading.source.startswith("cgroup ")
    assert reading.limit_bytes == LIMIT
    assert 0 < reading.use.shared < LIMIT  # shared memory touched so far
    assert 0 < reading.use.private < LIMIT


def test_the_meter_reads_the_process_tree_without_a_cgroup(sandbox: Sandbox) -> None:
    meter = TargetController.for_sandbox(sandbox).memory_meter()
    assert meter is not None
    reading = meter.read()
    assert reading is not None
    assert reading.source.startswith("PSS of ")
    assert int(reading.source.split()[2]) >= 4  # postmaster, checkpointer, bgwriter, ...
    assert reading.use.total > 0


# One backend that grows by 8 MiB every half second, to 480 MiB: more than the cgroup holds.
EAT = (
    "DO $$DECLARE a text[] := '{}'; BEGIN FOR i IN 1..60 LOOP "
    "a[i] := repeat(md5(i::text), 262144); PERFORM pg_sleep(0.5); END LOOP; END$$;"
)


def test_the_live_guard_stops_a_run_before_the_oom_killer(capped: Sandbox) -> None:
    ctl = TargetController.for_sandbox(capped)
    wl = WorkloadIn.model_validate(
        {"builtin": None, "scripts": [{"sql": EAT}], "init": False, "clients": 1, "jobs": 1,
         "duration_s": 45, "warmup_s": 1}
    )  # fmt: skip
    executor = TrialExecutor(
        ctl,
        capped.dsn,
        workload_for(wl, clients=1),
        duration_s=45,
        warmup_s=1,
        app_name="knobtune-pgbench-memtest",
        meter=ctl.memory_meter(),
    )
    with psycopg.connect(capped.dsn) as conn:
        started = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    cand = Candidate(0, {"work_mem": "4MB"}, "work_mem", "4MB", "candidate")
    out = executor.run(cand, incumbent={"work_mem": "4MB"})
    assert out.rejected is not None, out.error
    assert out.rejected.startswith("memory guard (live): the server held")
    assert "over 90% of the 320MB it may use; run stopped" in out.rejected
    assert out.timings["bench_s"] < 40  # stopped, not run to its end
    # the server is up, was never restarted (no backend was OOM-killed), and the hungry
    # backend is gone
    assert ctl.is_up(), capped.log_path.read_text(errors="replace")[-3000:]
    with psycopg.connect(capped.dsn) as conn:
        assert conn.execute("SELECT pg_postmaster_start_time()").fetchone() == started
        left = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'knobtune-%'"
        ).fetchone()
    assert left == (0,)
    log = capped.log_path.read_text(errors="replace")
    assert "terminated by signal 9" not in log
    assert "out of memory" not in log.lower()


# The session's server: room enough that the step it measures (256MB, half of it) fits
# whatever its backends hold besides (a 320 MB server left 24 MB for them: refused under
# a loaded CI run), while the knob's bound (90%) never fits with its WAL buffers.
SESSION_LIMIT = 512 * MIB


@pytest.fixture
def capped_target(client: TestClient) -> Iterator[int]:
    r = client.post(
        "/api/v1/targets", json={"name": "capped-512", "sandbox": {"memory": str(SESSION_LIMIT)}}
    )
    assert r.status_code == 201, r.text
    tid: int = r.json()["id"]
    yield tid
    # the sandbox, its cgroup with it, goes with the target and its sessions
    r = client.delete(f"/api/v1/targets/{tid}", params={"history": "drop"})
    assert r.status_code == 204, r.text


def test_a_small_server_gets_a_pool_well_past_a_quarter_of_its_memory(
    client: TestClient, capped_target: int
) -> None:
    r = client.post(
        "/api/v1/sessions",
        json={
            "target_id": capped_target,
            "knobs": ["shared_buffers"],
            "hints": False,
            # the fewest a session may (baseline 2, a first evaluation 3): the refused
            # 460MB, then 256MB applied and measured, are all this test asks of it
            "max_trials": 5,
            "final_check_runs": 0,
            "seed": 1,
            # one client: no level is asserted here (not throttled: the warm-up after the
            # restart reads until the reads settle, and 100 tps left them unsettled)
            "workload": {"builtin": "select-only", "scale": 1, "clients": 1, "jobs": 1,
                         "duration_s": 3, "warmup_s": 1},
        },
    )  # fmt: skip
    assert r.status_code == 202, r.text
    final = wait_done(client, r.json()["id"], 300)
    trials = client.get(f"/api/v1/sessions/{final['id']}/trials").json()
    assert final["status"] == "succeeded", final
    cands = [t for t in trials if t["role"] == "candidate"]
    # x4 from 128MB is past the knob's bound (90% of 512MB): 460MB, whose pool and WAL
    # buffers alone pass 90% of the server's memory: refused unapplied
    first = cands[0]
    assert first["value"] == "460MB", cands
    assert first["verdict"] == "rejected"
    assert first["reason"].startswith("memory guard: would hold")
    assert "apply_s" not in first["timings"]
    # then a finer step: 256MB, half the server's memory, applied (a restart) and measured
    second = cands[1]
    assert second["value"] == "256MB", cands
    # applied and run: the memory guard let it through. On a loaded host the throughput
    # watch may stop its run early (a CI run: 2 s far below the incumbent's), which is
    # the performance guard's decision, not the memory guard's
    assert not (second["reason"] or "").startswith("memory guard"), second["reason"]
    if second["verdict"] == "rejected":
        assert second["reason"].startswith("performance guard"), second["reason"]
    assert second["error"] is None
    assert second["samples"]["n"] > 0
    assert "apply_s" in second["timings"]
    # warmed after the restart until the server's own counter said the data was in the pool
    # (scale 1 is 16 MB: a 256MB pool never fills)
    assert second["timings"]["warm_up"].startswith("reads settled"), second["timings"]
    # the refused value is never asked for again, nor recommended; the server is put back
    assert all(t["value"] != "460MB" for t in cands[1:])
    assert final["best_config"]["shared_buffers"] != "460MB"
    assert [t["index"] for t in trials] == list(range(1, len(trials) + 1))
    assert shared_buffers_now(client, final["target_id"]) == "128MB"


def shared_buffers_now(client: TestClient, target_id: int) -> str:
    """The managed sandbox's shared_buffers as its server reports it (its controller)."""
    db: Database = client.app.state.db  # type: ignore[attr-defined]
    settings: Settings = client.app.state.settings  # type: ignore[attr-defined]
    with db.session() as s:
        row = s.get(Target, target_id)
        assert row is not None
        ctl = controller_for(row, settings)
    return ctl.snapshot(["shared_buffers"]).effective["shared_buffers"]
