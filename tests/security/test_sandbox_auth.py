"""Finding 4 of issue 25: sandboxes let any local user in (trust on loopback), and a
client's script ran as the sandbox's superuser, a shell away from the service's host.

Now every connection needs a password (scram-sha-256, random per sandbox), and a
client's workload runs as the sandbox's benchmark role: it owns its database, and may
neither run programs nor read files of the server's host.
"""

from __future__ import annotations

import sqlite3
import tempfile
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from tests.security.exec_helpers import (
    client_for,
    service_dir,
    settings_for,
    stored_targets,
    wait_done,
)


def _sandbox_target(api: Any, name: str = "box") -> int:
    r = api.post("/api/v1/targets", json={"name": name, "sandbox": True})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def test_a_sandbox_refuses_connections_without_its_password() -> None:
    with service_dir() as base:
        settings = settings_for(base)
        with client_for(settings) as api:
            tid = _sandbox_target(api)
            [box] = stored_targets(settings.database_url)
            params = conninfo_to_dict(box.dsn)
            port, socket_dir = params["port"], params["host"]
            let_in: list[str] = []
            refusals: list[str] = []
            for how in (
                f"host=127.0.0.1 port={port} user=postgres dbname=postgres",
                f"host={socket_dir} port={port} user=postgres dbname=postgres",
                f"host=127.0.0.1 port={port} user=postgres dbname=postgres password=postgres",
            ):
                try:
                    psycopg.connect(how, connect_timeout=5).close()
                    let_in.append(how)
                except psycopg.OperationalError as exc:
                    refusals.append(str(exc))
            # A second service (no token either) cannot register the first one's sandbox.
            with service_dir() as other_base, client_for(settings_for(other_base)) as other:
                stolen = other.post(
                    "/api/v1/targets",
                    json={"name": "stolen", "dsn": f"host=127.0.0.1 port={port} user=postgres"},
                )
            api.delete(f"/api/v1/targets/{tid}")
        assert let_in == [], f"the sandbox let in: {let_in}"
        assert all("password" in r for r in refusals), refusals
        assert stolen.status_code == 422, stolen.text


def test_a_sandbox_sessions_scripts_cannot_reach_the_host() -> None:
    marker = Path(tempfile.gettempdir()) / f"knobtune-copy-marker-{uuid.uuid4().hex}"
    with service_dir() as base:
        settings = settings_for(base, run_scheduler=False)
        with client_for(settings) as api:
            tid = _sandbox_target(api)
            [box] = stored_targets(settings.database_url)
            answers = {}
            for label, sql in (
                ("program", f"COPY (SELECT 1) TO PROGRAM 'touch {marker}';"),
                (
                    "from program",
                    f"CREATE TEMP TABLE t (a text); COPY t FROM PROGRAM 'touch {marker}';",
                ),
                ("read", "SELECT length(pg_read_file('/etc/hostname'));"),
                ("read binary", "SELECT length(pg_read_binary_file('/etc/hostname'));"),
            ):
                r = api.post(
                    "/api/v1/sessions",
                    json={
                        "target_id": tid,
                        "knobs": ["work_mem"],
                        "workload": {
                            "builtin": None,
                            "scripts": [{"sql": sql}],
                            "clients": 1,
                            "jobs": 1,
                        },
                    },
                )
                answers[label] = (r.status_code, r.text)
            # The role the workloads use (the target's bench DSN where it has one).
            bench = getattr(box, "workload_dsn", box.dsn)
            with psycopg.connect(bench) as conn:
                row = conn.execute(
                    "SELECT rolsuper, pg_has_role(current_user, 'pg_read_server_files', 'USAGE'),"
                    " pg_has_role(current_user, 'pg_write_server_files', 'USAGE'),"
                    " pg_has_role(current_user, 'pg_execute_server_program', 'USAGE'),"
                    " (SELECT datdba = r.oid FROM pg_database WHERE datname = current_database())"
                    " FROM pg_roles r WHERE rolname = current_user"
                ).fetchone()
            api.delete(f"/api/v1/targets/{tid}")
    try:
        assert not marker.exists(), "a script ran a program on the sandbox's host"
    finally:
        marker.unlink(missing_ok=True)
    for label, (status, text) in answers.items():
        assert status == 422, f"{label}: {status} {text}"
        assert "permission denied" in text or "must be superuser" in text, f"{label}: {text}"
    # not superuser, no server files or programs, and (issue 40) does not own the
    # benchmark database: it could ALTER DATABASE knobtune SET the tuned knobs
    assert row == (False, False, False, False, False)


def test_a_sandbox_session_runs_as_the_benchmark_role() -> None:
    """pgbench, the preflight and the data load connect as the benchmark role; the
    controller keeps the superuser for ALTER SYSTEM (the session tunes and restores)."""
    with service_dir() as base:
        settings = settings_for(base)
        with client_for(settings) as api:
            tid = _sandbox_target(api)
            [box] = stored_targets(settings.database_url)
            sid = api.post(
                "/api/v1/sessions",
                json={
                    "target_id": tid,
                    "knobs": ["work_mem"],
                    "max_trials": 5,
                    "final_check_runs": 0,
                    "workload": {
                        "builtin": "tpcb-like",
                        "scale": 1,
                        "clients": 2,
                        "jobs": 1,
                        "duration_s": 2,
                        "warmup_s": 1,
                        "rate": 100,  # pgbench -R: the roles are the point
                    },
                },
            ).json()["id"]
            done = wait_done(api, sid)
            bench = getattr(box, "workload_dsn", box.dsn)
            with psycopg.connect(bench) as conn:
                owners = conn.execute(
                    "SELECT DISTINCT tableowner FROM pg_tables WHERE tablename LIKE 'pgbench_%'"
                ).fetchall()
            api.delete(f"/api/v1/targets/{tid}?history=drop")
    assert done["status"] == "succeeded", done["error"]
    assert owners == [("knobtune_bench",)], owners  # loaded by the benchmark role


def test_an_old_trust_sandbox_is_hardened_when_the_service_starts() -> None:
    """Sandboxes made by earlier versions trusted every local connection."""
    with service_dir() as base:
        settings = settings_for(base, run_scheduler=True)
        with client_for(settings) as api:
            tid = _sandbox_target(api)
        [box] = stored_targets(settings.database_url)
        params = conninfo_to_dict(box.dsn)
        data_dir = Path(str(box.data_dir))
        # As an earlier version left it: trust in pg_hba.conf, a DSN without a password.
        (data_dir / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 127.0.0.1/32 trust\n"
        )
        old_dsn = f"host={params['host']} port={params['port']} user=postgres dbname=postgres"
        with sqlite3.connect(base / "knobtune.db") as conn:
            conn.execute(
                "UPDATE targets SET dsn = ?, restart_command = 'pg_ctl restart' WHERE id = ?",
                (old_dsn, tid),
            )
            if "bench_dsn" in {r[1] for r in conn.execute("PRAGMA table_info(targets)")}:
                conn.execute("UPDATE targets SET bench_dsn = NULL WHERE id = ?", (tid,))
        with client_for(settings) as api:
            shown = api.get(f"/api/v1/targets/{tid}").json()
            try:
                psycopg.connect(old_dsn, connect_timeout=5).close()
                trusted = True
            except psycopg.OperationalError:
                trusted = False
            [box] = stored_targets(settings.database_url)
            with psycopg.connect(box.dsn) as conn:  # the service's new password works
                assert conn.execute("SELECT 1").fetchone() == (1,)
            api.delete(f"/api/v1/targets/{tid}")
    assert not trusted, "the old sandbox still trusts local connections"
    assert shown["restart_command"] is None
    assert shown["restart_note"] is None
