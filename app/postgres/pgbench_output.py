"""Parsers of pgbench's output: progress lines, the final summary, the per-transaction log.

Pure text and arrays, no process: app/postgres/pgbench.py runs pgbench and feeds these.
Latency percentiles come from pgbench's per-transaction log (``--log``), never from
averages: the aggregate log only has per-interval sums. The log is kept as arrays
(:class:`TxLog`: client, transaction number, script, start, latency of every
transaction) for per-transaction evidence (app/workloads/stream_run.py).
"""

from __future__ import annotations

import io
import math
import re
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

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
