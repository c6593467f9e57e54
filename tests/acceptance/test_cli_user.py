"""`knobtune tune --dsn` as a user runs it: a server started on its own, a script that plain
`pgbench -f` runs (untyped parameters), a fresh directory and no KNOBTUNE_* variable."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg

from app.postgres.sandbox import Sandbox
from tests.acceptance.conftest import BIN, user_env
from tests.helpers import file_settings

# `:d` has no type of its own: under the prepared protocol PostgreSQL reads it as an
# integer and `date <= integer` fails; pgbench's default (simple) substitutes the text.
# The \sleep paces the client (about 40 transactions a second, not a CPU kept busy for
# the session): what is asserted is what the tune writes, says and restores, never a level.
REPORT = """\\set d random(60, 120)
SELECT l_flag, count(*), sum(qty)
FROM lineitem
WHERE l_shipdate <= date '1998-12-01' - :d
GROUP BY l_flag;
\\sleep 20 ms
"""


def test_tune_dsn_with_an_untyped_script(user_dir: Path) -> None:
    with Sandbox.create() as server:  # not managed by knobtune: a server of the user's
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE lineitem (l_shipdate date, l_flag char, qty int)")
            conn.execute(
                "INSERT INTO lineitem SELECT date '1995-01-01' + i % 1500, "
                "chr(65 + i % 3), i % 50 FROM generate_series(1, 20000) i"
            )
        before = file_settings(server.dsn)
        (user_dir / "report.sql").write_text(REPORT)
        res = subprocess.run(
            [
                str(BIN / "knobtune"),
                "tune",
                "--dsn",
                server.dsn,
                "--script",
                "report.sql",
                "--no-init",
                "--knobs",
                "work_mem",
                "--duration",
                "2",
                "--warmup",
                "1",
                "--clients",
                "1",
                "--jobs",
                "1",
                # the fewest with a final check (baseline 2, an evaluation 3, 2); 2 s runs:
                # what is asserted is what the tune writes, says and restores
                "--max-trials",
                "7",
                "--final-check-runs",
                "2",
                "--out",
                "out",
            ],
            cwd=user_dir,
            env=user_env(),
            capture_output=True,
            text=True,
            timeout=540,
        )
        # finished (a confirmed gain, no change, or unconfirmed: docs/cli.md's exit codes)
        assert res.returncode in (0, 3, 4), res.stderr[-4000:]
        assert "config: out/knobtune-session-1.conf" in res.stdout
        assert (
            (user_dir / "out" / "knobtune-session-1.conf")
            .read_text()
            .startswith("# knobtune recommendation")
        )
        assert "failed" not in res.stderr.lower(), res.stderr[-4000:]
        assert file_settings(server.dsn) == before  # restored
        assert (user_dir / "knobtune.db").exists()  # the default metadata DB, here


def test_tune_dsn_refuses_a_broken_script_before_touching_the_server(user_dir: Path) -> None:
    with Sandbox.create() as server:
        before = file_settings(server.dsn)
        (user_dir / "bad.sql").write_text("SELECT 1;\nSELECT * FROM missing_table;\n")
        res = subprocess.run(
            [
                str(BIN / "knobtune"),
                "tune",
                "--dsn",
                server.dsn,
                "--script",
                "bad.sql",
                "--no-init",
                "--max-trials",
                "12",
            ],
            cwd=user_dir,
            env=user_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 1, res.stderr
        assert 'relation "missing_table" does not exist' in res.stderr
        assert "workload.scripts[0], line 2" in res.stderr
        assert "Traceback" not in res.stderr
        assert file_settings(server.dsn) == before
