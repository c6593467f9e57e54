"""Finding 2 of issue 25: a target's restart_command was shell run as root for any client.

The API never accepts a command now: restarts are methods the operator declares
(KNOBTUNE_RESTART_METHODS), run as argv without a shell, picked by name.
"""

from __future__ import annotations

import shlex
import sqlite3
import subprocess
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest
import yaml
from sqlalchemy import create_engine, text

from app.db import upgrade
from app.postgres.sandbox import Sandbox, as_postgres
from app.settings import Settings
from tests.conftest import SandboxFactory
from tests.docs.blocks import command
from tests.security.exec_helpers import (
    QUICK,
    client_for,
    service_dir,
    settings_for,
    wait_done,
)


def _marker() -> Path:
    return Path(tempfile.gettempdir()) / f"knobtune-restart-marker-{uuid.uuid4().hex}"


def _shell_restart(sb: Sandbox, marker: Path) -> str:
    """What a hostile client sent: a command, then the real restart so nothing looks amiss."""
    pg_ctl = [str(sb.bindir / "pg_ctl"), "restart", "-w", "-s", "-m", "fast"]
    argv = as_postgres([*pg_ctl, "-D", str(sb.data_dir), "-l", str(sb.log_path)])
    return f"touch {marker}; {shlex.join(argv)}"


def _started(dsn: str) -> object:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    assert row is not None
    return row[0]


RESTART_SESSION = {
    "knobs": ["shared_buffers", "work_mem"],
    "max_trials": 5,
    "final_check_runs": 0,
    "hints": False,
    "workload": QUICK,
}


def test_a_clients_restart_command_never_runs(sandbox_factory: SandboxFactory) -> None:
    sb = sandbox_factory()
    marker = _marker()
    with service_dir() as base, client_for(settings_for(base)) as api:
        r = api.post(
            "/api/v1/targets",
            json={"name": "evil", "dsn": sb.dsn, "restart_command": _shell_restart(sb, marker)},
        )
        if r.status_code == 201:  # taken: a session that tunes a restart knob runs it
            body = {"target_id": r.json()["id"], **RESTART_SESSION}
            sid = api.post("/api/v1/sessions", json=body).json()["id"]
            wait_done(api, sid)
        try:
            assert not marker.exists(), "a client's restart_command ran on the service's host"
        finally:
            marker.unlink(missing_ok=True)
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert "restart_method" in detail
        assert "KNOBTUNE_RESTART_METHODS" in detail
        assert api.get("/api/v1/targets").json() == []  # nothing half-registered


def test_a_configured_method_restarts_the_target(sandbox_factory: SandboxFactory) -> None:
    sb = sandbox_factory()
    method = {"kind": "pg_ctl", "data_dir": str(sb.data_dir), "log_file": str(sb.log_path)}
    with (
        service_dir() as base,
        client_for(settings_for(base, restart_methods={"local": method})) as api,
    ):
        assert {"name": "local", "kind": "pg_ctl"} in api.get("/api/v1/restart-methods").json()
        unknown = api.post(
            "/api/v1/targets", json={"name": "t0", "dsn": sb.dsn, "restart_method": "nope"}
        )
        assert unknown.status_code == 422
        assert "'nope'" in unknown.json()["detail"]
        assert "local" in unknown.json()["detail"]
        r = api.post(
            "/api/v1/targets", json={"name": "t", "dsn": sb.dsn, "restart_method": "local"}
        )
        assert r.status_code == 201, r.text
        target = r.json()
        assert target["restart_method"] == "local"
        assert target["restart_note"] is None
        assert target["data_dir"] == str(sb.data_dir)  # the method's, trusted
        # A method cannot be smuggled in through PATCH either: names only.
        assert (
            api.patch(f"/api/v1/targets/{target['id']}", json={"restart_command": "id"}).status_code
            == 422
        )
        before = _started(sb.dsn)
        sid = api.post(
            "/api/v1/sessions", json={"target_id": target["id"], **RESTART_SESSION}
        ).json()["id"]
        done = wait_done(api, sid)
        assert done["status"] == "succeeded", done["error"]
        assert not any("skipped" in n for n in done["notes"]), done["notes"]
        assert _started(sb.dsn) != before  # the method restarted it (shared_buffers)


def test_a_stored_restart_command_is_kept_never_run_and_explained(
    sandbox_factory: SandboxFactory,
) -> None:
    sb = sandbox_factory()
    marker = _marker()
    with service_dir() as base:
        settings = settings_for(base)
        with client_for(settings) as api:
            tid = api.post("/api/v1/targets", json={"name": "old", "dsn": sb.dsn}).json()["id"]
        # A row from before restart methods: its command as an old version stored it.
        with sqlite3.connect(base / "knobtune.db") as conn:
            conn.execute(
                "UPDATE targets SET restart_command = ? WHERE id = ?",
                (_shell_restart(sb, marker), tid),
            )
        with client_for(settings) as api:
            shown = api.get(f"/api/v1/targets/{tid}").json()
            sid = api.post("/api/v1/sessions", json={"target_id": tid, **RESTART_SESSION}).json()[
                "id"
            ]
            done = wait_done(api, sid)
        try:
            assert not marker.exists(), "a stored restart_command ran"
        finally:
            marker.unlink(missing_ok=True)
        note = shown["restart_note"]
        assert "never run" in note
        assert "KNOBTUNE_RESTART_METHODS" in note
        assert "restart_method" in note
        assert shown["restart_command"]  # kept as text for the operator to translate
        skipped = [n for n in done["notes"] if n.startswith("shared_buffers skipped")]
        assert skipped, done["notes"]
        assert "KNOBTUNE_RESTART_METHODS" in skipped[0]


def test_the_migration_converts_sandboxes_and_keeps_other_commands(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    upgrade(url, "0004")
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for name, command, sandbox_dir in (
                ("sb", "runuser -u postgres -- pg_ctl restart -D /x/data", "/x"),
                ("real", "ssh db5 sudo pg_ctlcluster 15 main restart", None),
            ):
                conn.execute(
                    text(
                        "INSERT INTO targets (name, dsn, restart_command, sandbox_dir, probe, "
                        "created_at) VALUES (:n, 'host=/x', :c, :d, '{}', '2026-01-01')"
                    ),
                    {"n": name, "c": command, "d": sandbox_dir},
                )
        upgrade(url)
        with engine.connect() as conn:
            rows = dict(
                (r[0], (r[1], r[2]))
                for r in conn.execute(
                    text("SELECT name, restart_method, restart_command FROM targets")
                )
            )
    finally:
        engine.dispose()
    assert rows["sb"] == ("sandbox", None)
    assert rows["real"] == (None, "ssh db5 sudo pg_ctlcluster 15 main restart")


def test_the_documented_methods_are_valid_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """docker-compose.yml's method and docs/security.md's example parse as the service
    reads them."""
    root = Path(__file__).resolve().parents[2]
    compose = yaml.safe_load((root / "docker-compose.yml").read_text())
    env = compose["services"]["api"]["environment"]
    monkeypatch.setenv("KNOBTUNE_RESTART_METHODS", env["KNOBTUNE_RESTART_METHODS"])
    method = Settings().restart_methods["compose-target"]
    assert method.argv() == ["knobtune-restart-target"]
    monkeypatch.setenv("KNOBTUNE_RESTART_DSN", "host=target password=x")
    assert method.env() == {"KNOBTUNE_RESTART_DSN": "host=target password=x"}
    # docs/security.md's example, run as a shell runs it: the variable it exports
    block = command("restart-methods")
    shown = subprocess.run(
        ["bash", "-c", block + '\nprintf %s "$KNOBTUNE_RESTART_METHODS"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    monkeypatch.setenv("KNOBTUNE_RESTART_METHODS", shown)
    names = set(Settings().restart_methods)
    assert {"local", "unit", "docker", "db5", "compose-target"} <= names


def test_the_cli_declares_a_restart_command_in_process_only() -> None:
    """`knobtune tune --restart-command`: the CLI operates its in-process service, so it
    may declare a method (argv, split like a shell would, run without one); a remote
    service restarts only with its own operator's methods."""
    from app.cli import build_parser
    from app.cli.shared import CliError
    from app.cli.targets import cli_restart

    args = build_parser().parse_args(
        ["tune", "--dsn", "host=x", "--restart-command", "sudo -n systemctl restart 'pg 15'"]
    )
    methods = cli_restart(args)
    assert methods == {
        "cli": {"kind": "command", "argv": ["sudo", "-n", "systemctl", "restart", "pg 15"]}
    }
    assert args.restart_method == "cli"
    remote = build_parser().parse_args(
        ["tune", "--dsn", "host=x", "--server", "http://h", "--restart-command", "id"]
    )
    with pytest.raises(CliError, match="--restart-method"):
        cli_restart(remote)
