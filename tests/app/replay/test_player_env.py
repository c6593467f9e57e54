"""The replay player of a root install whose clone is private (a 0700 directory under
/root): the unprivileged user it runs as can read neither the clone nor its .venv, so the
player runs from the environment .ci/bootstrap makes (app/postgres/pgbench.py: PLAYER_DIR)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from app.postgres import pgbench, privilege
from app.postgres.sandbox import Sandbox
from tests.app.replay.logs import stderr_log
from tests.app.replay.test_player import DB, replay_stream, run

PYTHON = pgbench.PLAYER_DIR / "bin" / "python"

pytestmark = pytest.mark.skipif(
    not privilege.dropping(), reason="not root: the player runs as this user, from .venv"
)


def _bootstrapped() -> None:
    assert PYTHON.exists(), (
        f"{PYTHON} is missing: run `bash .ci/bootstrap` as root (it makes the replay "
        "player's environment)"
    )


def test_the_unprivileged_user_runs_the_player_from_it_without_the_clone(tmp_path: Path) -> None:
    _bootstrapped()
    private = tmp_path / "clone"  # as a clone under /root: nobody may enter it
    private.mkdir(mode=0o700)
    code = "import psycopg.pq, app.replay.player as p; print(p.__file__)"
    res = subprocess.run(
        [str(PYTHON), "-P", "-c", code],
        env=pgbench.player_env(privilege.child_env()) | {"PYTHONPATH": str(private)},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        **privilege.child_kwargs(),
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().startswith(f"{pgbench.PLAYER_DIR}/"), res.stdout


@pytest.fixture
def private_clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as if its clone and interpreter were in a private directory."""
    _bootstrapped()
    private = tmp_path / "clone"
    private.mkdir(mode=0o700)
    (private / "python3").symlink_to(sys.executable)
    monkeypatch.setattr(pgbench, "_PROJECT_ROOT", private)
    monkeypatch.setattr(sys, "executable", str(private / "python3"))
    monkeypatch.setattr(pgbench, "_players", {})


@pytest.fixture
def dsn(sandbox: Sandbox) -> Iterator[str]:
    with psycopg.connect(sandbox.dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB}")
        conn.execute(f"CREATE DATABASE {DB} OWNER knobtune_bench")
    out = sandbox.bench_dsn.replace("dbname=knobtune", f"dbname={DB}")
    with psycopg.connect(out, autocommit=True) as conn:
        conn.execute("CREATE TABLE seen (id serial PRIMARY KEY, who text, n int, v text)")
    yield out
    with psycopg.connect(sandbox.dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


def test_a_private_clone_replays_through_the_bootstrap_player(
    private_clone: None, dsn: str
) -> None:
    assert pgbench.find_player() == (str(PYTHON), ())
    a = [(0.05 * k, f"INSERT INTO seen (who, n) VALUES ('a', {k})") for k in range(5)]
    r = run(dsn, replay_stream(stderr_log([a])), duration_s=2)
    assert r.ok, r.error
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT n FROM seen ORDER BY id").fetchall()
    assert [n for (n,) in rows] == [0, 1, 2, 3, 4]
