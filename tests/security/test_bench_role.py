"""Finding 5 of issue 40 (its last item): a sandbox's benchmark role could ``CREATE
DATABASE`` and ``ALTER DATABASE knobtune SET work_mem``, which overrides the knob being
tuned in every later session.

Now the role has no CREATEDB and does not own its database (the superuser does; it may
create tables in ``public``). A role can still ``ALTER ROLE`` itself ``SET``, as every
PostgreSQL role may, so before a session starts the workload's connection is asked
where each tuned knob's value comes from (app/postgres/overrides.py): a client's server
refuses the session with the statement that removes the override, knobtune's own
sandbox removes it and says so in the session's notes. A replay's per-run copy on a
sandbox is made by its superuser. Sandboxes made before are restricted at the service's
next start.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from app.postgres import overrides, sandbox
from app.postgres.sandbox import BENCH_DB, BENCH_ROLE, Sandbox
from app.workloads.replay import Replay
from tests.app.replay.logs import stderr_log
from tests.conftest import SandboxFactory
from tests.security.exec_helpers import (
    QUICK,
    client_for,
    service_dir,
    settings_for,
    stored_targets,
    wait_done,
)


def _fails(dsn: str, statement: str) -> str | None:
    """PostgreSQL's refusal of ``statement`` on ``dsn`` (None: it ran)."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(statement)
    except psycopg.Error as exc:
        return str(exc).splitlines()[0]
    return None


def _role_facts(dsn: str) -> tuple[bool, str, list[Any]]:
    """(rolcreatedb, owner of the benchmark database, pg_db_role_setting rows)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT rolcreatedb, (SELECT pg_get_userbyid(datdba) FROM pg_database"
            " WHERE datname = %s) FROM pg_roles WHERE rolname = %s",
            [BENCH_DB, BENCH_ROLE],
        ).fetchone()
        settings = conn.execute("SELECT setconfig FROM pg_db_role_setting").fetchall()
    assert row is not None
    return bool(row[0]), str(row[1]), [r[0] for r in settings]


def test_the_benchmark_role_can_neither_create_databases_nor_set_its_databases_knobs(
    sandbox_factory: SandboxFactory,
) -> None:
    sb = sandbox_factory()
    set_db = _fails(sb.bench_dsn, f"ALTER DATABASE {BENCH_DB} SET work_mem = '64kB'")
    create = _fails(sb.bench_dsn, "CREATE DATABASE mine")
    createdb, owner, settings = _role_facts(sb.dsn)
    assert set_db is not None, "the benchmark role set work_mem for its database"
    assert "must be owner" in set_db
    assert create is not None, "the benchmark role created a database"
    assert "permission denied" in create
    assert (createdb, owner, settings) == (False, "postgres", [])
    # what its workloads need still works: tables in its database
    assert _fails(sb.bench_dsn, "CREATE TABLE t (a int); INSERT INTO t VALUES (1)") is None


def test_overrides_of_tuned_knobs_are_found_with_the_statement_that_removes_them(
    sandbox_factory: SandboxFactory,
) -> None:
    sb = sandbox_factory()
    # what any role may do to itself
    assert _fails(sb.bench_dsn, f"ALTER ROLE {BENCH_ROLE} SET work_mem = '64kB'") is None
    stmt = f"ALTER ROLE {BENCH_ROLE} IN DATABASE {BENCH_DB} SET random_page_cost = 9"
    assert _fails(sb.bench_dsn, stmt) is None
    found = overrides.check(sb.bench_dsn, ["work_mem", "random_page_cost", "shared_buffers"])
    assert [(o.name, o.value, o.source) for o in found] == [
        ("random_page_cost", "9", "database user"),
        ("work_mem", "64kB", "user"),
    ]
    said = overrides.refusal(found)
    assert f'ALTER ROLE "{BENCH_ROLE}" RESET "work_mem"' in said
    assert f'ALTER ROLE "{BENCH_ROLE}" IN DATABASE "{BENCH_DB}" RESET "random_page_cost"' in said
    assert "leave random_page_cost, work_mem out of knobs" in said
    note = overrides.clear(sb.dsn, found)
    assert "removed" in note
    assert overrides.check(sb.bench_dsn, ["work_mem", "random_page_cost"]) == []


def _register(api: Any, sb: Sandbox) -> Any:
    """``sb`` as a client's server: its superuser for the controller, the benchmark role
    for the workload (where this version takes a workload DSN)."""
    body = {"name": "dsn-target", "dsn": sb.dsn, "workload_dsn": sb.bench_dsn}
    r = api.post("/api/v1/targets", json=body)
    if r.status_code == 422 and "workload_dsn" in r.text:
        r = api.post("/api/v1/targets", json={"name": "dsn-target", "dsn": sb.dsn})
    return r


def test_a_session_on_a_clients_server_with_an_overridden_knob_is_refused(
    sandbox_factory: SandboxFactory,
) -> None:
    sb = sandbox_factory()
    for role in (BENCH_ROLE, "postgres"):  # whichever the workload runs as
        stmt = f"ALTER ROLE {role} IN DATABASE {BENCH_DB} SET work_mem = '64kB'"
        assert _fails(sb.dsn, stmt) is None
        stmt = f"ALTER ROLE {role} IN DATABASE postgres SET work_mem = '64kB'"
        assert _fails(sb.dsn, stmt) is None
    with service_dir() as base, client_for(settings_for(base)) as api:
        r = _register(api, sb)
        assert r.status_code == 201, r.text
        body = {
            "target_id": r.json()["id"],
            "knobs": ["work_mem"],
            "max_trials": 5,
            "final_check_runs": 0,
            "workload": QUICK,
        }
        refused = api.post("/api/v1/sessions", json=body)
    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"]
    assert "work_mem = '64kB' set for role" in detail
    assert 'RESET "work_mem"' in detail


def test_a_sandbox_session_removes_its_benchmark_roles_overrides_and_says_so() -> None:
    with service_dir() as base:
        settings = settings_for(base, run_scheduler=True)
        with client_for(settings) as api:
            r = api.post("/api/v1/targets", json={"name": "box", "sandbox": True})
            assert r.status_code == 201, r.text
            [box] = stored_targets(settings.database_url)
            bench = box.workload_dsn
            # a client's earlier script, as the benchmark role: ALTER ROLE itself SET
            assert _fails(bench, f"ALTER ROLE {BENCH_ROLE} SET work_mem = '64kB'") is None
            body = {
                "target_id": r.json()["id"],
                "knobs": ["work_mem"],
                "max_trials": 5,
                "final_check_runs": 0,
                "workload": QUICK,
            }
            made = api.post("/api/v1/sessions", json=body)
            assert made.status_code in (201, 202), made.text
            sid = made.json()["id"]
            notes: list[Any] = []
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                got = api.get(f"/api/v1/sessions/{sid}").json()
                notes = got["notes"]
                if any("overrode tuned knob" in str(n) for n in notes) or got["status"] in (
                    "succeeded",
                    "failed",
                    "cancelled",
                ):
                    break
                time.sleep(0.3)
            api.post(f"/api/v1/sessions/{sid}/cancel")
            wait_done(api, sid)
            _, _, left = _role_facts(box.dsn)
            api.delete(f"/api/v1/targets/{box.id}?history=drop")
    said = [str(n) for n in notes if "overrode tuned knob" in str(n)]
    assert said, notes
    assert "work_mem = '64kB' set for role knobtune_bench" in said[0]
    assert left == []


def test_a_sandbox_made_before_is_restricted_at_the_services_start() -> None:
    with service_dir() as base:
        settings = settings_for(base)
        with client_for(settings) as api:
            r = api.post("/api/v1/targets", json={"name": "old", "sandbox": True})
            assert r.status_code == 201, r.text
        [box] = stored_targets(settings.database_url)
        sb = Sandbox.open(Path(str(box.sandbox_dir)))
        sb.stop()  # stopped at the service's shutdown already; single-user mode needs it
        sandbox._single_user(  # as an earlier version made it, plus a planted setting
            sb.bindir,
            sb.data_dir,
            [
                f"ALTER ROLE {BENCH_ROLE} CREATEDB",
                f"ALTER DATABASE {BENCH_DB} OWNER TO {BENCH_ROLE}",
                f"ALTER DATABASE {BENCH_DB} SET work_mem = '64kB'",
            ],
        )
        sb.bench_role = 1
        sb._write_record()
        with client_for(settings) as api:
            facts = _role_facts(box.dsn)
            api.delete(f"/api/v1/targets/{box.id}")
    assert facts == (False, "postgres", [])


def test_a_replay_on_a_sandbox_copies_as_its_superuser(sandbox_factory: SandboxFactory) -> None:
    """The benchmark role has no CREATEDB: the sandbox's superuser makes the per-run copy,
    owned by the benchmark role; the replay database must be that role's."""
    sb = sandbox_factory()
    with psycopg.connect(sb.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE shop OWNER {BENCH_ROLE}")
    shop = make_conninfo(sb.bench_dsn, dbname="shop")
    assert _fails(shop, "CREATE TABLE accounts (id int); INSERT INTO accounts VALUES (1)") is None
    text = stderr_log([[(0.0, "SELECT count(*) FROM accounts"), (0.5, "SELECT 1")]])
    plain = Replay(text, duration_s=2, warmup_s=0, replay_database="shop")
    with pytest.raises(Exception, match=f"ALTER ROLE {BENCH_ROLE} CREATEDB"):
        plain.prepare(sb.bench_dsn)
    wl = Replay(text, duration_s=2, warmup_s=0, replay_database="shop")
    wl.admin_dsn = sb.dsn
    note = wl.prepare(sb.bench_dsn)
    assert note is not None
    assert f"as role {BENCH_ROLE}" in note
    with psycopg.connect(sb.dsn) as conn:
        row = conn.execute(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'knobtune_replay'"
        ).fetchone()
    assert row == (BENCH_ROLE,)


def test_a_replay_comparison_on_a_sandbox_this_process_made_copies_as_its_superuser(
    sandbox_factory: SandboxFactory,
) -> None:
    """A comparison's replay on knobtune's own cluster gets its superuser for the per-run
    copies, as a session's does (app.targets.access.admin_dsn_for): here a sandbox this
    process made, registered by its superuser DSN (its workload: the benchmark role, which
    may not create databases). Before, the comparison failed preparing the replay:
    'role knobtune_bench may not create databases'."""
    sb = sandbox_factory()
    with psycopg.connect(sb.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE shop OWNER {BENCH_ROLE}")
    shop = make_conninfo(sb.bench_dsn, dbname="shop")
    assert _fails(shop, "CREATE TABLE accounts (id int); INSERT INTO accounts VALUES (1)") is None
    text = stderr_log([[(0.0, "SELECT count(*) FROM accounts"), (0.5, "SELECT 1")]])
    with service_dir() as base, client_for(settings_for(base, run_scheduler=True)) as api:
        r = api.post("/api/v1/targets", json={"name": "own", "dsn": sb.dsn})
        assert r.status_code == 201, r.text
        [target] = stored_targets(str(settings_for(base).database_url))
        assert target.sandbox_dir is None
        assert target.workload_dsn == sb.bench_dsn
        cap = api.post(
            "/api/v1/captures/import",
            params={"name": "shop-log", "database": "shop"},
            headers={"Content-Type": "application/octet-stream"},
            content=text.encode(),
        )
        assert cap.status_code == 201, cap.text
        body = {
            "target_id": r.json()["id"],
            "configs": [{"name": "default"}, {"name": "wm8", "settings": {"work_mem": "8MB"}}],
            "rounds": 2,
            "workload": {
                "replay": cap.json()["id"],
                "replay_database": "shop",
                "duration_s": 2,
                "warmup_s": 0,
            },
            "warmup_run_s": 1,
        }
        made = api.post("/api/v1/comparisons", json=body)
        assert made.status_code == 202, made.text
        cid = made.json()["id"]
        deadline = time.monotonic() + 180
        got: dict[str, Any] = {}
        while time.monotonic() < deadline:
            got = api.get(f"/api/v1/comparisons/{cid}").json()
            if got["status"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.3)
    assert got["status"] == "succeeded", got
    assert [run["error"] for run in got["runs"]] == [None] * 4
    with psycopg.connect(sb.dsn) as conn:
        row = conn.execute(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'knobtune_replay'"
        ).fetchone()
    assert row == (BENCH_ROLE,)  # made by the superuser, for the workload's role
