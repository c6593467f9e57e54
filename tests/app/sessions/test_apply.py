"""Applying a session's recommendation to a real sandbox, verifying it, and rolling it back.

The session rows carry a finished session's result (what it recommends); everything from
there on is real: the REST route, the target's controller, ALTER SYSTEM, reloads and
restarts of a sandbox cluster, pg_settings and pg_file_settings.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from app.db import Database, utcnow
from app.main import create_app
from app.models import Apply, TuningSession
from app.postgres.restart import PgCtlMethod
from app.postgres.sandbox import Sandbox
from app.settings import Settings
from tests.conftest import SandboxFactory
from tests.helpers import file_settings


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'meta.db'}", work_dir=tmp_path, run_scheduler=False
    )
    with TestClient(create_app(settings)) as c:
        yield c


def state(sb: Sandbox) -> dict[str, Any]:
    """Everything 'exactly as before' means: files as read, every setting, the auto.conf text."""
    with psycopg.connect(sb.dsn, autocommit=True) as conn:
        settings = conn.execute(
            "SELECT name, setting, pending_restart FROM pg_settings ORDER BY name"
        ).fetchall()
    return {
        "files": file_settings(sb.dsn),
        "settings": settings,
        "auto_conf": (sb.data_dir / "postgresql.auto.conf").read_text(),
    }


def show(sb: Sandbox, name: str) -> str:
    with psycopg.connect(sb.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting(%s)", [name]).fetchone()
    assert row is not None
    return str(row[0])


def alter(sb: Sandbox, **values: str) -> None:
    with psycopg.connect(sb.dsn, autocommit=True) as conn:
        for name, value in values.items():
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")


def register(api: TestClient, sb: Sandbox, *, restart: bool) -> int:
    body: dict[str, Any] = {"name": "staging", "dsn": sb.dsn, "data_dir": str(sb.data_dir)}
    if restart:  # the operator's method for this server (clients name one, never send one)
        settings = api.app.state.settings  # type: ignore[attr-defined]
        settings.restart_methods["staging"] = PgCtlMethod(
            kind="pg_ctl", data_dir=str(sb.data_dir), log_file=str(sb.log_path)
        )
        body["restart_method"] = "staging"
    r = api.post("/api/v1/targets", json=body)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def finished_session(
    api: TestClient,
    target_id: int,
    best: dict[str, str],
    *,
    start: dict[str, str] | None = None,
    gain_status: str = "confirmed",
    status: str = "succeeded",
) -> int:
    """A session that ended recommending ``best`` (its trials are not needed here)."""
    db: Database = api.app.state.db  # type: ignore[attr-defined]
    now = utcnow()
    start = start or {"work_mem": "4MB", "shared_buffers": "128MB"}
    sess = TuningSession(
        target_id=target_id,
        status=status,
        phase="done",
        request={"knobs": sorted(best), "workload": {"builtin": "tpcb-like"}},
        seed=1,
        start_config=start,
        best_config={**start, **best},
        gain=0.2,
        gain_status=gain_status,
        benchmark_s=60.0,
        notes=[],
        cancel_requested=False,
        attempts=1,
        created_at=now,
        started_at=now,
        finished_at=None if status == "running" else now,
    )
    with db.session() as s:
        s.add(sess)
    return sess.id


@pytest.mark.timeout(120)
def test_apply_verify_rollback_leaves_the_server_exactly_as_before(
    api: TestClient, sandbox_factory: SandboxFactory
) -> None:
    sb = sandbox_factory()
    alter(sb, checkpoint_completion_target="0.8")  # an entry of the DBA's own: it stays
    tid = register(api, sb, restart=True)
    sid = finished_session(api, tid, {"work_mem": "28MB", "shared_buffers": "256MB"})
    before = state(sb)

    # The dry run shows the diff against the server and changes nothing.
    r = api.post(f"/api/v1/sessions/{sid}/apply", json={"dry_run": True})
    assert r.status_code == 200, r.text
    dry = r.json()
    assert dry["status"] == "dry-run"
    assert dry["id"] is None
    assert {c["knob"]: (c["current"], c["new"]) for c in dry["changes"]} == {
        "work_mem": ("4MB", "28MB"),
        "shared_buffers": ("128MB", "256MB"),
    }
    assert dry["restart"] == "will-restart"
    assert "Nothing was changed" in dry["message"]
    assert state(sb) == before

    # Apply: reload, a restart for shared_buffers, every value checked.
    r = api.post(f"/api/v1/sessions/{sid}/apply", json={})
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["status"] == "applied", done
    assert done["restart"] == "restarted"
    assert done["pending_restart"] == []
    assert {v["knob"]: v["ok"] for v in done["verified"]} == {
        "work_mem": True,
        "shared_buffers": True,
    }
    assert show(sb, "work_mem") == "28MB"
    assert show(sb, "shared_buffers") == "256MB"
    assert show(sb, "checkpoint_completion_target") == "0.8"
    assert f"knobtune rollback {sid}" in done["message"]

    # Recorded in the metadata DB.
    history = api.get(f"/api/v1/sessions/{sid}/applies").json()
    assert [h["status"] for h in history] == ["applied"]
    db: Database = api.app.state.db  # type: ignore[attr-defined]
    with db.session() as s:
        row = s.get(Apply, done["id"])
        assert row is not None
        assert row.config == {"work_mem": "28MB", "shared_buffers": "256MB"}
        assert row.before is not None
        assert row.after is not None

    # Applying again changes nothing: the server runs the values already.
    again = api.post(f"/api/v1/sessions/{sid}/apply", json={}).json()
    assert again["status"] == "nothing-to-do", again

    # Roll back: files, settings and the auto.conf text exactly as before the apply.
    r = api.post(f"/api/v1/sessions/{sid}/rollback", json={})
    assert r.status_code == 200, r.text
    back = r.json()
    assert back["status"] == "rolled-back", back
    assert back["restart"] == "restarted"
    assert all(v["ok"] for v in back["verified"]), back["verified"]
    assert state(sb) == before
    assert [h["status"] for h in api.get(f"/api/v1/sessions/{sid}/applies").json()] == [
        "rolled-back"
    ]
    # Nothing left to roll back.
    r = api.post(f"/api/v1/sessions/{sid}/rollback", json={})
    assert r.status_code == 409
    assert "no apply to roll back" in r.json()["detail"]


@pytest.mark.timeout(120)
def test_without_a_restart_method_a_restart_knob_is_flagged_pending(
    api: TestClient, sandbox_factory: SandboxFactory
) -> None:
    sb = sandbox_factory()
    tid = register(api, sb, restart=False)
    sid = finished_session(api, tid, {"work_mem": "28MB", "shared_buffers": "256MB"})
    before = state(sb)

    dry = api.post(f"/api/v1/sessions/{sid}/apply", json={"dry_run": True}).json()
    assert dry["restart"] == "pending"
    assert "next restart" in dry["message"]

    done = api.post(f"/api/v1/sessions/{sid}/apply", json={}).json()
    assert done["status"] == "applied", done
    assert done["restart"] == "pending"
    assert done["pending_restart"] == ["shared_buffers"]
    checks = {v["knob"]: v for v in done["verified"]}
    assert checks["work_mem"]["ok"]
    assert not checks["work_mem"]["pending_restart"]
    assert checks["shared_buffers"]["pending_restart"]
    assert "next restart" in done["message"]
    assert show(sb, "work_mem") == "28MB"
    assert show(sb, "shared_buffers") == "128MB"  # until somebody restarts it

    back = api.post(f"/api/v1/sessions/{sid}/rollback", json={}).json()
    assert back["status"] == "rolled-back", back
    assert back["pending_restart"] == []
    assert state(sb) == before


@pytest.mark.timeout(120)
def test_a_server_changed_since_the_apply_gets_a_diff_and_needs_a_confirmation(
    api: TestClient, sandbox_factory: SandboxFactory
) -> None:
    sb = sandbox_factory()
    tid = register(api, sb, restart=False)
    sid = finished_session(api, tid, {"work_mem": "28MB"}, start={"work_mem": "4MB"})
    assert api.post(f"/api/v1/sessions/{sid}/apply", json={}).json()["status"] == "applied"
    alter(sb, work_mem="64MB", random_page_cost="1.5")  # somebody else, meanwhile

    dry = api.post(f"/api/v1/sessions/{sid}/rollback", json={"dry_run": True}).json()
    assert dry["changed_since"] == {
        "random_page_cost": [None, "1.5"],
        "work_mem": ["28MB", "64MB"],
    }
    r = api.post(f"/api/v1/sessions/{sid}/rollback", json={})
    assert r.status_code == 409
    detail = r.json()["detail"]
    assert "work_mem: 28MB -> 64MB" in detail
    assert "random_page_cost" in detail
    assert "confirm=true" in detail
    assert show(sb, "work_mem") == "64MB"  # refused: nothing changed

    back = api.post(f"/api/v1/sessions/{sid}/rollback", json={"confirm": True}).json()
    assert back["status"] == "rolled-back", back
    assert show(sb, "work_mem") == "4MB"  # the apply's knob is back as before it
    assert show(sb, "random_page_cost") == "1.5"  # the other change stays


def test_apply_refuses_what_it_should_not_do(
    api: TestClient, sandbox_factory: SandboxFactory
) -> None:
    sb = sandbox_factory()
    tid = register(api, sb, restart=False)
    before = state(sb)

    nothing = finished_session(api, tid, {}, gain_status="no-change")
    r = api.post(f"/api/v1/sessions/{nothing}/apply", json={})
    assert r.status_code == 200
    assert r.json()["status"] == "nothing-to-do"
    assert "recommends no change" in r.json()["message"]

    shaky = finished_session(api, tid, {"work_mem": "28MB"}, gain_status="unconfirmed")
    r = api.post(f"/api/v1/sessions/{shaky}/apply", json={})
    assert r.status_code == 409
    assert "force=true" in r.json()["detail"]
    assert "UNCONFIRMED" in r.json()["detail"]
    assert state(sb) == before
    dry = api.post(f"/api/v1/sessions/{shaky}/apply", json={"dry_run": True}).json()
    assert "the session's gain is UNCONFIRMED" in dry["warnings"]

    running = finished_session(api, tid, {"work_mem": "28MB"}, status="running")
    r = api.post(f"/api/v1/sessions/{running}/apply", json={})
    assert r.status_code == 409
    assert "still running" in r.json()["detail"]

    assert api.post("/api/v1/sessions/999/apply", json={}).status_code == 404
    assert api.post(f"/api/v1/sessions/{shaky}/rollback", json={}).status_code == 409
    assert state(sb) == before
