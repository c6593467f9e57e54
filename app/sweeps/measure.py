"""Client sweep (issue 16): the workload at increasing client counts, to find the knee.

Tuning at a concurrency past the knee measures lock and CPU queues, not the
configuration; the sweep finds where throughput stops rising before anyone tunes.

* :func:`measure` runs it against a DSN: a doubling series of client counts from 1 up
  to a cap derived from ``max_connections`` and the CPUs (or the user's list), each a
  short pgbench run with warm-up, every count ``repeats`` times in up-down order (drift
  shifts all counts alike), then ``pgbench -C`` at the knee for the cost of connecting
  per transaction. A failing run is recorded and the sweep goes on. For a local target
  the host's CPU utilisation and I/O wait come from /proc/stat over each run's measured
  window; for a remote one the record says why CPU is not visible.
* It is pure measurement, no metadata DB: :mod:`app.sweeps.service` keeps sweeps in
  ``sweeps`` and :mod:`app.sweeps.runner` runs one under a lease, like a session (one sweep
  or session at a time per target; cancel stops pgbench, and restores nothing because
  the sweep changes nothing). ``done`` resumes a sweep a dead process left: its stored
  runs count, the rest of the plan is measured.

The analysis itself (knee, best, latency climb, advice) is pure: :mod:`optimizer.sweep`.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from app.postgres.benchlock import HostBenchLock, maybe_turn
from app.postgres.connect import connect_target, current
from app.postgres.dsn import is_local, mask_dsn, scrub
from app.postgres.pgbench import (
    BenchResult,
    BenchSpec,
    PgbenchError,
    init_data,
    pgbench_jobs,
    run_bench,
)
from app.postgres.roles import privileges, refusal
from app.sweeps.schemas import SweepIn
from optimizer.sweep import (
    ConnectionCost,
    SweepRun,
    advise,
    analyse,
    client_cap,
    doubling_series,
    run_order,
)
from optimizer.verdict import run_stat

log = logging.getLogger(__name__)

PROC_STAT = Path("/proc/stat")


class SweepError(Exception):
    """The sweep cannot run (bad counts for this server, pgbench unusable): a user's fix."""


# -- host CPU ------------------------------------------------------------------------
def cpu_times(path: Path = PROC_STAT) -> tuple[int, int, int] | None:
    """(total, idle, iowait) jiffies of all CPUs from /proc/stat; None where unreadable."""
    try:
        with path.open() as f:
            for line in f:
                if line.startswith("cpu "):
                    v = [int(x) for x in line.split()[1:]]
                    # user nice system idle iowait irq softirq steal (guest is inside user)
                    total = sum(v[:8])
                    return total, v[3], v[4] if len(v) > 4 else 0
    except (OSError, ValueError):
        return None
    return None


def cpu_share(a: tuple[int, int, int] | None, b: tuple[int, int, int] | None) -> dict[str, float]:
    """Busy and I/O-wait fractions of the host's CPU time between two readings."""
    if a is None or b is None or b[0] <= a[0]:
        return {}
    total = b[0] - a[0]
    idle, iowait = b[1] - a[1], b[2] - a[2]
    return {
        "util": round(max(0.0, total - idle - iowait) / total, 4),
        "iowait": round(max(0, iowait) / total, 4),
    }


def cpu_visibility(dsn: str) -> tuple[bool, str]:
    """Whether this host's /proc/stat is the target server's CPU, and why not."""
    try:
        local = is_local(dsn)
    except psycopg.Error:
        return False, "CPU not sampled: the connection string cannot be parsed"
    if local:
        return True, (
            "host CPU from /proc/stat over each run's measured seconds; it includes "
            "pgbench's own CPU (it runs on the same host)"
        )
    host = str(conninfo_to_dict(dsn).get("host") or conninfo_to_dict(dsn).get("hostaddr") or "?")
    return False, (
        f"CPU is not visible: the target ({host}) is not on this host, and /proc/stat here "
        "would measure knobtune's machine, not the server's; watch the server's own CPU "
        "(e.g. vmstat or node_exporter) during the sweep"
    )


# -- server facts ----------------------------------------------------------------------
def server_facts(dsn: str) -> dict[str, int]:
    """max_connections and the connections reserved for superusers (and roles, PG 16+)."""
    try:
        with connect_target(dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT current_setting('max_connections')::int,"
                " current_setting('superuser_reserved_connections')::int,"
                " coalesce(current_setting('reserved_connections', true), '0')::int"
            ).fetchone()
            # a sweep runs the client's scripts: never as a role that reaches the
            # server's host (app/postgres/roles.py), checked before each sweep
            user, unfit = privileges(conn)
    except psycopg.Error as exc:
        raise SweepError(
            f"cannot connect to {mask_dsn(dsn)}: {scrub(str(exc).strip(), dsn)}"
        ) from None
    if unfit and not current().operator:
        raise SweepError(refusal(user, unfit))
    assert row is not None
    return {"max_connections": row[0], "reserved": row[1] + row[2]}


def plan_counts(body: SweepIn, facts: dict[str, int], cpus: int | None) -> list[int]:
    """The client counts: the user's list (checked against the server) or a doubling
    series up to the cap."""
    usable = facts["max_connections"] - facts["reserved"] - 3
    if body.clients:
        too_many = [c for c in body.clients if c > usable]
        if too_many:
            raise SweepError(
                f"clients {too_many} exceed what the server allows a benchmark "
                f"(max_connections={facts['max_connections']} minus {facts['reserved']} "
                f"reserved minus 3 for knobtune = {usable}); give smaller counts"
            )
        return sorted(set(body.clients))
    try:
        cap = client_cap(facts["max_connections"], cpus, facts["reserved"])
    except ValueError as exc:
        raise SweepError(str(exc)) from None
    return doubling_series(cap)


# -- measuring ------------------------------------------------------------------------
def _spec(body: SweepIn, clients: int, *, connect_per_transaction: bool = False) -> BenchSpec:
    return BenchSpec(
        builtin=body.builtin,
        builtin_weight=body.builtin_weight,
        scripts=[(s.sql, s.weight) for s in body.scripts] if body.scripts else None,
        clients=clients,
        jobs=pgbench_jobs(body.jobs, clients),
        duration_s=body.duration_s,
        warmup_s=body.warmup_s,
        protocol=body.protocol,
        connect_per_transaction=connect_per_transaction,
    )


def _bench(
    dsn: str,
    spec: BenchSpec,
    *,
    local: bool,
    stop: threading.Event | None,
    workdir: Path | None,
    app_name: str | None,
) -> tuple[BenchResult, dict[str, float]]:
    """One pgbench run, with host CPU over its measured seconds (after the warm-up)."""
    marks: dict[str, tuple[int, int, int] | None] = {}

    def on_sample(t: float, _tps: float) -> None:
        if not local:
            return
        if "start" not in marks and t >= spec.warmup_s - 0.5:
            marks["start"] = cpu_times()
        elif "start" in marks and t <= spec.duration_s + 0.5:
            marks["end"] = cpu_times()

    if local and spec.warmup_s == 0:
        marks["start"] = cpu_times()
    res = run_bench(dsn, spec, on_sample=on_sample, stop=stop, workdir=workdir, app_name=app_name)
    return res, cpu_share(marks.get("start"), marks.get("end")) if local else {}


def _level(res: BenchResult) -> tuple[float | None, float]:
    """The run's throughput level (the verdict's trimmed log centre) and its variance."""
    if not res.ok:
        return None, 0.0
    if res.samples:
        st = run_stat(res.samples)
        return math.exp(st.centre), st.within_var
    return (res.tps if res.tps and res.tps > 0 else None), 0.0


def _record(clients: int, order: int, res: BenchResult, cpu: dict[str, float]) -> dict[str, Any]:
    tps, within = _level(res)
    return {
        "clients": clients,
        "order": order,
        "tps": None if tps is None else round(tps, 3),
        "within_var": within,
        "latency_mean_ms": res.latency_mean_ms,
        "latency_p95_ms": res.latency_p95_ms,
        "latency_p99_ms": res.latency_p99_ms,
        "failed_transactions": res.failed_transactions,
        "transactions": res.transactions,
        "samples": res.samples,
        "cpu": cpu or None,
        "error": res.error,
    }


def measure(
    dsn: str,
    body: SweepIn,
    *,
    cpus: int | None = None,
    stop: threading.Event | None = None,
    on_run: Callable[[dict[str, Any]], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
    workdir: Path | None = None,
    app_name: str | None = None,
    done: Sequence[dict[str, Any]] = (),
    bench_lock: HostBenchLock | None = None,
) -> dict[str, Any]:
    """Run the sweep against ``dsn`` and analyse it; the result is JSON-ready.

    ``bench_lock``: each run takes a turn of its host's benchmark lock
    (app/postgres/benchlock.py), so no two knobtune benchmarks of one host overlap.

    ``cpus``: the server's CPUs when it is remote (a local one counts this host's).
    Raises SweepError for what the user must change; pgbench failures of single runs
    are recorded in their run and the sweep goes on. ``stop`` ends it early
    (``result["stopped"]``); the runs measured so far are analysed. ``done``: the runs
    an earlier process measured (a resume); they must be the plan's first runs, and only
    the rest is measured (after a fresh warm-up: this process's first run is cold too).
    """
    t0 = time.monotonic()
    phase = on_phase or (lambda _p: None)
    local, cpu_note = cpu_visibility(dsn)
    facts = server_facts(dsn)
    host_cpus = os.cpu_count() if local else cpus
    counts = plan_counts(body, facts, host_cpus)
    order = run_order(counts, body.repeats)
    if [r.get("clients") for r in done] != order[: len(done)]:
        raise SweepError(
            f"cannot resume: the {len(done)} stored runs are not the start of the plan "
            f"{order} (the server's max_connections or CPUs changed since); start a new sweep"
        )
    load_before = os.getloadavg() if local else None
    if body.init:
        phase(f"loading pgbench data (scale {body.scale})")
        try:
            init_data(dsn, body.scale)
        except PgbenchError as exc:
            raise SweepError(str(exc)) from None

    def bench(spec: BenchSpec) -> tuple[BenchResult, dict[str, float]]:
        with maybe_turn(bench_lock, stop):
            res, cpu = _bench(dsn, spec, local=local, stop=stop, workdir=workdir, app_name=app_name)
        if res.fatal:
            raise SweepError(res.error or "pgbench cannot run on this host")
        return res, cpu

    # One unrecorded run first: the sweep's first count must not be the only cold one.
    mid = counts[len(counts) // 2]
    phase(f"warming up at {mid} clients")
    warm, _ = bench(_spec(body, mid))
    runs: list[dict[str, Any]] = list(done)
    for i, c in enumerate(order):
        if i < len(done):
            continue
        if stop is not None and stop.is_set():
            break
        phase(f"run {i + 1}/{len(order)}: {c} clients")
        res, cpu = bench(_spec(body, c))
        rec = _record(c, i, res, cpu) | {"of": len(order)}
        runs.append(rec)
        if on_run is not None:
            on_run(rec)
    stopped = stop is not None and stop.is_set()
    analysis = analyse(
        [
            SweepRun(
                clients=r["clients"],
                tps=r["tps"],
                within_var=r["within_var"],
                latency_mean_ms=r["latency_mean_ms"],
                latency_p95_ms=r["latency_p95_ms"],
                latency_p99_ms=r["latency_p99_ms"],
                failed_transactions=r["failed_transactions"],
            )
            for r in runs
        ]
        or [SweepRun(clients=counts[0], tps=None)],
        tolerance=body.tolerance,
    )
    cost: ConnectionCost | None = None
    cost_out: dict[str, Any] | None = None
    knee = analysis.knee_clients
    if body.connect_cost and knee is not None and analysis.knee_tps and not stopped:
        phase(f"connection cost: pgbench -C at {knee} clients")
        res, cpu = bench(_spec(body, knee, connect_per_transaction=True))
        tps_c, _ = _level(res)
        cost_out = {"clients": knee, "error": res.error, "cpu": cpu or None}
        if tps_c:
            cost = ConnectionCost(knee, analysis.knee_tps, tps_c)
            cost_out |= {
                "tps_persistent": round(cost.tps_persistent, 2),
                "tps_new_connection": round(tps_c, 2),
                "throughput_loss": round(cost.throughput_loss, 4),
                "ms_per_connection": round(cost.ms_per_connection, 3),
            }
    advice = advise(analysis, max_connections=facts["max_connections"], cost=cost)
    points = []
    for p in analysis.points:
        cpus_at = [r["cpu"] for r in runs if r["clients"] == p.clients and r["cpu"]]
        point = asdict(p)
        point["cpu_util"] = _avg([c.get("util") for c in cpus_at])
        point["cpu_iowait"] = _avg([c.get("iowait") for c in cpus_at])
        points.append(point)
    return {
        "counts": counts,
        "order": order,
        "runs_planned": len(order),
        "stopped": stopped,
        "max_connections": facts["max_connections"],
        "reserved_connections": facts["reserved"],
        "cpus": host_cpus,
        "cpu_visible": local,
        "cpu_note": cpu_note,
        "points": points,
        "best_clients": analysis.best_clients,
        "best_tps": analysis.best_tps,
        "knee_clients": knee,
        "knee_tps": analysis.knee_tps,
        "latency_climb_clients": analysis.latency_climb_clients,
        "still_rising": analysis.still_rising,
        "run_sd": round(analysis.run_sd, 4),
        "tolerance": analysis.tolerance,
        "connection_cost": cost_out,
        "pool_size": advice.pool_size,
        "advice": advice.lines,
        "warnings": advice.warnings,
        "warmup": {"clients": mid, "tps": warm.tps, "error": warm.error},
        "loadavg": {
            "before": round(load_before[0], 2) if load_before else None,
            "after": round(os.getloadavg()[0], 2) if local else None,
        },
        "wall_s": round(time.monotonic() - t0, 1),
        "runs": runs,
    }


def _avg(values: list[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return round(sum(v) / len(v), 4) if v else None
