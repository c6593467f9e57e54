"""TPC-H at one scale on a fresh default-config sandbox: load time, size, per-query times.

Loads ``--scale`` with :class:`app.workloads.tpch.Tpch` (DuckDB dbgen, COPY, indexes,
VACUUM ANALYZE), times a second prepare() (the re-use path), then runs each of the 22
queries once, in order, with ``--timeout`` seconds as statement_timeout. Prints JSON:
``load_s``, ``rows``, ``db_mb`` (pg_database_size), ``reuse_s``, ``query_s`` per query
(null when cancelled) and ``pass_s`` (the default set's sum). Pick the tuning scale from
``pass_s``: a run of D seconds holds about D / pass_s power passes. ``--bench D`` then
runs the power stream through pgbench for D seconds as the runner does
(:func:`app.workloads.stream_run.bench_spec`: one script, ``-D n=0``, every transaction
logged) and adds ``bench``: transactions, passes and mean latency per query label.

    .venv/bin/python bench/tpch_scale.py --scale 1 [--timeout 300] [--bench 60]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import psycopg

# the checkout's packages first: run as a script, bench/ leads sys.path and its
# optimizer.py would shadow the optimizer package that app.workloads.stream_run imports
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.postgres.pgbench import run_bench  # noqa: E402
from app.postgres.sandbox import Sandbox  # noqa: E402
from app.workloads.stream_run import bench_spec  # noqa: E402
from app.workloads.tpch import DEFAULT_QUERIES, QUERY_NAMES, Tpch, postgres_query  # noqa: E402
from bench.common import run_main  # noqa: E402


def power_run(dsn: str, wl: Tpch, seconds: int) -> dict[str, object]:
    (stream,) = wl.streams()
    spec = bench_spec(stream, duration_s=seconds, warmup_s=0)
    t0 = time.monotonic()
    res = run_bench(dsn, spec)
    wall = time.monotonic() - t0
    if not res.ok or res.tx is None:
        return {"error": res.error}
    lat: dict[str, list[float]] = {}
    for c, k, s, ms in zip(
        res.tx.client, res.tx.txno, res.tx.script, res.tx.latency_ms, strict=True
    ):
        lat.setdefault(stream.label(int(c), int(k), int(s)), []).append(float(ms))
    return {
        "wall_s": round(wall, 1),
        "transactions": len(res.tx),
        "passes": round(len(res.tx) / len(stream.sequence), 2),
        "mean_ms": {q: round(float(np.mean(lat[q]))) for q in stream.sequence if q in lat},
        "count": {q: len(lat[q]) for q in stream.sequence if q in lat},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--timeout", type=int, default=300, help="statement_timeout per query, s")
    ap.add_argument("--bench", type=int, default=0, help="then a pgbench power run of N s")
    args = ap.parse_args()
    out: dict[str, object] = {"scale": args.scale}
    with Sandbox.create() as sb:
        wl = Tpch(scale=args.scale)
        t0 = time.monotonic()
        out["note"] = wl.prepare(sb.dsn)
        out["load_s"] = round(time.monotonic() - t0, 1)
        t0 = time.monotonic()
        wl.prepare(sb.dsn)
        out["reuse_s"] = round(time.monotonic() - t0, 3)
        times: dict[str, float | None] = {}
        with psycopg.connect(sb.dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT pg_database_size(current_database()), (SELECT rows FROM knobtune_tpch)"
            ).fetchone()
            assert row is not None
            out["db_mb"] = round(row[0] / 1e6)
            out["rows"] = row[1]
            conn.execute(f"SET statement_timeout = '{args.timeout}s'")
            for q in QUERY_NAMES:
                t0 = time.monotonic()
                try:
                    conn.execute(postgres_query(q, args.scale)).fetchall()
                    times[q] = round(time.monotonic() - t0, 2)
                except psycopg.errors.QueryCanceled:
                    times[q] = None
                print(q, times[q], flush=True)
        out["query_s"] = times
        out["pass_s"] = round(sum(times[q] or float("nan") for q in DEFAULT_QUERIES), 1)
        if args.bench:
            out["bench"] = power_run(sb.dsn, wl, args.bench)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    run_main(main)
