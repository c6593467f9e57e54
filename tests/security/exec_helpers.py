"""Shared by the issue-25 tests of commands, secrets, sandboxes and servers (sec-exec).

Written against what both the old and the fixed service offer (the REST API, the
metadata DB through the ORM, a sandbox's dsn), so that each test fails on the old
service for the reason it names, not for a missing function.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from app.db import Database
from app.main import create_app
from app.models import Target
from app.postgres.sandbox import Sandbox
from app.settings import Settings

# pgbench -R 100: these sessions are about restarts, roles and refusals, not a level; a
# throttled run keeps the builtin path (its load, pgbench, the samples) and leaves the
# CPUs to the other workers (unthrottled, a module of them kept a CPU busy throughout)
QUICK = {
    "builtin": "select-only",
    "rate": 100,
    "scale": 1,
    "clients": 2,
    "jobs": 1,
    "duration_s": 2,
    "warmup_s": 1,
}


@contextlib.contextmanager
def service_dir() -> Iterator[Path]:
    """A directory like /var/lib/knobtune: under /tmp, enterable by every OS user (0755).

    pytest's tmp_path is private to root, which would hide a file-mode problem of the
    service behind a directory that nobody else may enter anyway.
    """
    path = Path(tempfile.mkdtemp(prefix="knobtune-sec-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        sandboxes = path / "work" / "sandboxes"
        for sb in sorted(sandboxes.iterdir()) if sandboxes.is_dir() else []:
            with contextlib.suppress(Exception):
                Sandbox.open(sb).destroy()
        shutil.rmtree(path, ignore_errors=True)


def settings_for(base: Path, **extra: Any) -> Settings:
    return Settings(
        database_url=f"sqlite:///{base / 'knobtune.db'}",
        work_dir=base / "work",
        poll_seconds=0.3,
        **extra,
    )


@contextlib.contextmanager
def client_for(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


def stored_targets(url: str) -> list[Target]:
    """The targets as the service stores them (DSNs as the service itself reads them)."""
    db = Database(url)
    try:
        with db.session() as s:
            return list(s.scalars(select(Target).order_by(Target.id)))
    finally:
        db.dispose()


def wait_done(client: TestClient, sid: int, timeout: float = 240) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = client.get(f"/api/v1/sessions/{sid}").json()
        if body["status"] in ("succeeded", "failed", "cancelled"):
            return body
        time.sleep(0.5)
    raise AssertionError(f"session {sid} did not finish: {body}")
