"""The dashboard's tests: one service in-process on a fresh SQLite metadata DB, no scheduler,
redirects shown as they are answered."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'm.db'}", work_dir=tmp_path, run_scheduler=False
    )
    with TestClient(create_app(settings), follow_redirects=False) as c:
        yield c
