"""docker-compose.yml and the Dockerfile, as far as a machine without a Docker engine can check.

`docker-compose config -q` validates the file (Debian package docker-compose). The
restart path of the compose target is exercised for real, minus Docker: the
supervisor loop from docker-compose.yml runs a sandbox cluster, and the
Dockerfile's knobtune-restart-target script restarts it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from app.postgres.sandbox import Sandbox, as_postgres
from tests.conftest import SandboxFactory

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


def compose(*args: str, token: str | None = "test-token") -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is missing: apt-get install docker-compose"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KNOBTUNE_")}
    if token is not None:
        env["KNOBTUNE_API_TOKEN"] = token
    return subprocess.run(
        [binary, "-f", str(COMPOSE), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_compose_file_is_valid() -> None:
    res = compose("config", "-q")
    assert res.returncode == 0, res.stderr
    services = compose("config", "--services")
    assert sorted(services.stdout.split()) == ["api", "metadata", "target"], services.stderr


def test_compose_refuses_to_serve_without_a_token() -> None:
    res = compose("config", "-q", token=None)
    assert res.returncode != 0
    assert "KNOBTUNE_API_TOKEN" in res.stderr


def block_after(text: str, marker: str) -> str:
    """The lines after the line ``marker`` (indentation included) that are indented deeper."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.rstrip() == marker)
    indent = len(lines[start]) - len(lines[start].lstrip())
    out = []
    for line in lines[start + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        out.append(line)
    return "\n".join(out)


def restart_script() -> str:
    """The knobtune-restart-target script, from the Dockerfile's heredoc."""
    text = (ROOT / "Dockerfile").read_text()
    body = text.split("/usr/local/bin/knobtune-restart-target\n", 1)[1]
    return body.split("\nEOF\n", 1)[0] + "\n"


def supervisor_loop(postgres: str, data_dir: Path) -> str:
    """The target's supervisor loop from docker-compose.yml ($$ is compose's escaped $)."""
    service = block_after(COMPOSE.read_text(), "  target:")
    loop = block_after(service, "      - |").replace("$$", "$")
    assert "docker-entrypoint.sh postgres &" in loop
    return loop.replace("docker-entrypoint.sh postgres", f"{postgres} -D {data_dir}")


def start_time(dsn: str) -> object:
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
        assert row is not None
        return row[0]


@pytest.mark.timeout(120)
def test_restart_path_restarts_a_supervised_server(
    sandbox_factory: SandboxFactory, tmp_path: Path
) -> None:
    assert shutil.which("psql"), "psql is missing: apt-get install postgresql-client"
    sb: Sandbox = sandbox_factory()
    sb.stop()  # the supervisor loop runs the server from now on, as in the container
    script = tmp_path / "knobtune-restart-target"
    script.write_text(restart_script())
    script.chmod(0o755)
    loop = supervisor_loop(str(sb.bindir / "postgres"), sb.data_dir)
    log = (tmp_path / "supervisor.log").open("w")
    proc = subprocess.Popen(
        as_postgres(["sh", "-c", loop]),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                before = start_time(sb.dsn)
                break
            except psycopg.OperationalError:
                assert time.monotonic() < deadline, "the supervised server did not start"
                time.sleep(0.2)
        res = subprocess.run(
            [str(script)],
            env={**os.environ, "KNOBTUNE_RESTART_DSN": sb.dsn},
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        assert start_time(sb.dsn) != before  # returned only once the new server was up
        assert proc.poll() is None  # the loop survived the restart
    finally:
        # SIGTERM, as docker stop sends it: the loop shuts PostgreSQL down cleanly.
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()
    assert not sb.is_running()
    assert "starting it again" in (tmp_path / "supervisor.log").read_text()
