"""A ServiceError on a dashboard page is the error page, with the service's status and its
message; under /api it stays JSON with the REST hint (app/api/errors.py)."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient

from app.db import utcnow
from app.models import Target


def error_page(r: httpx.Response, status: int, message: str) -> None:
    """The dashboard's error page (with the pages' security headers), saying ``message``."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"].startswith("default-src 'self'")
    assert "<h1>Nothing here</h1>" in r.text
    assert f'<p class="error">{message}</p>' in r.text


@pytest.mark.parametrize(
    ("method", "path", "message"),
    [
        ("GET", "/sessions/999", "no session 999"),
        ("GET", "/sessions/999/results", "no session 999"),
        ("GET", "/sessions/999/apply", "no session 999"),
        ("GET", "/sessions/999/rollback", "no session 999"),
        ("GET", "/sweeps/999", "no sweep 999"),
        ("GET", "/comparisons/999", "no comparison 999"),
        ("GET", "/captures/999", "no capture 999"),
        # a form post whose page is gone: the error page too, not the page with a note
        ("POST", "/sessions/999/cancel", "no session 999"),
        ("POST", "/sweeps/999/cancel", "no sweep 999"),
        ("POST", "/comparisons/999/cancel", "no comparison 999"),
        ("POST", "/captures/999/cancel", "no capture 999"),
        ("POST", "/captures/999/delete", "no capture 999"),
        ("POST", "/targets/999/sweeps", "no target 999"),
        # an id no 64-bit column holds is "not found" too, never a 500
        ("GET", f"/sessions/{2**70}", f"no session {2**70}"),
    ],
)
def test_an_unknown_page_is_the_error_page_with_404(
    client: TestClient, method: str, path: str, message: str
) -> None:
    form = {"content-type": "application/x-www-form-urlencoded"}
    r = client.request(method, path, headers=form if method == "POST" else None)
    error_page(r, 404, message)


def test_the_error_page_keeps_the_service_status(client: TestClient) -> None:
    """Not only 404: a sweep on a recommend-only target is refused with the service's 409."""
    db = client.app.state.db  # type: ignore[attr-defined]
    with db.session() as s:
        t = Target(
            name="prod", dsn="host=/nowhere", probe={}, created_at=utcnow(), recommend_only=True
        )
        s.add(t)
        s.flush()
        tid = t.id
    r = client.post(
        f"/targets/{tid}/sweeps", headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert r.status_code == 409
    assert "<h1>Nothing here</h1>" in r.text
    assert "target &#39;prod&#39; is recommend-only" in r.text


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        ("/api/v1/sessions/999", "no session 999; GET /api/v1/sessions lists them"),
        ("/api/v1/sweeps/999", "no sweep 999; GET /api/v1/sweeps lists them"),
        ("/api/v1/comparisons/999", "no comparison 999; GET /api/v1/comparisons lists them"),
        ("/api/v1/captures/999", "no capture 999; GET /api/v1/captures lists them"),
    ],
)
def test_an_api_error_stays_json(client: TestClient, path: str, detail: str) -> None:
    r = client.get(path)
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"detail": detail}
