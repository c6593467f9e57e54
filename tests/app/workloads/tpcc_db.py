"""One CH-benCHmark load (TPC-C at 1 warehouse + the CH tables) per test session.

The load takes 10-30 s on 2 busy cores, so it happens once, into a template database of
the session sandbox; each test module gets its own copy (CREATE DATABASE ... TEMPLATE,
~1-2 s), so a module that changes data (new orders, deliveries) cannot disturb another.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from app.postgres.sandbox import BENCH_DB, BENCH_ROLE, Sandbox
from app.workloads.chbench import Chbench

TEMPLATE = "knobtune_ch_template"
_notes: dict[str, str] = {}  # sandbox DSN -> the note of its one load


def _dsn(sandbox: Sandbox, db: str) -> str:
    return sandbox.dsn.replace("dbname=postgres", f"dbname={db}")


def _bench_dsn(sandbox: Sandbox, db: str) -> str:
    return sandbox.bench_dsn.replace(f"dbname={BENCH_DB}", f"dbname={db}")


@pytest.fixture(scope="session", name="ch_template")
def ch_template_fixture(sandbox: Sandbox) -> Iterator[str]:
    """The note of the session's one load (imported by several modules: loads once)."""
    if sandbox.dsn not in _notes:
        with psycopg.connect(sandbox.dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE}")
            # the benchmark role's, as a workload's data is (a session on a copy runs as
            # that role: issue 40)
            conn.execute(f"CREATE DATABASE {TEMPLATE} OWNER {BENCH_ROLE}")
        _notes[sandbox.dsn] = Chbench().prepare(_bench_dsn(sandbox, TEMPLATE)) or ""
    yield _notes[sandbox.dsn]
    with psycopg.connect(sandbox.dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")


def copy_of_template(sandbox: Sandbox, db: str) -> Iterator[str]:
    """A fresh copy of the loaded template named ``db``, dropped afterwards."""
    with psycopg.connect(sandbox.dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {db}")
        conn.execute(f"CREATE DATABASE {db} TEMPLATE {TEMPLATE} OWNER {BENCH_ROLE}")
    yield _dsn(sandbox, db)
    with psycopg.connect(sandbox.dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def one(dsn: str, sql: str) -> object:
    """The first column of the first row of ``sql``."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]
