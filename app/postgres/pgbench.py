"""pgbench runner: data init, a run with live per-second samples, parsers of its output.

A run never raises for pgbench's own failures (aborted clients, lost connection,
pgbench missing or killed, unwritable log directory): it returns a failed
``BenchResult`` with pgbench's message, so a tuning loop records the trial and goes
on. ``fatal`` marks failures of this host (pgbench missing, log directory
unwritable) that no other config can fix: a tuning loop should stop on them.
Connection parameters reach pgbench through libpq environment variables, so a
password is never on a command line; messages are scrubbed of it too.

Latency percentiles come from pgbench's per-transaction log (``--log``), never
from averages: the aggregate log only has per-interval sums. The log is also kept as
arrays (:class:`TxLog`: client, transaction number, script, start, latency of every
transaction) for per-transaction evidence (app/evidence.py).
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import psycopg

from app.postgres.dsn import libpq_env, mask_dsn, scrub
from app.postgres.sandbox import INSTALL_HINT, PostgresNotInstalled, find_bindir

log = logging.getLogger(__name__)

BUILTINS = ("tpcb-like", "simple-update", "select-only")
PROTOCOLS = ("simple", "extended", "prepared")
ISOLATION_LEVELS = ("read committed", "repeatable read", "serializable")
PGBENCH_ENV = "KNOBTUNE_PGBENCH"
# Runs up to this long log every transaction; longer ones are sampled so the
# log stays about this size (a 60 s full log at 10k tps is ~20 MB).
FULL_LOG_SECONDS = 60
# Stopping: SIGINT at once (pgbench dies on it), SIGTERM after 1 s, SIGKILL after 2 s.
_STOP_SIGNALS = ((0.0, signal.SIGINT), (1.0, signal.SIGTERM), (2.0, signal.SIGKILL))
_FINISH_GRACE_S = 60.0  # beyond -T: connection setup, vacuum, final report


class PgbenchError(RuntimeError):
    """pgbench could not be run or failed outside a measurement (e.g. ``pgbench -i``)."""


# -- specification ---------------------------------------------------------------
@dataclass
class BenchSpec:
    """One pgbench run. ``duration_s`` includes ``warmup_s``, whose samples are dropped."""

    builtin: str | None = "tpcb-like"
    scripts: list[tuple[str, int]] | None = None  # (sql, weight), mixed with the builtin
    clients: int = 8
    jobs: int = 2
    duration_s: int = 60
    warmup_s: int = 5
    protocol: str = "simple"  # pgbench's own default; "prepared" only when asked for
    rate: float | None = None  # target tps (-R)
    builtin_weight: int = 1
    log_sampling: float | None = None  # fraction of transactions logged; None: automatic
    defines: dict[str, str] = field(default_factory=dict)  # -D name=value
    max_tries: int = 1  # --max-tries: retries of serialization failures and deadlocks
    isolation: str | None = None  # default_transaction_isolation of its sessions (PGOPTIONS)
    connect_per_transaction: bool = False  # -C: a new connection for every transaction

    def validate(self) -> None:
        """Raise ValueError naming what to change."""
        if self.builtin is not None and self.builtin not in BUILTINS:
            raise ValueError(
                f"unknown builtin {self.builtin!r}; choose one of {', '.join(BUILTINS)}"
            )
        if self.builtin is None and not self.scripts:
            raise ValueError("give a builtin script or at least one SQL script")
        for sql_text, weight in self.scripts or []:
            if not sql_text.strip():
                raise ValueError("a script is empty")
            if weight < 1:
                raise ValueError(f"script weights must be >= 1, got {weight}")
        if self.builtin_weight < 1:
            raise ValueError("builtin_weight must be >= 1")
        if self.protocol not in PROTOCOLS:
            raise ValueError(
                f"unknown protocol {self.protocol!r}; choose one of {', '.join(PROTOCOLS)}"
            )
        if self.clients < 1 or self.jobs < 1:
            raise ValueError("clients and jobs must be >= 1")
        if self.duration_s < 1:
            raise ValueError("duration_s must be >= 1")
        if not 0 <= self.warmup_s < self.duration_s:
            raise ValueError("warmup_s must be >= 0 and less than duration_s")
        if self.rate is not None and not self.rate > 0:
            raise ValueError("rate must be > 0")
        if self.log_sampling is not None and not 0 < self.log_sampling <= 1:
            raise ValueError("log_sampling must be in (0, 1]")
        if self.max_tries < 1:
            raise ValueError("max_tries must be >= 1")
        if self.isolation is not None and self.isolation not in ISOLATION_LEVELS:
            raise ValueError(
                f"unknown isolation {self.isolation!r}; choose one of {', '.join(ISOLATION_LEVELS)}"
            )
        for name in self.defines:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"pgbench variable name {name!r} is not a plain identifier")

    def sampling_rate(self) -> float:
        if self.log_sampling is not None:
            return self.log_sampling
        if self.duration_s <= FULL_LOG_SECONDS:
            return 1.0
        return max(0.01, FULL_LOG_SECONDS / self.duration_s)


# -- parsers ---------------------------------------------------------------------
_F = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+|nan|inf)"
_PROGRESS = re.compile(
    rf"^progress: (?P<t>{_F}) s, (?P<tps>{_F}) tps, lat (?P<lat>{_F}) ms"
    rf"(?: stddev (?P<sd>{_F}))?"
    r"(?:, (?P<failed>\d+) failed)?"  # 15+
    rf"(?:, lag (?P<lag>{_F}) ms)?"  # with -R
    r"(?:, (?P<skipped>\d+) skipped)?"  # with -R and -L
    r"(?:, (?P<retried>\d+) retried, (?P<retries>\d+) retries)?$",  # 15+ with --max-tries
    re.IGNORECASE,
)


@dataclass(frozen=True)
class ProgressSample:
    """One ``progress:`` line: the interval that ended at ``time_s`` since the start."""

    time_s: float
    tps: float
    latency_ms: float | None  # None when the interval had no transaction
    stddev_ms: float | None
    failed: int | None = None  # 15+
    lag_ms: float | None = None
    skipped: int | None = None
    retried: int | None = None
    retries: int | None = None


def _finite(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def parse_progress_line(line: str) -> ProgressSample | None:
    """A ``progress:`` line of pgbench 9.5-17 (also with --progress-timestamp); else None."""
    m = _PROGRESS.match(line.strip())
    if not m:
        return None
    t = _finite(m.group("t"))
    if t is None:
        return None
    # tps cannot really be nan (it is count/elapsed); treat garbage as an empty interval.
    tps = _finite(m.group("tps")) or 0.0
    lat = _finite(m.group("lat"))
    if tps <= 0:
        lat = None  # old versions print 0 or nan for an interval without transactions
    return ProgressSample(
        time_s=t,
        tps=max(tps, 0.0),
        latency_ms=lat,
        stddev_ms=_finite(m.group("sd")) if lat is not None else None,
        failed=int(m.group("failed")) if m.group("failed") else None,
        lag_ms=_finite(m.group("lag")),
        skipped=int(m.group("skipped")) if m.group("skipped") else None,
        retried=int(m.group("retried")) if m.group("retried") else None,
        retries=int(m.group("retries")) if m.group("retries") else None,
    )


@dataclass
class Summary:
    """pgbench's final report (stdout). Fields it did not print stay None."""

    transaction_type: str | None = None
    scale: int | None = None
    query_mode: str | None = None
    clients: int | None = None
    threads: int | None = None
    max_tries: int | None = None
    duration_s: int | None = None
    transactions: int | None = None
    transactions_planned: int | None = None  # -t runs: "processed: 10000/10000"
    failed: int | None = None  # 15+
    skipped: int | None = None
    retried: int | None = None
    retries: int | None = None
    latency_avg_ms: float | None = None
    latency_stddev_ms: float | None = None
    initial_connection_ms: float | None = None  # 14+
    tps: float | None = None  # without initial connection time / excluding connections
    tps_including_connections: float | None = None  # 13 and older
    aborted: bool = False


def _int(m: re.Match[str] | None, group: int = 1) -> int | None:
    if m is None or m.group(group) is None:
        return None
    try:
        return int(m.group(group))
    except ValueError:
        return None


def _search(pattern: str, text: str) -> re.Match[str] | None:
    return re.search(pattern, text, re.MULTILINE)


def parse_summary(text: str) -> Summary:
    """Read pgbench's final report (13-17 formats). Never raises; unknown text gives Nones."""
    s = Summary()
    m = _search(r"^transaction type: (.+?)\s*$", text)
    s.transaction_type = m.group(1) if m else None
    s.scale = _int(_search(r"^scaling factor: (\d+)", text))
    m = _search(r"^query mode: (\w+)", text)
    s.query_mode = m.group(1) if m else None
    s.clients = _int(_search(r"^number of clients: (\d+)", text))
    s.threads = _int(_search(r"^number of threads: (\d+)", text))
    s.max_tries = _int(_search(r"^maximum number of tries: (\d+)", text))
    s.duration_s = _int(_search(r"^duration: (\d+) s", text))
    m = _search(r"^number of transactions actually processed: (\d+)(?:/(\d+))?", text)
    s.transactions = _int(m)
    s.transactions_planned = _int(m, 2)
    s.failed = _int(_search(r"^number of failed transactions: (\d+)", text))
    s.skipped = _int(_search(r"^number of transactions skipped: (\d+)", text))
    s.retried = _int(_search(r"^number of transactions retried: (\d+)", text))
    s.retries = _int(_search(r"^total number of retries: (\d+)", text))
    m = _search(rf"^latency average\s*[=:]\s*({_F}) ms", text)
    s.latency_avg_ms = _finite(m.group(1)) if m else None
    m = _search(rf"^latency stddev\s*[=:]\s*({_F}) ms", text)
    s.latency_stddev_ms = _finite(m.group(1)) if m else None
    m = _search(rf"^initial connection time\s*=\s*({_F}) ms", text)
    s.initial_connection_ms = _finite(m.group(1)) if m else None
    for m in re.finditer(rf"^tps\s*=\s*({_F}) \(([^)]*)\)", text, re.MULTILINE):
        kind = m.group(2)
        if "including" in kind:
            s.tps_including_connections = _finite(m.group(1))
        elif s.tps is None:  # "without initial connection time" / "excluding connections ..."
            s.tps = _finite(m.group(1))
    s.aborted = "Run was aborted" in text
    return s


@dataclass(frozen=True)
class LogEntry:
    """One line of pgbench's per-transaction log."""

    end_s: float  # epoch seconds when the transaction ended
    latency_ms: float | None  # None for failed / skipped transactions
    failed: bool = False
    skipped: bool = False
    client: int = 0
    txno: int = 0  # the client's transaction number (from 1)
    script: int = 0  # pgbench's script number (-b first, then each -f, in order)


def parse_log_line(line: str) -> LogEntry | None:
    """``client_id transaction_no time script_no time_epoch time_us [lag] [retries]``."""
    parts = line.split()
    if len(parts) < 6:
        return None
    try:
        end = int(parts[4]) + int(parts[5]) / 1e6
        client, txno, script = int(parts[0]), int(parts[1]), int(parts[3])
    except ValueError:
        return None
    if parts[2] in ("failed", "skipped"):
        return LogEntry(
            end,
            None,
            failed=parts[2] == "failed",
            skipped=parts[2] == "skipped",
            client=client,
            txno=txno,
            script=script,
        )
    try:
        lat_us = float(parts[2])
    except ValueError:
        return None
    if not math.isfinite(lat_us) or lat_us < 0:
        return None
    return LogEntry(end, lat_us / 1000.0, client=client, txno=txno, script=script)


@dataclass
class LatencyStats:
    mean_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    p95_per_second: dict[int, float] = field(default_factory=dict)  # second index (1-based)
    logged: int = 0
    failed: int = 0


@dataclass(frozen=True)
class TxLog:
    """A run's per-transaction log as arrays, one entry per completed transaction.

    ``start_s`` counts from the start of the run's first transaction; failed transactions
    (after pgbench's retries) have no latency: their script and end time are kept apart.
    """

    client: np.ndarray
    txno: np.ndarray
    script: np.ndarray
    start_s: np.ndarray
    latency_ms: np.ndarray
    failed_script: np.ndarray
    failed_end_s: np.ndarray

    @classmethod
    def empty(cls) -> TxLog:
        z = np.zeros(0)
        return cls(z, z, z, z, z, z, z)

    def __len__(self) -> int:
        return int(self.latency_ms.size)


def _tx_log(cols: np.ndarray) -> TxLog:
    """Columns ``client txno latency_us script epoch us`` (failed: -inf, skipped: nan)."""
    lat_us, ends = cols[:, 2], cols[:, 4] + cols[:, 5] / 1e6
    ok = np.isfinite(lat_us) & (lat_us >= 0) & np.isfinite(ends)
    bad = np.isneginf(lat_us) & np.isfinite(ends)
    lat_ms = lat_us[ok] / 1000.0
    starts = ends[ok] - lat_ms / 1000.0
    t0 = float(np.min(starts)) if starts.size else (float(np.min(ends[bad])) if bad.any() else 0.0)
    return TxLog(
        client=cols[ok, 0].astype(np.int64),
        txno=cols[ok, 1].astype(np.int64),
        script=cols[ok, 3].astype(np.int64),
        start_s=starts - t0,
        latency_ms=lat_ms,
        failed_script=cols[bad, 3].astype(np.int64),
        failed_end_s=ends[bad] - t0,
    )


def _log_columns(text: str) -> TxLog | None:
    """The :class:`TxLog` of a well-formed log, parsed in C.

    pgbench writes every line of a run with the same fields. Parsing them one by one in
    Python held the GIL for ~0.5 s per 150,000 lines, at the end of every run, while the
    service answered pollers (bench/api_load.py); numpy's loadtxt takes a quarter of that.
    None when the text is not like that (a torn last line, garbage): the per-line parser
    takes over.
    """
    if not text.strip():
        return None
    marked = text.replace("failed", "-inf").replace("skipped", "nan")
    try:
        cols = np.loadtxt(io.StringIO(marked), dtype=np.float64, ndmin=2)
    except ValueError:
        return None
    if cols.shape[1] < 6:
        return None
    return _tx_log(cols)


def _log_lines(text: str) -> TxLog:
    """Like :func:`_log_columns`, line by line, skipping what is not a log line."""
    rows = array("d")
    for line in text.splitlines():
        e = parse_log_line(line)
        if e is None or e.skipped:
            continue
        lat = -math.inf if e.latency_ms is None else e.latency_ms * 1000.0
        end_s = math.floor(e.end_s)
        rows.extend((e.client, e.txno, lat, e.script, end_s, round((e.end_s - end_s) * 1e6)))
    cols = np.frombuffer(rows, dtype=np.float64).reshape(-1, 6)
    return _tx_log(cols) if cols.size else TxLog.empty()


def read_tx_log(lines: Iterable[str]) -> TxLog:
    """The per-transaction log of a run from its lines, or whole log files' texts."""
    text = "\n".join(lines)
    return _log_columns(text) or _log_lines(text)


def latency_stats(lines: Iterable[str] | TxLog, warmup_s: float) -> LatencyStats:
    """Percentiles of per-transaction latencies after the warm-up, overall and per second.

    ``lines``: the log's lines, or whole log files' texts (or the log already read).
    Second k (1-based) holds transactions that ended in (k-1, k] seconds after the first
    transaction started, matching pgbench's ``progress: k.0 s`` interval.
    """
    log = lines if isinstance(lines, TxLog) else read_tx_log(lines)
    lat_arr = log.latency_ms
    out = LatencyStats(logged=len(lat_arr), failed=int(log.failed_script.size))
    if not lat_arr.size:
        return out
    rel = log.start_s + lat_arr / 1000.0  # end times since the first transaction started
    keep = rel > warmup_s
    if not keep.any():
        return out
    kept_lat, kept_rel = lat_arr[keep], rel[keep]
    out.mean_ms = float(np.mean(kept_lat))
    out.p95_ms = float(np.percentile(kept_lat, 95))
    out.p99_ms = float(np.percentile(kept_lat, 99))
    second = np.ceil(kept_rel).astype(np.int64)
    order = np.argsort(second, kind="stable")
    second, kept_lat = second[order], kept_lat[order]
    bounds = np.flatnonzero(np.diff(second)) + 1
    for idx, chunk in zip(np.split(second, bounds), np.split(kept_lat, bounds), strict=True):
        out.p95_per_second[int(idx[0])] = float(np.percentile(chunk, 95))
    return out


# -- running ---------------------------------------------------------------------
@dataclass
class BenchResult:
    ok: bool
    error: str | None
    samples: list[float]  # per-second tps after the warm-up
    all_samples: list[float]  # every per-second tps, warm-up included
    latency_p95_samples: list[float]  # per-second p95 (ms) after the warm-up
    tps: float | None
    latency_mean_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    transactions: int
    failed_transactions: int
    duration_s: float
    stopped: bool
    db_metrics: dict[str, float]
    progress: list[ProgressSample] = field(default_factory=list)
    summary: Summary | None = None
    early_stop: str | None = None  # why ``watch`` stopped the run
    fatal: bool = False  # pgbench cannot run on this host at all (see module docstring)
    tx: TxLog | None = None  # every logged transaction (None when nothing was logged)
    log_sampling: float = 1.0  # the fraction of transactions the log holds

    @classmethod
    def failure(cls, error: str, *, duration_s: float = 0.0, fatal: bool = False) -> BenchResult:
        return cls(
            ok=False,
            error=error,
            samples=[],
            all_samples=[],
            latency_p95_samples=[],
            tps=None,
            latency_mean_ms=None,
            latency_p95_ms=None,
            latency_p99_ms=None,
            transactions=0,
            failed_transactions=0,
            duration_s=duration_s,
            stopped=False,
            db_metrics={},
            fatal=fatal,
        )


def find_pgbench() -> str:
    """pgbench's path: $KNOBTUNE_PGBENCH, PATH, then PostgreSQL's bin directory."""
    explicit = os.environ.get(PGBENCH_ENV)
    if explicit:
        if os.access(explicit, os.X_OK):
            return explicit
        raise PgbenchError(f"{PGBENCH_ENV}={explicit} is not an executable pgbench")
    found = shutil.which("pgbench")
    if found:
        return found
    with contextlib.suppress(PostgresNotInstalled):
        candidate = find_bindir() / "pgbench"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    raise PgbenchError(f"pgbench was not found on PATH; install it with: {INSTALL_HINT}")


def build_command(
    spec: BenchSpec, pgbench: str, rundir: Path, script_paths: list[tuple[Path, int]]
) -> list[str]:
    """pgbench's argv (no connection parameters: they travel in the environment)."""
    argv = [
        pgbench,
        "-P",
        "1",
        "-T",
        # One extra second: pgbench never prints the progress line of its last second,
        # so -T N gives N-1 samples; the extra second's sample is dropped below.
        str(spec.duration_s + 1),
        "-c",
        str(spec.clients),
        "-j",
        str(min(spec.jobs, spec.clients)),
        "-M",
        spec.protocol,
        "-l",
        f"--log-prefix={rundir / 'pgbench_log'}",
    ]
    rate = spec.sampling_rate()
    if rate < 1:
        argv.append(f"--sampling-rate={rate:g}")
    if spec.rate is not None:
        argv += ["-R", f"{spec.rate:g}"]
    if spec.max_tries > 1:
        argv.append(f"--max-tries={spec.max_tries}")
    if spec.connect_per_transaction:
        argv.append("-C")
    for name, value in spec.defines.items():
        argv += ["-D", f"{name}={value}"]
    if spec.builtin is not None:
        argv += ["-b", f"{spec.builtin}@{spec.builtin_weight}"]
    for path, weight in script_paths:
        argv += ["-f", f"{path}@{weight}"]
    if script_paths:
        argv.append("-n")  # custom scripts: the pgbench tables to vacuum may not exist
    return argv


def _db_stats(conn: psycopg.Connection[Any]) -> dict[str, float]:
    version = conn.info.server_version
    out: dict[str, float] = {}
    row = conn.execute(
        "SELECT xact_commit, xact_rollback, blks_hit, blks_read, temp_files, temp_bytes, deadlocks"
        " FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    if row is not None:
        keys = (
            "xact_commit",
            "xact_rollback",
            "blks_hit",
            "blks_read",
            "temp_files",
            "temp_bytes",
            "deadlocks",
        )
        out.update({k: float(v or 0) for k, v in zip(keys, row, strict=True)})
    if version >= 170000:
        # 17 moved checkpoint counters to pg_stat_checkpointer and backend writes to pg_stat_io.
        row = conn.execute(
            "SELECT c.num_timed, c.num_requested, c.buffers_written, b.buffers_clean,"
            " (SELECT coalesce(sum(writes), 0) FROM pg_stat_io"
            "  WHERE backend_type = 'client backend')"
            " FROM pg_stat_checkpointer c, pg_stat_bgwriter b"
        ).fetchone()
    else:
        row = conn.execute(
            "SELECT checkpoints_timed, checkpoints_req, buffers_checkpoint, buffers_clean,"
            " buffers_backend FROM pg_stat_bgwriter"
        ).fetchone()
    if row is not None:
        keys2 = (
            "checkpoints_timed",
            "checkpoints_req",
            "buffers_checkpoint",
            "buffers_clean",
            "buffers_backend",
        )
        out.update({k: float(v or 0) for k, v in zip(keys2, row, strict=True)})
    return out


def _read_stats(dsn: str, app_name: str | None = None) -> dict[str, float]:
    """Counters of the bench database; waits briefly for pgbench's backends to exit first
    (a backend reports its statistics when it exits)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        if app_name:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [app_name]
                ).fetchone()
                if not row or not row[0]:
                    break
                time.sleep(0.05)
        return _db_stats(conn)


def _pump(stream: IO[str], name: str, q: queue.Queue[tuple[str, str | None]]) -> None:
    for line in stream:
        q.put((name, line.rstrip("\n")))
    q.put((name, None))


def _error_text(stderr_lines: list[str], returncode: int) -> str:
    keys = ("error", "fatal", "FATAL", "ERROR", "abort", "could not", "connection")
    picked = [ln.strip() for ln in stderr_lines if any(k in ln for k in keys)]
    lines = picked[-6:] or [ln.strip() for ln in stderr_lines[-3:] if ln.strip()]
    detail = "; ".join(dict.fromkeys(lines)) or "no message"
    if returncode < 0:  # Popen's convention: killed by signal -returncode
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        said = "; ".join(dict.fromkeys(picked[-6:]))  # its progress chatter says nothing here
        return f"pgbench was killed by {name} (not by knobtune)" + (f": {said}" if said else "")
    return f"pgbench exited with status {returncode}: {detail}"


def run_bench(
    dsn: str,
    spec: BenchSpec,
    *,
    on_sample: Callable[[float, float], None] | None = None,
    stop: threading.Event | None = None,
    workdir: Path | None = None,
    watch: Callable[[ProgressSample], str | None] | None = None,
    app_name: str | None = None,
) -> BenchResult:
    """Run pgbench for ``spec.duration_s`` seconds and measure.

    ``on_sample(t, tps)`` is called from this thread for every per-second
    progress line (warm-up included). Setting ``stop`` ends the run within about
    a second (``stopped=True``, ``ok=False``). ``watch`` sees every progress
    sample too; the first reason it returns stops the run the same way
    (``early_stop`` = the reason, ``ok=False``). ``app_name`` prefixes the
    application_name of pgbench's connections (unless the DSN sets one), so
    they can be found in pg_stat_activity. Raises ValueError for an invalid spec
    only; pgbench failures come back as ``ok=False`` with pgbench's message.
    """
    spec.validate()
    try:
        pgbench = find_pgbench()
    except PgbenchError as exc:
        return BenchResult.failure(str(exc), fatal=True)
    try:
        env = libpq_env(dsn)
    except psycopg.Error as exc:
        return BenchResult.failure(
            f"invalid connection string {mask_dsn(dsn)}: {scrub(str(exc), dsn)}"
        )
    if spec.isolation is not None:
        # libpq's options: spaces inside a value are escaped with a backslash
        level = spec.isolation.replace(" ", "\\ ")
        extra = f"-c default_transaction_isolation={level}"
        env["PGOPTIONS"] = f"{env['PGOPTIONS']} {extra}" if env.get("PGOPTIONS") else extra
    name = env.get("PGAPPNAME")
    if name is None:
        name = env["PGAPPNAME"] = f"{app_name or 'knobtune-pgbench'}-{uuid.uuid4().hex[:8]}"
    try:
        if workdir is not None:
            workdir.mkdir(parents=True, exist_ok=True)
        rundir = Path(tempfile.mkdtemp(prefix="bench-", dir=workdir))
    except OSError as exc:
        where = workdir if workdir is not None else tempfile.gettempdir()
        return BenchResult.failure(
            f"cannot write pgbench's logs in {where}: {exc.strerror or exc}; "
            "give a writable work directory (KNOBTUNE_WORK_DIR)",
            fatal=True,
        )
    try:
        return _run(dsn, spec, pgbench, env, name, rundir, on_sample, stop, watch)
    except OSError as exc:  # e.g. the disk filled up while writing scripts
        return BenchResult.failure(f"cannot write pgbench's files in {rundir}: {exc}", fatal=True)
    finally:
        shutil.rmtree(rundir, ignore_errors=True)


def run_streams(
    dsn: str,
    specs: Sequence[BenchSpec],
    *,
    on_sample: Callable[[float, float], None] | None = None,
    stop: threading.Event | None = None,
    workdir: Path | None = None,
    watch: Callable[[ProgressSample], str | None] | None = None,
    app_name: str | None = None,
) -> list[BenchResult]:
    """Several pgbench processes at once (a workload's streams), one :func:`run_bench` each.

    The first stream feeds ``on_sample`` and ``watch``. ``stop``, an early stop of the
    first stream, or a failure of any stream ends them all: a stream that was ended
    because of another comes back ``stopped=True`` (the one that failed says why).
    Results are in the order of ``specs``.
    """
    if not specs:
        raise ValueError("a run needs at least one stream")
    for spec in specs:
        spec.validate()
    if len(specs) == 1:
        only = run_bench(
            dsn,
            specs[0],
            on_sample=on_sample,
            stop=stop,
            workdir=workdir,
            watch=watch,
            app_name=app_name,
        )
        return [only]
    end_all = threading.Event()
    results: list[BenchResult | None] = [None] * len(specs)
    done = threading.Event()

    def one(i: int) -> None:
        try:
            r = run_bench(
                dsn,
                specs[i],
                on_sample=on_sample if i == 0 else None,
                stop=end_all,
                workdir=workdir,
                watch=watch if i == 0 else None,
                app_name=app_name,
            )
        except Exception as exc:  # an invalid spec was caught above; anything else: a failure
            log.exception("stream %d of a run failed", i)
            r = BenchResult.failure(f"stream {i + 1}: {exc}")
        results[i] = r
        if not r.ok:
            end_all.set()  # a failed or early-stopped stream ends the run

    threads = [
        threading.Thread(target=one, args=(i,), name=f"pgbench-stream-{i}", daemon=True)
        for i in range(len(specs))
    ]
    for t in threads:
        t.start()

    def relay() -> None:  # the caller's stop ends every stream
        while not done.is_set():
            if stop is not None and stop.wait(0.1):
                end_all.set()
                return
            if stop is None:
                done.wait(0.5)

    relayer = threading.Thread(target=relay, daemon=True)
    relayer.start()
    for t in threads:
        t.join()
    done.set()
    relayer.join(timeout=2)
    out = [r for r in results if r is not None]
    assert len(out) == len(specs)
    return out


def _run(
    dsn: str,
    spec: BenchSpec,
    pgbench: str,
    env: dict[str, str],
    app_name: str,
    rundir: Path,
    on_sample: Callable[[float, float], None] | None,
    stop: threading.Event | None,
    watch: Callable[[ProgressSample], str | None] | None,
) -> BenchResult:
    script_paths: list[tuple[Path, int]] = []
    for i, (sql_text, weight) in enumerate(spec.scripts or []):
        path = rundir / f"script{i}.sql"
        path.write_text(sql_text if sql_text.endswith("\n") else sql_text + "\n")
        script_paths.append((path, weight))
    try:
        before = _read_stats(dsn)
    except psycopg.Error as exc:
        return BenchResult.failure(
            f"cannot connect to {mask_dsn(dsn)}: {scrub(str(exc).strip(), dsn)}"
        )
    argv = build_command(spec, pgbench, rundir, script_paths)
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=rundir,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
    except OSError as exc:
        return BenchResult.failure(
            f"cannot start pgbench ({pgbench}): {exc.strerror or exc}", fatal=True
        )
    assert proc.stdout is not None
    assert proc.stderr is not None
    q: queue.Queue[tuple[str, str | None]] = queue.Queue()
    readers = [
        threading.Thread(target=_pump, args=(proc.stdout, "out", q), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, "err", q), daemon=True),
    ]
    for r in readers:
        r.start()
    progress: list[ProgressSample] = []
    stdout_lines: list[str] = []
    stderr_lines: list[str] = []
    open_streams = 2
    stopped = False
    timed_out = False
    early: str | None = None
    signalled_at: float | None = None
    pending = list(_STOP_SIGNALS)
    limit = spec.duration_s + _FINISH_GRACE_S
    while open_streams:
        now = time.monotonic()
        if signalled_at is None and (
            (stop is not None and stop.is_set()) or early is not None or now - t0 > limit
        ):
            stopped = stop is not None and stop.is_set()
            timed_out = not stopped and early is None
            signalled_at = now
        if signalled_at is not None and pending and now - signalled_at >= pending[0][0]:
            _signal(proc, pending.pop(0)[1])
        try:
            name, line = q.get(timeout=0.1)
        except queue.Empty:
            continue
        if line is None:
            open_streams -= 1
        elif name == "out":
            stdout_lines.append(line)
        else:
            sample = parse_progress_line(line)
            if sample is None:
                stderr_lines.append(line)
                continue
            progress.append(sample)
            if on_sample is not None:
                try:
                    on_sample(sample.time_s, sample.tps)
                except Exception:  # a display callback must not kill the measurement
                    log.exception("on_sample callback failed")
            if watch is not None and early is None and signalled_at is None:
                try:
                    early = watch(sample)
                except Exception:  # a broken guard must not kill the measurement either
                    log.exception("watch callback failed")
    returncode = proc.wait()
    elapsed = time.monotonic() - t0
    summary = parse_summary("\n".join(stdout_lines))
    summary.aborted = summary.aborted or any("Run was aborted" in ln for ln in stderr_lines)
    tx = _read_logs(rundir)
    lat = latency_stats(tx, spec.warmup_s)
    try:
        # After a stop nobody waits for the backends to report; return at once.
        after = _read_stats(dsn, None if stopped or early else app_name)
        metrics = {k: after[k] - before[k] for k in after if k in before}
    except psycopg.Error:
        metrics = {}  # the server went away: the run's own result says so
    all_samples = [s.tps for s in progress]
    # Exactly the seconds warmup_s+1 .. duration_s: what the caller asked to measure.
    post = [s for s in progress if spec.warmup_s + 0.5 <= s.time_s <= spec.duration_s + 0.5]
    samples = [s.tps for s in post]
    p95_samples = [
        lat.p95_per_second[k] for k in (round(s.time_s) for s in post) if k in lat.p95_per_second
    ]
    error: str | None = None
    if stopped:
        error = "stopped before completion"
    elif early is not None:
        error = f"stopped early: {early}"
    elif timed_out:
        error = f"pgbench did not finish within {limit:.0f} s and was killed"
    elif returncode != 0:
        error = scrub(_error_text(stderr_lines, returncode), dsn)
    elif not progress and spec.duration_s >= 3:
        # -P 1 prints a line a second: a run this long without one is not output we can read.
        said = "; ".join(ln.strip() for ln in (stderr_lines + stdout_lines)[:3] if ln.strip())
        error = scrub(
            f"{pgbench} exited normally but printed no progress line knobtune can read "
            f"(is it pgbench 13-17?); its output began: {said[:300] or '(nothing)'}",
            dsn,
        )
    failed = summary.failed if summary.failed is not None else lat.failed
    return BenchResult(
        ok=error is None,
        error=error,
        samples=samples,
        all_samples=all_samples,
        latency_p95_samples=p95_samples,
        tps=(sum(samples) / len(samples)) if samples else summary.tps,
        latency_mean_ms=lat.mean_ms if lat.mean_ms is not None else summary.latency_avg_ms,
        latency_p95_ms=lat.p95_ms,
        latency_p99_ms=lat.p99_ms,
        transactions=summary.transactions or 0,
        failed_transactions=failed,
        duration_s=elapsed,
        stopped=stopped,
        db_metrics=metrics,
        progress=progress,
        summary=summary,
        early_stop=early if not stopped else None,
        tx=tx if len(tx) or tx.failed_script.size else None,
        log_sampling=spec.sampling_rate(),
    )


def _signal(proc: subprocess.Popen[str], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


def _read_logs(rundir: Path) -> TxLog:
    def texts() -> Iterable[str]:
        for path in sorted(rundir.glob("pgbench_log.*")):
            yield path.read_text(errors="replace")

    try:
        return read_tx_log(texts())
    except OSError:
        return TxLog.empty()


# -- data ------------------------------------------------------------------------
def _has_data(dsn: str, scale: int) -> bool:
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT to_regclass('pgbench_accounts') IS NOT NULL"
                " AND to_regclass('pgbench_tellers') IS NOT NULL"
                " AND to_regclass('pgbench_history') IS NOT NULL"
                " AND to_regclass('pgbench_branches') IS NOT NULL"
            ).fetchone()
            if not row or not row[0]:
                return False
            count = conn.execute("SELECT count(*) FROM pgbench_branches").fetchone()
            return bool(count and count[0] == scale)
    except psycopg.Error as exc:
        raise PgbenchError(
            f"cannot connect to {mask_dsn(dsn)}: {scrub(str(exc).strip(), dsn)}"
        ) from None


def init_data(
    dsn: str,
    scale: int,
    *,
    foreign_keys: bool = False,
    unlogged: bool = False,
    force: bool = False,
    timeout_s: float | None = None,
) -> bool:
    """``pgbench -i`` at ``scale``; skipped (False) when the tables already hold that scale.

    Raises PgbenchError with pgbench's message (password scrubbed).
    """
    if scale < 1:
        raise ValueError("scale must be >= 1")
    if not force and _has_data(dsn, scale):
        return False
    argv = [find_pgbench(), "-i", "-q", "-s", str(scale)]
    if foreign_keys:
        argv.append("--foreign-keys")
    if unlogged:
        argv.append("--unlogged-tables")
    try:
        res = subprocess.run(
            argv,
            env=libpq_env(dsn),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise PgbenchError(f"pgbench -i -s {scale} did not finish within {timeout_s} s") from None
    if res.returncode != 0:
        detail = _error_text(res.stderr.splitlines(), res.returncode)
        raise PgbenchError(scrub(f"pgbench -i -s {scale} failed: {detail}", dsn))
    return True
