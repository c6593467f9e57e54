"""Finding 3 of issue 25: the service's secrets leaked through a target.

- DSN passwords were stored in plain text in the metadata DB;
- a sandbox's superuser (the postgres OS user) could pg_read_binary_file the service's
  own knobtune.db and its -wal;
- an error text could carry another target's password.
"""

from __future__ import annotations

import os
import sqlite3
import stat

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.conftest import SandboxFactory
from tests.security.exec_helpers import client_for, service_dir, settings_for, stored_targets

SECRET = "Xq7-stored-secret-4711"
OTHER = "Kw9-other-targets-secret"


def _with_password(sb_dsn: str, password: str) -> str:
    """The sandbox's DSN with ``password`` (its superuser's password set to it first)."""
    with psycopg.connect(sb_dsn, autocommit=True) as conn:
        conn.execute(f"ALTER ROLE postgres PASSWORD '{password}'")
    return f"{sb_dsn} password={password}"  # libpq: the last one wins


def test_stored_dsn_password_is_not_plain_text(sandbox_factory: SandboxFactory) -> None:
    sb = sandbox_factory()
    dsn = _with_password(sb.dsn, SECRET)
    with service_dir() as base:
        settings = settings_for(base)
        with client_for(settings) as api:
            r = api.post("/api/v1/targets", json={"name": "kept", "dsn": dsn})
            assert r.status_code == 201, r.text
            raw = {
                p.name: p.read_bytes()
                for p in base.glob("knobtune.db*")  # the DB file, its -wal and -shm
            }
            with sqlite3.connect(base / "knobtune.db") as conn:
                stored = [row[0] for row in conn.execute("SELECT dsn FROM targets")]
        assert raw
        for name, content in raw.items():
            assert SECRET.encode() not in content, f"{name} holds the password in plain text"
        assert stored
        assert all(SECRET not in value for value in stored)
        # ... and the service still reads it: the target works.
        [target] = stored_targets(settings.database_url)
        assert conninfo_to_dict(target.dsn)["password"] == SECRET


def test_plain_text_rows_of_an_older_version_are_encrypted_at_start(
    sandbox_factory: SandboxFactory,
) -> None:
    sb = sandbox_factory()
    dsn = _with_password(sb.dsn, SECRET)
    with service_dir() as base:
        settings = settings_for(base)
        with client_for(settings) as api:
            tid = api.post("/api/v1/targets", json={"name": "old", "dsn": dsn}).json()["id"]
        with sqlite3.connect(base / "knobtune.db") as conn:  # as an older version stored it
            conn.execute("UPDATE targets SET dsn = ? WHERE id = ?", (dsn, tid))
        with client_for(settings) as api:
            assert api.get(f"/api/v1/targets/{tid}").status_code == 200
        with sqlite3.connect(base / "knobtune.db") as conn:
            [(value,)] = conn.execute("SELECT dsn FROM targets").fetchall()
        assert SECRET not in value


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox's OS user differs from ours as root")
def test_metadata_db_and_work_dir_are_unreadable_from_a_sandbox(
    sandbox_factory: SandboxFactory,
) -> None:
    with service_dir() as base:
        settings = settings_for(base)
        with client_for(settings) as api:
            r = api.post("/api/v1/targets", json={"name": "box", "sandbox": True})
            assert r.status_code == 201, r.text
            files = sorted(p for p in base.glob("knobtune.db*") if p.is_file())
            files += sorted(p for p in (base / "work").iterdir() if p.is_file())
            [box] = stored_targets(settings.database_url)
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in files}
            work_mode = stat.S_IMODE((base / "work").stat().st_mode)
            readable: list[str] = []
            # The sandbox's superuser, with the password only the service knows.
            with psycopg.connect(box.dsn, autocommit=True) as conn:
                assert conn.execute("SELECT current_setting('is_superuser')").fetchone() == ("on",)
                for path in files:
                    try:
                        conn.execute("SELECT pg_read_binary_file(%s)", [str(path)])
                        readable.append(path.name)
                    except psycopg.Error:
                        pass
            api.delete(f"/api/v1/targets/{r.json()['id']}")
        assert "knobtune.db" in modes
        assert readable == [], f"the sandbox's superuser read {readable}"
        assert all(m & 0o077 == 0 for m in modes.values()), modes
        assert work_mode & 0o066 == 0, oct(work_mode)  # nobody else lists or writes it


def test_no_error_carries_any_stored_password(sandbox_factory: SandboxFactory) -> None:
    """A target's error text echoes what its script said: another target's password is
    masked in it all the same (the service knows every stored password)."""
    a, b = sandbox_factory(), sandbox_factory()
    dsn_a = _with_password(a.dsn, OTHER)
    with service_dir() as base, client_for(settings_for(base)) as api:
        assert api.post("/api/v1/targets", json={"name": "a", "dsn": dsn_a}).status_code == 201
        tb = api.post("/api/v1/targets", json={"name": "b", "dsn": b.dsn}).json()
        r = api.post(
            "/api/v1/sessions",
            json={
                "target_id": tb["id"],
                "knobs": ["work_mem"],
                "workload": {
                    "builtin": None,
                    "scripts": [{"sql": f"SELECT '{OTHER}'::int;"}],
                    "clients": 1,
                    "jobs": 1,
                },
            },
        )
        assert r.status_code == 422, r.text
        assert "invalid input syntax" in r.text  # the server's own message is still there
        assert OTHER not in r.text
