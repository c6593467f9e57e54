"""End-to-end: tune real PostgreSQL through the real service, then confirm the result.

For each reference workload, on a fresh sandbox cluster:

1. a tuning session through the REST API of a `knobtune serve` subprocess, with a fixed
   time budget;
2. a confirmation run that interleaves the default config (A), a PGTune-style config for
   this machine (B) and knobtune's recommendation (C): A, B, C, A, B, C, ... Each run is
   preceded by a discarded warm-up run (a restart empties shared_buffers, and a cold run
   must never be compared with a warm one).

Statistics: a config's level is the median of its runs' medians, with a bootstrap 95%
interval. Gains compare configs within each round (adjacent runs), which cancels slow
drift: gain = exp(mean(log C_i - log A_i)) - 1, p-value of a paired t test on those log
differences (two-sided).

    .venv/bin/python bench/e2e.py                      # both workloads, ~50 minutes
    .venv/bin/python bench/e2e.py --workloads W2 --budget-s 300 --rounds 3   # quicker look
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
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
from app.postgres.pgbench import BenchSpec, run_bench  # noqa: E402
from app.postgres.sandbox import Sandbox  # noqa: E402
from app.postgres.target import TargetController  # noqa: E402
from optimizer.catalogue import CATALOGUE, Hardware  # noqa: E402
from optimizer.heuristic import pgtune  # noqa: E402
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
}


def tune(
    api: httpx.Client, target_id: int, spec: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    body = {
        "target_id": target_id,
        "workload": {**spec["workload"], "duration_s": args.duration, "warmup_s": args.warmup},
        "workload_kind": spec["kind"],
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
    # where the rest of the wall time went: apply (reload/restart), post-restart warm-up
    overhead = {
        part: round(sum(t["timings"].get(f"{part}_s", 0.0) for t in trials), 1)
        for part in ("apply", "warmup")
    }
    overhead["restarts"] = sum(1 for t in trials if "warmup_s" in t["timings"])
    overhead["other_s"] = round(wall - bench_s - overhead["apply"] - overhead["warmup"], 1)
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
) -> dict[str, list[float]]:
    """Interleaved runs: warm-up (discarded) then a measured run, config after config."""
    ctl = TargetController(sb.dsn, restart_command=sb.restart_command, data_dir=sb.data_dir)
    wl = spec["workload"]
    scripts = [(s["sql"], s["weight"]) for s in wl.get("scripts", [])] or None
    bench = BenchSpec(
        builtin=wl["builtin"],
        builtin_weight=wl.get("builtin_weight", 1),
        scripts=scripts,
        clients=wl["clients"],
        jobs=wl["jobs"],
        duration_s=args.confirm_duration,
        warmup_s=args.warmup,
    )
    warm = BenchSpec(**{**bench.__dict__, "duration_s": args.confirm_warmup, "warmup_s": 0})
    names = sorted({k for c in configs.values() for k in c})
    snapshot = ctl.snapshot(names)
    levels: dict[str, list[float]] = {k: [] for k in configs}
    try:
        for rnd in range(args.rounds):
            for label, config in configs.items():
                ctl.revert(snapshot)
                if config:
                    ctl.apply(config)
                run_bench(sb.dsn, warm)
                res = run_bench(sb.dsn, bench)
                if not res.ok or not res.samples:
                    raise RuntimeError(f"confirmation run of {label} failed: {res.error}")
                levels[label].append(statistics.median(res.samples))
                print(f"  round {rnd + 1} {label}: {levels[label][-1]:.1f} tps", file=sys.stderr)
    finally:
        ctl.revert(snapshot)
    return levels


def summarize(levels: dict[str, list[float]], seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for label, xs in levels.items():
        arr = np.array(xs)
        boots = np.median(rng.choice(arr, size=(10_000, arr.size), replace=True), axis=1)
        out[label] = {
            "median_tps": round(float(np.median(arr)), 2),
            "ci95": [
                round(float(np.percentile(boots, 2.5)), 2),
                round(float(np.percentile(boots, 97.5)), 2),
            ],
            "runs": [round(x, 2) for x in xs],
        }
    return out


def paired_gain(c: list[float], ref: list[float]) -> dict[str, Any]:
    d = np.log(np.array(c)) - np.log(np.array(ref))
    n = d.size
    mean, sd = float(d.mean()), float(d.std(ddof=1)) if n > 1 else 0.0
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n) if n > 1 and sd > 0 else 0.0
    p = float(stats.ttest_1samp(d, 0.0).pvalue) if n > 1 and sd > 0 else None
    return {
        "gain": round(math.exp(mean) - 1, 4),
        "ci95": [round(math.exp(mean - half) - 1, 4), round(math.exp(mean + half) - 1, 4)],
        "p_value": None if p is None else round(p, 5),
    }


def run_workload(name: str, args: argparse.Namespace) -> dict[str, Any]:
    spec = {**WORKLOADS[name], "name": name}
    print(f"{name}: {spec['description']}", file=sys.stderr)
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
        pgtune_config = {k: v for k, v in pgtune(hw, "mixed").items() if k in CATALOGUE}
        configs = {"default": {}, "pgtune": pgtune_config, "knobtune": session["best_config"]}
        print(f"{name}: confirmation, {args.rounds} rounds of A/B/C", file=sys.stderr)
        levels = confirm(sb, configs, spec, args)
    summary = summarize(levels)
    vs_default = paired_gain(levels["knobtune"], levels["default"])
    vs_pgtune = paired_gain(levels["knobtune"], levels["pgtune"])
    claimed = session["claimed_gain"]
    kept = (vs_default["gain"] / claimed) if claimed and claimed > 0 else None
    low, high = vs_default["ci95"]
    return {
        "workload": spec["description"],
        "session": session,
        "configs": {"pgtune": pgtune_config, "knobtune": session["best_config"]},
        "confirmation": summary,
        "knobtune_vs_default": vs_default,
        "knobtune_vs_pgtune": vs_pgtune,
        "share_of_claimed_gain_confirmed": None if kept is None else round(kept, 3),
        # a small claim's share is mostly noise: is the claim inside the confirmed interval?
        "claim_within_confirmed_ci95": claimed is not None and low <= claimed <= high,
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
