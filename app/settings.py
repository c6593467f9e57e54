"""Service settings, read from the environment (prefix ``KNOBTUNE_``)."""

from __future__ import annotations

import os
import socket
import uuid
from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KNOBTUNE_", env_file=None)

    database_url: str = Field(
        default="sqlite:///knobtune.db",
        description="Metadata DB (SQLAlchemy URL). SQLite file by default; "
        "postgresql+psycopg://user:pass@host/db for deployments.",
    )
    api_token: SecretStr | None = Field(
        default=None,
        description="When set, every /api route requires 'Authorization: Bearer <token>'.",
    )
    max_parallel_sessions: int = Field(
        default=2, ge=1, description="Sessions run at once by this process."
    )
    lease_seconds: float = Field(
        default=30.0,
        gt=0,
        description="A running session's lease; another process takes it over once it expires.",
    )
    poll_seconds: float = Field(
        default=2.0, gt=0, description="How often the claim loop looks for work."
    )
    work_dir: Path = Field(
        default=Path(".knobtune"), description="pgbench scripts and logs, managed sandboxes."
    )
    run_scheduler: bool = Field(
        default=True, description="Run sessions in this process (off: API only)."
    )
    instance_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}",
        description="Identifies this process in session leases.",
    )
    target_retry_s: float = Field(
        default=60.0, ge=0, description="How long a session waits for a target that went down."
    )

    # Paths are resolved once, here: pgbench runs with its run directory as its cwd and
    # the service may be started from anywhere, so nothing later may depend on the cwd.
    @field_validator("work_dir")
    @classmethod
    def _absolute_work_dir(cls, v: Path) -> Path:
        return v.expanduser().resolve()

    @field_validator("database_url")
    @classmethod
    def _absolute_sqlite_path(cls, v: str) -> str:
        return absolute_sqlite_url(v)


def absolute_sqlite_url(url: str) -> str:
    """``url`` with a relative SQLite file path made absolute against the current directory."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ValueError(
            f"not a SQLAlchemy URL: {exc}; e.g. sqlite:////var/lib/knobtune/knobtune.db "
            "or postgresql+psycopg://user:pass@host/db"
        ) from None
    db = parsed.database
    if not parsed.drivername.startswith("sqlite") or not db or db == ":memory:":
        return url
    if db.startswith("file:") or Path(db).is_absolute():
        return url
    return parsed.set(database=str(Path(db).expanduser().resolve())).render_as_string(
        hide_password=False
    )


@lru_cache
def get_settings() -> Settings:
    return Settings()
