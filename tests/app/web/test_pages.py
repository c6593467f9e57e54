"""What the dashboard's pages take from the services: a time objective's run levels (the
API's figures), which target a job holds."""

from __future__ import annotations

import ast
import itertools
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from markupsafe import escape

from app.db import Database, utcnow
from app.models import Target, Trial, TuningSession
from app.sessions import service as session_svc
from optimizer.evidence import ScriptStat, StreamStat
from optimizer.objective import CHOICE_WORDS, OBJECTIVE_KINDS

NAMES = itertools.count(1)


def seed(db: Database, status: str, objective: str, means_ms: list[float]) -> tuple[int, int]:
    """A target and a session on it whose trials ran at these mean latencies."""
    now = utcnow()
    with db.session() as s:
        t = Target(name=f"t{next(NAMES)}", dsn="host=/nowhere", probe={}, created_at=now)
        s.add(t)
        s.flush()
        sess = TuningSession(
            target_id=t.id,
            status=status,
            phase=status,
            request={"knobs": ["work_mem"], "workload": {}, "objective": objective},
            seed=1,
            start_config={"work_mem": "4MB"},
            best_config={"work_mem": "4MB"},
            notes=[],
            cancel_requested=False,
            attempts=1,
            created_at=now,
            started_at=now,
        )
        s.add(sess)
        s.flush()
        for i, mean in enumerate(means_ms, start=1):
            script = ScriptStat("script1", 1.0, 1000, 0, mean, 0.01)
            stream = StreamStat("main", 4, (script,), p95_ms=2 * mean, mean_ms=mean)
            s.add(
                Trial(
                    session_id=sess.id,
                    index=i,
                    role="baseline" if i == 1 else "candidate",
                    knob=None if i == 1 else "work_mem",
                    value=None if i == 1 else "8MB",
                    config={"work_mem": "4MB"},
                    samples=[100.0],
                    median_tps=100.0,
                    evidence={"streams": [stream.to_json()]},
                    started_at=now + timedelta(seconds=i),
                    finished_at=now + timedelta(seconds=i + 1),
                )
            )
        return t.id, sess.id


def test_a_time_objectives_run_levels_are_the_apis(client: TestClient) -> None:
    db: Database = client.app.state.db  # type: ignore[attr-defined]
    _, sid = seed(db, "succeeded", "latency_mean", [5.0, 10.0])
    request = session_svc.get_session(db, sid).request
    levels = session_svc.trial_levels(db, sid, request)
    assert levels == pytest.approx({1: 5.0, 2: 10.0})
    api = {t["index"]: t["level"] for t in client.get(f"/api/v1/sessions/{sid}/trials").json()}
    assert api == pytest.approx(levels)
    page = client.get(f"/sessions/{sid}")
    assert page.status_code == 200
    assert "<svg" in page.text
    # throughput: the chart plots the median tps, no run has a level
    _, tps = seed(db, "succeeded", "throughput", [5.0])
    assert session_svc.trial_levels(db, tps, {"objective": "throughput"}) == {1: None}


def test_the_index_says_which_session_holds_a_target(client: TestClient) -> None:
    db: Database = client.app.state.db  # type: ignore[attr-defined]
    _, sid = seed(db, "running", "throughput", [])
    idle, _ = seed(db, "succeeded", "throughput", [])
    page = client.get("/").text
    assert f'<a href="/sessions/{sid}">busy: #{sid}</a>' in page
    assert f'action="/targets/{idle}/delete"' in page  # an idle target may be removed
    assert page.count("busy: #") == 1


def test_a_retired_targets_sessions_keep_its_name(client: TestClient) -> None:
    db: Database = client.app.state.db  # type: ignore[attr-defined]
    tid, sid = seed(db, "succeeded", "throughput", [])
    with db.session() as s:
        target = s.get(Target, tid)
        assert target is not None
        target.retired_at = utcnow()
        name = target.name
    for path in ("/", "/partials/sessions"):
        page = client.get(path).text
        assert f'<a href="/sessions/{sid}">' in page, path
        assert f"<td>{name}</td>" in page, path


def test_the_dashboard_runs_no_sql_of_its_own() -> None:
    """It reads through the domain services, like the API (docs/architecture.md)."""
    web = Path(__file__).resolve().parents[3] / "app" / "web"
    for path in sorted(web.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                names += [a.name for a in node.names]
                assert not any(n.split(".")[0] == "sqlalchemy" for n in names), path
            if isinstance(node, ast.Attribute):
                assert node.attr != "session", f"{path}:{node.lineno} opens a DB session"


def test_a_dsn_no_key_opens_reads_the_same_on_every_page(client: TestClient) -> None:
    """The dashboard shows a stored DSN as the API does (app/targets/service.py:
    shown_dsn): a DSN that this service's key cannot open says what to do, not the vault's
    marker."""
    from sqlalchemy import text

    db: Database = client.app.state.db  # type: ignore[attr-defined]
    tid, sid = seed(db, "succeeded", "throughput", [])
    with db.session() as s:  # encrypted with a key this service does not have
        s.execute(text("UPDATE targets SET dsn = 'fernet:not-a-token' WHERE id = :i"), {"i": tid})
    [api] = [t for t in client.get("/api/v1/targets").json() if t["id"] == tid]
    assert api["dsn"].startswith("(cannot be decrypted with this service's secret key")
    page = client.get("/").text
    assert "register the target again" in page
    for path in ("/", f"/sessions/{sid}"):
        assert "undecryptable" not in client.get(path).text, path


def test_the_objective_words_come_from_the_one_vocabulary(client: TestClient) -> None:
    """The form offers every kind (optimizer/objective.py) and a time's page reads as one."""
    assert set(CHOICE_WORDS) == set(OBJECTIVE_KINDS)
    db: Database = client.app.state.db  # type: ignore[attr-defined]
    _, time_sid = seed(db, "succeeded", "latency_mean", [5.0])
    _, tps_sid = seed(db, "succeeded", "throughput", [5.0])
    page = client.get("/").text  # the form is shown once there is a target
    for kind, text in CHOICE_WORDS.items():
        assert f'<option value="{kind}"' in page
        assert escape(text) in page
    time_page = client.get(f"/sessions/{time_sid}").text
    tps_page = client.get(f"/sessions/{tps_sid}").text
    assert '<th class="num">Change</th>' in time_page
    assert '<span class="label">Start</span>' not in time_page
    assert '<th class="num">Gain</th>' in tps_page
    assert '<span class="label">Start</span>' in tps_page
