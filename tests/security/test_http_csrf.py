"""Issue 40, finding 5 (HTTP): another site's page cannot change anything here.

Found: with no token set, a foreign web page cancelled a session (202) and imported a
capture (201) through plain ``text/plain`` POSTs (no CORS preflight), and a body-less
``apply`` reached the apply logic. Now every state-changing request is refused (403)
when its ``Origin`` is not the service's own (or one the operator lists), or when it
has ``Sec-Fetch-Site: cross-site``; the import takes only the types the CLI sends; apply
and rollback require their JSON body. Clients that are not browsers send neither header
and are served as before.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.db import Database, utcnow
from app.main import create_app
from app.models import Target, TuningSession
from app.settings import Settings

EVIL = "https://evil.example"
LOG_TEXT = (
    "2026-11-27 10:00:00.001 UTC|app|shop|6b0a.1|LOG:  connection authorized: user=app "
    "database=shop\n"
    "2026-11-27 10:00:00.002 UTC|app|shop|6b0a.1|LOG:  statement: SELECT 1\n"
    "2026-11-27 10:00:00.999 UTC|app|shop|6b0a.1|LOG:  disconnection: session time: "
    "0:00:01.000 user=app\n"
)


def _client(tmp_path: Path, **settings: Any) -> TestClient:
    s = Settings(
        database_url=f"sqlite:///{tmp_path / 'm.db'}",
        work_dir=tmp_path / "work",
        run_scheduler=False,
        **settings,
    )
    return TestClient(create_app(s), raise_server_exceptions=False)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    with _client(tmp_path) as c:
        yield c


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """One service for the tests that only read what a request was answered."""
    with _client(tmp_path_factory.mktemp("csrf")) as c:
        yield c


def queued_session(c: TestClient) -> int:
    """A queued session on a target nothing connects to (no scheduler runs here)."""
    db: Database = c.app.state.db  # type: ignore[attr-defined]
    with db.session() as s:
        t = Target(name=f"t{utcnow().timestamp()}", dsn="host=/nowhere", probe={})
        t.created_at = utcnow()
        s.add(t)
        s.flush()
        sess = TuningSession(
            target_id=t.id,
            status="queued",
            phase="queued",
            request={},
            seed=1,
            benchmark_s=0.0,
            notes=[],
            cancel_requested=False,
            attempts=0,
            created_at=utcnow(),
        )
        s.add(sess)
        s.flush()
        return sess.id


def status_of(c: TestClient, sid: int) -> str:
    return str(c.get(f"/api/v1/sessions/{sid}").json()["status"])


# -- Origin and Sec-Fetch-Site ------------------------------------------------------------
def test_a_foreign_page_cannot_cancel_a_session_or_import_a_capture(api: TestClient) -> None:
    sid = queued_session(api)
    # what a foreign page's <form> or no-cors fetch sends: text/plain, its own Origin
    page = {"Origin": EVIL, "Content-Type": "text/plain", "Sec-Fetch-Site": "cross-site"}
    r = api.post(f"/api/v1/sessions/{sid}/cancel", headers=page, content="x")
    assert r.status_code == 403, r.text
    assert "KNOBTUNE_ALLOWED_ORIGINS" in r.json()["detail"]
    assert EVIL in r.json()["detail"]
    assert status_of(api, sid) == "queued"
    r = api.post("/api/v1/captures/import?name=csrf", headers=page, content=LOG_TEXT)
    assert r.status_code == 403, r.text
    assert api.get("/api/v1/captures").json() == []
    # a browser that sends no Origin but says where the request came from
    r = api.post(
        f"/api/v1/sessions/{sid}/cancel", headers={"Sec-Fetch-Site": "cross-site"}, content="x"
    )
    assert r.status_code == 403, r.text
    assert status_of(api, sid) == "queued"
    # Origin: null (a sandboxed frame, a file: page) is no origin of this service
    r = api.post(f"/api/v1/sessions/{sid}/cancel", headers={"Origin": "null"})
    assert r.status_code == 403
    # the CLI, curl, scripts: neither header, served as before
    r = api.post(f"/api/v1/sessions/{sid}/cancel")
    assert r.status_code == 202, r.text
    assert status_of(api, sid) == "cancelled"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/v1/targets"),
        ("PATCH", "/api/v1/targets/1"),
        ("DELETE", "/api/v1/targets/1"),
        ("POST", "/api/v1/sessions"),
        ("POST", "/api/v1/sessions/1/apply"),
        ("POST", "/api/v1/sessions/1/rollback"),
        ("POST", "/api/v1/targets/1/sweeps"),
        ("POST", "/api/v1/sweeps/1/cancel"),
        ("POST", "/api/v1/schedules"),
        ("DELETE", "/api/v1/schedules/1"),
        ("POST", "/api/v1/captures"),
        ("DELETE", "/api/v1/captures/1"),
        ("PUT", "/api/v1/no-such-route"),
        ("POST", "/sessions"),  # the dashboard's own form routes, by the same rule
        ("POST", "/login"),
    ],
)
def test_every_state_changing_route_refuses_a_foreign_origin(
    shared: TestClient, method: str, path: str
) -> None:
    r = shared.request(method, path, headers={"Origin": EVIL}, json={})
    assert r.status_code == 403, (method, path, r.text)
    r = shared.request(method, path, headers={"Sec-Fetch-Site": "cross-site"}, json={})
    assert r.status_code == 403, (method, path, r.text)
    # the same request from no browser goes on to the route (whatever it answers)
    assert shared.request(method, path, json={}).status_code != 403


def test_own_origin_listed_origins_and_reads_pass(tmp_path: Path) -> None:
    with _client(tmp_path, allowed_origins=["https://ops.example"]) as c:
        sid = queued_session(c)
        # the dashboard's own pages: Origin is the service's Host
        own = {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
        assert c.post(f"/api/v1/sessions/{sid}/cancel", headers=own).status_code == 202
        sid = queued_session(c)
        # a listed origin, even on another site
        listed = {"Origin": "https://OPS.example", "Sec-Fetch-Site": "cross-site"}
        assert c.post(f"/api/v1/sessions/{sid}/cancel", headers=listed).status_code == 202
        # another port of the listed host is another origin
        r = c.post(f"/api/v1/sessions/{sid}/cancel", headers={"Origin": "https://ops.example:8443"})
        assert r.status_code == 403
        # reads are never refused: a GET changes nothing
        assert c.get("/api/v1/targets", headers={"Origin": EVIL}).status_code == 200
        assert c.get("/healthz", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 200


def test_allowed_origins_are_checked_when_read() -> None:
    with pytest.raises(ValueError, match="scheme://host"):
        Settings(allowed_origins="ops.example")
    with pytest.raises(ValueError, match="no path"):
        Settings(allowed_origins="https://ops.example/knobtune")
    s = Settings(allowed_origins="https://Ops.Example/, http://127.0.0.1:3000")
    assert s.allowed_origins == ["https://ops.example", "http://127.0.0.1:3000"]


# -- the import's content type ------------------------------------------------------------
def test_the_import_takes_only_the_types_a_page_cannot_send_without_preflight(
    api: TestClient,
) -> None:
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        r = api.post(
            "/api/v1/captures/import?name=t", headers={"Content-Type": ctype}, content=LOG_TEXT
        )
        assert r.status_code == 415, (ctype, r.text)
        assert "application/gzip" in r.json()["detail"]
    # no type at all: a no-cors fetch of a Blob sends none
    r = api.post("/api/v1/captures/import?name=t", content=LOG_TEXT.encode())
    assert r.status_code == 415, r.text
    assert api.get("/api/v1/captures").json() == []
    # what the CLI sends, and a plain upload as octet-stream
    gz = {"Content-Type": "application/gzip"}
    r = api.post(
        "/api/v1/captures/import?name=gz", headers=gz, content=gzip.compress(LOG_TEXT.encode())
    )
    assert r.status_code == 201, r.text
    raw = {"Content-Type": "application/octet-stream"}
    r = api.post("/api/v1/captures/import?name=raw", headers=raw, content=LOG_TEXT)
    assert r.status_code == 201, r.text


def test_the_cli_import_is_accepted(tmp_path: Path) -> None:
    """The real command, in-process against the same service code."""
    log = tmp_path / "pg.log"
    log.write_text(LOG_TEXT)
    db = f"sqlite:///{tmp_path / 'm.db'}"
    cmd = ["captures", "import", str(log), "--name", "cli", "--database-url", db]
    res = subprocess.run(
        [sys.executable, "-m", "app.cli", *cmd],
        env={"PATH": "/usr/bin:/bin", "KNOBTUNE_WORK_DIR": str(tmp_path / "work")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "cli" in res.stdout


# -- apply and rollback need their body ---------------------------------------------------
@pytest.mark.parametrize("action", ["apply", "rollback"])
def test_a_body_less_apply_is_422_before_the_apply_logic(api: TestClient, action: str) -> None:
    url = f"/api/v1/sessions/999/{action}"
    r = api.post(url)  # before: 404 from the apply logic, which looked the session up
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body"]
    # a JSON text as text/plain is no JSON body (FastAPI's strict content type)
    r = api.post(url, content='{"dry_run": false}', headers={"Content-Type": "text/plain"})
    assert r.status_code == 422, r.text
    # with its body, the request reaches the logic: there is no session 999
    assert api.post(url, json={}).status_code == 404
