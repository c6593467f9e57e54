"""Issue 43, several processes: one secret key for one metadata DB.

Found: each process that found no ``KNOBTUNE_SECRET_KEY`` generated its own key into
its own work directory. Two processes on one PostgreSQL metadata DB then could not read
each other's DSNs: the survivor of a crash claimed the other's session and crashed on
it in a loop ("invalid connection string knobtune:undecryptable").

Now the metadata DB records the fingerprint of every key that has encrypted in it; a
process lacking one refuses to start and says what to set; a PostgreSQL metadata DB
needs a key (``KNOBTUNE_SECRET_KEY`` or ``KNOBTUNE_SECRET_KEY_FILE``); the embedded
SQLite default still needs no configuration.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient
from sqlalchemy import text

from app import vault
from app.db import Database, upgrade, utcnow
from app.main import create_app
from app.postgres.sandbox import free_port
from app.settings import Settings
from tests.helpers import ROOT, ServiceProcess, metadata_db

K1, K2 = Fernet.generate_key().decode(), Fernet.generate_key().decode()
PASSWORD = "Sk-across-processes-7q"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL metadata DB of this test's own on the host's server (dropped after)."""
    with metadata_db("knobtune_key") as url:
        yield url


def start(url: str, work_dir: Path, **settings: Any) -> TestClient:
    s = Settings(database_url=url, work_dir=work_dir, run_scheduler=False, **settings)
    return TestClient(create_app(s), raise_server_exceptions=False)


def refusal(url: str, work_dir: Path, **settings: Any) -> str:
    with pytest.raises(vault.SecretKeyError) as err, start(url, work_dir, **settings):
        pass
    return str(err.value)


def recorded(url: str) -> list[str]:
    db = Database(url)
    try:
        with db.engine.connect() as conn:
            return [r[0] for r in conn.execute(text("SELECT fingerprint FROM secret_keys"))]
    finally:
        db.dispose()


def add_target(url: str, key: str, name: str = "shared") -> None:
    """A target row as a process with ``key`` writes it (its DSN encrypted with it)."""
    token = Fernet(key.encode()).encrypt(f"host=db.example password={PASSWORD}".encode())
    db = Database(url)
    try:
        with db.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO targets (name, dsn, probe, created_at) VALUES (:n, :d, '{}', :at)"
                ),
                {
                    "n": name,
                    "d": vault.PREFIX + token.decode(),
                    "at": utcnow().replace(tzinfo=None),
                },
            )
    finally:
        db.dispose()


# -- the embedded default --------------------------------------------------------------------
def test_sqlite_needs_no_configuration_and_refuses_a_second_key(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    with start(url, tmp_path / "a") as c:  # nothing configured: a key file is generated
        assert c.get("/healthz").status_code == 200
    key_file = tmp_path / "a" / "secret.key"
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert recorded(url) == [vault.fingerprint(key_file.read_text())]
    assert key_file.read_text().strip() not in (tmp_path / "meta.db").read_bytes().decode(
        "latin-1"
    )  # a fingerprint, never the key
    # a second process on the same DB with a work directory (and so a key) of its own
    msg = refusal(url, tmp_path / "b")
    assert "KNOBTUNE_SECRET_KEY_FILE" in msg
    assert str(tmp_path / "b" / "secret.key") in msg  # where its key came from
    assert vault.fingerprint(key_file.read_text())[:12] in msg  # which key it lacks
    # given the first one's key, it starts
    with start(url, tmp_path / "b", secret_key=key_file.read_text().strip()) as c:
        assert c.get("/healthz").status_code == 200
    with start(url, tmp_path / "a") as c:  # and the first one still does
        assert c.get("/healthz").status_code == 200


# -- a PostgreSQL metadata DB ----------------------------------------------------------------
def test_postgres_metadata_needs_a_key_given_or_a_named_key_file(
    pg_url: str, tmp_path: Path
) -> None:
    msg = refusal(pg_url, tmp_path / "w")
    assert "PostgreSQL metadata DB needs a secret key" in msg
    assert "KNOBTUNE_SECRET_KEY_FILE" in msg
    assert not (tmp_path / "w" / "secret.key").exists()  # no per-process key made
    named = tmp_path / "keys" / "knobtune.key"
    with start(pg_url, tmp_path / "w", secret_key_file=named) as c:
        assert c.get("/healthz").status_code == 200
    assert oct(named.stat().st_mode & 0o777) == "0o600"  # made there, private
    assert recorded(pg_url) == [vault.fingerprint(named.read_text())]
    # a second process given a copy of that file, with its own work directory
    copy = tmp_path / "other-host.key"
    copy.write_text(named.read_text())
    with start(pg_url, tmp_path / "w2", secret_key_file=copy) as c:
        assert c.get("/healthz").status_code == 200
    # a named file that holds no key is refused, not filled
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    assert "holds no key" in refusal(pg_url, tmp_path / "w3", secret_key_file=empty)


def test_two_instances_share_a_key_and_another_key_is_refused(pg_url: str, tmp_path: Path) -> None:
    with (
        start(pg_url, tmp_path / "a", secret_key=K1, instance_id="host-a:1") as a,
        start(pg_url, tmp_path / "b", secret_key=K1, instance_id="host-b:2") as b,
    ):
        assert a.get("/healthz").status_code == 200
        assert b.get("/healthz").status_code == 200
    msg = refusal(pg_url, tmp_path / "c", secret_key=K2)
    assert "cannot read the metadata DB's secrets" in msg
    assert "host-a:1" in msg  # who first used the key it lacks
    assert vault.fingerprint(K1)[:12] in msg  # the key it lacks
    assert vault.fingerprint(K2)[:12] in msg  # its own
    assert K1 not in msg
    assert K2 not in msg
    assert "knobtune db adopt-key" in msg  # the way out when the key is lost for good
    # rotation: the new key first, the old one after it; the new one is recorded
    with start(pg_url, tmp_path / "c", secret_key=f"{K2},{K1}") as c:
        assert c.get("/healthz").status_code == 200
    assert sorted(recorded(pg_url)) == sorted([vault.fingerprint(K1), vault.fingerprint(K2)])
    # a process with the old key alone can no longer start: the new one encrypts now
    assert "cannot read" in refusal(pg_url, tmp_path / "a", secret_key=K1)
    # the old key given up for good: only the new one is needed
    db = Database(pg_url)
    try:
        dropped = vault.adopt_key(db.engine, K2, source="test", instance="ops")
    finally:
        db.dispose()
    assert dropped == [vault.fingerprint(K1)]
    with start(pg_url, tmp_path / "c", secret_key=K2) as c:
        assert c.get("/healthz").status_code == 200


def test_a_db_from_before_the_check_refuses_a_key_that_opens_none_of_its_dsns(
    pg_url: str, tmp_path: Path
) -> None:
    upgrade(pg_url)
    add_target(pg_url, K1)  # written by an earlier version, with no fingerprint recorded
    assert recorded(pg_url) == []
    msg = refusal(pg_url, tmp_path / "b", secret_key=K2)
    assert "stored DSNs were encrypted with another secret key" in msg
    assert recorded(pg_url) == []
    with start(pg_url, tmp_path / "a", secret_key=K1) as a:
        [t] = a.get("/api/v1/targets").json()
        assert "password=***" in t["dsn"]
    assert recorded(pg_url) == [vault.fingerprint(K1)]


# -- two real processes ----------------------------------------------------------------------
def test_two_serve_processes_read_each_others_dsns_and_a_third_key_is_refused(
    pg_url: str, tmp_path: Path
) -> None:
    env = {"KNOBTUNE_DATABASE_URL": pg_url, "KNOBTUNE_RUN_SCHEDULER": "false"}
    a = ServiceProcess(tmp_path / "a", **env, KNOBTUNE_SECRET_KEY=K1)
    b = ServiceProcess(tmp_path / "b", **env, KNOBTUNE_SECRET_KEY=K1)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a.start()
    try:
        add_target(pg_url, K1)  # as process a writes a DSN
        b.start()
        for svc in (a, b):
            [t] = httpx.get(f"{svc.url}/api/v1/targets", timeout=10).json()
            assert "password=***" in t["dsn"], t  # read, and masked
            assert PASSWORD not in t["dsn"]
        # a third process with another key, as a host that generated its own
        res = serve_once(tmp_path / "c", {**env, "KNOBTUNE_SECRET_KEY": K2})
        assert res.returncode != 0
        assert "cannot read the metadata DB's secrets" in res.stderr
        assert "Traceback" not in res.stderr  # one line saying what to set
    finally:
        b.stop()
        a.stop()


def serve_once(work_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`knobtune serve` expected to refuse to start: its exit and output."""
    work_dir.mkdir(exist_ok=True)
    full = {
        **{k: v for k, v in os.environ.items() if not k.startswith("KNOBTUNE_")},
        "KNOBTUNE_WORK_DIR": str(work_dir),
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(free_port())],
        env=full,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,  # a process that does not refuse serves until then: a failure
    )


def test_the_fingerprint_tells_nothing_about_the_key() -> None:
    fp = vault.fingerprint(K1)
    assert len(fp) == 64
    assert K1 not in fp
    assert fp == vault.fingerprint(K1 + "\n")  # as read from a file
    assert fp != vault.fingerprint(K2)
