"""Connecting to the target: its DSN, a connection with knobtune's timeouts, whether the
server answers, and ending clients' connections; and the small query helpers the other
modules of this package share (``Conn``, ``_one``, ``_pg_message``).
"""

from __future__ import annotations

import time
from typing import Any, LiteralString

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from app.postgres.connect import connect_target
from app.postgres.dsn import is_local, mask_dsn, scrub
from app.postgres.target.errors import ConnectError, TargetError

Conn = psycopg.Connection[TupleRow]


class Connector:
    """How knobtune reaches one target: its DSN (``local``: on this host) and timeout."""

    def __init__(self, dsn: str, *, connect_timeout_s: float = 10.0) -> None:
        try:
            self._params = conninfo_to_dict(dsn)
        except psycopg.Error as exc:
            raise ConnectError(
                f"invalid connection string {mask_dsn(dsn)}: {scrub(str(exc), dsn)}"
            ) from None
        self.dsn = dsn
        self.connect_timeout_s = connect_timeout_s
        self.local = is_local(dsn)

    def connect(self, timeout_s: float | None = None) -> Conn:
        kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in self._params:
            # libpq treats values below 2 as 2.
            kwargs["connect_timeout"] = max(2, int(timeout_s or self.connect_timeout_s))
        try:
            return connect_target(self.dsn, **kwargs)
        except psycopg.Error as exc:
            raise ConnectError(
                f"cannot connect to {mask_dsn(self.dsn)}: {scrub(str(exc).strip(), self.dsn)}"
            ) from None

    def scrub(self, text: str) -> str:
        return scrub(text, self.dsn)

    def is_up(self) -> bool:
        """Whether the server accepts our connection and answers a query."""
        try:
            with self.connect(timeout_s=2) as conn:
                conn.execute("SELECT 1")
            return True
        except (ConnectError, psycopg.Error):
            return False

    def wait_until_up(self, timeout_s: float) -> bool:
        """Poll until the server accepts connections; False after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.is_up():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))

    def terminate_clients(self, application_prefix: str) -> int:
        """End the target's connections whose application_name starts with the prefix.

        After a crash of the service its pgbench (a process group of its own) runs
        on; the next process ends those connections instead of benchmarking beside them.
        Each is waited for (up to 5 s, PostgreSQL 14+): a backend the memory guard
        stopped frees its memory only as it exits, and the next run must not start
        beside it.
        """
        with self.connect() as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                "WHERE left(application_name, length(%s)) = %s AND pid <> pg_backend_pid()",
                [application_prefix, application_prefix],
            ).fetchall()
        return len(rows)


def _one(conn: Conn, query: LiteralString) -> Any:
    row = conn.execute(query).fetchone()
    if row is None:
        raise TargetError(f"no result for {query!r}")
    return row[0]


def _pg_message(exc: psycopg.Error) -> str:
    diag = exc.diag
    msg = diag.message_primary or str(exc).strip()
    if diag.message_detail:
        msg += f" ({diag.message_detail})"
    if diag.message_hint:
        msg += f" HINT: {diag.message_hint}"
    return msg
