"""Alembic is the only source of schema: upgrade/downgrade on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, inspect

from app.db import alembic_config, downgrade, upgrade
from tests.helpers import metadata_db

# The machine's shared PostgreSQL (never reconfigured: we only create and drop
# a database of our own on it).
TABLES = {"targets", "sessions", "trials", "schedules", "alembic_version"}


@pytest.fixture
def pg_url() -> Iterator[str]:
    with metadata_db("knobtune_mig") as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'meta.db'}"


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_upgrade_to_head_and_back(backend: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    upgrade(url)
    engine = create_engine(url)
    try:
        assert set(inspect(engine).get_table_names()) >= TABLES
        indexes = {ix["name"] for ix in inspect(engine).get_indexes("sessions")}
        assert "uq_sessions_one_active_per_target" in indexes
        # The models and the migrations describe the same schema.
        command.check(alembic_config(url))
        downgrade(url)
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        upgrade(url)  # and up again from base
        assert set(inspect(engine).get_table_names()) >= TABLES
    finally:
        engine.dispose()
