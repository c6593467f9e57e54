"""End-to-end: tune real PostgreSQL through the real service, then confirm the result.

For each reference workload, on a fresh sandbox cluster:

1. a tuning session through the REST API of a `knobtune serve` subprocess, with a fixed
   time budget;
2. a confirmation run that interleaves the default config (A), a PGTune-style config for
   this machine (B) and knobtune's recommendation (C) in rounds whose order rotates: A, B,
   C, then B, C, A, then C, A, B, ... Each run is preceded by a discarded warm-up run (a
   restart empties shared_buffers, and a cold run must never be compared with a warm one)
   and by the workload's reset of its data (TPC-C's orders grow as it runs).

Statistics: a run's level is what the session's verdict judges, from its transactions
(optimizer/evidence.py: throughput, or the geometric mean of per-query mean times for
TPC-H, "higher is better" as exp of the log level); a config's level is the median over
its runs, with a bootstrap 95% interval. Gains compare configs within each round (adjacent
runs), which cancels slow drift: gain = exp(mean(log C_i - log A_i)) - 1 (for query times:
the fraction of time saved), p-value of a paired t test on those log differences
(two-sided).

The PGTune-style config is PGTune's for the workload's kind (dw for analytics, oltp for
write-heavy, mixed otherwise: optimizer.heuristic.db_type_for), as the session's hints.

    .venv/bin/python bench/e2e.py                      # W1 and W2, ~50 minutes
    .venv/bin/python bench/e2e.py --workloads H1 --duration 40 --confirm-duration 40
    .venv/bin/python bench/e2e.py --workloads W2 --budget-s 300 --rounds 3   # quicker look

``--compare`` skips the session and confirms the default against the given configs
(a diagnostic: which knob could move this workload at all, durability knobs included):

    .venv/bin/python bench/e2e.py --workloads C1 --rounds 4 --confirm-duration 30 \
        --compare '{"sync_off": {"synchronous_commit": "off"}}'
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.chart import final_label, points_of, render_svg  # noqa: E402
from app.evidence import bench_spec, stream_stat  # noqa: E402
from app.postgres.pgbench import run_streams  # noqa: E402
from app.postgres.sandbox import Sandbox  # noqa: E402
from app.postgres.target import TargetController  # noqa: E402
from app.schemas import WorkloadIn  # noqa: E402
from app.workloads import workload_for  # noqa: E402
from optimizer.catalogue import CATALOGUE, Hardware  # noqa: E402
from optimizer.evidence import FLOOR, Objective, run_level, unfinished  # noqa: E402
from optimizer.heuristic import db_type_for, pgtune  # noqa: E402
from tests.helpers import ServiceProcess  # noqa: E402

# W2's reporting query: sorts a 60,000-row range of pgbench_accounts by a wide column, so
# work_mem decides between an in-memory sort and a spill to disk (DESIGN.md: ~39-48 tps at
# 4MB, 57-80 at 16MB). Mixed 1:1 (by transaction count) with TPC-B.
REPORT_SQL = (
    "\\set a random(1, 100000 * :scale - 60000)\n"
    "SELECT aid FROM (SELECT aid, filler FROM pgbench_accounts "
    "WHERE aid BETWEEN :a AND :a + 60000 ORDER BY filler DESC, aid) s OFFSET 59990;\n"
)

WORKLOADS: dict[str, dict[str, Any]] = {
    "W1": {
        "description": "write-heavy: pgbench tpcb-like, scale 20, 8 clients, 2 jobs",
        "workload": {"builtin": "tpcb-like", "scale": 20, "clients": 8, "jobs": 2},
        "kind": "write-heavy",
    },
    "W2": {
        "description": "mixed: tpcb-like@1 + reporting sort over 60,000 accounts@1, "
        "scale 20, 8 clients, 2 jobs",
        "workload": {
            "builtin": "tpcb-like",
            "builtin_weight": 1,
            "scripts": [{"sql": REPORT_SQL, "weight": 1}],
            "scale": 20,
            "clients": 8,
            "jobs": 2,
        },
        "kind": "mixed",
    },
    # Analytic: TPC-H's 22 queries in turn (power test), scale factor 0.2: 341 MB, one pass
    # 13-20 s on this machine, so a 40 s run holds 2-3 passes (app/workloads/tpch.py).
    "H1": {
        "description": "analytic: TPC-H SF 0.2, the 22 queries in turn (power), 1 client; "
        "objective: geometric mean of the per-query mean times",
        "workload": {"builtin": "tpch", "scale": 0.2, "mode": "power"},
        "kind": "analytics",
        "objective": "query_time_geomean",
    },
    # OLTP: TPC-C at 4 warehouses (421 MB), 8 clients, the standard mix; throughput
    "C1": {
        "description": "OLTP: TPC-C, 4 warehouses, 8 clients, standard mix (45/43/4/4/4)",
        "workload": {"builtin": "tpcc", "scale": 4, "clients": 8},
        "kind": "write-heavy",
    },
    # Hybrid: CH-benCHmark, TPC-C clients and one analytic client on the same data
    "CH1": {
        "description": "hybrid: CH-benCHmark, 2 warehouses, 4 TPC-C clients + 1 client "
        "running 12 CH queries in turn; weighted geometric mean of both streams",
        "workload": {"builtin": "chbench", "scale": 2, "clients": 4, "olap_clients": 1},
        "kind": "mixed",
    },
}


def tune(
    api: httpx.Client, target_id: int, spec: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    body = {
        "target_id": target_id,
        "workload": {**spec["workload"], "duration_s": args.duration, "warmup_s": args.warmup},
        "workload_kind": spec["kind"],
        "objective": spec.get("objective", "throughput"),
        "time_budget_s": args.budget_s,
        "max_trials": 500,  # the time budget decides
        "start": args.start,
        "seed": 1,
    }
    r = api.post("/api/v1/sessions", json=body)
    r.raise_for_status()
    sid = r.json()["id"]
    last = None
    while True:
        s = api.get(f"/api/v1/sessions/{sid}").json()
        if s["progress"]["trials_done"] != last:
            last = s["progress"]["trials_done"]
            print(f"  [{time.strftime('%H:%M:%S')}] {last} trials, {s['phase']}", file=sys.stderr)
        if s["status"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(2)
    if s["status"] != "succeeded":
        raise RuntimeError(f"session {sid} {s['status']}: {s['error']}")
    trials = api.get(f"/api/v1/sessions/{sid}/trials").json()
    wall = (
        datetime.fromisoformat(s["finished_at"]) - datetime.fromisoformat(s["started_at"])
    ).total_seconds()
    bench_s = sum(t["timings"].get("bench_s", 0.0) for t in trials)
    # where the rest of the wall time went: apply (reload/restart), post-restart warm-up,
    # restoring the workload's data before each run
    parts = ("apply", "warmup", "reset")
    overhead = {
        part: round(sum(t["timings"].get(f"{part}_s", 0.0) for t in trials), 1) for part in parts
    }
    overhead["restarts"] = sum(1 for t in trials if "warmup_s" in t["timings"])
    overhead["other_s"] = round(wall - bench_s - sum(overhead[p] for p in parts), 1)
    first = datetime.fromisoformat(trials[0]["started_at"])
    loop_wall = (datetime.fromisoformat(trials[-1]["finished_at"]) - first).total_seconds()
    start = trials[0]["config"]
    best = s["best_config"] or {}
    chart = Path(args.out).with_name(f"e2e-{spec['name']}-chart.svg")
    chart.write_text(
        render_svg(
            points_of(trials),
            baseline=s["baseline_tps"],
            title=f"bench/e2e.py {spec['name']}: median tps per trial",
            final_label=final_label(s),
        )
    )
    return {
        "session_id": sid,
        "claimed_gain": s["gain"],
        "claim": {
            "status": s["gain_status"],
            "text": s.get("gain_text"),
            "p_value": s["gain_p_value"],
            "ci95": s["gain_ci"],
        },
        "per_label": s.get("per_label"),
        "per_stream": s.get("per_stream"),
        "baseline_tps": s["baseline_tps"],
        "best_tps": s["best_tps"],
        "wall_s": round(wall, 1),
        "benchmark_share": round(bench_s / wall, 3),
        "benchmark_share_trial_loop": round(bench_s / loop_wall, 3),
        "overhead_s": overhead,
        "trials": len(trials),
        "knobs_tuned": sorted(start),
        "knobs_changed": {k: [start[k], v] for k, v in best.items() if start.get(k) != v},
        "best_config": best,
        "notes": s["notes"],
        "chart": chart.name,
        "trials_list": [
            [
                t["index"],
                t["role"],
                t["knob"] or t["value"],
                t["samples"]["median_tps"],
                t["verdict"],
            ]
            for t in trials
        ],
    }


def confirm(
    sb: Sandbox, configs: dict[str, dict[str, str]], spec: dict[str, Any], args: argparse.Namespace
) -> tuple[dict[str, list[float | None]], dict[str, list[list[str]]]]:
    """Interleaved runs: warm-up (discarded) then a measured run, config after config.

    Each run is every stream of the workload at once, levelled from its transactions by
    the session's objective (as the verdict does), reported as exp(level). A run in which
    some designed query never finished has no level (None; the verdict does not use such
    a run either): its missing stream/label names are returned beside.
    """
    ctl = TargetController(sb.dsn, restart_command=sb.restart_command, data_dir=sb.data_dir)
    wl = WorkloadIn.model_validate({**spec["workload"], "duration_s": 60, "warmup_s": 5})
    workload = workload_for(wl)
    workload.prepare(sb.dsn)  # re-uses what a session loaded
    streams = workload.streams()
    objective = Objective(kind=spec.get("objective", "throughput"))
    measured = [
        bench_spec(st, duration_s=args.confirm_duration, warmup_s=args.warmup) for st in streams
    ]
    warm = [bench_spec(st, duration_s=args.confirm_warmup, warmup_s=0) for st in streams]
    names = sorted({k for c in configs.values() for k in c})
    snapshot = ctl.snapshot(names)
    levels: dict[str, list[float | None]] = {k: [] for k in configs}
    missing: dict[str, list[list[str]]] = {k: [] for k in configs}
    try:
        labels = list(configs)
        for rnd in range(args.rounds):
            # each config takes each place in the round in turn, so that whatever drifts
            # within a round (cache, autovacuum) does not always favour the same one
            k = rnd % len(labels)
            for label in labels[k:] + labels[:k]:
                config = configs[label]
                ctl.revert(snapshot)
                if config:
                    ctl.apply(config)
                run_streams(sb.dsn, warm)
                workload.reset(sb.dsn)  # as the session does: every measured run on the same data
                results = run_streams(sb.dsn, measured)
                stats = [
                    stream_stat(st, res, args.warmup)
                    for st, res in zip(streams, results, strict=True)
                ]
                if not all(r.ok for r in results) or any(x is None for x in stats):
                    errors = "; ".join(str(r.error) for r in results if not r.ok)
                    raise RuntimeError(f"confirmation run of {label} failed: {errors}")
                done = [x for x in stats if x is not None]
                level = run_level(done, objective)
                gone = unfinished(done)
                levels[label].append(None if level.centre <= FLOOR else math.exp(level.centre))
                missing[label].append(gone)
                figures = ", ".join(f"{x.name} {x.transactions} tx" for x in done)
                shown = "incomplete" if gone else f"{math.exp(level.centre):.4g}"
                print(
                    f"  round {rnd + 1} {label}: level {shown} ({figures}"
                    f"{'; never finished: ' + ' '.join(gone) if gone else ''})",
                    file=sys.stderr,
                )
    finally:
        ctl.revert(snapshot)
    return levels, missing


def summarize(
    levels: dict[str, list[float | None]], lower_is_better: bool = False, seed: int = 0
) -> dict[str, Any]:
    """Per config: the median complete run in the objective's units (tps; for a query-time
    objective, ms, the level being 1 / time) with a bootstrap 95% interval, every run
    (None: incomplete) and how many were incomplete."""
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for label, runs in levels.items():
        xs = [x for x in runs if x is not None]
        if not xs:
            out[label] = {"median": None, "runs": runs, "incomplete_runs": len(runs)}
            continue
        arr = 1.0 / np.array(xs) if lower_is_better else np.array(xs)
        boots = np.median(rng.choice(arr, size=(10_000, arr.size), replace=True), axis=1)

        def sig(x: float) -> float:
            return float(f"{x:.4g}")

        out[label] = {
            "unit": "ms" if lower_is_better else "tps",
            "median": sig(float(np.median(arr))),
            "ci95": [sig(float(np.percentile(boots, 2.5))), sig(float(np.percentile(boots, 97.5)))],
            "runs": [None if x is None else sig(1.0 / x if lower_is_better else x) for x in runs],
            "incomplete_runs": len(runs) - len(xs),
        }
    return out


def paired_gain(
    c: list[float | None], ref: list[float | None], lower_is_better: bool = False
) -> dict[str, Any]:
    """Gain of c over ref from per-round log ratios of levels (levels: higher is better),
    over the rounds where both runs are complete.

    ``lower_is_better``: the objective is a time; the gain is the fraction of time saved.
    """
    pairs = [(x, y) for x, y in zip(c, ref, strict=True) if x is not None and y is not None]
    if not pairs:
        return {"gain": None, "ci95": None, "p_value": None, "rounds": 0}
    d = np.log(np.array([x for x, _ in pairs])) - np.log(np.array([y for _, y in pairs]))
    n = d.size
    mean, sd = float(d.mean()), float(d.std(ddof=1)) if n > 1 else 0.0
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n) if n > 1 and sd > 0 else 0.0
    p = float(stats.ttest_1samp(d, 0.0).pvalue) if n > 1 and sd > 0 else None

    def gain(x: float) -> float:
        return round(-math.expm1(-x) if lower_is_better else math.expm1(x), 4)

    return {
        "gain": gain(mean),
        "ci95": [gain(mean - half), gain(mean + half)],
        "p_value": None if p is None else round(p, 5),
        "rounds": n,
    }


def run_workload(name: str, args: argparse.Namespace) -> dict[str, Any]:
    spec = {**WORKLOADS[name], "name": name}
    print(f"{name}: {spec['description']}", file=sys.stderr)
    if args.compare:
        return compare_only(spec, json.loads(args.compare), args)
    with tempfile.TemporaryDirectory(prefix=f"knobtune-e2e-{name}-") as tmp, Sandbox.create() as sb:
        service = ServiceProcess(Path(tmp))
        service.start()
        try:
            api = httpx.Client(base_url=service.url, timeout=120)
            target = api.post(
                "/api/v1/targets",
                json={
                    "name": f"e2e-{name}",
                    "dsn": sb.dsn,
                    "restart_command": sb.restart_command,
                    "data_dir": str(sb.data_dir),
                },
            )
            target.raise_for_status()
            t0 = time.monotonic()
            session = tune(api, target.json()["id"], spec, args)
            session["tuning_wall_s"] = round(time.monotonic() - t0, 1)
        finally:
            service.stop()
        hw = Hardware(
            ram_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            cpus=os.cpu_count() or 1,
        )
        db_type = db_type_for(spec["kind"])
        pgtune_config = {k: v for k, v in pgtune(hw, db_type).items() if k in CATALOGUE}
        configs = {"default": {}, "pgtune": pgtune_config, "knobtune": session["best_config"]}
        print(f"{name}: confirmation, {args.rounds} rounds of A/B/C", file=sys.stderr)
        levels, missing = confirm(sb, configs, spec, args)
    lower = Objective(kind=spec.get("objective", "throughput")).lower_is_better
    summary = summarize(levels, lower)
    vs_default = paired_gain(levels["knobtune"], levels["default"], lower)
    vs_pgtune = paired_gain(levels["knobtune"], levels["pgtune"], lower)
    claimed = session["claimed_gain"]
    kept = (
        (vs_default["gain"] / claimed) if claimed and claimed > 0 and vs_default["gain"] else None
    )
    low, high = vs_default["ci95"] or (None, None)
    return {
        "workload": spec["description"],
        "session": session,
        "objective": spec.get("objective", "throughput"),
        "pgtune_db_type": db_type,
        "configs": {"pgtune": pgtune_config, "knobtune": session["best_config"]},
        "confirmation": summary,
        "confirmation_never_finished": missing,
        "knobtune_vs_default": vs_default,
        "knobtune_vs_pgtune": vs_pgtune,
        "share_of_claimed_gain_confirmed": None if kept is None else round(kept, 3),
        # a small claim's share is mostly noise: is the claim inside the confirmed interval?
        "claim_within_confirmed_ci95": None
        if low is None or high is None
        else claimed is not None and low <= claimed <= high,
    }


def compare_only(
    spec: dict[str, Any], configs: dict[str, dict[str, str]], args: argparse.Namespace
) -> dict[str, Any]:
    """No session: the default against each of ``configs`` ({label: {knob: value}})."""
    with Sandbox.create() as sb:
        levels, missing = confirm(sb, {"default": {}, **configs}, spec, args)
    lower = Objective(kind=spec.get("objective", "throughput")).lower_is_better
    return {
        "workload": spec["description"],
        "objective": spec.get("objective", "throughput"),
        "configs": configs,
        "confirmation": summarize(levels, lower),
        "confirmation_never_finished": missing,
        "vs_default": {k: paired_gain(levels[k], levels["default"], lower) for k in configs},
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workloads", default="W1,W2")
    p.add_argument("--budget-s", type=float, default=900, help="tuning time budget per workload")
    p.add_argument(
        "--duration", type=int, default=30, help="seconds per tuning run (incl. warm-up)"
    )
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--start", choices=["current", "heuristic"], default="current")
    p.add_argument("--rounds", type=int, default=5, help="confirmation rounds (runs per config)")
    p.add_argument("--confirm-duration", type=int, default=20)
    p.add_argument("--confirm-warmup", type=int, default=10, help="discarded run before each")
    p.add_argument(
        "--compare",
        help='no session: confirm the default against these configs, JSON {"label": {knob: value}}',
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "e2e.json"))
    args = p.parse_args()
    load_before = os.getloadavg()
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "args": vars(args),
        "workloads": {w: run_workload(w, args) for w in args.workloads.split(",")},
    }
    # Other work on the machine adds noise to every run; say how busy it was.
    results["load_average_1m"] = {
        "before": round(load_before[0], 2),
        "after": round(os.getloadavg()[0], 2),
    }
    text = json.dumps(results, indent=2)
    Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
