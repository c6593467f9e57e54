"""Shared fixtures: disposable PostgreSQL sandbox clusters (real servers, no mocks).

``sandbox`` is one cluster for the whole test session: tests that change its
configuration must put it back (TargetController.revert). ``sandbox_factory``
makes fresh clusters that are destroyed after the test; ``fresh_sandbox`` is one
of those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.postgres.sandbox import Sandbox
from app.settings import Settings

SandboxFactory = Callable[..., Sandbox]


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox.create() as sb:
        yield sb


@pytest.fixture
def sandbox_factory() -> Iterator[SandboxFactory]:
    made: list[Sandbox] = []

    def make(
        root: Path | None = None,
        *,
        port: int | None = None,
        settings: dict[str, str] | None = None,
    ) -> Sandbox:
        sb = Sandbox.create(root, port=port, settings=settings)
        made.append(sb)
        return sb

    yield make
    for sb in made:
        sb.destroy()


@pytest.fixture
def fresh_sandbox(sandbox_factory: SandboxFactory) -> Sandbox:
    return sandbox_factory()


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The real app, scheduler included, on its own SQLite metadata DB, per test module."""
    tmp = tmp_path_factory.mktemp("svc")
    settings = Settings(database_url=f"sqlite:///{tmp / 'meta.db'}", work_dir=tmp, poll_seconds=0.3)
    with TestClient(create_app(settings)) as c:
        yield c
