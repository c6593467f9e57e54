"""Parsers of pgbench output: real PostgreSQL 15 captures and documented 13/14/16/17 formats."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.postgres.pgbench_output import (
    LatencyStats,
    LogEntry,
    ProgressSample,
    Summary,
    _log_columns,
    latency_stats,
    parse_log_line,
    parse_progress_line,
    parse_summary,
)

DATA = Path(__file__).parent / "data"


def read(name: str) -> str:
    return (DATA / name).read_text()


def progress(name: str) -> list[ProgressSample]:
    out = [parse_progress_line(line) for line in read(name).splitlines()]
    return [s for s in out if s is not None]


# -- progress lines ------------------------------------------------------------------
def test_progress_pg15_captured() -> None:
    samples = progress("pg15_tpcb.stderr")
    assert [s.time_s for s in samples] == [1.0, 2.0, 3.0]
    assert samples[0] == ProgressSample(
        time_s=1.0, tps=2519.4, latency_ms=1.569, stddev_ms=1.067, failed=0
    )


def test_progress_pg15_lag_and_skipped() -> None:
    s = progress("pg15_rate_limit.stderr")
    assert len(s) == 3
    assert (s[0].tps, s[0].lag_ms, s[0].skipped, s[0].failed) == (1423.6, 0.159, 16, 0)


def test_progress_pg15_retried() -> None:
    s = progress("pg15_max_tries.stderr")
    assert [(x.retried, x.retries) for x in s] == [(0, 0), (0, 0)]


def test_progress_zero_transaction_intervals() -> None:
    s = progress("pg15_idle.stderr")
    assert [x.tps for x in s] == [0.0, 0.0, 1.0, 0.0, 0.0]
    assert s[0].latency_ms is None
    assert s[0].stddev_ms is None
    assert s[2].latency_ms == pytest.approx(2517.291)


def test_progress_pg13_formats_with_nan() -> None:
    s = progress("pg13_docs.stderr")
    assert len(s) == 6
    assert s[0].failed is None  # no failed column before 15
    assert (s[2].lag_ms, s[3].lag_ms, s[3].skipped) == (0.211, 0.301, 3)
    for empty in s[4:]:
        assert empty.tps == 0.0
        assert empty.latency_ms is None


def test_progress_pg17_formats() -> None:
    s = progress("pg17_docs.stderr")
    assert [(x.failed, x.retried, x.retries) for x in s[:2]] == [(0, 2, 2), (1, 3, 4)]
    assert (s[2].lag_ms, s[2].skipped, s[2].retried) == (0.120, 4, 1)
    assert s[3].time_s == pytest.approx(1732012345.678)  # --progress-timestamp


@pytest.mark.parametrize(
    "line",
    [
        "",
        "starting vacuum...end.",
        "progress: soon",
        "progress: 1.0 s, many tps, lat 1 ms stddev 1",
        "pgbench: error: client 0 aborted",
        "progress: 1.0 s, 10.0 tps, lat 1.0 ms stddev 1.0, 0 failed, extra",
    ],
)
def test_progress_rejects_other_lines(line: str) -> None:
    assert parse_progress_line(line) is None


# -- final report --------------------------------------------------------------------
def test_summary_pg15_captured() -> None:
    s = parse_summary(read("pg15_tpcb.stdout"))
    assert s.transaction_type == "<builtin: TPC-B (sort of)>"
    assert (s.scale, s.query_mode, s.clients, s.threads, s.max_tries, s.duration_s) == (
        2,
        "prepared",
        4,
        2,
        1,
        3,
    )
    assert (s.transactions, s.failed) == (6775, 0)
    assert s.tps == pytest.approx(2256.5935)
    assert (s.latency_avg_ms, s.latency_stddev_ms, s.initial_connection_ms) == (1.762, 2.843, 7.562)
    assert s.tps_including_connections is None
    assert not s.aborted


def test_summary_pg15_rate_limit_and_retries() -> None:
    s = parse_summary(read("pg15_rate_limit.stdout"))
    assert (s.transactions, s.skipped) == (4391, 46)
    assert s.tps == pytest.approx(1473.29959)
    m = parse_summary(read("pg15_max_tries.stdout"))
    assert (m.max_tries, m.retried, m.retries, m.transactions) == (3, 0, 0, 6931)


def test_summary_pg15_aborted_run() -> None:
    s = parse_summary(read("pg15_aborted.stdout") + read("pg15_aborted.stderr"))
    assert s.aborted
    assert s.transactions == 21795


def test_summary_pg13_connections_establishing() -> None:
    s = parse_summary(read("pg13_docs.stdout"))
    assert s.tps == pytest.approx(622.977698)  # excluding connections establishing
    assert s.tps_including_connections == pytest.approx(618.764555)
    assert (s.transactions, s.transactions_planned) == (10000, 10000)
    assert s.failed is None
    assert s.max_tries is None
    assert s.initial_connection_ms is None


def test_summary_pg13_aborted() -> None:
    s = parse_summary(read("pg13_aborted.stdout") + read("pg13_aborted.stderr"))
    assert s.aborted
    assert s.transactions == 3301
    assert s.tps == pytest.approx(2496.31189)


def test_summary_pg14() -> None:
    s = parse_summary(read("pg14_docs.stdout"))
    assert s.tps == pytest.approx(896.967014)
    assert s.initial_connection_ms == 45.758
    assert s.failed is None


def test_summary_pg16() -> None:
    s = parse_summary(read("pg16_docs.stdout"))
    assert s.tps == pytest.approx(896.967014)
    assert (s.failed, s.max_tries, s.latency_avg_ms) == (0, 1, 11.013)


def test_summary_pg17_multiple_scripts() -> None:
    s = parse_summary(read("pg17_docs.stdout") + read("pg17_docs.stderr"))
    # Totals, not the per-script " - " lines that repeat the same labels.
    assert (s.transactions, s.failed, s.retried, s.retries) == (212345, 17, 95, 104)
    assert s.latency_avg_ms == 2.259
    assert s.tps == pytest.approx(3539.036522)
    assert s.aborted


def test_summary_of_garbage_is_empty() -> None:
    assert parse_summary("connection refused\n") == Summary()


# -- per-transaction log -------------------------------------------------------------
def test_log_lines() -> None:
    assert parse_log_line("0 1 6511 0 1795280285 688166") == LogEntry(
        1795280285.688166, 6.511, client=0, txno=1, script=0
    )
    with_lag = parse_log_line("0 1 2528 0 1795280288 759580 109")
    assert with_lag is not None
    assert with_lag.latency_ms == 2.528
    assert parse_log_line("3 17 failed 1 1795280288 759580 0 2") == LogEntry(
        1795280288.75958, None, failed=True, client=3, txno=17, script=1
    )
    assert parse_log_line("3 17 skipped 0 1795280288 759580 5000") == LogEntry(
        1795280288.75958, None, skipped=True, client=3, txno=17
    )
    assert parse_log_line("garbage") is None
    assert parse_log_line("0 1 x 0 1 2") is None


def test_latency_stats_from_captured_log() -> None:
    lines = read("pg15_tpcb.txlog").splitlines()
    stats = latency_stats(lines, warmup_s=0)
    lats = sorted(e.latency_ms for e in map(parse_log_line, lines) if e and e.latency_ms)
    assert stats.logged == len(lats) == len(lines)
    assert stats.mean_ms == pytest.approx(sum(lats) / len(lats))
    assert lats[0] <= stats.p95_ms <= stats.p99_ms <= lats[-1]  # type: ignore[operator]
    assert set(stats.p95_per_second) == {1}  # 150+150 lines span well under a second


@pytest.mark.parametrize(
    ("extra", "in_c"),
    [
        ([], True),  # as captured
        (["3 17 failed 0 1795280288 759580", "3 18 skipped 0 1795280288 759590"], True),
        (["0 999 25"], False),  # a torn last line: the per-line parser takes over
    ],
)
def test_latency_stats_in_c_match_the_line_parser(extra: list[str], in_c: bool) -> None:
    lines = read("pg15_tpcb.txlog").splitlines() + extra
    assert (_log_columns("\n".join(lines)) is not None) == in_c
    fast = latency_stats(lines, warmup_s=0)
    slow = latency_stats_by_line(lines)
    assert fast.logged == slow.logged > 0
    assert fast.failed == slow.failed == sum(" failed " in x for x in extra)
    assert fast.mean_ms == pytest.approx(slow.mean_ms)
    assert fast.p99_ms == pytest.approx(slow.p99_ms)


def latency_stats_by_line(lines: list[str]) -> LatencyStats:
    ok = [e for e in map(parse_log_line, lines) if e is not None]
    lats = [e.latency_ms for e in ok if e.latency_ms is not None]
    return LatencyStats(
        mean_ms=sum(lats) / len(lats),
        p99_ms=float(np.percentile(lats, 99)),
        logged=len(lats),
        failed=sum(e.failed for e in ok),
    )


def test_latency_stats_per_second_and_warmup() -> None:
    # Transactions of 1 ms ending every 10 ms for 3 s; second 3 is ten times slower.
    lines = []
    for i in range(1, 300):
        end = 1000 + i / 100
        lat_us = 10000 if end > 1002 else 1000
        lines.append(f"0 {i} {lat_us} 0 {int(end)} {round((end % 1) * 1e6)}")
    stats = latency_stats(lines, warmup_s=1)
    assert sorted(stats.p95_per_second) == [2, 3]
    assert stats.p95_per_second[2] == pytest.approx(1.0)
    assert stats.p95_per_second[3] == pytest.approx(10.0)
    assert latency_stats([], 0).p95_ms is None
    assert latency_stats(["0 1 failed 0 1 2"], 0).failed == 1


# -- fuzz ----------------------------------------------------------------------------
_progressish = st.builds(
    lambda parts: "progress: " + " ".join(parts),
    st.lists(
        st.sampled_from(
            [
                "1.0",
                "s,",
                "nan",
                "-nan",
                "tps,",
                "lat",
                "ms",
                "stddev",
                "0",
                "failed,",
                "lag",
                "skipped",
                "retried,",
                "retries",
                "inf",
                "1e309",
                ",",
                "12.5",
            ]
        ),
        max_size=14,
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), _progressish))
def test_fuzz_progress_never_crashes(line: str) -> None:
    s = parse_progress_line(line)
    if s is not None:
        assert math.isfinite(s.time_s)
        assert math.isfinite(s.tps)
        assert s.tps >= 0
        assert s.latency_ms is None or math.isfinite(s.latency_ms)


_summaryish = st.lists(
    st.sampled_from(
        [
            "tps = nan (without initial connection time)",
            "tps = 12.5 (including connections establishing)",
            "number of transactions actually processed: 99999999999999999999999/",
            "number of failed transactions: x",
            "latency average = -nan ms",
            "latency average: 1e5 ms",
            "scaling factor: ",
            "Run was aborted",
            "duration: 9 s",
        ]
    ),
    max_size=8,
).map("\n".join)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=500), _summaryish))
def test_fuzz_summary_never_crashes(text: str) -> None:
    s = parse_summary(text)
    assert s.tps is None or math.isfinite(s.tps)
    assert s.latency_avg_ms is None or math.isfinite(s.latency_avg_ms)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=60), max_size=20))
def test_fuzz_log_never_crashes(lines: list[str]) -> None:
    stats = latency_stats(lines, warmup_s=0)
    assert stats.p95_ms is None or math.isfinite(stats.p95_ms)
