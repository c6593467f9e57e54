"""Shared fixtures: disposable PostgreSQL sandbox clusters (real servers, no mocks).

``sandbox`` is one cluster for the whole test session (of each xdist worker): tests that
change its configuration must put it back (TargetController.revert). ``sandbox_factory``
makes fresh clusters that are destroyed after the test; ``fresh_sandbox`` is one
of those.

The suite runs on several xdist workers (pyproject.toml: ``-n``, ``--dist loadfile``):
most of its time is spent waiting on benchmark runs, not computing. A module runs whole
on one worker (its module-scoped fixtures are made once); slow modules start first, so
that no worker is left with a long one at the end. (``--dist loadgroup`` would let the
three modules that share the CH-benCHmark load share one worker, but pytest 9 ignores
the node ids pytest-xdist 3.8 renames for it.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.postgres.sandbox import Sandbox, remove_orphan_templates
from app.settings import Settings

SandboxFactory = Callable[..., Sandbox]

# The slowest modules first, longest first (their time on a full run with four workers,
# 2026-11-27): a worker that picked one up late would otherwise run alone at the end.
# pyproject.toml's --no-loadscope-reorder keeps this order: by default pytest-xdist hands
# out the modules with the most tests first (the optimizer's), whatever the collection's
# order: the 470 s module once started 500 s into the run, the 210 s one after 800 s.
_SLOW_FIRST = (
    "tests/docs/test_results_captures.py",  # 470 s
    "tests/docs/test_results_search_order.py",
    "tests/docs/test_results_e2e_tpcc.py",
    "tests/docs/test_results_e2e_oltp.py",
    "tests/docs/test_fresh_copy.py",
    "tests/docs/test_results_commands.py",
    "tests/app/sweeps/test_sweep.py",
    "tests/acceptance/test_service_lifecycle.py",
    "tests/docs/test_captures.py",
    "tests/docs/test_results_e2e_tpch.py",
    "tests/app/api/test_security.py",
    "tests/docs/test_cli_commands.py",
    "tests/e2e/test_cli.py",
    "tests/e2e/test_faults.py",
    "tests/docs/test_cli_sessions.py",
    "tests/app/sessions/test_builtin_sessions.py",
    "tests/docs/test_results_quality.py",
    "tests/acceptance/test_readme.py",
    "tests/acceptance/test_cli_user.py",  # 73 s
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow modules first (``--dist loadfile`` hands out whole modules in this order)."""
    rank = {m: i for i, m in enumerate(_SLOW_FIRST)}
    items.sort(key=lambda it: rank.get(it.nodeid.split("::")[0], len(rank)))  # stable


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Leave no initdb template behind: a process the tests killed (SIGKILL) cannot remove
    its own (46 MB), and the next service start that would is not part of the suite."""
    remove_orphan_templates()


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
