"""PostgreSQL 18 (from .ci/fetch-postgres, which .ci/bootstrap-tests runs): a sandbox of
that version, the catalogue against its pg_settings, apply and rollback of a reload and a
restart knob, and a short session through the service that ends with the server as it was.
The rest of the suite runs on the default version (Debian's 15)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient

from app.db import Database
from app.models import Target
from app.postgres.binaries import PostgresNotInstalled, find_bindir
from app.postgres.sandbox import Sandbox
from app.postgres.target import TargetController
from optimizer.catalogue import CATALOGUE, GB, Hardware, available_knobs
from optimizer.knobs import Knob
from tests.acceptance.conftest import user_dir  # noqa: F401  (a fixture)
from tests.docs.blocks import command, replace
from tests.docs.shell import bash, knobtune
from tests.helpers import ROOT, wait_done

VERSION = 18
# where 18 differs from the catalogue's 15 on purpose: the server's context wins (narrow)
CONTEXT_IN_18 = {"autovacuum_max_workers": "sighup"}


@pytest.fixture(scope="module")
def bindir() -> Path:
    try:
        return find_bindir(VERSION)
    except PostgresNotInstalled as exc:
        pytest.fail(
            f"PostgreSQL {VERSION} is missing: run `bash .ci/bootstrap-tests` (it fetches it "
            f"with .ci/fetch-postgres {VERSION}). {exc}"
        )


@pytest.fixture(scope="module")
def sb18(bindir: Path) -> Iterator[Sandbox]:
    with Sandbox.create(version=VERSION) as sb:
        yield sb


def _settings(dsn: str, names: list[str]) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", [names]
        ).fetchall()
    return dict(rows)


def _auto_conf(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT name FROM pg_file_settings WHERE sourcefile LIKE '%%postgresql.auto.conf'"
        ).fetchall()
    return sorted(r[0] for r in rows)


def test_a_sandbox_of_18_runs_its_binaries_and_reports_18(sb18: Sandbox, bindir: Path) -> None:
    assert sb18.bindir == bindir
    with psycopg.connect(sb18.dsn) as conn:
        num = conn.execute("SHOW server_version_num").fetchone()
    assert num is not None
    assert int(num[0]) // 10000 == VERSION
    probe = TargetController.for_sandbox(sb18).probe(sorted(CATALOGUE))
    assert probe.version.startswith(f"PostgreSQL {VERSION}.")
    assert probe.missing == []  # every catalogue knob, the asynchronous I/O ones included


def test_the_catalogue_matches_what_18_reports(sb18: Sandbox) -> None:
    probe = TargetController.for_sandbox(sb18).probe(available_knobs(VERSION))
    hw = Hardware(ram_bytes=8 * GB, cpus=4)
    for name in available_knobs(VERSION):
        spec, row = CATALOGUE[name], probe.settings[name]
        assert row.vartype == spec.kind, name
        assert row.unit == spec.unit, name
        assert row.context == CONTEXT_IN_18.get(name, spec.context), name
        # the default this version has: PostgreSQL's built-in one, in the knob's units
        knob = Knob.from_row(row)
        assert knob.parse(spec.default_for(VERSION)) == knob.parse(row.boot_val or ""), name
        assert spec.build(hw).name == name
    assert probe.settings["io_method"].enumvals is not None
    assert {"sync", "worker"} <= set(probe.settings["io_method"].enumvals)


def test_apply_and_rollback_of_a_reload_and_a_restart_knob_on_18(sb18: Sandbox) -> None:
    ctl = TargetController.for_sandbox(sb18)
    names = ["io_workers", "io_method"]
    before = _settings(sb18.dsn, names)
    assert before == {"io_workers": "3", "io_method": "worker"}
    snap = ctl.snapshot(names)
    res = ctl.apply({"io_workers": "5", "io_method": "sync"})
    assert res.restarted  # io_method is a postmaster knob
    assert _settings(sb18.dsn, names) == {"io_workers": "5", "io_method": "sync"}
    back = ctl.revert(snap)
    assert back.restarted
    assert _settings(sb18.dsn, names) == before
    assert _auto_conf(sb18.dsn) == []


def _row(client: TestClient, target_id: int) -> Target:
    db: Database = client.app.state.db  # type: ignore[attr-defined]
    with db.session() as s:
        row = s.get(Target, target_id)
        assert row is not None
        s.expunge(row)
        return row


def test_a_session_on_an_18_sandbox_tunes_its_io_knob_and_restores_it(
    client: TestClient, bindir: Path
) -> None:
    # a version this host does not have: refused, saying which it has
    r = client.post("/api/v1/targets", json={"name": "pg12", "sandbox": {"version": 12}})
    assert r.status_code == 422, r.text
    assert "PostgreSQL 12 is not installed" in r.json()["detail"]

    r = client.post("/api/v1/targets", json={"name": "pg18", "sandbox": {"version": VERSION}})
    assert r.status_code == 201, r.text
    target = r.json()
    try:
        dsn = _row(client, target["id"]).dsn
        names = ["work_mem", "io_workers"]
        before = _settings(dsn, names)
        body = {
            "target_id": target["id"],
            "knobs": names,
            "workload": {
                "builtin": "select-only",
                "scale": 1,
                "clients": 2,
                "jobs": 1,
                "duration_s": 2,
                "warmup_s": 0,
                "rate": 100,  # pgbench -R: what is asserted is never the throughput
            },
            "max_trials": 7,
            "final_check_runs": 2,
            "seed": 1,
        }
        r = client.post("/api/v1/sessions", json=body)
        assert r.status_code == 202, r.text
        s = wait_done(client, r.json()["id"], timeout=120)
        assert s["status"] == "succeeded", s["error"]
        trials = client.get(f"/api/v1/sessions/{s['id']}/trials").json()
        tried = {t["config"]["io_workers"] for t in trials if t.get("config")}
        assert len(tried) > 1, trials  # the 18-only knob was really tuned
        assert _settings(dsn, names) == before
        assert _auto_conf(dsn) == []
    finally:
        # the sandbox goes with it
        r = client.delete(f"/api/v1/targets/{target['id']}", params={"history": "drop"})
        assert r.status_code == 204, r.text


def test_the_manuals_commands_make_an_18_sandbox(user_dir: Path, bindir: Path) -> None:  # noqa: F811
    """docs/configuration.md: fetch a version (cached: nothing downloaded), then a target
    on a sandbox of it."""
    block = replace(command("sandbox-version"), "bash .ci/", f"bash {ROOT}/.ci/")
    res = bash(block, user_dir, 300)
    try:
        assert res.returncode == 0, res.stderr[-2000:]
        assert res.stdout.splitlines()[0] == str(bindir)
        listed = knobtune("targets", "--json", "list", cwd=user_dir)
        assert listed.returncode == 0, listed.stderr
        (t,) = json.loads(listed.stdout)
        assert t["server_version"].startswith(f"PostgreSQL {VERSION}.")
    finally:
        gone = knobtune("targets", "remove", "pg18", cwd=user_dir)
        assert gone.returncode == 0, gone.stderr
