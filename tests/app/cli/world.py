"""The CLI end to end on a simulated world: `knobtune tune` runs in-process, as a user runs
it, and its service's scheduler drives the session in a FakeEnv (tests/app/runs/fake.py):
real metadata DB, API, session loop, optimizer and verdict; a simulated server and runs.

So a CLI test gets a real session outcome (a confirmed gain, no change, an unconfirmed
gain, a failure, a cancel) in seconds, and checks what the CLI does with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

import app.main
from app.cli import main
from app.db import Database
from app.jobs.scheduler import Scheduler
from app.models import Target
from app.settings import Settings
from tests.app.runs.fake import FakeEnv, add_target, make_db
from tests.optimizer.sim import Surface

# the smallest session the budget check takes, on pgbench's builtin (no preflight)
TUNE = [
    "--builtin", "tpcb-like", "--scale", "1", "--clients", "2", "--duration", "20",
    "--warmup", "2",
]  # fmt: skip


class World:
    """A metadata DB with one simulated target, and the CLI pointed at it."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch, surface: Surface) -> None:
        self.dir = tmp / "service"
        self.dir.mkdir()
        # one key for the rows written here and the CLI's service (never the checkout's
        # ./.knobtune/secret.key, which the default work directory would make)
        key = Fernet.generate_key().decode()
        monkeypatch.setenv("KNOBTUNE_SECRET_KEY", key)
        monkeypatch.setenv("KNOBTUNE_WORK_DIR", str(self.dir / "work"))
        monkeypatch.setenv("KNOBTUNE_POLL_SECONDS", "0.2")
        self.db: Database = make_db(self.dir, work_dir=self.dir / "work", key=key)
        tid = add_target(self.db, surface)
        with self.db.session() as s:
            row = s.get(Target, tid)
            assert row is not None
            row.server_id = f"simulated-{tid}"  # no probe of a server that does not exist
            self.target = row.name
        self.surface = surface
        self.env = FakeEnv(surface, seed=3)  # the world of the next session (tune() sets it)
        self.url = self.db.url

        def scheduler(db: Database, settings: Settings) -> Scheduler:
            self.env.db = db
            return Scheduler(db, settings, self.env)

        monkeypatch.setattr(app.main, "Scheduler", scheduler)

    def tune(self, *args: str, env: FakeEnv | None = None) -> int:
        """`knobtune tune --target T ...` on this world; its exit status."""
        self.env = env or FakeEnv(self.surface, seed=3)
        self.env.session_id = self.next_id()
        return main(["tune", "--target", self.target, "--database-url", self.url, *TUNE, *args])

    def next_id(self) -> int:
        from sqlalchemy import func, select

        from app.models import TuningSession

        with self.db.session() as s:
            return int(s.scalar(select(func.max(TuningSession.id))) or 0) + 1

    def cli(self, *args: str) -> int:
        """Another command on this world's metadata DB."""
        return main([*args, "--database-url", self.url])

    def session(self, sid: int) -> dict[str, Any]:
        """The API's response for session ``sid`` (what `status --json` prints)."""
        from app.sessions.service import get_session, session_out

        return session_out(self.db, get_session(self.db, sid)).model_dump(mode="json")
