"""``knobtune compare`` over REST on a real sandbox: 2 configs x 2 rounds of 2 s runs.

What is asserted is what the service decided and what PostgreSQL reported (the recorded
order, the settings each run had, the statistics' fields, the target's files and settings
afterwards), never which config was faster. Also: what a hostile client gets for a bad
request (4xx that say what to change), a cancel and a crash recovery that restore.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from app.compare.runner import ComparisonRunner
from app.compare.schemas import ComparisonIn
from app.compare.service import resolve_request
from app.db import Database, upgrade, utcnow
from app.errors import ServiceError
from app.models import Comparison, Target, TuningSession
from app.postgres.sandbox import Sandbox
from app.postgres.target import TargetController
from app.settings import Settings
from app.targets.probe_data import rows_to_json
from optimizer.catalogue import CATALOGUE
from optimizer.compare import round_orders
from tests.helpers import file_settings

QUICK: dict[str, Any] = {
    "builtin": "tpcb-like",
    "scale": 1,
    "clients": 2,
    "jobs": 1,
    "duration_s": 2,
    "warmup_s": 0,
    "rate": 100,  # pgbench -R: what is asserted is never the throughput
}


def wait_comparison(client: TestClient, cid: int, timeout: float = 240) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = client.get(f"/api/v1/comparisons/{cid}").json()
        if body["status"] in ("succeeded", "failed", "cancelled"):
            return body
        time.sleep(0.3)
    raise AssertionError(f"comparison {cid} did not finish: {body}")


def work_mem(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('work_mem')").fetchone()
    assert row is not None
    return str(row[0])


@pytest.fixture(scope="module")
def server() -> Iterator[Sandbox]:
    """A server of the user's own, with an ALTER SYSTEM entry the comparison must keep."""
    with Sandbox.create() as sb:
        with psycopg.connect(sb.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET work_mem = '6MB'")
            conn.execute("SELECT pg_reload_conf()")
        yield sb


@pytest.fixture(scope="module")
def target_id(client: TestClient, server: Sandbox) -> int:
    r = client.post("/api/v1/targets", json={"name": "compare-sb", "dsn": server.dsn})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def test_two_configs_interleaved_measured_and_restored(
    client: TestClient, target_id: int, server: Sandbox
) -> None:
    before = file_settings(server.dsn)
    assert work_mem(server.dsn) == "6MB"
    body = {
        "target_id": target_id,
        "configs": [{"name": "default"}, {"name": "wm8", "settings": {"work_mem": "8MB"}}],
        "rounds": 2,
        "workload": QUICK,
        "warmup_run_s": 1,
        "seed": 7,
    }
    r = client.post("/api/v1/comparisons", json=body)
    assert r.status_code == 202, r.text
    cid = int(r.json()["id"])
    assert r.headers["Location"] == f"/api/v1/comparisons/{cid}"
    # the comparison holds its target like a session
    sess = client.post("/api/v1/sessions", json={"target_id": target_id, "knobs": ["work_mem"]})
    assert sess.status_code == 409
    assert f"busy with comparison {cid}" in sess.json()["detail"]

    c = wait_comparison(client, cid)
    assert c["status"] == "succeeded", c
    # the recorded order: each round a permutation drawn from the seed, run as recorded
    names = ["default", "wm8"]
    expected = [[names[i] for i in o] for o in round_orders(2, 2, 7)]
    assert c["seed"] == 7
    assert c["orders"] == expected
    assert [r["config"] for r in c["runs"]] == [n for o in expected for n in o]
    assert [(r["round"], r["position"]) for r in c["runs"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert c["runs_done"] == c["runs_planned"] == 4
    # what each run had: PostgreSQL's own work_mem for default (its boot value), 8MB for
    # wm8, read as the measured run began; and what was applied, in the run's row
    for run in c["runs"]:
        want = "4MB" if run["config"] == "default" else "8MB"
        assert run["settings"]["work_mem"] == want, run
        assert run["applied"]["work_mem"] == want
        assert run["error"] is None
        assert run["level"] > 0
        assert run["transactions"] > 0
        assert run["timings"]["warmup_s"] > 0  # a discarded run after every apply
    configs = {x["name"]: x for x in c["configs"]}
    assert configs["default"]["settings"] == {"work_mem": "4MB"}  # only what differs here
    assert configs["wm8"]["settings"] == {"work_mem": "8MB"}
    # the statistics: each config's median with its interval, the gain vs the reference
    assert c["reference"] == "default"
    assert c["unit"] == "tps"
    for level in c["levels"]:
        assert level["median"] > 0
        assert len(level["runs"]) == 2
        low, high = level["ci95"]
        assert low <= level["median"] <= high
    (gain,) = c["gains"]
    assert gain["name"] == "wm8"
    assert gain["vs"] == "default"
    assert gain["rounds"] == 2
    assert {"gain", "ci95", "p_value", "significant", "text"} <= set(gain)
    assert gain["text"].startswith("throughput ")
    if gain["p_value"] is not None and gain["p_value"] >= 0.05:
        assert gain["text"].endswith("not significant")
    # the target as it was: its files and its settings
    assert c["restored"] is True
    assert file_settings(server.dsn) == before
    assert work_mem(server.dsn) == "6MB"
    auto = (server.data_dir / "postgresql.auto.conf").read_text()
    assert "work_mem = '6MB'" in auto
    assert "8MB" not in auto
    assert any("restored" in n for n in c["notes"])
    # listed, and its page
    assert cid in [x["id"] for x in client.get("/api/v1/comparisons").json()]
    page = client.get(f"/comparisons/{cid}")
    assert page.status_code == 200, page.text
    assert "Comparison" in page.text
    assert "wm8" in page.text
    assert gain["text"] in page.text


BAD: list[tuple[dict[str, Any], int, str]] = [
    ({"configs": [{"name": "default"}]}, 422, "at least 2"),
    ({"configs": [{"name": "default"}, {"name": "default"}]}, 422, "given twice"),
    ({"rounds": 1}, 422, "greater than or equal to 2"),
    ({"rounds": 21}, 422, "less than or equal to 20"),
    ({"reference": "nope"}, 422, "reference 'nope' is none of the configs"),
    ({"configs": [{"name": "default"}, {"name": "file:/etc/passwd"}]}, 422, "never reads a path"),
    (
        {"configs": [{"name": "default"}, {"name": "pgtune", "settings": {"work_mem": "8MB"}}]},
        422,
        "is a named config",
    ),
    ({"configs": [{"name": "default"}, {"name": "mine"}]}, 422, "give its settings inline"),
    ({"configs": [{"name": "default"}, {"name": "mine", "settings": {}}]}, 422, "'current'"),
    (
        {"configs": [{"name": "default"}, {"name": "a b", "settings": {"work_mem": "8MB"}}]},
        422,
        "pattern",
    ),
    (
        {"configs": [{"name": "default"}, {"name": "m", "settings": {"work_mem": 8}}]},
        422,
        "valid string",
    ),
    (
        {"configs": [{"name": "default"}, {"name": "m", "settings": {"wrok_mem": "8MB"}}]},
        422,
        "did you mean work_mem",
    ),
    (
        {"configs": [{"name": "default"}, {"name": "m", "settings": {"listen_addresses": "*"}}]},
        422,
        "not a knob knobtune compares",
    ),
    (
        {"configs": [{"name": "default"}, {"name": "m", "settings": {"work_mem": "8 furlongs"}}]},
        422,
        "invalid value for work_mem",
    ),
    (
        {"configs": [{"name": "default"}, {"name": "m", "settings": {"work_mem": "32kB"}}]},
        422,
        "outside what the server accepts",
    ),
    (
        {"configs": [{"name": "default"}, {"name": "m", "settings": {"work_mem": "1TB"}}]},
        422,
        "more than the server's memory",
    ),
    (
        {"configs": [{"name": "default"}, {"name": "m", "settings": {"fsync": "off"}}]},
        422,
        "durability-unsafe",
    ),
    (
        {"configs": [{"name": "default"}, {"name": "m", "settings": {"shared_buffers": "256MB"}}]},
        422,
        "need(s) a server restart",
    ),
    ({"configs": [{"name": "default"}, {"name": "session:999999"}]}, 422, "no session 999999"),
    ({"workload": {**QUICK, "duration_s": 86_400}}, 422, "at most 24 h"),
    ({"workload": {**QUICK, "clients": "auto"}}, 422, "is for sessions"),
    ({"target_id": 999_999}, 422, "unknown target_id"),
    ({"shell": "rm -rf /"}, 422, "Extra inputs are not permitted"),
]


@pytest.mark.parametrize(("change", "status", "says"), BAD)
def test_bad_requests_say_what_to_change(
    client: TestClient, target_id: int, change: dict[str, Any], status: int, says: str
) -> None:
    body = {
        "target_id": target_id,
        "configs": [{"name": "default"}, {"name": "current"}],
        "workload": QUICK,
        **change,
    }
    r = client.post("/api/v1/comparisons", json=body)
    assert r.status_code == status, r.text
    assert says in r.text, r.text


def test_unknown_comparison_is_404(client: TestClient) -> None:
    r = client.get("/api/v1/comparisons/424242")
    assert r.status_code == 404
    assert "GET /api/v1/comparisons lists them" in r.text
    assert client.post("/api/v1/comparisons/424242/cancel").status_code == 404


def test_cancel_restores_the_target(client: TestClient, target_id: int, server: Sandbox) -> None:
    before = file_settings(server.dsn)
    body = {
        "target_id": target_id,
        "configs": [{"name": "current"}, {"name": "wm16", "settings": {"work_mem": "16MB"}}],
        "rounds": 2,
        "workload": {**QUICK, "duration_s": 60},
        "warmup_run_s": 1,
        "seed": 3,  # wm16 runs first in round 1: its change is in force when cancelled
    }
    assert round_orders(2, 2, 3)[0][0] == 1
    r = client.post("/api/v1/comparisons", json=body)
    assert r.status_code == 202, r.text
    cid = int(r.json()["id"])
    deadline = time.monotonic() + 60
    while work_mem(server.dsn) != "16MB":
        assert time.monotonic() < deadline, client.get(f"/api/v1/comparisons/{cid}").json()
        time.sleep(0.2)
    r = client.post(f"/api/v1/comparisons/{cid}/cancel")
    assert r.status_code == 202, r.text
    c = wait_comparison(client, cid, timeout=60)
    assert c["status"] == "cancelled", c
    assert c["restored"] is True
    assert file_settings(server.dsn) == before
    assert work_mem(server.dsn) == "6MB"
    assert client.post(f"/api/v1/comparisons/{cid}/cancel").status_code == 409


def test_a_crashed_comparison_is_restored_by_the_next_process(
    server: Sandbox, tmp_path: Path
) -> None:
    """A process died with a config applied; the comparison was cancelled meanwhile: the
    process that takes it over puts the snapshot back before it ends."""
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    upgrade(url)
    db = Database(url)
    settings = Settings(database_url=url, work_dir=tmp_path)
    before = file_settings(server.dsn)
    ctl = TargetController(server.dsn)
    snap = ctl.snapshot(["work_mem"])
    try:
        with db.session() as s:
            t = Target(name="crashed", dsn=server.dsn, probe={}, created_at=utcnow())
            s.add(t)
        request = ComparisonIn.model_validate(
            {
                "target_id": t.id,
                "configs": [{"name": "current"}, {"name": "m", "settings": {"work_mem": "9MB"}}],
                "workload": QUICK,
            }
        )
        # the dead process: its snapshot committed, its config applied, then gone, with
        # the comparison cancelled while nobody ran it
        ctl.apply({"work_mem": "9MB"})
        assert work_mem(server.dsn) == "9MB"
        with db.session() as s:
            c = Comparison(
                target_id=t.id,
                status="running",
                phase="round 1 of 4, m: measuring",
                request=request.model_dump(mode="json"),
                seed=1,
                configs=[
                    {"name": "current", "kind": "current", "settings": {}, "note": None},
                    {"name": "m", "kind": "settings", "settings": {"work_mem": "9MB"}},
                ],
                snapshot={"target": snap.to_json()},
                applied={"config": {"work_mem": "9MB"}, "label": "m"},
                runs=[],
                notes=[],
                cancel_requested=True,
                attempts=1,
                lease_owner="me",  # this process has just claimed its expired lease
                lease_expires_at=utcnow() + timedelta(seconds=60),
                created_at=utcnow(),
            )
            s.add(c)
        ComparisonRunner(db, settings, c.id, "me").run()
        with db.session() as s:
            c = s.get(Comparison, c.id)
            assert c is not None
            assert (c.status, c.restored) == ("cancelled", True), (c.status, c.error)
        assert file_settings(server.dsn) == before
        assert work_mem(server.dsn) == "6MB"
    finally:
        ctl.revert(snap)
        db.dispose()


def test_session_n_is_its_recommendation(server: Sandbox, tmp_path: Path) -> None:
    """session:N is what `knobtune apply N` would change; a session without one is refused."""
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    upgrade(url)
    db = Database(url)
    settings = Settings(database_url=url, work_dir=tmp_path)
    rows = rows_to_json(TargetController(server.dsn).probe(sorted(CATALOGUE)).settings)
    try:
        with db.session() as s:
            t = Target(name="t", dsn=server.dsn, probe={"rows": rows}, created_at=utcnow())
            s.add(t)
            s.flush()
            start = {"work_mem": "6MB", "random_page_cost": "4"}

            def session(status: str, gain_status: str | None, best: dict[str, str]) -> int:
                row = TuningSession(
                    target_id=t.id, status=status, phase=status, request={}, seed=1,
                    start_config=start, best_config=best, gain=0.12, gain_status=gain_status,
                    notes=[], created_at=utcnow(),
                )  # fmt: skip
                s.add(row)
                s.flush()
                return row.id

            kept = session("succeeded", "confirmed", {**start, "work_mem": "16MB"})
            nothing = session("succeeded", "no-change", start)
            running = session("running", None, start)

        def resolve(*names: str) -> list[Any]:
            configs = [{"name": "current"}, *({"name": n} for n in names)]
            body = ComparisonIn.model_validate(
                {"target_id": t.id, "configs": configs, "workload": QUICK}
            )
            return resolve_request(db, settings, t, body)

        _, rec, none = resolve(f"session:{kept}", f"session:{nothing}")
        assert rec.settings == {"work_mem": "16MB"}  # only what it changes
        assert rec.note == f"session {kept}'s recommendation (confirmed +12.0%)"
        assert none.settings == {}
        assert "recommends no change" in none.note
        with pytest.raises(ServiceError, match="is running, so it has no recommendation"):
            resolve(f"session:{running}")
    finally:
        db.dispose()
