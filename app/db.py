"""Engine and sessions of the metadata DB; schema comes only from Alembic."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib.resources import files
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import CursorResult, Engine, Executable, create_engine, event, text
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

if TYPE_CHECKING:
    from alembic.config import Config


def utcnow() -> datetime:
    return datetime.now(UTC)


def changed_rows(s: Session, stmt: Executable) -> int:
    """Rows an UPDATE/DELETE touched: the compare-and-set primitive of leases."""
    return cast(CursorResult[Any], s.execute(stmt)).rowcount


def transient(exc: BaseException) -> bool:
    """A metadata DB error that a retry may cure (connection lost, server down, locked)."""
    return isinstance(exc, OperationalError | InterfaceError)


def db_message(exc: BaseException) -> str:
    """The driver's message only: SQLAlchemy's str() appends the statement and parameters."""
    orig = getattr(exc, "orig", None)
    return str(orig or exc).strip().splitlines()[0] if str(orig or exc).strip() else repr(exc)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        # Worker threads and request threads share the file: WAL lets readers
        # proceed during a write, busy_timeout makes writers wait, not fail.
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def alembic_config(url: str) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(files("migrations")))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


# A migration's own lines naming it and its parent (migrations/versions/*.py).
_REVISION_LINE = re.compile(r'^(down_revision|revision)\b[^=]*= *(?:"([^"]*)"|None)$', re.M)


def head_revision() -> str | None:
    """The newest migration, read from migrations/versions/ without loading Alembic: the
    one revision no other names as its parent. None if the files do not say one (Alembic
    then decides). tests/app/test_migrations.py holds it equal to Alembic's head."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in files("migrations").joinpath("versions").iterdir():
        if not path.name.endswith(".py") or path.name.startswith("__"):
            continue
        for key, value in _REVISION_LINE.findall(path.read_text()):
            (revisions if key == "revision" else parents).add(value)
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


def current_revision(url: str) -> str | None:
    """The metadata DB's migration (Alembic's version table); None if it has none yet."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except SQLAlchemyError:  # no table yet, or no database: the upgrade says what is wrong
        return None
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> None:
    # Every service start and CLI call upgrades; one already at the head skips loading
    # Alembic and its migration scripts (0.6 s of CPU per process).
    if revision == "head" and (head := head_revision()) and current_revision(url) == head:
        return
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)


class Database:
    """One engine plus a session factory; the app and workers share one instance."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.sessionmaker = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def is_postgres(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessionmaker() as s, s.begin():
            yield s

    def dispose(self) -> None:
        self.engine.dispose()
