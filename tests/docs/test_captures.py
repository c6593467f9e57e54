"""docs/captures.md's commands, in order, at small sizes: dump and capture a production
server of one's own (a sandbox with the logging collector), read and download the capture,
import it back, restore the dump on the server to tune, tune on the capture, delete it."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
import time
from pathlib import Path

import psycopg
import pytest

from app.postgres.sandbox import Sandbox
from tests.docs.blocks import command, replace
from tests.docs.shell import bash
from tests.helpers import logging_sandbox


def _workload(dsn: str, stop: threading.Event) -> None:
    """The application: reads and writes in database shop until told to stop."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        i = 0
        while not stop.is_set():
            i += 1
            conn.execute("UPDATE acc SET balance = balance + %s WHERE id = %s", [i, i % 100])
            conn.execute("SELECT balance FROM acc WHERE id = %s", [i % 100])
            time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_capture_replay_workflow(user_dir: Path) -> None:
    prod: Sandbox = logging_sandbox(pgss=True)
    staging = Sandbox.create()
    try:
        with psycopg.connect(prod.dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE shop OWNER knobtune_bench")
        prod_shop = prod.dsn.replace("dbname=postgres", "dbname=shop")
        with psycopg.connect(prod_shop, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        app_dsn = prod.bench_dsn.replace("dbname=knobtune", "dbname=shop")
        with psycopg.connect(app_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE acc (id int PRIMARY KEY, balance bigint)")
            conn.execute("INSERT INTO acc SELECT g, 0 FROM generate_series(0, 99) g")
        env = {
            "PROD_SHOP": prod_shop,
            "STAGING": staging.dsn,
        }
        for name, sb in (("prod", prod), ("staging", staging)):
            res = bash(f"knobtune targets add {name} --dsn '{sb.dsn}'", user_dir, 120, **env)
            assert res.returncode == 0, res.stderr

        # 1-2: dump, then capture while the application runs
        stop = threading.Event()
        app = threading.Thread(target=_workload, args=(app_dsn, stop), daemon=True)
        app.start()
        try:
            run = replace(command("captures-run"), "--minutes 5", "--minutes 0.17")
            res = bash(run, user_dir, 200, **env)
        finally:
            stop.set()
            app.join(timeout=30)
        assert res.returncode == 0, res.stderr[-3000:]
        assert (user_dir / "shop.dump").stat().st_size > 0
        assert "capture 1 'shop-peak' (target prod, database shop): succeeded" in res.stdout
        assert "logging settings restored at" in res.stdout
        assert "UPDATE acc SET balance = balance + $1 WHERE id = $2" in res.stdout
        with psycopg.connect(prod.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT current_setting('log_statement')").fetchone()
        assert row == ("none",)  # put back

        # reading it, downloading it
        res = bash(command("captures-show"), user_dir, 120, **env)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "shop-peak" in res.stdout
        assert "queries by calls" in res.stdout
        assert "mean times: from pg_stat_statements" in res.stdout
        download = user_dir / "shop-peak.log.gz"
        assert stat.S_IMODE(os.stat(download).st_mode) == 0o600

        # importing a log of one's own (here: the one just downloaded)
        imp = replace(command("captures-import"), "postgresql.log.gz", "shop-peak.log.gz")
        res = bash(imp, user_dir, 120, **env)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "capture 2 'shop-imported' (import, database shop): succeeded" in res.stdout

        # 3: the starting data on the server to tune
        res = bash(command("captures-restore"), user_dir, 120, **env)
        assert res.returncode == 0, res.stderr[-3000:]
        staging_shop = staging.dsn.replace("dbname=postgres", "dbname=shop")
        with psycopg.connect(staging_shop, autocommit=True) as conn:
            count = conn.execute("SELECT count(*) FROM acc").fetchone()
        assert count == (100,)  # the data as dumped

        # 4: tune on the capture
        tune = command("captures-tune")
        # runs of 2 s (no warm-up: at most a quarter of a run): the replay's first 2 s of the
        # 10 s capture (60 s runs replay all of it); 5 runs, the fewest a session takes
        small = replace(tune, "--speed 1", "--speed 1 --duration 2 --knobs work_mem --max-trials 5")
        res = bash(small + " --final-check-runs 0", user_dir, 300, **env)
        # no final check: no change (3) or an unconfirmed gain (4), never a confirmed one
        assert res.returncode in (3, 4), res.stderr[-3000:]

        stored = user_dir / ".knobtune" / "captures"
        assert sorted(p.name for p in stored.iterdir()) == ["1.log.gz.fernet", "2.log.gz.fernet"]
        res = bash(command("captures-delete"), user_dir, 120, **env)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "capture 1 'shop-peak' deleted" in res.stdout
        # its file and its record are gone, the import's stay (what `knobtune captures`
        # lists, read here without another CLI process: each one starts the service)
        assert sorted(p.name for p in stored.iterdir()) == ["2.log.gz.fernet"]
        with contextlib.closing(sqlite3.connect(user_dir / "knobtune.db")) as db:
            names = db.execute("SELECT name FROM captures").fetchall()
        assert names == [("shop-imported",)]
    finally:
        prod.destroy()
        staging.destroy()
