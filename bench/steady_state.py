"""Does a config hold up once the server has run on it for a while? (issue 29, D1)

A confirmation run follows an apply, and a shared_buffers change restarts the server: the
run measures a fresh buffer pool. On a slow disk a large pool of dirty pages costs only
later, when the pool is full and the background writer must clean pages for every read.
This script runs each config for ``--minutes`` minutes on end after one apply: one-minute
runs back to back, nothing restarted between them (the session's own trial executor),
each run's throughput and the server's counters printed, so that a level that falls
after some minutes shows where and why.

    .venv/bin/python bench/steady_state.py --workloads D1 --profile micro --memory 2GB \\
        --cpus 2 --minutes 10 --out bench/results/steady-D1.json

The configs: the default and PGTune's for the profile's memory and CPUs (as bench/e2e.py
computes it), unless ``--configs '{"label": {knob: value}}'`` names others; they run in
the order given, each after the server's settings are put back.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.postgres.target import TargetController  # noqa: E402
from app.sessions.summary import io_line  # noqa: E402
from app.sessions.trial import TrialExecutor  # noqa: E402
from bench.common import limits_of, load_average, machine, profile_of, run_main  # noqa: E402
from bench.e2e import SMALL_RATE, WORKLOADS, _workload, make_sandbox, small_workload  # noqa: E402
from optimizer.catalogue import CATALOGUE, Hardware  # noqa: E402
from optimizer.descent import Candidate  # noqa: E402
from optimizer.heuristic import db_type_for, pgtune  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="D1", help="one of bench/e2e.py's workloads")
    p.add_argument("--profile", help="a hardware profile (docs/profiles.md)")
    p.add_argument("--memory", help="the profile's memory replaced, e.g. 2GB")
    p.add_argument("--disk-iops", type=int)
    p.add_argument("--disk-mbps", type=int)
    p.add_argument("--cpus", type=int)
    p.add_argument("--minutes", type=int, default=10, help="runs per config (default 10)")
    p.add_argument("--configs", help='JSON {"label": {knob: value}}; default: default, pgtune')
    p.add_argument("--run-s", type=int, default=60, help="seconds per run (default 60)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "steady.json"))
    p.add_argument(
        "--small",
        action="store_true",
        help=f"scale 1, 2 clients, one 3 s run per config at {SMALL_RATE} tps (pgbench -R): a "
        "check that the command runs (tests/docs), not a measurement",
    )
    args = p.parse_args()
    name = args.workloads
    spec = {**WORKLOADS[name], "name": name}
    rate = None
    if args.small:
        spec["workload"] = small_workload(spec["workload"])
        args.minutes, args.run_s = 1, 3
        # throttled: the run checks the path, never a level (flat out it kept the CPUs busy)
        rate = SMALL_RATE
    limits = limits_of(args)
    hw = Hardware(
        ram_bytes=(limits.memory_bytes if limits and limits.memory_bytes else None)
        or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        cpus=(limits.cpus if limits and limits.cpus else None) or os.cpu_count() or 1,
    )
    tuned = {k: v for k, v in pgtune(hw, db_type_for(spec["kind"])).items() if k in CATALOGUE}
    configs: dict[str, dict[str, str]] = (
        json.loads(args.configs) if args.configs else {"default": {}, "pgtune": tuned}
    )
    before = load_average()
    sb, load = make_sandbox(spec, limits, argparse.Namespace())
    runs: dict[str, list[dict[str, Any]]] = {}
    with sb:
        ctl = TargetController.for_sandbox(sb)
        names = sorted({k for c in configs.values() for k in c})
        snapshot = ctl.snapshot(names)
        executor = TrialExecutor(
            ctl, sb.dsn, _workload(spec), duration_s=args.run_s, warmup_s=0, rate=rate
        )
        try:
            n = 0
            for label, config in configs.items():
                ctl.revert(snapshot)
                runs[label] = []
                t0 = time.monotonic()
                for minute in range(args.minutes):
                    # the first run applies the config (a restart and a warm-up where a
                    # knob needs it); the rest find it applied and run on at once
                    out = executor.run(
                        Candidate(n, config, None, None, "baseline"), incumbent=config
                    )
                    n += 1
                    if out.error is not None or out.result is None:
                        raise SystemExit(f"{label}, minute {minute + 1}: {out.error}")
                    samples = out.result.samples
                    tps = sorted(samples)[len(samples) // 2] if samples else None
                    metrics = dict(out.result.db_metrics or {})
                    line = io_line(metrics)
                    runs[label].append(
                        {
                            "minute": minute + 1,
                            "since_apply_s": round(time.monotonic() - t0, 1),
                            "median_tps": tps,
                            "samples": samples,
                            "io": line,
                            "metrics": metrics,
                            "timings": out.timings,
                        }
                    )
                    print(f"  {label} minute {minute + 1}: {tps} tps [{line}]", file=sys.stderr)
        finally:
            ctl.revert(snapshot)
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "args": vars(args),
        "workload": spec["description"],
        "profile": profile_of(limits),
        "data": load,
        "configs": configs,
        "runs": runs,
        "load_average_1m": {"before": round(before, 2), "after": round(load_average(), 2)},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    for label, rows in runs.items():
        print(f"{label}: " + " ".join(f"{r['median_tps']:.0f}" for r in rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main)
