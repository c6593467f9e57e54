"""Measuring the target while it works: how full shared_buffers is (:class:`PoolFill`), the
buffers allocated so far (:class:`PoolCounter`), and the server's memory (a MemoryMeter of
app/postgres/memory.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import LiteralString

import psycopg

from app.postgres.memory import MemoryMeter
from app.postgres.target.conf_files import ConfFiles
from app.postgres.target.connection import Conn, Connector, _one
from app.postgres.target.errors import ConnectError, TargetError
from app.postgres.target.probe import postmaster_pid


@dataclass
class PoolFill:
    """shared_buffers and what is in it (see TargetController.buffer_pool)."""

    pool_bytes: int
    used_bytes: int | None  # pages in the pool (pg_buffercache), None: not measurable
    data_bytes: int  # every database's size: the most the pool can hold of them

    @property
    def fill(self) -> float:
        """The share of the pool in use: measured, or its upper bound from the data's size."""
        used = self.used_bytes if self.used_bytes is not None else self.data_bytes
        return min(1.0, used / self.pool_bytes) if self.pool_bytes > 0 else 1.0

    @property
    def measured(self) -> bool:
        return self.used_bytes is not None


_POOL_BUFFERS: LiteralString = (
    "SELECT setting::bigint FROM pg_settings WHERE name = 'shared_buffers'"  # in buffers
)


@dataclass
class PoolCounter:
    """shared_buffers' size in buffers and a reader of the buffers allocated so far
    (pg_stat_bgwriter.buffers_alloc, readable by any role; see TargetController.pool_counter)."""

    conn: Conn
    pool_buffers: int

    def allocated(self) -> int:
        """Raises psycopg.Error when the server went away."""
        return int(_one(self.conn, "SELECT buffers_alloc FROM pg_stat_bgwriter"))


class Measurer:
    """Readings of one target's buffer pool and memory."""

    def __init__(self, db: Connector, files: ConfFiles) -> None:
        self._db = db
        self._files = files

    def memory_meter(self) -> MemoryMeter | None:
        """A reader of this server's memory while it runs (app/postgres/memory.py), or None
        for a server on another host (or in another PID namespace)."""
        if not self._db.local:
            return None

        def find() -> int | None:
            with self._db.connect() as conn:
                return postmaster_pid(conn, self._files.data_dir)

        meter = MemoryMeter(find)
        return meter if meter.read() is not None else None

    def buffer_pool(self) -> PoolFill | None:
        """How full shared_buffers is now (None: the server cannot be asked).

        With the pg_buffercache extension installed in the DSN's database: the share of
        buffers holding a page. Without it (knobtune never installs anything): the data
        the pool could hold at most, every database's size against shared_buffers, which
        bounds the fill from above.
        """
        try:
            with self._db.connect() as conn:
                pool = int(_one(conn, _POOL_BUFFERS))
                block = int(_one(conn, "SELECT current_setting('block_size')::int"))
                data = int(_one(conn, "SELECT sum(pg_database_size(oid))::bigint FROM pg_database"))
                has = conn.execute(
                    "SELECT 1 FROM pg_extension WHERE extname = 'pg_buffercache'"
                ).fetchone()
                used: int | None = None
                if has is not None:
                    try:
                        used = int(
                            _one(
                                conn,
                                "SELECT count(*) FILTER (WHERE relfilenode IS NOT NULL) "
                                "FROM pg_buffercache",
                            )
                        )
                    except psycopg.Error:
                        used = None  # no right to read it: the bound below
        except (ConnectError, psycopg.Error):
            return None
        return PoolFill(
            pool_bytes=pool * block,
            used_bytes=used * block if used is not None else None,
            data_bytes=data,
        )

    @contextlib.contextmanager
    def pool_counter(self) -> Iterator[PoolCounter | None]:
        """Buffers allocated so far and the pool's size in buffers, read over one connection
        (a warm-up's), or None when the server cannot be asked."""
        try:
            conn = self._db.connect()
        except ConnectError:
            yield None
            return
        with conn:
            try:
                pool = int(_one(conn, _POOL_BUFFERS))
                counter = PoolCounter(conn, pool)
                counter.allocated()  # readable by this role, or None below
            except (psycopg.Error, TargetError):
                yield None
                return
            yield counter
