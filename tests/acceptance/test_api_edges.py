"""What a user hits through the API first: paths, defaults, bad numbers, deleting, preflight.

In-process app on its own SQLite DB, scheduler off (sessions stay queued, nothing runs),
against a real sandbox cluster; pgbench is real (the preflight runs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.postgres.sandbox import Sandbox
from app.settings import Settings
from optimizer.catalogue import CATALOGUE
from tests.helpers import ROOT, file_settings

UNTYPED = (
    "\\set d random(60, 120)\n"
    "SELECT count(*) FROM lineitem\n"
    "WHERE l_shipdate <= date '1998-12-01' - :d;\n"
)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox.create() as sb:
        with psycopg.connect(sb.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE secret (a int)")
            # A tuner that may ALTER SYSTEM but not read the table a script needs.
            conn.execute(f"CREATE ROLE tuner LOGIN PASSWORD '{sb.password}'")
            names = [
                r[0]
                for r in conn.execute(
                    "SELECT name FROM pg_settings WHERE name = ANY(%s)", [sorted(CATALOGUE)]
                )
            ]
            conn.execute(f"GRANT ALTER SYSTEM ON PARAMETER {', '.join(names)} TO tuner")
        # where the superuser's targets run their workload: the benchmark role's database
        with psycopg.connect(sb.bench_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE lineitem (l_shipdate date, qty int)")
            conn.execute(
                "INSERT INTO lineitem SELECT date '1998-01-01' + i, i "
                "FROM generate_series(1, 500) i"
            )
            conn.execute("GRANT SELECT ON lineitem TO tuner")
        yield sb


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    tmp = tmp_path_factory.mktemp("edges")
    settings = Settings(
        database_url=f"sqlite:///{tmp / 'meta.db'}", work_dir=tmp, run_scheduler=False
    )
    with TestClient(create_app(settings)) as c:
        yield c


def _target(api: TestClient, sandbox: Sandbox, name: str, user: str = "postgres") -> int:
    # One target per server (issue 25): the previous test's target of this sandbox goes
    # first (its queued sessions cancelled, its history dropped).
    for t in api.get("/api/v1/targets").json():
        for s in api.get("/api/v1/sessions", params={"target_id": t["id"]}).json():
            if s["status"] in ("queued", "running"):
                api.post(f"/api/v1/sessions/{s['id']}/cancel")
        api.delete(f"/api/v1/targets/{t['id']}", params={"history": "drop"})
    r = api.post(
        "/api/v1/targets",
        json={"name": name, "dsn": sandbox.dsn.replace("user=postgres", f"user={user}")},
    )
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _session(api: TestClient, target_id: int, **workload: Any) -> Any:
    body = {
        "target_id": target_id,
        "knobs": ["work_mem"],
        "max_trials": 12,
        "workload": {"duration_s": 3, "warmup_s": 1, "scale": 1, **workload},
    }
    return api.post("/api/v1/sessions", json=body)


def _cancelled_session(api: TestClient, target_id: int) -> int:
    r = _session(api, target_id)
    assert r.status_code == 202, r.text
    sid = int(r.json()["id"])
    assert api.post(f"/api/v1/sessions/{sid}/cancel").json()["status"] == "cancelled"
    return sid


def _cancelled_count(api: TestClient) -> int:
    line = next(
        ln
        for ln in api.get("/metrics").text.splitlines()
        if ln.startswith('knobtune_sessions{status="cancelled"}')
    )
    return int(line.split()[-1])


# -- paths ---------------------------------------------------------------------------------
def test_path_settings_are_absolute_whatever_the_cwd_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KNOBTUNE_WORK_DIR", raising=False)
    monkeypatch.delenv("KNOBTUNE_DATABASE_URL", raising=False)
    s = Settings()
    monkeypatch.chdir("/")
    assert s.work_dir == tmp_path.resolve() / ".knobtune"
    assert s.database_url == f"sqlite:///{tmp_path.resolve() / 'knobtune.db'}"
    other = Settings(database_url="postgresql+psycopg://u:p@h/db", work_dir=Path("w"))
    assert other.database_url == "postgresql+psycopg://u:p@h/db"
    assert other.work_dir == Path("/w")


# -- defaults and bad numbers ----------------------------------------------------------------
def test_default_protocol_is_pgbench_own(api: TestClient, sandbox: Sandbox) -> None:
    tid = _target(api, sandbox, "proto")
    r = _session(api, tid, builtin=None, scripts=[{"sql": UNTYPED}], init=False)
    assert r.status_code == 202, r.text
    assert r.json()["request"]["workload"]["protocol"] == "simple"
    api.post(f"/api/v1/sessions/{r.json()['id']}/cancel")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/sessions", '{"target_id": 1, "workload": {"duration_s": 1e400}}'),
        ("/api/v1/sessions", '{"target_id": 1, "min_gain": NaN}'),
        ("/api/v1/sessions", '{"target_id": 1, "time_budget_s": Infinity}'),
        ("/api/v1/sessions", '{"target_id": 1, "workload": {"rate": Infinity}}'),
        ("/api/v1/sessions", '{"target_id": 1, "max_p99_worsening": -Infinity}'),
        ("/api/v1/targets", '{"name": "x", "sandbox": true, "ram_bytes": 1e400}'),
        ("/api/v1/schedules", '{"interval_s": NaN, "session": {"target_id": 1}}'),
        ("/api/v1/sessions", "NaN"),
    ],
)
def test_non_finite_numbers_are_422(api: TestClient, path: str, body: str) -> None:
    r = api.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"]


# -- deleting a target ------------------------------------------------------------------------
def test_delete_with_history_is_refused_then_kept_or_dropped(
    api: TestClient, sandbox: Sandbox
) -> None:
    tid = _target(api, sandbox, "history")
    sid = _cancelled_session(api, tid)
    cancelled_before = _cancelled_count(api)
    r = api.delete(f"/api/v1/targets/{tid}")
    assert r.status_code == 409
    assert "?history=keep" in r.json()["detail"]
    assert "?history=drop" in r.json()["detail"]
    assert api.get(f"/api/v1/sessions/{sid}").status_code == 200  # nothing lost

    assert api.delete(f"/api/v1/targets/{tid}?history=keep").status_code == 204
    assert tid not in [t["id"] for t in api.get("/api/v1/targets").json()]
    assert api.get(f"/api/v1/targets/{tid}").json()["retired_at"] is not None
    assert api.get(f"/api/v1/sessions/{sid}").json()["status"] == "cancelled"
    assert _cancelled_count(api) == cancelled_before  # /metrics still counts it
    assert _session(api, tid).status_code == 422  # a retired target is not tuned again
    assert api.delete(f"/api/v1/targets/{tid}?history=drop").status_code == 404

    again = _target(api, sandbox, "history")  # the name is free again
    sid2 = _cancelled_session(api, again)
    assert api.delete(f"/api/v1/targets/{again}?history=drop").status_code == 204
    assert api.get(f"/api/v1/sessions/{sid2}").status_code == 404
    assert api.get(f"/api/v1/sessions/{sid}").status_code == 200  # the retired one's stays


def test_delete_without_history_needs_no_choice(api: TestClient, sandbox: Sandbox) -> None:
    tid = _target(api, sandbox, "fresh")
    assert api.delete(f"/api/v1/targets/{tid}").status_code == 204
    assert api.get(f"/api/v1/targets/{tid}").status_code == 404


def test_dashboard_removes_a_target_keeping_its_history(api: TestClient, sandbox: Sandbox) -> None:
    tid = _target(api, sandbox, "dash-remove")
    sid = _cancelled_session(api, tid)
    page = api.get("/").text
    assert f'action="/targets/{tid}/delete"' in page
    r = api.post(
        f"/targets/{tid}/delete",
        data={"history": "keep"},
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    page = api.get("/").text
    assert f'action="/targets/{tid}/delete"' not in page
    assert f'<option value="{tid}"' not in page  # not offered in the session form
    assert f"/sessions/{sid}" in page  # its session is still listed


# -- preflight -----------------------------------------------------------------------------
def _no_sessions_of(api: TestClient, tid: int) -> bool:
    return api.get("/api/v1/sessions", params={"target_id": tid}).json() == []


def test_preflight_quotes_postgres_and_names_script_and_line(
    api: TestClient, sandbox: Sandbox
) -> None:
    tid = _target(api, sandbox, "pf-prepared")
    before = file_settings(sandbox.dsn)
    r = _session(
        api, tid, builtin=None, scripts=[{"sql": UNTYPED}], init=False, protocol="prepared"
    )
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "operator does not exist: date <= integer" in detail
    assert "workload.scripts[0], line 3" in detail
    assert "protocol 'simple'" in detail
    assert _no_sessions_of(api, tid)
    assert file_settings(sandbox.dsn) == before


def test_preflight_missing_table_with_init_false(api: TestClient, sandbox: Sandbox) -> None:
    tid = _target(api, sandbox, "pf-missing")
    script = "SELECT 1;\n-- the report\nSELECT count(*)\n  FROM orders;\n"
    r = _session(
        api, tid, builtin=None, scripts=[{"sql": "SELECT 1;"}, {"sql": script}], init=False
    )
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert 'relation "orders" does not exist' in detail
    assert "workload.scripts[1], line 4" in detail
    assert "workload.init is false" in detail
    # The builtin without its tables and without init: said so, with the fix.
    r = _session(api, tid, builtin="tpcb-like", init=False)
    assert r.status_code == 422
    assert "set workload.init to true" in r.json()["detail"]
    # init: the tables come later, so their absence is no error now.
    r = _session(api, tid, builtin="tpcb-like", init=True)
    assert r.status_code == 202, r.text
    api.post(f"/api/v1/sessions/{r.json()['id']}/cancel")


def test_preflight_missing_privilege(api: TestClient, sandbox: Sandbox) -> None:
    tid = _target(api, sandbox, "pf-priv", user="tuner")
    r = _session(api, tid, builtin=None, scripts=[{"sql": "SELECT * FROM secret;"}], init=False)
    assert r.status_code == 422, r.text
    assert "permission denied for table secret" in r.json()["detail"]
    assert "GRANT" in r.json()["detail"]


# -- the CLI without a server -------------------------------------------------------------------
def test_sessions_without_server_says_where_it_looked(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KNOBTUNE_")}
    cli = [sys.executable, "-m", "app.cli"]
    res = subprocess.run(
        [*cli, "sessions"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1
    assert f"no metadata DB at {tmp_path.resolve() / 'knobtune.db'}" in res.stderr
    assert "--server" in res.stderr
    assert list(tmp_path.iterdir()) == []  # no knobtune.db made on the way


# -- managed sandboxes across restarts ------------------------------------------------------------
def test_lost_sandbox_is_unregistered_at_start_never_left_idle() -> None:
    work = Path(tempfile.mkdtemp(prefix="knobtune-lost-"))
    work.chmod(0o755)
    settings = Settings(database_url=f"sqlite:///{work / 'meta.db'}", work_dir=work)
    try:
        with TestClient(create_app(settings)) as c:
            kept = c.post("/api/v1/targets", json={"name": "kept", "sandbox": True}).json()
            lost = c.post("/api/v1/targets", json={"name": "lost", "sandbox": True}).json()
        # The service stopped: its idle sandboxes are stopped, not removed.
        kept_root = Path(kept["data_dir"]).parent
        assert not Sandbox.open(kept_root).is_running()
        lost_sock = Sandbox.open(Path(lost["data_dir"]).parent).socket_dir
        assert lost_sock.is_dir()
        shutil.rmtree(Path(lost["data_dir"]).parent)  # e.g. someone cleaned the disk
        with TestClient(create_app(settings)) as c:
            names = [t["name"] for t in c.get("/api/v1/targets").json()]
            assert names == ["kept"]
            assert not lost_sock.exists()  # its socket directory in /tmp went with it
            assert Sandbox.open(kept_root).is_running()  # started again with the service
            r = c.post("/api/v1/targets", json={"name": "lost", "sandbox": True})
            assert r.status_code == 201, r.text  # the name is free again
            for t in c.get("/api/v1/targets").json():
                assert c.delete(f"/api/v1/targets/{t['id']}").status_code == 204
    finally:
        for meta in work.glob("**/sandbox.json"):
            Sandbox.open(meta.parent).destroy()
        shutil.rmtree(work, ignore_errors=True)
