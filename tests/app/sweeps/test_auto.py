"""clients "auto" (app/sweeps/auto.py) without a server: the sweep's measurement is faked,
what is asserted is what the session takes from its knee and what it says about it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.db import Database, utcnow
from app.models import Sweep, Target, TuningSession
from app.sessions.schemas import SessionIn
from app.sweeps import auto
from app.sweeps.service import session_notes
from tests.app.runs.fake import make_db


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    d = make_db(tmp_path)
    yield d
    d.dispose()


def _session(db: Database) -> int:
    with db.session() as s:
        t = Target(name="t", dsn="host=/nowhere", probe={}, created_at=utcnow())
        s.add(t)
        s.flush()
        sess = TuningSession(
            target_id=t.id, status="running", phase="running", request={}, seed=1,
            benchmark_s=0.0, notes=[], cancel_requested=False, attempts=0, created_at=utcnow(),
        )  # fmt: skip
        s.add(sess)
        s.flush()
        return sess.id


def _run(db: Database, monkeypatch: pytest.MonkeyPatch, jobs: int, knee: int) -> SessionIn:
    def measure(*_: Any, **__: Any) -> dict[str, Any]:
        return {
            "stopped": False, "runs": [], "counts": [1, 2, 4, 8], "knee_clients": knee,
            "knee_tps": 900.0, "best_clients": 8, "best_tps": 1000.0, "advice": ["a pool"],
        }  # fmt: skip

    monkeypatch.setattr(auto, "measure", measure)
    sid = _session(db)
    body = SessionIn.model_validate(
        {"target_id": 1, "workload": {"builtin": "tpcb-like", "clients": "auto", "jobs": jobs}}
    )
    out = auto.auto_clients(db, sid, body, "host=/nowhere", None, None, Path("."))
    assert out.workload.clients == knee
    out_notes = session_notes(db, sid, out)
    assert len(out_notes) == 1
    assert out_notes[0].startswith(f"clients auto: {knee} (client sweep")
    return out


def test_a_knee_below_the_jobs_lowers_them_and_says_so(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _run(db, monkeypatch, jobs=8, knee=2)
    assert out.workload.jobs == 2
    said = "jobs 8 lowered to 2: the session runs at the knee, 2 clients"
    assert said in session_notes(db, 1, out)[0]
    with db.session() as s:
        sw = s.get(Sweep, 1)
        assert sw is not None
        assert sw.result is not None
        assert sw.result["jobs_capped"] == {"from": 8, "to": 2}
        assert sw.result["advice"][0] == "a pool"
        assert said in sw.result["advice"][-1]


def test_jobs_within_the_knee_are_kept_without_a_word(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _run(db, monkeypatch, jobs=2, knee=4)
    assert out.workload.jobs == 2
    assert "lowered" not in session_notes(db, 1, out)[0]
    with db.session() as s:
        sw = s.get(Sweep, 1)
        assert sw is not None
        assert sw.result is not None
        assert "jobs_capped" not in sw.result
        assert sw.result["advice"] == ["a pool"]
