"""A run's server I/O counters: what the server did while a benchmark ran (issue 29).

app/postgres/pgbench.py reads PostgreSQL's cumulative statistics before and after the
measured window of a run and stores the differences with the trial (``trials.metrics``,
keys as the fields below). This module reads them back, pure: the WAL rate that the
checkpoint rule needs (optimizer/checkpoints.py), the figures that order the search
(optimizer/order.py), and one compact line per run, the way the studies read iostat::

    WAL 3.1 MB/s, FPI 38% | ckpt 0 timed 1 req | written ckpt 1.2k bgw 0 backend 3.4k |
    read 1.2k hit 98.7% | temp 0

A counter the server did not report (a version without the view, a role without the
right, pg_stat_statements not installed) is None, never 0: "not measured" is not "idle".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

KEYS = (
    "seconds",  # length of the window the differences cover
    # pg_stat_wal (PostgreSQL 14+)
    "wal_bytes",
    "wal_fpi",
    "wal_records",
    # pg_stat_bgwriter (<= 16) or pg_stat_checkpointer and pg_stat_io (17+)
    "checkpoints_timed",
    "checkpoints_req",
    "buffers_checkpoint",
    "buffers_clean",
    "buffers_backend",
    # pg_stat_database, the benchmark's database
    "blks_read",
    "blks_hit",
    "temp_files",
    "temp_bytes",
    "parallel_planned",  # PostgreSQL 18+: parallel_workers_to_launch
    "parallel_launched",
    # pg_stat_statements where installed (PostgreSQL 15+ for the JIT columns), in ms
    "jit_ms",
    "exec_ms",
)


@dataclass(frozen=True)
class ServerCounters:
    """Differences of the server's counters over one run's measured window."""

    seconds: float | None = None
    wal_bytes: float | None = None
    wal_fpi: float | None = None
    wal_records: float | None = None
    checkpoints_timed: float | None = None
    checkpoints_req: float | None = None
    buffers_checkpoint: float | None = None
    buffers_clean: float | None = None
    buffers_backend: float | None = None
    blks_read: float | None = None
    blks_hit: float | None = None
    temp_files: float | None = None
    temp_bytes: float | None = None
    parallel_planned: float | None = None
    parallel_launched: float | None = None
    jit_ms: float | None = None
    exec_ms: float | None = None

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, object] | None) -> ServerCounters | None:
        """The counters of a stored trial's ``metrics``; None when it has none of them."""
        if not metrics:
            return None
        values: dict[str, float] = {}
        for f in fields(cls):
            v = metrics.get(f.name)
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                values[f.name] = float(v)
        if not values or set(values) == {"seconds"}:
            return None
        return cls(**values)

    @property
    def wal_rate(self) -> float | None:
        """WAL written per second of the window (bytes/s); None if not measured."""
        if self.wal_bytes is None or not self.seconds or self.seconds <= 0:
            return None
        return max(self.wal_bytes, 0.0) / self.seconds

    @property
    def checkpoints(self) -> float | None:
        if self.checkpoints_timed is None and self.checkpoints_req is None:
            return None
        return (self.checkpoints_timed or 0.0) + (self.checkpoints_req or 0.0)

    @property
    def hit_ratio(self) -> float | None:
        """Blocks found in shared_buffers among those the workload asked for."""
        if self.blks_hit is None or self.blks_read is None:
            return None
        total = self.blks_hit + self.blks_read
        return self.blks_hit / total if total > 0 else None

    @property
    def jit_share(self) -> float | None:
        """Fraction of statement time spent compiling (JIT); None without pg_stat_statements."""
        if self.jit_ms is None or not self.exec_ms or self.exec_ms <= 0:
            return None
        return min(max(self.jit_ms, 0.0) / self.exec_ms, 1.0)


def _n(x: float | None) -> str:
    """A count, short: 950, 1.2k, 3.4M."""
    if x is None:
        return "?"
    a = abs(x)
    if a >= 1e6:
        return f"{x / 1e6:.1f}M"
    if a >= 1e4:
        return f"{x / 1e3:.0f}k"
    if a >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def size_text(nbytes: float) -> str:
    """Bytes, short: 512 B, 3.1 MB, 1.2 GB (powers of 1024, as PostgreSQL prints them)."""
    for unit, scale in (("GB", 1024.0**3), ("MB", 1024.0**2), ("kB", 1024.0)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


def summary(c: ServerCounters | None) -> str | None:
    """One compact line of a run's counters (None when nothing was measured)."""
    if c is None:
        return None
    parts: list[str] = []
    if c.wal_bytes is not None:
        rate = c.wal_rate
        wal = f"WAL {size_text(rate)}/s" if rate is not None else f"WAL {size_text(c.wal_bytes)}"
        if c.wal_fpi is not None and c.wal_records:
            wal += f", FPI {c.wal_fpi / c.wal_records:.0%}"
        parts.append(wal)
    if c.checkpoints is not None:
        parts.append(f"ckpt {_n(c.checkpoints_timed)} timed {_n(c.checkpoints_req)} req")
    if c.buffers_checkpoint is not None or c.buffers_backend is not None:
        parts.append(
            f"written ckpt {_n(c.buffers_checkpoint)} bgw {_n(c.buffers_clean)} "
            f"backend {_n(c.buffers_backend)}"
        )
    if c.blks_read is not None:
        hit = c.hit_ratio
        parts.append(f"read {_n(c.blks_read)}" + (f" hit {hit:.1%}" if hit is not None else ""))
    if c.temp_files is not None:
        temp = f"temp {_n(c.temp_files)}"
        if c.temp_files and c.temp_bytes:
            temp += f" ({size_text(c.temp_bytes)})"
        parts.append(temp)
    if c.parallel_planned:
        parts.append(f"parallel {_n(c.parallel_launched)}/{_n(c.parallel_planned)}")
    if c.jit_share is not None:
        parts.append(f"JIT {c.jit_share:.1%}")
    return " | ".join(parts) or None
