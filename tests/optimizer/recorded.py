"""Recorded runs on real PostgreSQL (bench/record_long.py), as the verdict sees them.

Shared by the tests and bench/optimizer.py. Each run becomes a :class:`Recorded`: its
config, its place in the recording (runs are interleaved A B A B ...) and two levels,
one from its transactions (optimizer/evidence.py, as the descent computes it when a
measurement carries streams) and one from its per-second pgbench samples
(optimizer/verdict.run_stat, the per-second path).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optimizer.evidence import StreamStat, run_level, summarize_stream
from optimizer.verdict import RUN_SD, Run, RunStat, compare, compare_paired, run_stat

DATA = Path(__file__).resolve().parents[1] / "data"
LONG = DATA / "long-query-runs.json.gz"  # the busy host, other test suites running
TPCB = DATA / "tpcb-runs.json.gz"
# the same under nice -n -10 (the other jobs still ran, with less of the CPU)
LONG_NICED = DATA / "long-query-runs-niced.json.gz"
TPCB_NICED = DATA / "tpcb-runs-niced.json.gz"
# and with config B at work_mem 8MB instead of 64MB, 30 s runs (bench/record_long.py)
LONG_WM8 = DATA / "long-query-runs-niced-wm8.json.gz"
# the same as LONG_WM8 (8+8 runs of 30 s) on the host with no other job running, niced
LONG_QUIET = DATA / "long-query-runs-quiet.json.gz"
TPCB_QUIET = DATA / "tpcb-runs-quiet.json.gz"
# config B = hash_mem_multiplier 4 (the NOT IN hashed, the rest as in A): a +25-30% effect
# (bench/record_long.py --probe), 8+8 runs of 30 s, the host quiet (load 1.8-2.1)
LONG_QUIET_HM4 = DATA / "long-query-runs-quiet-hm4.json.gz"
RECORDINGS = {
    "long_queries_busy": LONG,
    "tpcb_busy": TPCB,
    "long_queries_niced": LONG_NICED,
    "long_queries_niced_wm8": LONG_WM8,
    "tpcb_niced": TPCB_NICED,
    "long_queries_quiet_wm8": LONG_QUIET,
    "tpcb_quiet": TPCB_QUIET,
    "long_queries_quiet_hm4": LONG_QUIET_HM4,
}


@dataclass(frozen=True)
class Recorded:
    config: str
    t: float  # position in the recording
    tx: RunStat  # level from the run's transactions
    sec: RunStat  # level from its per-second samples
    streams: tuple[StreamStat, ...]
    loadavg: float


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def streams_of(run: dict[str, Any], shares: dict[str, float] | None) -> tuple[StreamStat, ...]:
    if "streams" in run:
        return tuple(StreamStat.from_json(s) for s in run["streams"])
    assert shares is not None
    stream = summarize_stream(
        "reporting",
        clients=int(run["clients"]),
        shares=shares,
        start_s=run["start_s"],
        latency_ms=run["latency_ms"],
        labels=run["labels"],
        failed=run["failed"],
        warmup_s=float(run["warmup_s"]),
    )
    return (stream,)


def recorded_runs(path: Path) -> list[Recorded]:
    """Every run of a recording, in the order it ran."""
    data = load(path)
    shares = data.get("shares")
    out = []
    for i, run in enumerate(data["runs"]):
        streams = streams_of(run, shares)
        out.append(
            Recorded(
                config=run["config"],
                t=float(i),
                tx=run_level(streams, "throughput"),
                sec=run_stat(run["samples"]),
                streams=streams,
                loadavg=float(run["loadavg_before"]),
            )
        )
    return out


def sequential(
    inc: list[Run], cand: list[Run], run_sd: float = RUN_SD, paired: bool = False
) -> bool:
    """Kept at some look after 1+1, 2+2, ... runs (the descent judges after every run)."""
    verdict = compare_paired if paired else compare
    n = min(len(inc), len(cand))
    return any(verdict(inc[:k], cand[:k], run_sd=run_sd).keep for k in range(1, n + 1))


def adjacent_windows(
    runs: list[Recorded],
    level: str,
    max_runs: int = 3,
    run_sd: float = RUN_SD,
    paired: bool = False,
) -> tuple[list[bool], list[bool]]:
    """(no-op kept, real effect kept) per window of runs next to each other in time, as
    the descent compares them; ``level`` "tx" (per transaction) or "sec" (per second).

    Real effect: every window of ``2k`` consecutive runs of the recording (A B A B ...:
    k of each), judged after 1+1 ... k+k. No-op: every ``2k`` consecutive runs of one
    config, alternately incumbent and candidate, both ways round (numbered 0, 1, 2 ... so
    that a paired verdict sets each run beside the next).
    """
    seq = [(r.config, Run(r.t, r.tx if level == "tx" else r.sec)) for r in runs]
    n_a = sum(c == "A" for c, _ in seq)
    k = min(max_runs, n_a, len(seq) - n_a)
    real = []
    for s in range(len(seq) - 2 * k + 1):
        w = seq[s : s + 2 * k]
        a, b = [r for c, r in w if c == "A"], [r for c, r in w if c == "B"]
        if len(a) == len(b) == k:
            real.append(sequential(a, b, run_sd, paired))
    noop = []
    for cfg in ("A", "B"):
        same = [r for c, r in seq if c == cfg]
        m = min(k, len(same) // 2)
        for s in range(len(same) - 2 * m + 1):
            w = [Run(float(i), r.stat) for i, r in enumerate(same[s : s + 2 * m])]
            noop.append(sequential(w[0::2], w[1::2], run_sd, paired))
            noop.append(sequential(w[1::2], w[0::2], run_sd, paired))
    return noop, real
