"""Alembic is the only source of schema: upgrade/downgrade on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from alembic import command
from sqlalchemy import create_engine, inspect

from app.db import alembic_config, downgrade, upgrade

# The machine's shared PostgreSQL (never reconfigured: we only create and drop
# a database of our own on it).
ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
TABLES = {"targets", "sessions", "trials", "schedules", "alembic_version"}


@pytest.fixture
def pg_url() -> Iterator[str]:
    name = f"knobtune_mig_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
