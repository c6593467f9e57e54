"""Finding 3 (the echo): the preflight's 422 quoted the target's error text whole.

Through it came another target's password, /etc/passwd and the output of COPY ... FROM
PROGRAM. Now only PostgreSQL's primary message passes, its first line, each quoted value
cut to 64 characters, the whole to 200, every known password masked
(app/postgres/errors.py says why that much). A failing run's error is bounded alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient

from app.postgres.errors import MAX_MESSAGE, MAX_QUOTED
from app.postgres.pgbench import BenchSpec, run_bench
from app.postgres.sandbox import Sandbox
from tests.security.conftest import session_body

OTHER_SECRET = "Pw-other-target-7f3q"  # another target's password, as stored
UNKNOWN_SECRET = "Pw-not-knobtunes-2k9"  # in a DSN knobtune never saw


@pytest.fixture(scope="module")
def other_target(service: TestClient, sandbox_factory_module: Callable[[], Sandbox]) -> int:
    sb = sandbox_factory_module()
    with psycopg.connect(sb.dsn, autocommit=True) as conn:  # the password as stored
        conn.execute(f"ALTER ROLE postgres PASSWORD '{OTHER_SECRET}'")
    sb.password = OTHER_SECRET
    r = service.post("/api/v1/targets", json={"name": "sec-other", "dsn": sb.dsn})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


@pytest.fixture(scope="module")
def sandbox_factory_module() -> Iterator[Callable[[], Sandbox]]:
    made: list[Sandbox] = []

    def make() -> Sandbox:
        sb = Sandbox.create()
        made.append(sb)
        return sb

    yield make
    for sb in made:
        sb.destroy()


@pytest.fixture(scope="module")
def loot(sandbox: Sandbox) -> None:
    """Text the target's user can read, as the service's metadata DB was read from a
    sandbox (pg_read_binary_file): another target's password, a DSN. In the benchmark
    database, where the workload runs (as knobtune_bench: issue 40)."""
    with psycopg.connect(sandbox.bench_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS loot")
        conn.execute("CREATE TABLE loot (id int, t text)")
        conn.execute(
            "INSERT INTO loot VALUES (1, %s), (2, %s)",
            [OTHER_SECRET, f"postgresql://app:{UNKNOWN_SECRET}@db.internal/app"],
        )


def _preflight_error(service: TestClient, target_id: int, sql: str) -> str:
    r = service.post("/api/v1/sessions", json=session_body(target_id, sql))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, str)
    assert detail.startswith("preflight: workload.scripts[1], line "), detail
    return detail


def _quoted(detail: str) -> list[str]:
    return re.findall(r'"([^"]*)"?', detail)


@pytest.mark.usefixtures("loot", "other_target")
@pytest.mark.parametrize(
    ("sql", "gone"),
    [
        ("SELECT t::int FROM loot WHERE id = 1;", [OTHER_SECRET]),
        ("SELECT t::int FROM loot WHERE id = 2;", [UNKNOWN_SECRET]),
        ("SELECT encode(t::bytea, 'hex')::int FROM loot WHERE id = 1;",
         [OTHER_SECRET.encode().hex()]),
        ("SELECT pg_read_file('/etc/passwd')::int;",
         Path("/etc/passwd").read_text().splitlines()[1:3]),
        ("CREATE TEMP TABLE t (a int);\nCOPY t FROM PROGRAM 'id';", ["CONTEXT", "COPY t, line"]),
        ("DO $$ BEGIN RAISE EXCEPTION 'boom %', repeat('x', 500) USING DETAIL = 'the detail',"
         " HINT = 'the hint'; END $$;", ["the detail", "the hint", "x" * 300]),
    ],
)  # fmt: skip
def test_preflight_errors_pass_on_a_bounded_primary_message(
    service: TestClient, target_id: int, sql: str, gone: list[str]
) -> None:
    detail = _preflight_error(service, target_id, sql)
    for text in gone:
        assert text not in detail
    said = detail.split("): ", 1)[1].split("; ")[0]  # PostgreSQL's part
    assert len(said) <= MAX_MESSAGE
    assert all(len(q) <= MAX_QUOTED + 3 for q in _quoted(said)), said


@pytest.mark.usefixtures("loot")
def test_the_primary_message_still_says_what_to_fix(service: TestClient, target_id: int) -> None:
    detail = _preflight_error(service, target_id, "SELECT 1;\nSELECT t::int FROM loot;")
    assert 'invalid input syntax for type integer: "' in detail
    assert "workload.scripts[1], line 2" in detail
    detail = _preflight_error(service, target_id, "SELECT 1;\nSELECT * FROM nowhere;")
    assert 'relation "nowhere" does not exist' in detail
    assert "create the table first" in detail


def test_a_failing_run_reports_pgbench_lines_only_and_bounded(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """A session's or a sweep's error: further lines of a server message that look like
    errors ("ERROR: ...") used to be picked up too."""
    sql = "SELECT ('first' || chr(10) || 'ERROR: second line ' || repeat('y', 300))::int;"
    spec = BenchSpec(builtin=None, scripts=[(sql, 1)], clients=1, jobs=1, duration_s=2,
                     warmup_s=0)  # fmt: skip
    res = run_bench(sandbox.dsn, spec, workdir=tmp_path)
    assert not res.ok
    assert res.error is not None
    assert "invalid input syntax for type integer" in res.error
    assert "second line" not in res.error
    assert "y" * 100 not in res.error
