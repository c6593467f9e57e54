"""Finding 4 of issue 40: one request stopped the service.

``POST /api/v1/captures/import`` with a 120 KB log of one statement, ``CREATE VIEW v AS
SELECT 1+1+...`` (60,000 terms), made the service exit with SIGSEGV: pglast's
``parse_sql`` recursed in C past the stack. A live capture's summary (its log and
pg_stat_statements' texts) and a replay parse the same way, so any user of a captured
server could take knobtune down.

Each hostile case runs in a child Python process, so that a crash fails the test (its
exit status is -11) instead of killing pytest. Now a long statement is parsed in a worker
process (app/captures/sqlparse.py): it is marked unparsed there, and the service lives.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.captures import logparse, sqlparse
from tests.app.replay.logs import stderr_log

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "CREATE VIEW v AS SELECT " + "+".join(["1"] * 60_000)  # 120 KB


def _child(code: str, timeout: float = 120) -> dict[str, object]:
    """Run ``code`` in a child interpreter; its last stdout line is JSON."""
    prelude = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.app.replay.logs import stderr_log
        HOSTILE = "CREATE VIEW v AS SELECT " + "+".join(["1"] * 60_000)
        LOG = stderr_log([[(0.0, "SELECT 1"), (0.1, HOSTILE), (0.2, "SELECT 2")]])
        """
    )
    res = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert res.returncode == 0, (
        f"the process exited with {res.returncode} (-11: SIGSEGV), stderr: {res.stderr[-800:]}"
    )
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def test_an_import_of_a_hostile_statement_is_stored_with_it_unparsed(tmp_path: Path) -> None:
    got = _child(
        f"""
        from fastapi.testclient import TestClient
        from app.main import create_app
        from app.settings import Settings
        base = {str(tmp_path)!r}
        settings = Settings(database_url=f"sqlite:///{{base}}/meta.db", work_dir=base,
                            run_scheduler=False)
        with TestClient(create_app(settings)) as client:
            r = client.post("/api/v1/captures/import", params={{"name": "hostile"}},
                            content=LOG.encode(),
                            headers={{"Content-Type": "application/octet-stream"}})
            alive = client.get("/healthz").status_code
        print(json.dumps({{"status": r.status_code, "body": r.json(), "alive": alive}}))
        """
    )
    assert got["status"] == 201, got
    summary = got["body"]["summary"]  # type: ignore[index]
    assert summary["statements"] == 3
    assert summary["unparsed_statements"] == 1
    assert got["alive"] == 200


def test_a_live_captures_summary_survives_a_hostile_statement() -> None:
    """What app/captures/runner.py does with a capture's log and pg_stat_statements' texts."""
    got = _child(
        """
        from app.captures import summary as summaries
        timing = summaries.timing_from([(HOSTILE, 1, 5.0), ("SELECT $1", 2, 1.0)])
        s = summaries.build(summaries.parse(LOG, "shop"), timing, window_s=1.0)
        print(json.dumps({"unparsed": s["unparsed_statements"], "statements": s["statements"],
                          "measured": len(timing["queries"])}))
        """
    )
    assert got == {"unparsed": 1, "statements": 3, "measured": 2}


def test_a_replay_of_a_hostile_statement_replays_it_unparsed() -> None:
    got = _child(
        """
        from app.workloads.replay import Replay
        from app.replay.plan import decode
        wl = Replay(LOG, duration_s=2, warmup_s=0, replay_database="shop")
        [stream] = wl.streams()
        sent = sorted(len(st.sql) for s in decode(stream.replay.plan).sessions
                      for st in s.statements)
        print(json.dumps({"scripts": sorted(sc.name for sc in stream.scripts), "sent": sent}))
        """
    )
    names = got["scripts"]
    assert isinstance(names, list)
    assert len(names) == 2
    assert any(str(n).startswith("unparsed statement") for n in names), names
    assert got["sent"] == [8, 8, len(HOSTILE)]  # replayed as captured: PostgreSQL refuses it


# -- the guard itself, in this process -----------------------------------------------------
@pytest.fixture
def no_worker(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The worker replaced by a recorder: what it was asked (the statements' lengths)."""
    asked: list[int] = []

    def ask(op: str, sql: str, timeout_s: float) -> tuple[bool, object]:
        asked.append(len(sql))
        return False, None

    monkeypatch.setattr(sqlparse._worker, "ask", ask)
    return asked


def test_short_statements_are_parsed_in_process(no_worker: list[int]) -> None:
    sessions = [[(k * 0.01, f"SELECT c{k} FROM t WHERE a = {k}") for k in range(500)]]
    parsed = logparse.parse_log(stderr_log(sessions))
    assert parsed.unparsed_statements == 0
    assert len(parsed.labels) == 500
    assert no_worker == []


def test_long_statements_go_to_the_worker_and_oversized_ones_nowhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    in_list = "SELECT * FROM t WHERE id IN (" + ", ".join(str(i) for i in range(3000)) + ")"
    assert len(in_list) > sqlparse.IN_PROCESS_MAX_CHARS
    described = sqlparse.describe(in_list)
    assert described is not None
    assert described[0].startswith("SELECT * FROM t WHERE id IN ($1, $2, $3")
    assert described[1] == "read"
    monkeypatch.setattr(sqlparse, "MAX_CHARS", len(in_list) - 1)
    assert sqlparse.describe(in_list) is None  # over the limit: not even tried


def test_a_worker_that_dies_leaves_its_statement_unparsed_and_is_replaced() -> None:
    parser = sqlparse.Parser()
    assert parser.describe(HOSTILE) is None
    assert parser.deaths == 1
    assert parser.fingerprint("SELECT 1 /*" + " " * 9000 + "*/") is not None  # a new worker


def test_after_enough_deaths_long_statements_are_not_tried(no_worker: list[int]) -> None:
    parser = sqlparse.Parser()
    long = "SELECT " + "+".join(["1"] * 5000)
    results = [parser.fingerprint(long) for _ in range(sqlparse.MAX_WORKER_DEATHS + 2)]
    assert results == [None] * (sqlparse.MAX_WORKER_DEATHS + 2)
    assert len(no_worker) == sqlparse.MAX_WORKER_DEATHS
    assert parser.fingerprint("SELECT 1") is not None  # short ones still parse
