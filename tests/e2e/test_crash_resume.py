"""SIGKILL the service mid-benchmark; a new process resumes the session by replay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from app.postgres.sandbox import Sandbox, free_port


def file_settings(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT sourcefile, name, setting, applied, error FROM pg_file_settings "
            "ORDER BY sourcefile, seqno"
        ).fetchall()


class Service:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "KNOBTUNE_DATABASE_URL": f"sqlite:///{tmp / 'meta.db'}",
            "KNOBTUNE_WORK_DIR": str(tmp),
            "KNOBTUNE_LEASE_SECONDS": "3",
            "KNOBTUNE_POLL_SECONDS": "0.5",
        }
        self.log = (tmp / "service.log").open("ab")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.cli",
                "serve",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError("service did not start")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    svc = Service(tmp_path)
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


def test_sigkill_during_benchmark_then_resume(service: Service) -> None:
    with Sandbox.create() as sandbox:
        before = file_settings(sandbox.dsn)
        api = httpx.Client(base_url=service.url, timeout=30)
        target = api.post(
            "/api/v1/targets",
            json={
                "name": "crash",
                "dsn": sandbox.dsn,
                "restart_command": sandbox.restart_command,
                "data_dir": str(sandbox.data_dir),
            },
        ).json()
        sid = api.post(
            "/api/v1/sessions",
            json={
                "target_id": target["id"],
                "knobs": ["work_mem", "max_wal_size"],
                "max_trials": 7,
                "seed": 3,
                "workload": {
                    "builtin": "tpcb-like",
                    "scale": 1,
                    "clients": 2,
                    "jobs": 1,
                    "duration_s": 3,
                    "warmup_s": 1,
                },
            },
        ).json()["id"]
        # Kill while a benchmark of trial 3 or later is producing samples.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            s = api.get(f"/api/v1/sessions/{sid}").json()
            if (
                s["progress"]["trials_done"] >= 2
                and s["live_tps"]
                and s["phase"].startswith(("measuring", "re-"))
            ):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"session never got going: {s}")
        done_before_kill = s["progress"]["trials_done"]
        service.kill()

        service.start()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            s = api.get(f"/api/v1/sessions/{sid}").json()
            if s["status"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.5)
        assert s["status"] == "succeeded", s
        assert s["attempts"] == 2  # a second process resumed it
        trials = api.get(f"/api/v1/sessions/{sid}/trials").json()
        indexes = [t["index"] for t in trials]
        assert indexes == list(range(1, 8)), indexes  # none lost, none duplicated
        assert done_before_kill < 7
        assert file_settings(sandbox.dsn) == before
