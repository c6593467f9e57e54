"""End-to-end: tune real PostgreSQL through the real service, then confirm the result.

For each reference workload, on a fresh sandbox cluster:

1. a tuning session through the REST API of a `knobtune serve` subprocess, with a fixed
   time budget;
2. a confirmation run that interleaves the default config (A), a PGTune-style config for
   this machine (B) and knobtune's recommendation (C) in rounds, each config once per
   round in an order shuffled per round (seed 0): ``knobtune compare``'s own rounds
   (app/compare/rounds.py). Each run is preceded by a discarded warm-up run (a restart
   empties shared_buffers, and a cold run must never be compared with a warm one) and by
   the workload's reset of its data (TPC-C's orders grow as it runs).

Statistics, ``knobtune compare``'s (optimizer/compare.py): a run's level is what the
session's verdict judges, from its transactions (optimizer/evidence.py: throughput, or the
geometric mean of per-query mean times for TPC-H, "higher is better" as exp of the log
level); a config's level is the median over its runs, with a bootstrap 95% interval. Gains
compare configs within each round, which cancels slow drift: gain = exp(mean(log C_i -
log A_i)) - 1 (for query times: the fraction of time saved), p-value of a paired t test on
those log differences (two-sided).

The PGTune-style config is PGTune's for the workload's kind (dw for analytics, oltp for
write-heavy, mixed otherwise: optimizer.heuristic.db_type_for), as the session's hints.

    .venv/bin/python bench/e2e.py                      # W1 and W2, ~50 minutes
    .venv/bin/python bench/e2e.py --workloads H1 --duration 40 --confirm-duration 40
    .venv/bin/python bench/e2e.py --workloads W2 --budget-s 300 --rounds 3   # quicker look

``--compare`` skips the session and confirms the default against the given configs
(a diagnostic: which knob could move this workload at all, durability knobs included):

    .venv/bin/python bench/e2e.py --workloads C1 --rounds 4 --confirm-duration 30 \
        --compare '{"sync_off": {"synchronous_commit": "off"}}'

``--profile NAME`` runs the sandbox as a small server (docs/profiles.md): it is created in
that profile's cgroup (memory, page cache included, disk IOPS and MB/s, CPUs), and every
start and restart stays inside it, the session's (the restart method handed to the service
names the cgroup) and the confirmation's alike. The target is registered with the profile's
memory and CPUs, and the PGTune-style config is computed for them, not for the host. The
output records the profile, its limits, the cgroup, whether the postmaster and its backends
were inside it after the session and after the confirmation, and each run's I/O counters
(docs/evidence.md). B1 is issue 29's first case, sized for ``small`` (1 GB):

    .venv/bin/python bench/e2e.py --workloads B1 --profile small --budget-s 900 \
        --duration 45 --rounds 4 --out bench/results/e2e-B1-small.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.compare.rounds import run_record  # noqa: E402
from app.postgres.cgroups import PROFILES, Limits  # noqa: E402
from app.postgres.sandbox import Sandbox  # noqa: E402
from app.postgres.target import TargetController  # noqa: E402
from app.reports.chart import final_label, points_of, render_svg  # noqa: E402
from app.sessions.trial import TrialExecutor, TrialOutcome  # noqa: E402
from app.workloads import workload_for  # noqa: E402
from app.workloads.kinds import KNOBTUNE_BUILTINS  # noqa: E402
from app.workloads.schemas import WorkloadIn  # noqa: E402
from bench.common import (  # noqa: E402
    interleaved,
    limits_of,
    load_average,
    machine,
    paired_gain,
    profile_of,
    run_main,
)
from optimizer.catalogue import CATALOGUE, Hardware, default_knobs  # noqa: E402
from optimizer.compare import summarize  # noqa: E402
from optimizer.descent import Candidate  # noqa: E402
from optimizer.evidence import Objective  # noqa: E402
from optimizer.heuristic import db_type_for, pgtune  # noqa: E402
from tests.helpers import ServiceProcess  # noqa: E402

# W2's reporting query: sorts a 60,000-row range of pgbench_accounts by a wide column, so
# work_mem decides between an in-memory sort and a spill to disk (docs/architecture.md:
# ~39-48 tps at 4MB, 57-80 at 16MB). Mixed 1:1 (by transaction count) with TPC-B.
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
    # Issue 29's first case, the 001 study: TPC-B on data larger than the server's memory.
    # Sized for profile "small" (1 GB, 1 CPU, 1000 IOPS, 100 MB/s): scale 100 is about
    # 1.5 GB of tables and indexes. The study's knobs first (it tuned max_wal_size and the
    # bgwriter; the issue's one memory knob worth about +30% there is shared_buffers), then
    # the rest of the write-heavy set. The session's counters may still reorder them
    # (docs/evidence.md: busy mechanisms first) and set checkpoint knobs aside on runs that
    # hold no checkpoint cycle.
    "B1": {
        "description": "TPC-B on data larger than memory: pgbench tpcb-like, scale 100 "
        "(about 1.5 GB), 8 clients, 2 jobs; the 001 study's knobs first",
        "workload": {"builtin": "tpcb-like", "scale": 100, "clients": 8, "jobs": 2},
        "kind": "write-heavy",
        "knobs": [
            "max_wal_size",
            "bgwriter_lru_maxpages",
            "shared_buffers",
            "wal_compression",
            "checkpoint_timeout",
            "checkpoint_completion_target",
            "min_wal_size",
            "wal_buffers",
        ],
    },
    # A server with less memory than data: TPC-B at scale 50 (about 750 MB of tables and
    # indexes) for profile "micro" with its disk raised to 1000 IOPS (--profile micro
    # --disk-iops 1000 --disk-mbps 100): 512 MB, so PGTune's 25% rule gives PostgreSQL's
    # own 128MB. The session's default write-heavy knob set.
    "B2": {
        "description": "TPC-B on data larger than memory: pgbench tpcb-like, scale 50 "
        "(about 750 MB), 8 clients, 2 jobs",
        "workload": {"builtin": "tpcb-like", "scale": 50, "clients": 8, "jobs": 2},
        "kind": "write-heavy",
    },
    # Issue 29's second case: TPC-C, the blocked issue's target, on an I/O-bound server.
    # 10 warehouses is about 1 GB of tables and indexes: larger than profile "small"'s
    # memory once PostgreSQL's own memory is counted, on a 1000-IOPS disk. The session's
    # default write-heavy knob set, ordered again by the baseline's counters.
    "C2": {
        "description": "OLTP on data larger than memory: TPC-C, 10 warehouses (about 1 GB), "
        "8 clients, standard mix",
        "workload": {"builtin": "tpcc", "scale": 10, "clients": 8},
        "kind": "write-heavy",
    },
    # Issue 29's third case, the 004 study (pgbench on PG16, the disk the bottleneck): TPC-B
    # whose data fits in memory (scale 50, about 750 MB, under 2 GB), so every commit waits
    # on a throttled disk (profile micro's 500 IOPS and 50 MB/s; 2 GB and 2 CPUs so that
    # neither memory nor CPU is the limit: --profile micro --memory 2GB --cpus 2). The safe
    # knobs that act on WAL flushing and volume; synchronous_commit only with
    # --allow-unsafe, and then reported as a durability trade.
    "D1": {
        "description": "commit-bound TPC-B: pgbench tpcb-like, scale 50 (about 750 MB, in "
        "memory), 16 clients, 2 jobs, on a 500-IOPS disk",
        "workload": {"builtin": "tpcb-like", "scale": 50, "clients": 16, "jobs": 2},
        "kind": "write-heavy",
        "knobs": [
            "commit_delay",
            "wal_compression",
            "wal_buffers",
            "max_wal_size",
            "checkpoint_timeout",
            "checkpoint_completion_target",
            "wal_writer_delay",
            "shared_buffers",
            # PGTune's pool stalled here with the background writer busy (docs/results)
            "bgwriter_lru_maxpages",
        ],
    },
    # Hybrid: CH-benCHmark, TPC-C clients and one analytic client on the same data
    "CH1": {
        "description": "hybrid: CH-benCHmark, 2 warehouses, 4 TPC-C clients + 1 client "
        "running 12 CH queries in turn; weighted geometric mean of both streams",
        "workload": {"builtin": "chbench", "scale": 2, "clients": 4, "olap_clients": 1},
        "kind": "mixed",
    },
}


# --small's pgbench rate (-R, tps) for workloads pgbench runs from its own scripts (not
# TPC-H, TPC-C or CH-benCHmark's): a small run checks the command's path, never a level,
# and unthrottled it keeps a CPU busy that a test suite's other workers wait for
SMALL_RATE = 100


def small_workload(wl: dict[str, Any]) -> dict[str, Any]:
    """A workload at its smallest (--small): scale 1 (TPC-H SF 0.01), 2 clients, 1 job."""
    small = {**wl, "scale": 0.01 if wl["builtin"] == "tpch" else 1}
    small.update({k: v for k, v in (("clients", 2), ("jobs", 1)) if k in wl})
    return small


def tune(
    api: httpx.Client, target_id: int, spec: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """A session through the REST API, polled until it ends; what it claimed and how its
    time went. ``spec``: name, workload, kind, and optionally objective, knobs, request
    (more fields of the session's request) and chart (the chart's file name, written next
    to ``args.out``)."""
    body = {
        "target_id": target_id,
        "workload": {**spec["workload"], "duration_s": args.duration, "warmup_s": args.warmup},
        "workload_kind": spec["kind"],
        "objective": spec.get("objective", "throughput"),
        "time_budget_s": args.budget_s,
        "max_trials": args.max_trials,
        "start": args.start,
        "final_check_runs": args.final_check_runs,
        "seed": 1,
    }
    if spec.get("knobs"):
        body["knobs"] = spec["knobs"]
    body.update(spec.get("request") or {})
    if args.as_before:
        # the search as it was before issue 29: the listed order, checkpoint knobs judged
        # on any run
        body.update(search_order="catalogue", checkpoint_rule=False)
    if args.allow_unsafe:
        # durability-unsafe knobs join the set: the session labels them as a trade
        body["allow_unsafe"] = True
        base = body.get("knobs") or default_knobs(spec["kind"])
        body["knobs"] = [*base, *args.allow_unsafe.split(",")]
    r = api.post("/api/v1/sessions", json=body)
    if r.status_code != 202:
        raise SystemExit(f"the service refused the session ({r.status_code}): {r.text}")
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
    chart = Path(args.out).with_name(spec.get("chart") or f"e2e-{spec['name']}-chart.svg")
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
                t.get("io"),
                t["value"],  # the candidate's value (a rejected one has no run to show it)
                # why it was kept, reverted, rejected or left undecided, and by how much
                t["reason"],
                t["gain"],
                t["p_value"],
            ]
            for t in trials
        ],
        # the server's counters over each trial's measured window (docs/evidence.md)
        "trials_metrics": [t.get("metrics") or {} for t in trials],
    }


Confirmed = tuple[
    dict[str, list[float | None]], dict[str, list[list[str]]], dict[str, list[dict[str, Any]]]
]


def confirm(
    sb: Sandbox, configs: dict[str, dict[str, str]], spec: dict[str, Any], args: argparse.Namespace
) -> Confirmed:
    """Interleaved runs: warm-up (discarded) then a measured run, config after config.

    Each run is every stream of the workload at once, levelled from its transactions by
    the session's objective (as the verdict does), reported as exp(level). A run in which
    some designed query never finished has no level (None; the verdict does not use such
    a run either): its missing stream/label names are returned beside, and each run's
    server counters (its I/O line and the raw differences).
    """
    ctl = TargetController.for_sandbox(sb)
    wl = WorkloadIn.model_validate({**spec["workload"], "duration_s": 60, "warmup_s": 5})
    workload = workload_for(wl)
    workload.prepare(sb.dsn)  # re-uses what a session loaded
    objective = Objective(kind=spec.get("objective", "throughput"))
    # the session's trial executor: apply, a discarded warm-up run, reset, measured run, stats
    executor = TrialExecutor(
        ctl,
        sb.dsn,
        workload,
        duration_s=args.confirm_duration,
        warmup_s=args.warmup,
        rate=wl.rate,  # the session's runs' rate (pgbench -R), where the workload has one
        warmup_run_s=args.confirm_warmup,
    )
    levels: dict[str, list[float | None]] = {k: [] for k in configs}
    missing: dict[str, list[list[str]]] = {k: [] for k in configs}
    io: dict[str, list[dict[str, Any]]] = {k: [] for k in configs}

    def record(rnd: int, label: str, out: TrialOutcome) -> None:
        rec = run_record(out, objective)  # what `knobtune compare` records of a run
        if rec["error"] is not None:
            raise RuntimeError(f"confirmation run of {label} failed: {rec['error']}")
        gone = rec["unfinished"]
        levels[label].append(rec["level"])
        missing[label].append(gone)
        io[label].append({"io": rec["io"], "metrics": rec["metrics"]})
        figures = ", ".join(f"{x['name']} {x['transactions']} tx" for x in rec["streams"])
        shown = "incomplete" if rec["level"] is None else f"{rec['level']:.4g}"
        print(
            f"  round {rnd + 1} {label}: level {shown} ({figures}"
            f"{'; never finished: ' + ' '.join(gone) if gone else ''})"
            f" [{io[label][-1]['io']}]",
            file=sys.stderr,
        )

    interleaved(ctl, executor, configs, args.rounds, record)
    return levels, missing, io


def _workload(spec: dict[str, Any]) -> Any:
    return workload_for(WorkloadIn.model_validate({**spec["workload"], "duration_s": 60}))


def _db_size(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return int(row[0]) if row else 0


def make_sandbox(
    spec: dict[str, Any], limits: Limits | None, args: argparse.Namespace
) -> tuple[Sandbox, dict[str, Any]]:
    """A sandbox (in the profile's cgroup from its first start) with the workload's data
    loaded under the same limits: B1's scale 100 (1.47 GiB) loads in about 93 s under
    ``small``, so there is no need to load before the cap and evict the cache after."""
    sb = Sandbox.create(limits=limits)
    try:
        t = time.monotonic()
        note = _workload(spec).prepare(sb.dsn)
        load: dict[str, Any] = {
            "seconds": round(time.monotonic() - t, 1),
            "under": str(limits) if limits is not None else "no limits",
            "note": note,
            "size_bytes": _db_size(sb.dsn),
        }
        print(
            f"  data: {load['size_bytes'] / 2**30:.2f} GiB loaded in {load['seconds']} s "
            f"under {load['under']}",
            file=sys.stderr,
        )
        if getattr(args, "settle_s", 0):
            load["settle_tps"] = settle(sb, spec, args.settle_s, args.settle_run_s)
    except BaseException:
        sb.destroy()
        raise
    return sb, load


def settle(sb: Sandbox, spec: dict[str, Any], seconds: float, run_s: int) -> list[float]:
    """The workload on the default config for ``seconds`` after the load, in runs of
    ``run_s`` (each after the workload's reset, as a session's): each run's mean tps.

    A server freshly loaded is not the production server a session meets. On profile
    small, TPC-C's level rose by about 4.6% a run over its first twelve one-minute runs
    (216 to 298 tps, bench/results/steady-C2-small.json): a session started at once
    judges its candidates on a rising floor. And after ten one-minute runs, the first
    5-minute run measured 256 tps and every later one about 170 (twice, 2026-11-27): a
    server settled on shorter runs than the session's may not be settled for them
    (--settle-run-s)."""
    each = min(run_s, seconds)
    executor = TrialExecutor(
        TargetController.for_sandbox(sb),
        sb.dsn,
        _workload(spec),
        duration_s=int(each),
        warmup_s=0,
        rate=spec["workload"].get("rate"),
    )
    levels: list[float] = []
    for i in range(math.ceil(seconds / each)):
        out = executor.run(Candidate(i, {}, None, None, "baseline"), incumbent={})
        if out.error is not None or out.result is None:
            raise SystemExit(f"settling the server, run {i + 1}: {out.error}")
        samples = out.result.samples
        levels.append(round(sum(samples) / len(samples), 1) if samples else 0.0)
        print(f"  settling, run {i + 1}: {levels[-1]} tps", file=sys.stderr)
    return levels


def in_cgroup(sb: Sandbox) -> dict[str, Any] | None:
    """Are the postmaster and all its children in the sandbox's cgroup (None: no profile)?"""
    cg = sb.cgroup
    if cg is None:
        return None
    server = sb.postmaster_pids()
    outside = sb.outside(server, cg.pids)
    return {
        "cgroup": cg.name,
        "server_processes": len(server),
        "outside": sorted(outside),
        "all_inside": bool(server) and not outside,
    }


def run_workload(name: str, args: argparse.Namespace, chart: str | None = None) -> dict[str, Any]:
    """``chart``: the session chart's file name (default e2e-NAME-chart.svg), next to --out."""
    spec = {**WORKLOADS[name], "name": name}
    if chart is not None:
        spec["chart"] = chart
    print(f"{name}: {spec['description']}", file=sys.stderr)
    limits = limits_of(args)
    if args.compare:
        return compare_only(spec, json.loads(args.compare), limits, args)
    sb, load = make_sandbox(spec, limits, args)
    with tempfile.TemporaryDirectory(prefix=f"knobtune-e2e-{name}-") as tmp, sb:
        # the sandbox's own restart method: with a profile it names the cgroup, so the
        # service's restarts start the server inside it too
        methods = {"e2e": sb.restart_method.model_dump(by_alias=True)}
        # the operator allows the service to reach this sandbox (its socket directory):
        # API clients may not reach the host's own servers otherwise (docs/security.md)
        service = ServiceProcess(
            Path(tmp),
            KNOBTUNE_RESTART_METHODS=json.dumps(methods),
            KNOBTUNE_TARGET_HOSTS=f"*,{sb.socket_dir}",
        )
        service.start()
        body: dict[str, Any] = {
            "name": f"e2e-{name}",
            "dsn": sb.dsn,
            "restart_method": "e2e",
            "data_dir": str(sb.data_dir),
            # the workload runs as the sandbox's unprivileged benchmark role, as on a
            # client's server (never as a superuser: docs/security.md)
            "workload_dsn": sb.bench_dsn,
        }
        if limits is not None:
            # the server as the profile makes it (the service would also read the cgroup)
            body.update(ram_bytes=limits.memory_bytes, cpus=limits.cpus)
        try:
            api = httpx.Client(base_url=service.url, timeout=120)
            target = api.post("/api/v1/targets", json=body)
            if target.is_error:
                raise SystemExit(f"registering the sandbox failed: {target.text}")
            registered = {k: target.json().get(k) for k in ("ram_bytes", "cpus", "hardware_note")}
            t0 = time.monotonic()
            session = tune(api, target.json()["id"], spec, args)
            session["tuning_wall_s"] = round(time.monotonic() - t0, 1)
            session["target"] = registered
        finally:
            service.stop()
        in_cg = None if limits is None else {"after_session": in_cgroup(sb)}
        record = {
            "workload": spec["description"],
            "profile": profile_of(limits),
            "data": load,
            "server_in_cgroup": in_cg,
            "session": session,
            "objective": spec.get("objective", "throughput"),
        }
        if args.rounds == 0:
            # the session alone: its own runs are the figures (a session whose runs are
            # minutes long leaves no time for rounds in the same sitting)
            return {**record, "confirmation": None}
        hw = Hardware(
            ram_bytes=(limits.memory_bytes if limits and limits.memory_bytes else None)
            or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            cpus=(limits.cpus if limits and limits.cpus else None) or os.cpu_count() or 1,
        )
        db_type = db_type_for(spec["kind"])
        pgtune_config = {k: v for k, v in pgtune(hw, db_type).items() if k in CATALOGUE}
        configs = {"default": {}, "pgtune": pgtune_config, "knobtune": session["best_config"]}
        print(f"{name}: confirmation, {args.rounds} rounds of A/B/C", file=sys.stderr)
        levels, missing, io = confirm(sb, configs, spec, args)
        if in_cg is not None:
            in_cg["after_confirmation"] = in_cgroup(sb)
    lower = Objective(kind=spec.get("objective", "throughput")).lower_is_better
    summary = summarize(levels, lower)
    vs_default = paired_gain(levels["knobtune"], levels["default"], lower)
    vs_pgtune = paired_gain(levels["knobtune"], levels["pgtune"], lower)
    claimed = session["claimed_gain"]
    # the session's claim is against its own start: PGTune's config with --start heuristic
    vs_start = vs_pgtune if args.start == "heuristic" else vs_default
    kept = (vs_start["gain"] / claimed) if claimed and claimed > 0 and vs_start["gain"] else None
    low, high = vs_start["ci95"] or (None, None)
    return {
        **record,
        "pgtune_hardware": {"ram_bytes": hw.ram_bytes, "cpus": hw.cpus},
        "pgtune_db_type": db_type,
        "configs": {"pgtune": pgtune_config, "knobtune": session["best_config"]},
        "confirmation": summary,
        "confirmation_never_finished": missing,
        "confirmation_io": io,
        "knobtune_vs_default": vs_default,
        "knobtune_vs_pgtune": vs_pgtune,
        "pgtune_vs_default": paired_gain(levels["pgtune"], levels["default"], lower),
        "claim_against": "pgtune" if args.start == "heuristic" else "default",
        "share_of_claimed_gain_confirmed": None if kept is None else round(kept, 3),
        # a small claim's share is mostly noise: is the claim inside the confirmed interval?
        "claim_within_confirmed_ci95": None
        if low is None or high is None
        else claimed is not None and low <= claimed <= high,
    }


def compare_only(
    spec: dict[str, Any],
    configs: dict[str, dict[str, str]],
    limits: Limits | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """No session: the default against each of ``configs`` ({label: {knob: value}})."""
    sb, load = make_sandbox(spec, limits, args)
    with sb:
        levels, missing, io = confirm(sb, {"default": {}, **configs}, spec, args)
    lower = Objective(kind=spec.get("objective", "throughput")).lower_is_better
    return {
        "workload": spec["description"],
        "profile": profile_of(limits),
        "data": load,
        "objective": spec.get("objective", "throughput"),
        "configs": configs,
        "confirmation": summarize(levels, lower),
        "confirmation_never_finished": missing,
        "confirmation_io": io,
        "vs_default": {k: paired_gain(levels[k], levels["default"], lower) for k in configs},
    }


def parser(description: str | None = __doc__) -> argparse.ArgumentParser:
    """The options of a session and its confirmation (bench/search_order.py takes them too)."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workloads", default="W1,W2")
    p.add_argument("--budget-s", type=float, default=900, help="tuning time budget per workload")
    p.add_argument(
        "--duration", type=int, default=30, help="seconds per tuning run (incl. warm-up)"
    )
    p.add_argument(
        "--max-trials",
        type=int,
        default=500,
        help="the session's trial budget (the default leaves it to --budget-s); a test "
        "gives trials and a wide --budget-s, so that a loaded host's slower runs cannot end "
        "the session before what it asserts",
    )
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--start", choices=["current", "heuristic"], default="current")
    p.add_argument(
        "--final-check-runs",
        type=int,
        default=6,
        help="the session's final check (best and start side by side, A B B A ...), even",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="confirmation rounds (runs per config); 0: the session only, no confirmation",
    )
    p.add_argument("--confirm-duration", type=int, default=20)
    p.add_argument("--confirm-warmup", type=int, default=10, help="discarded run before each")
    p.add_argument(
        "--compare",
        help='no session: confirm the default against these configs, JSON {"label": {knob: value}}',
    )
    p.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        help="run the sandbox as this hardware profile's small server (docs/profiles.md)",
    )
    p.add_argument("--memory", help="the profile's memory replaced, e.g. 2GB")
    p.add_argument("--disk-iops", type=int, help="the profile's disk IOPS replaced")
    p.add_argument("--disk-mbps", type=int, help="the profile's disk MB/s replaced")
    p.add_argument("--cpus", type=int, help="the profile's CPUs replaced")
    p.add_argument(
        "--allow-unsafe",
        metavar="KNOBS",
        help="let the session tune these durability-unsafe knobs too (comma-separated, "
        "e.g. synchronous_commit); it labels what it keeps as a durability trade",
    )
    p.add_argument(
        "--as-before",
        action="store_true",
        help="the session searches as before issue 29 (search_order catalogue, "
        "checkpoint_rule false): the before of a before/after",
    )
    p.add_argument(
        "--settle-s",
        type=float,
        default=0,
        help="run the workload on the default config this long after loading, before the "
        "session or the comparison, so that both meet a server past its warm-up, as a "
        "production server is (each run's level is in the output's data.settle_tps)",
    )
    p.add_argument(
        "--settle-run-s",
        type=int,
        default=60,
        help="the settling runs' length: as long as the session's runs (--duration) when "
        "those are longer, so that their first long runs are not the session's",
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "e2e.json"))
    p.add_argument(
        "--small",
        action="store_true",
        help="each workload at its smallest size (scale 1, TPC-H SF 0.01, 2 clients; pgbench's "
        f"own scripts throttled to {SMALL_RATE} tps): a check that the command runs "
        "(tests/docs), not a measurement",
    )
    return p


def parse_args(p: argparse.ArgumentParser) -> argparse.Namespace:
    """The arguments; with --small, every workload shrunk to its smallest."""
    args = p.parse_args()
    if args.rounds < 0:
        p.error(f"--rounds must be 0 (no confirmation) or more, not {args.rounds}")
    if args.settle_run_s < 1:
        p.error(f"--settle-run-s must be 1 or more, not {args.settle_run_s}")
    if args.rounds == 0 and args.compare:
        p.error("--compare is a confirmation without a session: give --rounds 1 or more")
    if args.small:
        for spec in WORKLOADS.values():
            spec["workload"] = small_workload(spec["workload"])
            if spec["workload"].get("builtin") not in KNOBTUNE_BUILTINS:
                spec["workload"]["rate"] = SMALL_RATE
        args.settle_s = min(args.settle_s, 2)
        args.settle_run_s = min(args.settle_run_s, 2)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    return args


def main() -> int:
    args = parse_args(parser())
    load_before = load_average()
    results: dict[str, Any] = {
        "machine": machine(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "args": vars(args),
        "workloads": {w: run_workload(w, args) for w in args.workloads.split(",")},
    }
    # Other work on the machine adds noise to every run; say how busy it was.
    results["load_average_1m"] = {"before": load_before, "after": load_average()}
    text = json.dumps(results, indent=2)
    Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    run_main(main)
