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


def test_the_head_read_from_the_files_is_alembics(sqlite_url: str) -> None:
    """app.db reads the newest migration from the files (no Alembic at each start)."""
    from alembic.script import ScriptDirectory

    from app.db import head_revision

    assert (
        head_revision()
        == ScriptDirectory.from_config(alembic_config(sqlite_url)).get_current_head()
    )


def test_an_upgraded_db_starts_without_alembic_and_an_older_one_is_upgraded(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.db import current_revision, head_revision

    assert current_revision(sqlite_url) is None  # no DB yet
    upgrade(sqlite_url)
    head = head_revision()
    assert current_revision(sqlite_url) == head
    real = command.upgrade
    ran: list[str] = []

    def recorded(cfg: object, revision: str) -> None:
        ran.append(revision)
        real(cfg, revision)  # type: ignore[arg-type]

    monkeypatch.setattr(command, "upgrade", recorded)
    upgrade(sqlite_url)  # at the head: Alembic is not asked
    assert ran == []
    downgrade(sqlite_url, "-1")
    assert current_revision(sqlite_url) != head
    upgrade(sqlite_url)  # one behind: Alembic upgrades it
    assert ran == ["head"]
    assert current_revision(sqlite_url) == head
