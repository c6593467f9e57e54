"""Fixtures of the capture tests: a sandbox whose log can be read through SQL (the logging
collector on, pg_stat_statements loaded: tests/helpers.py logging_sandbox), and the service."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.postgres.sandbox import Sandbox
from app.postgres.serverlog import LOGGING_SETTINGS
from app.settings import Settings
from tests.helpers import logging_sandbox


@pytest.fixture(scope="module")
def logsb() -> Iterator[Sandbox]:
    sb = logging_sandbox()
    try:
        yield sb
    finally:
        sb.destroy()


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Settings]]:
    tmp = tmp_path_factory.mktemp("cap")
    settings = Settings(database_url=f"sqlite:///{tmp / 'meta.db'}", work_dir=tmp, poll_seconds=0.3)
    with TestClient(create_app(settings)) as c:
        yield c, settings


def server_state(sb: Sandbox) -> dict[str, Any]:
    """What a capture may touch: postgresql.auto.conf as a file, and the logging settings
    as the server has them (value and where it comes from)."""
    with psycopg.connect(sb.dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT name, setting, source, sourcefile FROM pg_settings WHERE name = ANY(%s) "
            "ORDER BY name",
            [list(LOGGING_SETTINGS)],
        ).fetchall()
    return {
        "auto_conf": (sb.data_dir / "postgresql.auto.conf").read_text(),
        "settings": rows,
    }


def log_setting(sb: Sandbox, name: str = "log_statement") -> str:
    with psycopg.connect(sb.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting(%s)", [name]).fetchone()
    assert row is not None
    return str(row[0])


def work_dir(settings: Settings) -> Path:
    return Path(settings.work_dir)
