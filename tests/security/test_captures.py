"""Captured workloads as a hostile client and a careless log would have them (issue 28).

A capture holds the statements a server ran with their values: the user's data. It is
stored encrypted, 0600; no response other than the explicit download, no error and no log
line of the service carries a captured value; what a log says is data, never run; a
client names no path; and a capture holds its target like a session does.
"""

from __future__ import annotations

import gzip
import logging
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient

from app.captures.store import path_for, read_log
from app.db import Database, utcnow
from app.main import create_app
from app.models import Capture, TuningSession
from app.postgres.sandbox import Sandbox
from app.settings import Settings
from tests.helpers import logging_sandbox, wait_capture

LIMIT = 2 * 1024 * 1024  # KNOBTUNE_CAPTURE_MAX_BYTES here: twice the body limit of others
SECRET = f"s3cr3t-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Settings]]:
    tmp = tmp_path_factory.mktemp("capsec")
    settings = Settings(
        database_url=f"sqlite:///{tmp / 'meta.db'}",
        work_dir=tmp,
        poll_seconds=0.3,
        capture_max_bytes=LIMIT,
    )
    with TestClient(create_app(settings)) as c:
        yield c, settings


def log_of(*statements: str, session: str = "6b0a0000.1f00", db: str = "shop") -> str:
    """A server log as a capture writes it (prefix %m|%u|%d|%c|) with these statements."""
    pre = f"2026-11-27 10:00:00.%03d UTC|app|{db}|{session}|"
    lines = [(pre % 0) + f"LOG:  connection authorized: user=app database={db}"]
    for i, sql in enumerate(statements, 1):
        first, *rest = sql.split("\n")
        lines.append((pre % i) + f"LOG:  statement: {first}")
        lines += [f"\t{r}" for r in rest]
    lines.append((pre % 999) + "LOG:  disconnection: session time: 0:00:01.000 user=app")
    return "\n".join(lines) + "\n"


LOG = {"Content-Type": "application/octet-stream"}  # an import's body (text or gzip)


def _import(client: TestClient, name: str, body: bytes | str, **params: str) -> object:
    return client.post(
        "/api/v1/captures/import", params={"name": name, **params}, content=body, headers=LOG
    )


# -- sizes ------------------------------------------------------------------------------------
def test_an_oversized_import_is_413_naming_the_setting(svc: tuple[TestClient, Settings]) -> None:
    client, _ = svc
    stmt = "SELECT abalance FROM pgbench_accounts WHERE aid = 1"
    big = log_of(*[stmt] * (LIMIT // 80 + 10))
    assert len(big) > LIMIT
    r = _import(client, "too-big", big)
    assert r.status_code == 413, r.text
    assert "KNOBTUNE_CAPTURE_MAX_BYTES" in r.json()["detail"]
    # streamed (no Content-Length): counted as it comes
    r = client.post(
        "/api/v1/captures/import",
        params={"name": "too-big"},
        content=(big[i : i + 65536].encode() for i in range(0, len(big), 65536)),
        headers=LOG,
    )
    assert r.status_code == 413, r.text
    # a gzip bomb: small on the wire, over the limit once unpacked
    bomb = gzip.compress(log_of(*[stmt] * (LIMIT // 40)).encode(), compresslevel=9)
    assert len(bomb) < LIMIT
    r = _import(client, "bomb", bomb)
    assert r.status_code == 413, r.text
    assert "KNOBTUNE_CAPTURE_MAX_BYTES" in r.json()["detail"]
    # under the capture limit but over every other route's: accepted here only
    per_line = len(log_of(stmt)) - len(log_of())
    fits = log_of(*[stmt] * (1_500_000 // per_line))
    assert 1024 * 1024 < len(fits) < LIMIT
    r = _import(client, "fits", fits, database="shop")
    assert r.status_code == 201, r.text
    r = client.post("/api/v1/targets", content=fits, headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert "KNOBTUNE_MAX_BODY_BYTES" in r.json()["detail"]
    assert client.get("/api/v1/captures").json()[0]["name"] == "fits"


# -- what a log says is data ---------------------------------------------------------------------
def test_shell_and_program_statements_are_stored_as_data_never_run(
    svc: tuple[TestClient, Settings], marker: Path
) -> None:
    client, settings = svc
    text = log_of(
        f"\\! touch {marker}",
        f"COPY t FROM PROGRAM 'touch {marker}'",
        f"SELECT pg_read_file('{marker}')",
        "\\setshell x touch /tmp/knobtune-never",
    )
    r = _import(client, "hostile", text)
    assert r.status_code == 201, r.text
    body = r.json()
    assert not marker.exists()
    assert str(marker) not in r.text  # shown normalized, the path masked
    assert "COPY t FROM PROGRAM $1" in body["summary_text"]
    stored = read_log(settings.work_dir, body["id"])
    assert f"COPY t FROM PROGRAM 'touch {marker}'" in stored  # kept as it was, as data
    assert not marker.exists()
    assert not Path("/tmp/knobtune-never").exists()


# -- no captured value leaves except by download -----------------------------------------------
@pytest.mark.timeout(240)
def test_no_response_or_service_log_carries_a_captured_literal(
    svc: tuple[TestClient, Settings], caplog: pytest.LogCaptureFixture
) -> None:
    client, settings = svc
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []

    def call(method: str, url: str, **kw: object) -> object:
        r = client.request(method, url, **kw)  # type: ignore[arg-type]
        seen.append(f"{method} {url} {r.status_code} {r.text}")
        return r

    planted = log_of(
        f"SELECT * FROM users WHERE email = '{SECRET}@example.com'",
        f"UPDATE users SET note = '{SECRET}' /* {SECRET} */ WHERE id = 7",
        f"INSERT INTO t VALUES ('{SECRET}', $${SECRET}$$, E'{SECRET}')",
        f"SET app.token = '{SECRET}'",
    )
    r = call("POST", "/api/v1/captures/import?name=planted", content=planted, headers=LOG)
    assert r.status_code == 201  # type: ignore[attr-defined]
    cid = r.json()["id"]  # type: ignore[attr-defined]
    call("GET", "/api/v1/captures")
    call("GET", f"/api/v1/captures/{cid}")
    call("POST", f"/api/v1/captures/{cid}/cancel")  # 409: already succeeded
    # 409: name taken
    call("POST", "/api/v1/captures/import?name=planted", content=planted, headers=LOG)
    broken = f"2026-11-27 garbage {SECRET}\nnot a log line at all '{SECRET}'\n"
    r = call("POST", "/api/v1/captures/import?name=broken", content=broken, headers=LOG)
    assert r.status_code == 422  # type: ignore[attr-defined]
    assert "line" in r.json()["detail"]  # type: ignore[attr-defined]
    two_dbs = planted + log_of(f"SELECT '{SECRET}'", session="6b0a0000.2f00", db="other")
    r = call("POST", "/api/v1/captures/import?name=two", content=two_dbs, headers=LOG)
    assert r.status_code == 422  # type: ignore[attr-defined]
    call("POST", "/api/v1/captures/import?name=nothing&database=none", content=planted, headers=LOG)
    call("GET", "/captures")
    call("GET", f"/captures/{cid}")
    call("POST", f"/captures/{cid}/sessions", data={"target_id": "1", "speed": "1"})

    # a live capture of statements with the secret as values, read while and after it runs
    sb: Sandbox = logging_sandbox(pgss=True)
    try:
        t = call("POST", "/api/v1/targets", json={"name": "planted", "dsn": sb.dsn})
        tid = t.json()["id"]  # type: ignore[attr-defined]
        r = call(
            "POST",
            "/api/v1/captures",
            json={"target_id": tid, "name": "live-planted", "seconds": 10, "database": "knobtune"},
        )
        live = r.json()["id"]  # type: ignore[attr-defined]
        wait_capture(client, live, until="logging")
        with psycopg.connect(sb.bench_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS users (email text, note text)")
            conn.execute("INSERT INTO users VALUES (%s, %s)", [f"{SECRET}@x", SECRET])
            conn.execute(f"SELECT * FROM users WHERE note = '{SECRET}'")
            with pytest.raises(psycopg.errors.UndefinedTable):
                conn.execute(f"SELECT * FROM missing WHERE note = '{SECRET}'")
        call("GET", f"/api/v1/captures/{live}")
        call("GET", "/api/v1/captures")
        call("DELETE", f"/api/v1/captures/{live}")  # 409: running
        body = wait_capture(client, live)
        assert body["status"] == "succeeded", body
        assert body["summary"]["failed_statements"] == 1
        call("GET", f"/api/v1/captures/{live}")
        call("GET", f"/captures/{live}")
        call("GET", "/")
        assert SECRET in read_log(settings.work_dir, live)  # it was captured
    finally:
        sb.destroy()
    leaked = [s for s in seen if SECRET in s]
    assert not leaked, leaked[0][:500]
    assert SECRET not in caplog.text
    # the explicit download gives the owner of the token the log itself
    r = client.get(f"/api/v1/captures/{cid}/log")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/gzip"
    assert SECRET in gzip.decompress(r.content).decode()


def test_the_capture_file_is_private_and_encrypted(svc: tuple[TestClient, Settings]) -> None:
    client, settings = svc
    r = _import(client, "at-rest", log_of(f"SELECT '{SECRET}-at-rest'"))
    assert r.status_code == 201, r.text
    path = path_for(settings.work_dir, r.json()["id"])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    sealed = path.read_bytes()
    assert SECRET.encode() not in sealed
    assert sealed[:2] != b"\x1f\x8b"  # not merely gzip
    with pytest.raises(OSError):
        gzip.decompress(sealed)
    assert f"{SECRET}-at-rest" in read_log(settings.work_dir, r.json()["id"])
    assert client.delete(f"/api/v1/captures/{r.json()['id']}").status_code == 204
    assert not path.exists()


@pytest.mark.parametrize(
    "name", ["../etc", "a/b", "..", "a b", "a\\b", "", "x" * 101, "1234", "%2e%2e", "a\x00b", "-x"]
)
def test_a_capture_name_with_path_characters_is_refused(
    svc: tuple[TestClient, Settings], sandbox: Sandbox, name: str
) -> None:
    client, settings = svc
    r = _import(client, name, log_of("SELECT 1"))
    assert r.status_code == 422, r.text
    r = client.post("/api/v1/captures", json={"target_id": 1, "name": name, "seconds": 10})
    assert r.status_code == 422, r.text
    folder = settings.work_dir / "captures"
    names = [p.name for p in folder.iterdir()] if folder.exists() else []
    assert all(n.split(".", 1)[0].isdigit() for n in names), names
    assert not (settings.work_dir.parent / "etc").exists()


def test_a_capture_on_a_held_target_is_409_and_a_capture_holds_it(
    svc: tuple[TestClient, Settings], sandbox: Sandbox
) -> None:
    client, settings = svc
    t = client.post("/api/v1/targets", json={"name": "held", "dsn": sandbox.dsn})
    assert t.status_code == 201, t.text
    tid = t.json()["id"]
    db = Database(settings.database_url)
    try:
        with db.session() as s:
            sess = TuningSession(
                target_id=tid,
                status="running",
                phase="trial 3",
                request={},
                seed=1,
                benchmark_s=0.0,
                notes=[],
                cancel_requested=False,
                attempts=1,
                lease_owner="elsewhere",
                lease_expires_at=utcnow().replace(year=2100),
                created_at=utcnow(),
            )
            s.add(sess)
        r = client.post("/api/v1/captures", json={"target_id": tid, "name": "held", "seconds": 10})
        assert r.status_code == 409, r.text
        assert f"session {sess.id}" in r.json()["detail"]
        with db.session() as s:
            s.delete(s.get(TuningSession, sess.id))
            cap = Capture(
                name="holding",
                target_id=tid,
                source="live",
                database="postgres",
                status="running",
                phase="logging every statement",
                request={"seconds": 600},
                truncated=False,
                notes=[],
                cancel_requested=False,
                attempts=1,
                lease_owner="elsewhere",
                lease_expires_at=utcnow().replace(year=2100),
                created_at=utcnow(),
            )
            s.add(cap)
        body = {"target_id": tid, "workload": {"builtin": "select-only", "scale": 1}}
        r = client.post("/api/v1/sessions", json=body)
        assert r.status_code == 409, r.text
        assert f"capture {cap.id}" in r.json()["detail"]
        r = client.post(f"/api/v1/targets/{tid}/sweeps", json={"clients": [1]})
        assert r.status_code == 409, r.text
        assert client.delete(f"/api/v1/targets/{tid}").status_code == 409
    finally:
        with db.session() as s:
            for c in s.query(Capture).filter(Capture.name == "holding"):
                s.delete(c)
        db.dispose()
