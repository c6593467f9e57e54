"""Record long-query and TPC-B runs on real PostgreSQL for the verdict's figures.

``python -m bench.record_long [--out tests/data] [--runs 9] [--seconds 40]``

What it records (issue 13, part 4): a disposable sandbox (app.postgres.sandbox.Sandbox)
loads a reporting dataset (1M fact rows, a 300k-row dimension) and runs a reporting mix of
three long queries at 2 clients with run_bench (0.1-3 s each, depending on the config
and the host's load): a hash aggregate over ~630k groups, a NOT IN over a 100k-row
subquery, a sort under a window function (``QUERIES``), interleaving

* config A (work_mem 1MB): the hashes and the sort spill, and the NOT IN subplan does not
  fit its hash: PostgreSQL scans the materialised subquery for every outer row;
* config B (work_mem 64MB, or ``--b``, e.g. ``hash_mem_multiplier=8``): the NOT IN
  subplan is hashed (the measured effect is in bench/optimizer.py's figures);

A B A B ..., ``--runs`` each. Every run's transactions (label, start, latency) and its
per-second pgbench samples are saved, with the host's 1-minute load average before and
after it: the machine is shared with other test suites, so this is a busy-server
recording. Then TPC-B (scale 5, 4 clients, synchronous_commit on vs off, the latter a real
gain) is recorded the same way, but only as per-run StreamStats plus per-second samples
(its raw log runs to ~100k transactions a run).

Files: ``long-query-runs.json.gz`` and ``tpcb-runs.json.gz`` in ``--out`` (with
``--tag T``: ``long-query-runs-T.json.gz`` ...). Run under ``nice -n -10`` (as root) the
sandbox server and pgbench inherit the priority: the other jobs on the host still run,
but take CPU from the recording far less (the "niced" recording in tests/data).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

# `python bench/record_long.py` puts bench/ first on sys.path, where bench/optimizer.py
# would shadow the optimizer package: the repository comes first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.postgres.pgbench import BenchResult, BenchSpec, init_data, run_bench
from app.postgres.sandbox import Sandbox
from bench.common import run_main
from optimizer.evidence import StreamStat, run_level, summarize_stream

FACT_ROWS = 1_000_000
DIM_ROWS = 300_000

LOAD_SQL = f"""
DROP TABLE IF EXISTS facts, dim;
CREATE TABLE dim AS
  SELECT k, (k % 40) AS cat, md5(k::text) AS name FROM generate_series(1, {DIM_ROWS}) k;
CREATE TABLE facts AS
  SELECT i AS id, (hashint4(i) & 1048575) AS g,
         1 + (hashint4(i + 7) & 2147483647) % {DIM_ROWS} AS k,
         (hashint4(i + 13) & 65535) / 7.0 AS v, i % 97 AS w
  FROM generate_series(1, {FACT_ROWS}) i;
ANALYZE dim; ANALYZE facts;
"""

# name -> SQL; designed shares are equal (weight 1 each)
QUERIES: dict[str, str] = {
    "agg": "SELECT count(*) FROM (SELECT g, sum(v), count(*) FROM facts GROUP BY g) s;",
    # NOT IN over 100k rows: hashed when the hash fits in work_mem x hash_mem_multiplier,
    # else a plain subplan that scans the materialised list for every outer row
    "notin": (
        "SELECT count(*) FROM generate_series(1000001, 1000060) x"
        " WHERE x NOT IN (SELECT k FROM facts WHERE w < 10);"
    ),
    "sort": (
        "SELECT max(r) FROM (SELECT row_number() OVER (ORDER BY v, id) AS r"
        " FROM facts WHERE w < 60) s;"
    ),
}
BASE = {
    "shared_buffers": "512MB",
    "max_parallel_workers_per_gather": "0",  # 2 clients on 2 shared cores: no parallelism
    "jit": "off",
    "checkpoint_timeout": "30min",
    "max_wal_size": "4GB",
}
CONFIGS = {"A": {"work_mem": "1MB"}, "B": {"work_mem": "64MB"}}
TPCB_CONFIGS = {"A": {"synchronous_commit": "on"}, "B": {"synchronous_commit": "off"}}


def _set(sb: Sandbox, settings: dict[str, str]) -> None:
    with psycopg.connect(sb.dsn, autocommit=True) as conn:
        for name, value in settings.items():
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")
        time.sleep(0.5)
        for name, value in settings.items():
            row = conn.execute(f"SHOW {name}").fetchone()
            if row is None or str(row[0]) != value:
                raise SystemExit(f"{name} did not become {value}: {row}")


def _loadavg() -> float:
    return os.getloadavg()[0]


def _run(sb: Sandbox, spec: BenchSpec, names: list[str]) -> tuple[BenchResult, dict[str, Any]]:
    before = _loadavg()
    res = run_bench(sb.dsn, spec)
    if not res.ok or res.tx is None:
        raise SystemExit(f"pgbench failed: {res.error}")
    tx = res.tx
    labels = [names[int(s)] for s in tx.script]
    failed: dict[str, int] = {}
    for s in tx.failed_script:
        failed[names[int(s)]] = failed.get(names[int(s)], 0) + 1
    rec: dict[str, Any] = {
        "loadavg_before": round(before, 2),
        "loadavg_after": round(_loadavg(), 2),
        "duration_s": spec.duration_s,
        "warmup_s": spec.warmup_s,
        "clients": spec.clients,
        "samples": [round(x, 3) for x in res.samples],
        "failed": failed,
        "labels": labels,
        "start_s": [round(float(x), 4) for x in tx.start_s],
        "latency_ms": [round(float(x), 3) for x in tx.latency_ms],
    }
    return res, rec


def _load_reporting(sb: Sandbox, seconds: int, small: bool = False) -> BenchSpec:
    """Load the reporting dataset; the spec of one long-query run (``small``: one client,
    a 1 s warm-up: the path, at a quarter of the CPU)."""
    t = time.monotonic()
    with psycopg.connect(sb.dsn, autocommit=True) as conn:
        conn.execute(LOAD_SQL)  # type: ignore[arg-type]
    print(f"loaded {FACT_ROWS} facts in {time.monotonic() - t:.0f} s", flush=True)
    return BenchSpec(
        builtin=None,
        scripts=[(QUERIES[n], 1) for n in QUERIES],
        clients=1 if small else 2,
        jobs=1 if small else 2,
        duration_s=seconds,
        warmup_s=1 if small else 3,
        log_sampling=1.0,
    )


def _stream(rec: dict[str, Any]) -> StreamStat:
    return summarize_stream(
        "reporting",
        clients=int(rec["clients"]),
        shares=dict.fromkeys(QUERIES, 1.0),
        start_s=rec["start_s"],
        latency_ms=rec["latency_ms"],
        labels=rec["labels"],
        failed=rec["failed"],
        warmup_s=float(rec["warmup_s"]),
    )


def _settings(text: str) -> dict[str, str]:
    """``64MB`` (a work_mem) or ``name=value;name=value``."""
    if "=" not in text:
        return {"work_mem": text}
    return dict(x.split("=", 1) for x in text.split(";"))  # type: ignore[misc]


def _complete_a(sb: Sandbox, others: list[dict[str, str]]) -> None:
    """Config A names every setting another config changes (at the server's value), so
    that going back to A undoes it."""
    with psycopg.connect(sb.dsn) as conn:
        for name in {k for c in others for k in c} - set(CONFIGS["A"]):
            row = conn.execute(f"SHOW {name}").fetchone()
            assert row is not None
            CONFIGS["A"][name] = str(row[0])


def probe(sb: Sandbox, candidates: list[str], seconds: int) -> None:
    """One run of A and of each candidate config B, A again at the end: the effect sizes,
    to pick a B whose effect is the size a target is about."""
    spec = _load_reporting(sb, seconds)
    names = list(QUERIES)
    levels: list[tuple[str, float]] = []
    _complete_a(sb, [_settings(c) for c in candidates])
    a = ";".join(f"{k}={v}" for k, v in CONFIGS["A"].items())
    for wm in [a, *candidates, a]:
        _set(sb, {**CONFIGS["A"], **_settings(wm)})
        _run(
            sb, BenchSpec(**{**spec.__dict__, "duration_s": min(10, seconds), "warmup_s": 0}), names
        )
        _, rec = _run(sb, spec, names)
        st = _stream(rec)
        level = run_level((st,), "throughput").centre
        levels.append((wm, level))
        means = {x.label: round(x.mean_ms or 0) for x in st.scripts}
        print(f"{wm}: level {level:.3f} tx/s {means} load {rec['loadavg_before']}", flush=True)
    mean_a = (levels[0][1] + levels[-1][1]) / 2
    for wm, level in levels[1:-1]:
        print(f"{wm}: {level / mean_a - 1:+.1%} against A (mean of the two A runs)")


def record_long(sb: Sandbox, runs: int, seconds: int, small: bool = False) -> dict[str, Any]:
    spec = _load_reporting(sb, seconds, small)
    names = list(QUERIES)
    # one short run each to warm the cache and print the effect
    for cfg in ("A", "B"):
        _set(sb, CONFIGS[cfg])
        warm_s = 1 if small else min(10, seconds)
        warm = BenchSpec(**{**spec.__dict__, "duration_s": warm_s, "warmup_s": 0})
        _, rec = _run(sb, warm, names)
        by = {
            n: [x for x, lab in zip(rec["latency_ms"], rec["labels"], strict=True) if lab == n]
            for n in names
        }
        print(cfg, {n: round(sum(v) / len(v)) if v else None for n, v in by.items()}, flush=True)
    out: list[dict[str, Any]] = []
    for i in range(runs):
        for cfg in ("A", "B"):
            _set(sb, CONFIGS[cfg])
            _, rec = _run(sb, spec, names)
            rec["config"] = cfg
            out.append(rec)
            st = _stream(rec)
            means = {s.label: round(s.mean_ms or 0) for s in st.scripts}
            print(
                f"long {i + 1}/{runs} {cfg}: n={st.transactions} {means} "
                f"load {rec['loadavg_before']}",
                flush=True,
            )
    return {
        "about": "reporting mix, 2 clients, interleaved A/B on a shared (busy) 2-core host; "
        "recorded by bench/record_long.py",
        "queries": QUERIES,
        "shares": dict.fromkeys(names, 1.0),
        "base_settings": BASE,
        "configs": CONFIGS,
        "runs": out,
    }


def record_tpcb(sb: Sandbox, runs: int, seconds: int, small: bool = False) -> dict[str, Any]:
    init_data(sb.dsn, 1 if small else 5)
    spec = BenchSpec(
        builtin="tpcb-like",
        clients=2 if small else 4,
        jobs=1 if small else 2,
        duration_s=seconds,
        warmup_s=1 if small else 3,
        log_sampling=1.0,
    )
    out: list[dict[str, Any]] = []
    for i in range(runs):
        for cfg in ("A", "B"):
            _set(sb, TPCB_CONFIGS[cfg])
            res, rec = _run(sb, spec, ["tpcb-like"])
            st = summarize_stream(
                "tpcb",
                clients=spec.clients,
                shares={"tpcb-like": 1.0},
                start_s=rec["start_s"],
                latency_ms=rec["latency_ms"],
                labels=rec["labels"],
                failed=rec["failed"],
                warmup_s=spec.warmup_s,
            )
            out.append(
                {
                    "config": cfg,
                    "loadavg_before": rec["loadavg_before"],
                    "loadavg_after": rec["loadavg_after"],
                    "duration_s": seconds,
                    "warmup_s": spec.warmup_s,
                    "samples": rec["samples"],
                    "latency_p95_samples": [round(x, 3) for x in res.latency_p95_samples],
                    "streams": [st.to_json()],
                }
            )
            print(
                f"tpcb {i + 1}/{runs} {cfg}: {st.transactions} tx, load {rec['loadavg_before']}",
                flush=True,
            )
    return {
        "about": "pgbench tpcb-like scale 5, 4 clients, interleaved A/B on a shared (busy) "
        "2-core host; recorded by bench/record_long.py",
        "configs": TPCB_CONFIGS,
        "runs": out,
    }


def _save(path: Path, data: dict[str, Any]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"))
    print(f"wrote {path} ({path.stat().st_size} bytes)", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, default=Path("tests/data"))
    ap.add_argument("--runs", type=int, default=9, help="runs per config (long queries)")
    ap.add_argument("--seconds", type=int, default=40, help="length of a long-query run")
    ap.add_argument("--tpcb-runs", type=int, default=5)
    ap.add_argument("--tpcb-seconds", type=int, default=15)
    ap.add_argument("--tag", default="", help="suffix of the file names")
    ap.add_argument(
        "--b",
        default=CONFIGS["B"]["work_mem"],
        help="config B: a work_mem, or name=value;name=value (A's settings stay unless named)",
    )
    ap.add_argument(
        "--probe",
        default="",
        help="comma-separated configs as for --b: measure one run of each against A and stop",
    )
    ap.add_argument(
        "--small",
        action="store_true",
        help="the path at its smallest (tests): one client for the long queries, TPC-B at "
        "scale 1 and 2 clients, 1 s warm-ups",
    )
    args = ap.parse_args(argv)
    tag = f"-{args.tag}" if args.tag else ""
    CONFIGS["B"] = _settings(args.b)
    nice = os.nice(0)  # the niceness the server and pgbench inherit
    args.out.mkdir(parents=True, exist_ok=True)
    with Sandbox.create(settings=BASE) as sb:
        if args.probe:
            probe(sb, args.probe.split(","), args.seconds)
            return 0
        _complete_a(sb, [CONFIGS["B"]])
        CONFIGS["B"] = {**CONFIGS["A"], **CONFIGS["B"]}
        if args.runs:
            data = record_long(sb, args.runs, args.seconds, args.small)
            _save(args.out / f"long-query-runs{tag}.json.gz", {**data, "nice": nice})
        if args.tpcb_runs:
            data = record_tpcb(sb, args.tpcb_runs, args.tpcb_seconds, args.small)
            _save(args.out / f"tpcb-runs{tag}.json.gz", {**data, "nice": nice})
    return 0


if __name__ == "__main__":
    run_main(main)
