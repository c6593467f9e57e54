"""Fixtures of the security tests: the real service (scheduler running), a real sandbox
target, and a marker file that a script's shell command would create."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.postgres.sandbox import Sandbox
from app.settings import Settings


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The service as it runs for users: scheduler on, polling quickly."""
    tmp = tmp_path_factory.mktemp("sec")
    settings = Settings(database_url=f"sqlite:///{tmp / 'meta.db'}", work_dir=tmp, poll_seconds=0.3)
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture(scope="module")
def target_id(service: TestClient, sandbox: Sandbox) -> int:
    r = service.post("/api/v1/targets", json={"name": "sec-target", "dsn": sandbox.dsn})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


@pytest.fixture
def marker() -> Iterator[Path]:
    """A path a shell command in a script would create: in a directory any OS user can
    write to (pgbench may run as an unprivileged user), absent at the start."""
    d = Path(tempfile.mkdtemp(prefix="knobtune-sec-"))
    d.chmod(0o1777)
    path = d / "pwned"
    yield path
    path.unlink(missing_ok=True)
    d.rmdir()


def session_body(target_id: int, sql: str, **workload: Any) -> dict[str, Any]:
    """A session on ``sql`` alone whose preflight runs it (no init, no builtin)."""
    return {
        "target_id": target_id,
        "knobs": ["work_mem"],
        "max_trials": 5,
        "final_check_runs": 0,
        "workload": {
            "builtin": None,
            "scripts": [{"sql": "SELECT 1;\n"}, {"sql": sql}],
            "init": False,
            "scale": 1,
            "clients": 1,
            "jobs": 1,
            "duration_s": 2,
            "warmup_s": 1,
            **workload,
        },
    }


def settle(seconds: float = 1.0) -> None:
    """Time for anything started in the background (a preflight, a job) to have run."""
    time.sleep(seconds)
