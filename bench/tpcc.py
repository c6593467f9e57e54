"""TPC-C / CH-benCHmark figures on a fresh sandbox: load time, size, tps per transaction.

For each warehouse count: loads TPC-C (+ the CH tables), prints the load time and the
database size, then runs the TPC-C mix for ``--seconds`` with ``--clients`` as the runner
does (:func:`app.workloads.stream_run.bench_spec`: one pgbench thread) and prints
tps of each transaction type, tpmC and the failures; then each CH query once, timed.
Prints JSON lines. The sandbox runs with its defaults (no tuning).

    .venv/bin/python bench/tpcc.py [--warehouses 1 4] [--clients 8] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.postgres.pgbench import run_bench  # noqa: E402
from app.postgres.sandbox import Sandbox  # noqa: E402
from app.workloads.chbench import QUERIES, Chbench  # noqa: E402
from app.workloads.stream_run import bench_spec  # noqa: E402
from app.workloads.tpcc import Tpcc, tpm_c  # noqa: E402
from bench.common import run_main  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warehouses", type=int, nargs="+", default=[1])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=20)
    args = ap.parse_args()
    with Sandbox.create() as sb:
        for w in args.warehouses:
            t0 = time.monotonic()
            note = Tpcc(warehouses=w).prepare(sb.dsn)
            load_s = time.monotonic() - t0
            t0 = time.monotonic()
            ch_note = Chbench(warehouses=w).prepare(sb.dsn)
            ch_s = time.monotonic() - t0
            with psycopg.connect(sb.dsn) as conn:
                row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
            size_mb = int(str(row[0])) / 2**20 if row else 0.0
            print(
                json.dumps(
                    {
                        "warehouses": w,
                        "tpcc_load_s": round(load_s, 1),
                        "ch_extra_s": round(ch_s, 1),
                        "db_mb": round(size_mb),
                        "note": note,
                        "ch_note": ch_note,
                    }
                ),
                flush=True,
            )
            stream = Tpcc(warehouses=w, clients=args.clients).streams()[0]
            res = run_bench(sb.dsn, bench_spec(stream, duration_s=args.seconds, warmup_s=0))
            if not res.ok or res.tx is None:
                print(json.dumps({"warehouses": w, "error": res.error}), flush=True)
                continue
            span = float(res.tx.start_s.max() + res.tx.latency_ms.max() / 1000.0)
            counts = np.bincount(res.tx.script, minlength=len(stream.scripts))
            print(
                json.dumps(
                    {
                        "warehouses": w,
                        "clients": args.clients,
                        "seconds": round(span, 1),
                        "tps": round(len(res.tx) / span, 1),
                        "tps_by_type": {
                            s.name: round(int(c) / span, 1)
                            for s, c in zip(stream.scripts, counts, strict=True)
                        },
                        "p95_ms_by_type": {
                            s.name: round(
                                float(np.percentile(res.tx.latency_ms[res.tx.script == i], 95)), 1
                            )
                            for i, s in enumerate(stream.scripts)
                            if (res.tx.script == i).any()
                        },
                        "tpmC": round(tpm_c(int(counts[0]), span)),
                        "failed": res.failed_transactions,
                        "retried": res.summary.retried if res.summary else None,
                    }
                ),
                flush=True,
            )
            with psycopg.connect(sb.dsn) as conn:
                # the spec's remote shares (0 with one warehouse): payments by a customer
                # of another warehouse (15%) and order lines supplied by another one (1%)
                remote = conn.execute(
                    "SELECT (SELECT avg((h_c_w_id <> h_w_id)::int) FROM history"
                    "        WHERE h_date > now() - interval '1 hour' AND h_amount <> 10),"
                    "       (SELECT avg((ol_supply_w_id <> ol_w_id)::int) FROM order_line"
                    "        WHERE ol_o_id > 3000)"
                ).fetchone()
                print(
                    json.dumps(
                        {
                            "warehouses": w,
                            "remote_payment_share": float(str(remote[0])) if remote else None,
                            "remote_line_share": float(str(remote[1])) if remote else None,
                        }
                    ),
                    flush=True,
                )
                times = {}
                for name, sql in QUERIES.items():
                    t0 = time.monotonic()
                    conn.execute(sql).fetchall()
                    times[name] = round(time.monotonic() - t0, 3)
            print(json.dumps({"warehouses": w, "ch_query_s": times}), flush=True)


if __name__ == "__main__":
    run_main(main)
