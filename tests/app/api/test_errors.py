"""A service says what to change in its own words; the API adds the REST call that does it."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.db import Database
from app.errors import ServiceError
from app.main import create_app
from app.settings import Settings
from app.targets import service as targets


@pytest.fixture
def api(tmp_path: Path) -> TestClient:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'm.db'}", work_dir=tmp_path, run_scheduler=False
    )
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        ("/api/v1/targets/999", "no target 999; GET /api/v1/targets lists them"),
        ("/api/v1/sessions/999", "no session 999; GET /api/v1/sessions lists them"),
        ("/api/v1/sweeps/999", "no sweep 999; GET /api/v1/sweeps lists them"),
    ],
)
def test_not_found_names_the_listing(api: TestClient, path: str, detail: str) -> None:
    r = api.get(path)
    assert r.status_code == 404
    assert r.json()["detail"] == detail


def test_an_unknown_target_says_how_to_register_one(api: TestClient) -> None:
    r = api.post("/api/v1/sessions", json={"target_id": 999, "knobs": ["work_mem"]})
    assert r.status_code == 422
    assert r.json()["detail"] == (
        "unknown target_id 999: register the server first; POST /api/v1/targets registers one"
    )


def test_the_service_itself_names_no_path(api: TestClient) -> None:
    db: Database = api.app.state.db  # type: ignore[attr-defined]
    with pytest.raises(ServiceError) as exc:
        targets.get_target(db, 999)
    assert exc.value.message == "no target 999"
    assert exc.value.fix == "list-targets"
    assert "/api" not in str(exc.value)
