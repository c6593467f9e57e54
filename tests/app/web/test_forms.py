"""A form whose request is refused is shown again with the refusal, at its status: the
body's fields (422) or the service's own message and status. Only a page that is gone
is the error page (tests/app/web/test_errors.py)."""

from __future__ import annotations

import html
from datetime import timedelta

import httpx
import pytest
from fastapi.testclient import TestClient

from app.db import Database, utcnow
from app.models import Sweep, Target, TuningSession
from app.sweeps.schemas import SweepIn

FORM = {"content-type": "application/x-www-form-urlencoded"}


def db_of(client: TestClient) -> Database:
    db: Database = client.app.state.db  # type: ignore[attr-defined]
    return db


def target(client: TestClient, *, recommend_only: bool = False) -> int:
    with db_of(client).session() as s:
        t = Target(
            name="prod" if recommend_only else "t",
            dsn="host=/nowhere",
            probe={},
            created_at=utcnow(),
            recommend_only=recommend_only,
        )
        s.add(t)
        s.flush()
        return t.id


def session(client: TestClient, tid: int, status: str, best: str = "16MB") -> int:
    now = utcnow()
    with db_of(client).session() as s:
        sess = TuningSession(
            target_id=tid,
            status=status,
            phase=status,
            request={"knobs": ["work_mem"], "workload": {"builtin": "tpcb-like"}},
            seed=1,
            start_config={"work_mem": "4MB"},
            best_config={"work_mem": best},
            notes=[],
            cancel_requested=False,
            attempts=1,
            created_at=now,
            started_at=now,
            finished_at=None if status == "running" else now + timedelta(minutes=1),
        )
        s.add(sess)
        s.flush()
        return sess.id


def shown_with(r: httpx.Response, status: int, page: str, error: str) -> None:
    """``page``'s HTML (not the error page) at ``status``, with ``error`` as its alert."""
    assert r.status_code == status, r.text
    assert "Nothing here" not in r.text
    assert page in r.text
    assert f'<p class="error" role="alert">{html.escape(error)}</p>' in r.text


def test_the_session_form_shows_a_field_error_and_the_services_refusal(
    client: TestClient,
) -> None:
    tid = target(client)
    r = client.post("/sessions", data={"target_id": str(tid), "max_trials": "lots"})
    shown_with(
        r,
        422,
        'id="target-form"',
        "max_trials: Input should be a valid integer, unable to parse string as an integer",
    )
    assert 'value="lots"' in r.text  # the form keeps what was typed
    r = client.post("/sessions", data={"target_id": "999"})
    # the service's words, without the API's REST hint
    shown_with(r, 422, 'id="target-form"', "unknown target_id 999: register the server first")


def test_the_capture_form_keeps_the_services_status(client: TestClient) -> None:
    tid = target(client, recommend_only=True)
    r = client.post("/captures", data={"target_id": str(tid), "name": "c1", "seconds": "60"})
    assert r.status_code == 409
    assert "Nothing here" not in r.text
    assert "target &#39;prod&#39; is recommend-only" in r.text


def test_a_refused_cancel_shows_the_job_page_with_the_reason(client: TestClient) -> None:
    tid = target(client)
    sid = session(client, tid, "succeeded")
    r = client.post(f"/sessions/{sid}/cancel", headers=FORM)
    shown_with(r, 409, f"Session {sid}", f"session {sid} is already succeeded")
    with db_of(client).session() as s:
        sw = Sweep(
            target_id=tid,
            status="succeeded",
            phase="done",
            request=SweepIn().model_dump(mode="json"),
            created_at=utcnow(),
        )
        s.add(sw)
        s.flush()
        wid = sw.id
    r = client.post(f"/sweeps/{wid}/cancel", headers=FORM)
    shown_with(r, 409, f"Client sweep {wid}", f"sweep {wid} is already succeeded")


@pytest.mark.parametrize(
    ("method", "step", "title"),
    [
        ("GET", "apply", "Apply session"),
        ("POST", "apply", "Apply session"),
        ("GET", "rollback", "Roll back session"),
        ("POST", "rollback", "Roll back session"),
    ],
)
def test_apply_and_rollback_of_a_running_session_are_refused_on_their_page(
    client: TestClient, method: str, step: str, title: str
) -> None:
    sid = session(client, target(client), "running")
    r = client.request(method, f"/sessions/{sid}/{step}", headers=FORM)
    message = f"session {sid} is still running; apply it once it has finished"
    assert r.status_code == 409, r.text
    assert f"{title} {sid}" in r.text
    assert f'<p class="error" role="alert" id="apply-error">{message}</p>' in r.text


def test_an_apply_with_nothing_to_change_is_reviewed_then_done(client: TestClient) -> None:
    """No server is reached: the session recommends no change (its best is its start)."""
    sid = session(client, target(client), "succeeded", best="4MB")
    message = f"Session {sid} recommends no change: there is nothing to apply."
    review = client.get(f"/sessions/{sid}/apply")
    assert review.status_code == 200
    assert f"Apply session {sid}" in review.text
    assert message in review.text
    done = client.post(f"/sessions/{sid}/apply", headers=FORM)
    assert done.status_code == 200
    assert f"Session {sid}: done" in done.text
    assert message in done.text
