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

import ast
import inspect
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.postgres.sandbox import Sandbox, remove_orphan_templates
from app.settings import Settings

SandboxFactory = Callable[..., Sandbox]

# The slowest modules first, longest first: a worker that picked one up late would
# otherwise run alone at the end. Each one's time in a full run with four workers on this
# 2-core host (every test's wall and CPU seconds, its processes included, summed per module,
# 2026-11-29; they take about half of that alone). pyproject.toml's --no-loadscope-reorder
# keeps this order: by default pytest-xdist hands out the modules with the most tests first
# (the optimizer's), whatever the collection's order.
_SLOW_FIRST = (
    "tests/docs/test_results_captures.py",  # 180 s (42 CPU-s)
    "tests/docs/test_results_search_order.py",  # 135 s (25 CPU-s)
    "tests/app/sweeps/test_sweep.py",  # 103 s (67 CPU-s)
    "tests/e2e/test_faults.py",  # 101 s (28 CPU-s)
    "tests/acceptance/test_service_lifecycle.py",  # 98 s (17 CPU-s)
    "tests/docs/test_results_commands.py",  # 84 s (68 CPU-s)
    "tests/docs/test_cli_sessions.py",  # 70 s (26 CPU-s)
    "tests/docs/test_captures.py",  # 65 s (22 CPU-s)
    "tests/docs/test_fresh_copy.py",  # 64 s (49 CPU-s)
    "tests/docs/test_compare.py",  # 63 s (15 CPU-s)
    "tests/security/test_restart.py",  # 59 s (9 CPU-s)
    "tests/app/runs/test_memory_measured.py",  # 59 s (44 CPU-s)
    "tests/app/runs/test_guards.py",  # 52 s (9 CPU-s)
    "tests/e2e/test_dashboard.py",  # 52 s (19 CPU-s)
    "tests/docs/test_results_quality.py",  # 51 s (18 CPU-s)
    "tests/docs/test_results_duet.py",  # 50 s (16 CPU-s)
    "tests/app/sessions/test_builtin_sessions.py",  # 49 s (54 CPU-s)
    "tests/docs/test_cli_commands.py",  # 45 s (32 CPU-s)
    "tests/app/api/test_security.py",  # 39 s (18 CPU-s)
    "tests/app/api/test_service_api.py",  # 39 s (9 CPU-s)
    "tests/e2e/test_cli.py",  # 38 s (18 CPU-s)
    "tests/app/workloads/test_streams.py",  # 35 s (8 CPU-s)
    "tests/docs/test_results_steady.py",  # 33 s (7 CPU-s)
    "tests/acceptance/test_two_processes.py",  # 32 s (9 CPU-s)
    "tests/app/postgres/test_pg18.py",  # 32 s (13 CPU-s)
    "tests/docs/test_readme_steps.py",  # 31 s (24 CPU-s)
)


# The fast lane is `pytest -m "not slow"` (README, docs/contributing.md): the optimizer, the
# schemas, the services on the fake RunEnv, the API through TestClient. A test is `slow`
# without being marked by hand when it, or any fixture it depends on (pytest's closure of
# its fixtures), starts a real PostgreSQL server, pgbench, a browser, a script or the
# service as a process: it uses one of these fixtures, or its code, a fixture's or that of
# a test helper either calls (tests/ only, followed by name), says one of these.
_SLOW_FIXTURES = frozenset({"sandbox", "sandbox_factory", "fresh_sandbox", "staging", "user_dir"})
_STARTS_A_PROCESS = re.compile(
    r"\b(Sandbox\.(create|open)|Sandbox\(|logging_sandbox|ServiceProcess|subprocess|Popen"
    r"|run_bench|make_sandbox|sys\.executable|needs_cgroups|sync_playwright"
    r"|start_sandboxes|find_pgbench)\b|\.venv/bin|['\"]sandbox['\"]: |sandbox=True"
)
# the code followed: the tests' own and the bench scripts' (tests/e2e/test_faults.py runs
# bench/faults.py's scenarios); the app's is not (a test of it starts what it starts)
_FOLLOWED = (Path(__file__).resolve().parent, Path(__file__).resolve().parents[1] / "bench")


@cache
def _code(func: Callable[..., Any]) -> tuple[bool, frozenset[str]] | None:
    """Does a function or class of tests/ or bench/ say it starts a process (in its code,
    decorators kept, docstrings and comments dropped: prose says nothing), and the names
    it calls; None: not one of those."""
    try:
        where = Path(inspect.getfile(func)).resolve()
        if not any(where.is_relative_to(d) for d in _FOLLOWED):
            return None
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body[:1] = [ast.Pass()]
    calls = frozenset(
        n.func.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    )
    return _STARTS_A_PROCESS.search(ast.unparse(tree)) is not None, calls


@cache
def _starts_a_process(func: Callable[..., Any]) -> bool:
    """Does this test's, fixture's or helper's code start a server or a process, or does a
    function or class of tests/ or bench/ it calls by name? (Through its module's names,
    each one's code read once, a cycle cut.)"""
    seen: set[Callable[..., Any]] = set()

    def check(f: Callable[..., Any]) -> bool:
        f = inspect.unwrap(f)  # a @contextmanager's, say: its own code and module
        if f in seen:
            return False
        seen.add(f)
        code = _code(f)
        if code is None:
            return False
        if code[0]:
            return True
        module = sys.modules.get(getattr(f, "__module__", ""), None)
        names = getattr(f, "__globals__", None) or vars(module or sys)
        return any(
            (inspect.isfunction(names.get(n)) or inspect.isclass(names.get(n))) and check(names[n])
            for n in code[1]
        )

    return check(func)


def is_slow(item: pytest.Item) -> bool:
    if item.get_closest_marker("slow") is not None:
        return True
    if not isinstance(item, pytest.Function):
        return False
    if _SLOW_FIXTURES & set(item.fixturenames):
        return True
    funcs = [item.function]
    for name in item.fixturenames:
        if name != "_fast_lane_starts_no_server":  # every test's; it only watches
            funcs += [d.func for d in item._fixtureinfo.name2fixturedefs.get(name, ())]
    return any(_starts_a_process(f) for f in funcs)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that starts a real server or process is `slow` (the fast lane is the
    rest); slow modules first (``--dist loadfile`` hands out whole modules in this order).
    Tests are classified only for a -m expression that names `slow`: it reads their code
    (2 s of CPU per worker), and nothing else reads the mark."""
    if "slow" in (config.option.markexpr or ""):
        for item in items:
            if is_slow(item) and item.get_closest_marker("slow") is None:
                item.add_marker(pytest.mark.slow)
    rank = {m: i for i, m in enumerate(_SLOW_FIRST)}
    items.sort(key=lambda it: rank.get(it.nodeid.split("::")[0], len(rank)))  # stable


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Leave no initdb template behind: a process the tests killed (SIGKILL) cannot remove
    its own (46 MB), and the next service start that would is not part of the suite."""
    remove_orphan_templates()


@pytest.fixture(autouse=True)
def _fast_lane_starts_no_server(request: pytest.FixtureRequest) -> Iterator[None]:
    """In the fast lane (a -m expression that names `slow`), a test classified fast that
    creates a sandbox in the test process errors at its teardown, saying how to classify
    it (the sandbox is made: failing inside the app would break its TestClient)."""
    markexpr = request.config.option.markexpr or ""
    if "slow" not in markexpr or request.node.get_closest_marker("slow") is not None:
        yield
        return
    made: list[str] = []
    create = Sandbox.create.__func__  # type: ignore[attr-defined]

    def record(cls: type[Sandbox], *args: Any, **kwargs: Any) -> Sandbox:
        made.append("sandbox")
        sb: Sandbox = create(cls, *args, **kwargs)
        return sb

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Sandbox, "create", classmethod(record))
        yield
    if made:
        pytest.fail(
            f"{request.node.nodeid} started {len(made)} PostgreSQL sandbox(es) but is not "
            "marked slow: use a sandbox fixture or add @pytest.mark.slow (tests/conftest.py)"
        )


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
