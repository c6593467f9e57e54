"""The knobtune command as a user runs it: help, the demo, Ctrl-C, one-line errors."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from app.cli import build_parser
from app.postgres.sandbox import Sandbox, free_port
from tests.helpers import file_settings

CLI = [sys.executable, "-m", "app.cli"]
COMMANDS = [
    "serve", "db", "demo", "targets", "tune", "status", "cancel", "sessions", "export",
    "apply", "rollback", "sweep", "capture", "captures",
]  # fmt: skip


def run(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_help_for_the_command_and_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    """`knobtune --help` as a process; each command's help from the same parser in this
    process: 14 more interpreter starts only repeat the first, and took 49 s of a worker
    on a loaded run (docs/cli.md's reference is checked the same way: tests/docs/test_site.py)."""
    top = run("--help")
    assert top.returncode == 0, top.stderr
    for cmd in COMMANDS:
        assert cmd in top.stdout
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args([cmd, "--help"])
        assert done.value.code == 0
        assert f"usage: knobtune {cmd}" in capsys.readouterr().out


def _wait_for_line(proc: subprocess.Popen[str], pattern: str, timeout: float) -> str:
    assert proc.stderr is not None
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen += line
        if re.search(pattern, line):
            return seen
    raise AssertionError(f"no line matching {pattern!r}: {seen[-2000:]}")


def test_ctrl_c_during_tune_restores_the_target(tmp_path: Path) -> None:
    with Sandbox.create() as sb:
        with psycopg.connect(sb.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET work_mem = '8MB'")  # a pre-existing entry
            conn.execute("SELECT pg_reload_conf()")
        before = file_settings(sb.dsn)
        env = {
            **os.environ,
            "KNOBTUNE_DATABASE_URL": f"sqlite:///{tmp_path / 'm.db'}",
            "KNOBTUNE_WORK_DIR": str(tmp_path),
        }
        proc = subprocess.Popen(
            [
                *CLI,
                "tune",
                "--dsn",
                sb.dsn,
                "--knobs",
                "work_mem,max_wal_size",
                "--duration",
                "30",
                "--warmup",
                "1",
                "--scale",
                "1",
                "--clients",
                "1",
                "--jobs",
                "1",
                "--out",
                str(tmp_path),
            ],
            env=env,
            stderr=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            _wait_for_line(proc, r"session \d+ started", 60)
            # Let the first 30 s benchmark get going, then interrupt it.
            deadline = time.monotonic() + 60
            while not (running := _benchmark_running(sb.dsn)) and time.monotonic() < deadline:
                time.sleep(0.3)
            assert running, "knobtune's pgbench never connected"
            t0 = time.monotonic()
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 130, err[-2000:]
        assert time.monotonic() - t0 < 25  # the benchmark was stopped, not waited out
        assert "cancelled: the target was restored" in err
        assert file_settings(sb.dsn) == before


def _benchmark_running(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        n = conn.execute(
            # knobtune names its pgbench connections knobtune-pgbench-s<session>-<run>
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'knobtune-pgbench-%'"
        ).fetchone()
    return bool(n and n[0] > 0)


def test_interrupting_the_demo_removes_the_sandbox(tmp_path: Path) -> None:
    """SIGTERM (kill, timeout, systemd) inside the demo's first benchmark: the session is
    cancelled and the sandbox removed. Ctrl-C is the same handler while a session is
    followed (app/cli/follow.py): test_ctrl_c_during_tune_restores_the_target sends it to
    `tune`, and tests/e2e/test_cli_profiles.py to a demo (a second demo here took a minute
    of a worker on a loaded run)."""
    proc = subprocess.Popen(
        [
            *CLI,
            "demo",
            "--out",
            str(tmp_path / "out"),
            "--duration",
            "30",
            "--scale",
            "1",
            "--clients",
            "1",
        ],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        seen = _wait_for_line(proc, r"sandbox at ", 60)
        _wait_for_line(proc, r"session \d+", 60)
        time.sleep(4)  # inside the first benchmark
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    root = re.search(r"sandbox at (\S+)", seen)
    assert root is not None
    assert not Path(root.group(1)).exists()
    assert not (tmp_path / "out").exists()  # no file of a cancelled session


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["tune", "--dsn", "host=127.0.0.1 port={port} user=postgres connect_timeout=3"],
            "cannot connect to the target",
        ),
        (
            ["tune", "--dsn", "host=127.0.0.1 port=5432 user=postgres", "--knobs", "wrok_mem"],
            "wrok_mem",
        ),
        (["export", "12345"], "no session 12345"),
    ],
)
def test_user_errors_are_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    env = {
        **os.environ,
        "KNOBTUNE_DATABASE_URL": f"sqlite:///{tmp_path / 'm.db'}",
        "KNOBTUNE_WORK_DIR": str(tmp_path),
        "KNOBTUNE_RUN_SCHEDULER": "false",
    }
    args = [a.replace("{port}", str(free_port())) for a in args]
    res = run(*args, env=env, timeout=120)
    assert res.returncode == 1  # an error, not a usage error (2: docs/cli.md)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("knobtune: ")
    assert needle in lines[0]
    assert "Traceback" not in res.stderr


def test_missing_postgresql_is_one_line_saying_what_to_install(tmp_path: Path) -> None:
    env = {**os.environ, "KNOBTUNE_PG_BINDIR": str(tmp_path / "no-postgres-here")}
    res = run("demo", "--out", str(tmp_path), env=env, cwd=tmp_path)
    assert res.returncode == 1
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and "sandbox" not in ln]
    assert len(lines) == 1, res.stderr
    assert "apt-get install postgresql" in lines[0]
