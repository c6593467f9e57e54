"""The manual's CLI commands (docs/tuning.md, reading-results.md, cli.md, workloads.md,
getting-started.md), each run from its block at small sizes in a fresh directory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from app.postgres.sandbox import Sandbox, free_port
from tests.acceptance.conftest import BIN, user_env
from tests.docs.blocks import command, replace
from tests.docs.shell import bash, knobtune


def test_cli_help(user_dir: Path) -> None:
    res = bash(command("cli-help"), user_dir, 120)
    assert res.returncode == 0, res.stderr
    assert "failed" not in res.stdout
    assert "--allow-unsafe" in res.stdout
    assert "--final-check-runs" in res.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tune_tpch_keeps_the_power_test_single_client(user_dir: Path, staging: Sandbox) -> None:
    """Issue 27's failing command: --builtin tpch with the CLI's defaults, now one client."""
    res = knobtune("targets", "add", "staging", "--dsn", staging.dsn, cwd=user_dir)
    assert res.returncode == 0, res.stderr
    block = command("tune-tpch")
    small = replace(block, "--scale 0.2", "--scale 0.01")
    # the shortest session the budget check allows: 7 runs of 3 s with a final check of 2
    small = replace(
        small,
        "--duration 40",
        "--duration 3 --knobs work_mem --max-trials 7 --final-check-runs 2",
    )
    res = bash(small, user_dir, 500)
    # finished: a confirmed gain (0), no change (3) or unconfirmed (4): docs/cli.md
    assert res.returncode in (0, 3, 4), res.stderr[-3000:]
    assert "clients=8" not in res.stderr
    assert "query time (geometric mean)" in res.stdout
    # what `knobtune status 1` says, printed by the tune at its end (a status process is
    # another start of the app: 3-4 s of CPU)
    assert "session 1 on staging: succeeded" in res.stdout, res.stdout


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sweep_cli(user_dir: Path, staging: Sandbox) -> None:
    res = knobtune("targets", "add", "staging", "--dsn", staging.dsn, cwd=user_dir)
    assert res.returncode == 0, res.stderr
    small = replace(
        command("sweep-cli"),
        "--builtin select-only",
        "--builtin select-only --clients 1,2 --duration 2 --warmup 1 --scale 1 --no-connect-cost",
    )
    res = bash(small, user_dir, 300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "sweep 1 started on staging" in res.stderr
    # no --out: no chart written, and it says how to get one
    assert "chart: none written (--out DIR writes knobtune-sweep-1.svg)" in res.stdout
    assert not list(user_dir.glob("*.svg"))


@pytest.mark.timeout(120)
def test_serve(user_dir: Path) -> None:
    port = free_port()
    script = replace(command("serve"), "--port 8000", f"--port {port}")
    proc = subprocess.Popen(
        ["bash", "-c", "exec " + script],
        cwd=user_dir,
        env=user_env(PATH=f"{BIN}:{os.environ['PATH']}"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        ok = False
        while time.monotonic() < deadline and not ok:
            with contextlib.suppress(httpx.HTTPError):
                ok = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
            time.sleep(0.3)
        assert ok, "the service did not answer /healthz"
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=10)
        assert page.status_code == 200
        assert "Start a session" in page.text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    assert (user_dir / "knobtune.db").exists()
