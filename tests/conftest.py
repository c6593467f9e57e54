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

from app.postgres.sandbox import Sandbox

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
