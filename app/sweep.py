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
* The rest runs it as a background job of the service, persisted in ``sweeps``
  (one sweep or session at a time per target; cancel stops pgbench, and restores
  nothing because the sweep changes nothing).

The analysis itself (knee, best, latency climb, advice) is pure: :mod:`optimizer.sweep`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import select, update

from app.db import Database, utcnow
from app.models import ACTIVE_STATUSES, Sweep, Target, TuningSession
from app.postgres.dsn import is_local, mask_dsn, scrub
from app.postgres.pgbench import BenchResult, BenchSpec, PgbenchError, init_data, run_bench
from app.schemas import SessionIn, SweepIn, SweepOut
from app.settings import Settings
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
STALE_S = 120.0  # a running sweep whose heartbeat is older than this lost its process


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
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT current_setting('max_connections')::int,"
                " current_setting('superuser_reserved_connections')::int,"
                " coalesce(current_setting('reserved_connections', true), '0')::int"
            ).fetchone()
    except psycopg.Error as exc:
        raise SweepError(
            f"cannot connect to {mask_dsn(dsn)}: {scrub(str(exc).strip(), dsn)}"
        ) from None
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
        jobs=min(body.jobs, clients),  # pgbench refuses more threads than clients
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
) -> dict[str, Any]:
    """Run the sweep against ``dsn`` and analyse it; the result is JSON-ready.

    ``cpus``: the server's CPUs when it is remote (a local one counts this host's).
    Raises SweepError for what the user must change; pgbench failures of single runs
    are recorded in their run and the sweep goes on. ``stop`` ends it early
    (``result["stopped"]``); the runs measured so far are analysed.
    """
    t0 = time.monotonic()
    phase = on_phase or (lambda _p: None)
    local, cpu_note = cpu_visibility(dsn)
    facts = server_facts(dsn)
    host_cpus = os.cpu_count() if local else cpus
    counts = plan_counts(body, facts, host_cpus)
    order = run_order(counts, body.repeats)
    load_before = os.getloadavg() if local else None
    if body.init:
        phase(f"loading pgbench data (scale {body.scale})")
        try:
            init_data(dsn, body.scale)
        except PgbenchError as exc:
            raise SweepError(str(exc)) from None

    def bench(spec: BenchSpec) -> tuple[BenchResult, dict[str, float]]:
        res, cpu = _bench(dsn, spec, local=local, stop=stop, workdir=workdir, app_name=app_name)
        if res.fatal:
            raise SweepError(res.error or "pgbench cannot run on this host")
        return res, cpu

    # One unrecorded run first: the sweep's first count must not be the only cold one.
    mid = counts[len(counts) // 2]
    phase(f"warming up at {mid} clients")
    warm, _ = bench(_spec(body, mid))
    runs: list[dict[str, Any]] = []
    for i, c in enumerate(order):
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


# -- persistence and the background job ------------------------------------------------------
def _stale_before() -> Any:
    return utcnow() - timedelta(seconds=STALE_S)


def busy_sweep(s: Any, target_id: int) -> int | None:
    """The target's live sweep, if any; one whose process died is marked failed first."""
    for sw in s.scalars(
        select(Sweep).where(Sweep.target_id == target_id, Sweep.status.in_(ACTIVE_STATUSES))
    ):
        seen = sw.heartbeat_at or sw.created_at
        if seen < _stale_before():
            sw.status, sw.phase, sw.finished_at = "failed", "failed", utcnow()
            sw.error = f"the process running it stopped (no heartbeat for {STALE_S:.0f} s)"
            continue
        return int(sw.id)
    return None


def create_sweep(db: Database, target_id: int, body: SweepIn, owner: str) -> Sweep:
    from app.service import ServiceError, _id

    if body.clients:
        # a count the server cannot take is the user's to fix now, not a failed job later
        with db.session() as s:
            found = s.get(Target, _id(target_id))
            dsn = found.dsn if found is not None else None
        if dsn is not None:
            try:
                plan_counts(body, server_facts(dsn), None)
            except SweepError as exc:
                raise ServiceError(422, str(exc)) from None
    with db.session() as s:
        # FOR UPDATE on PostgreSQL: two POSTs for one target take turns at the check below
        target = s.get(Target, _id(target_id), with_for_update=True)
        if target is None or target.retired_at is not None:
            raise ServiceError(404, f"no target {target_id}; GET /api/v1/targets lists them")
        sid = s.scalar(
            select(TuningSession.id).where(
                TuningSession.target_id == target.id, TuningSession.status.in_(ACTIVE_STATUSES)
            )
        )
        if sid is not None:
            raise ServiceError(
                409, f"target {target.name!r} is busy with session {sid}; wait or cancel it"
            )
        other = busy_sweep(s, target.id)
        if other is not None:
            raise ServiceError(
                409, f"target {target.name!r} is busy with sweep {other}; wait or cancel it"
            )
        now = utcnow()
        sw = Sweep(
            target_id=target.id,
            status="queued",
            phase="queued",
            request=body.model_dump(mode="json"),
            runs=[],
            cancel_requested=False,
            lease_owner=owner,
            heartbeat_at=now,
            created_at=now,
        )
        s.add(sw)
    return sw


def get_sweep(db: Database, sweep_id: int) -> Sweep:
    from app.service import ServiceError, _id

    with db.session() as s:
        sw = s.get(Sweep, _id(sweep_id))
        if sw is None:
            raise ServiceError(404, f"no sweep {sweep_id}; GET /api/v1/sweeps lists them")
        return sw


def list_sweeps(db: Database, target_id: int | None = None, limit: int = 100) -> list[Sweep]:
    from app.service import _id

    with db.session() as s:
        q = select(Sweep).order_by(Sweep.id.desc()).limit(limit)
        if target_id is not None:
            q = q.where(Sweep.target_id == _id(target_id))
        return list(s.scalars(q).all())


def latest_knee(db: Database, target_id: int) -> Sweep | None:
    """The target's last finished sweep with a knee."""
    with db.session() as s:
        sw: Sweep | None = s.scalars(
            select(Sweep)
            .where(
                Sweep.target_id == target_id,
                Sweep.status == "succeeded",
                Sweep.knee_clients.is_not(None),
            )
            .order_by(Sweep.id.desc())
            .limit(1)
        ).first()
        return sw


def cancel_sweep(db: Database, sweep_id: int) -> Sweep:
    from app.service import ServiceError, _id

    with db.session() as s:
        sw = s.get(Sweep, _id(sweep_id), with_for_update=True)
        if sw is None:
            raise ServiceError(404, f"no sweep {sweep_id}")
        if sw.status not in ACTIVE_STATUSES:
            raise ServiceError(409, f"sweep {sweep_id} is already {sw.status}")
        sw.cancel_requested = True
        sw.phase = "cancelling (nothing to restore: a sweep changes no setting)"
        return sw


def sweep_out(sw: Sweep) -> SweepOut:
    r = sw.result or {}
    planned = r.get("runs_planned") or ((sw.runs or [{}])[-1].get("of") if sw.runs else None)
    elapsed = None
    if sw.started_at is not None:
        elapsed = round(((sw.finished_at or utcnow()) - sw.started_at).total_seconds(), 1)
    return SweepOut(
        id=sw.id,
        target_id=sw.target_id,
        status=sw.status,
        phase=sw.phase,
        request=sw.request,
        runs_done=len(sw.runs or []),
        runs_planned=planned,
        elapsed_s=elapsed,
        runs=sw.runs or [],
        points=r.get("points", []),
        knee_clients=sw.knee_clients,
        knee_tps=r.get("knee_tps"),
        best_clients=sw.best_clients,
        best_tps=sw.best_tps,
        latency_climb_clients=r.get("latency_climb_clients"),
        pool_size=r.get("pool_size"),
        connection_cost=r.get("connection_cost"),
        advice=r.get("advice", []),
        warnings=r.get("warnings", []),
        cpu_visible=r.get("cpu_visible"),
        cpu_note=r.get("cpu_note"),
        max_connections=r.get("max_connections"),
        error=sw.error,
        created_at=sw.created_at,
        started_at=sw.started_at,
        finished_at=sw.finished_at,
    )


class SweepJob:
    """Runs one queued sweep in this process: heartbeat, cancel, persisted runs."""

    def __init__(self, db: Database, settings: Settings, sweep_id: int) -> None:
        self.db, self.settings, self.sweep_id = db, settings, sweep_id
        self.stop = threading.Event()
        self._done = threading.Event()
        self.phase = "starting"

    def _write(self, **values: Any) -> None:
        with self.db.session() as s:
            s.execute(update(Sweep).where(Sweep.id == self.sweep_id).values(**values))

    def _beat(self) -> None:
        while not self._done.wait(1.0):
            try:
                with self.db.session() as s:
                    row = s.execute(
                        update(Sweep)
                        .where(Sweep.id == self.sweep_id)
                        .values(heartbeat_at=utcnow(), phase=self.phase)
                        .returning(Sweep.cancel_requested)
                    ).first()
                if row is not None and row[0]:
                    self.stop.set()
            except Exception as exc:  # metadata DB hiccup: the measurement goes on
                log.warning("sweep %s heartbeat failed: %s", self.sweep_id, exc)

    def _on_run(self, rec: dict[str, Any]) -> None:
        with self.db.session() as s:
            sw = s.get(Sweep, self.sweep_id)
            if sw is not None:
                sw.runs = [*(sw.runs or []), rec]

    def _on_phase(self, phase: str) -> None:
        self.phase = phase

    def run(self) -> None:
        with self.db.session() as s:
            sw = s.get(Sweep, self.sweep_id)
            if sw is None or sw.status != "queued":
                return
            if sw.cancel_requested:
                sw.status, sw.phase, sw.finished_at = "cancelled", "cancelled", utcnow()
                return
            target = s.get(Target, sw.target_id)
            assert target is not None
            dsn, cpus = target.dsn, target.cpus
            body = SweepIn.model_validate(sw.request)
            sw.status, sw.phase, sw.started_at, sw.heartbeat_at = (
                "running",
                "starting",
                utcnow(),
                utcnow(),
            )
        beat = threading.Thread(target=self._beat, name=f"sweep-{self.sweep_id}", daemon=True)
        beat.start()
        # absolute: pgbench runs inside its run directory and is given log paths under it
        workdir = (Path(self.settings.work_dir) / "sweeps" / str(self.sweep_id)).resolve()
        try:
            result = measure(
                dsn,
                body,
                cpus=cpus,
                stop=self.stop,
                on_run=self._on_run,
                on_phase=self._on_phase,
                workdir=workdir,
                app_name=f"knobtune-sweep-{self.sweep_id}",
            )
        except SweepError as exc:
            self._finish("failed", error=scrub(str(exc), dsn))
            return
        except Exception as exc:
            log.exception("sweep %s crashed", self.sweep_id)
            self._finish("failed", error=scrub(f"internal error: {exc}", dsn))
            return
        finally:
            self._done.set()
            beat.join(timeout=5)
            with contextlib.suppress(OSError):
                workdir.rmdir()
        status = "cancelled" if result["stopped"] else "succeeded"
        error = None
        if status == "succeeded" and result["knee_clients"] is None:
            # every run failed: the record stays, and says why
            status = "failed"
            errors = [r.get("error") for r in result.get("runs", []) if r.get("error")]
            error = "no run succeeded" + (f"; the first said: {errors[0]}" if errors else "")
        self._finish(
            status,
            error=error,
            result=result,
            knee_clients=result["knee_clients"],
            best_clients=result["best_clients"],
            best_tps=result["best_tps"],
        )

    def _finish(self, status: str, **values: Any) -> None:
        self._write(status=status, phase=status, finished_at=utcnow(), **values)


def start_sweep_job(db: Database, settings: Settings, sweep_id: int) -> threading.Thread:
    """Run the sweep on its own thread: it must not hold one of the scheduler's workers,
    which the claim loop and sessions need."""
    job = SweepJob(db, settings, sweep_id)
    t = threading.Thread(target=job.run, name=f"sweep-{sweep_id}", daemon=True)
    t.start()
    return t


def export_header(db: Database, target_id: int) -> dict[str, str]:
    """Lines for a session's exported config: the target's last sweep and its advice."""
    sw = latest_knee(db, target_id)
    if sw is None or sw.result is None:
        return {}
    r = sw.result
    wl = sw.request.get("builtin") or "custom scripts"
    out = {
        "client sweep": (
            f"sweep {sw.id} ({wl}, {sw.finished_at:%Y-%m-%d %H:%M} UTC): knee at "
            f"{r['knee_clients']} clients ({r['knee_tps']:.0f} tps), best {r['best_tps']:.0f} "
            f"tps at {r['best_clients']} clients"
        ),
        "connection pool": f"about {r['pool_size']} server connections for that workload",
    }
    cost = r.get("connection_cost") or {}
    if cost.get("tps_new_connection"):
        out["connection per transaction"] = (
            f"{cost['throughput_loss']:.0%} less throughput at {cost['clients']} clients "
            f"(about {cost['ms_per_connection']:.1f} ms per new connection): use a pooler"
        )
    for i, w in enumerate(r.get("warnings", [])):
        out[f"WARNING (sweep){'' if i == 0 else f' {i + 1}'}"] = w
    return out


# -- sessions with clients "auto" (issue 16, part 3) -------------------------------------
FAR_PAST_KNEE = 2  # a session's clients at least this many times a known knee gets a note
AUTO_RUN_S = 10  # longest run of a session's own sweep (its runs are short by design)


def _sweep_of(wl: Any) -> SweepIn:
    """The sweep of a session's workload: same scripts and data, short runs, no -C."""
    duration = max(3, min(int(wl.duration_s), AUTO_RUN_S))
    return SweepIn(
        builtin=wl.builtin,
        builtin_weight=wl.builtin_weight,
        scripts=wl.scripts,
        scale=wl.scale,
        init=wl.init,
        protocol=wl.protocol,
        jobs=wl.jobs,
        duration_s=duration,
        warmup_s=min(int(wl.warmup_s), duration - 1),
        connect_cost=False,
    )


def auto_clients(
    db: Database,
    session_id: int,
    body: SessionIn,
    dsn: str,
    cpus: int | None,
    stop: threading.Event | None,
    workdir: Path,
) -> SessionIn:
    """Sweep the session's workload and return its request with ``clients`` = the knee.

    The sweep is stored (status succeeded, ``result.session_id``), so the session's note,
    its export and later sessions can refer to it. Raises SweepError when no knee came out
    (every run failed); a stop returns the request unchanged (the caller checks its flag).
    """
    wl = body.workload
    sweep_body = _sweep_of(wl)
    started = utcnow()
    result = measure(
        dsn,
        sweep_body,
        cpus=cpus,
        stop=stop,
        workdir=workdir.resolve() / "sweep",
        app_name=f"knobtune-pgbench-s{session_id}",
    )
    if result["stopped"]:
        return body
    knee = result["knee_clients"]
    if knee is None:
        errors = [r["error"] for r in result["runs"] if r.get("error")]
        raise SweepError(
            "clients auto: the client sweep measured nothing"
            + (f" (first error: {errors[0]})" if errors else "")
        )
    with db.session() as s:
        sess = s.get(TuningSession, session_id)
        assert sess is not None
        sw = Sweep(
            target_id=sess.target_id,
            status="succeeded",
            phase="succeeded",
            request=sweep_body.model_dump(mode="json"),
            runs=result["runs"],
            result={**result, "session_id": session_id},
            knee_clients=knee,
            best_clients=result["best_clients"],
            best_tps=result["best_tps"],
            cancel_requested=False,
            created_at=started,
            started_at=started,
            finished_at=utcnow(),
        )
        s.add(sw)
    new_wl = wl.model_copy(update={"clients": knee, "jobs": min(wl.jobs, knee)})
    return body.model_copy(update={"workload": new_wl})


def _same_workload(req: dict[str, Any], wl: Any) -> bool:
    scripts = [s.model_dump(mode="json") for s in wl.scripts] if wl.scripts else None
    return bool(
        req.get("builtin") == wl.builtin
        and (req.get("scripts") or None) == scripts
        and req.get("scale") == wl.scale
    )


def session_notes(db: Database, session_id: int, body: SessionIn) -> list[str]:
    """Notes for a session from the target's sweeps: the sweep that chose its clients
    ("auto"), or a warning that its clients are far past a known knee of its workload."""
    with db.session() as s:
        sess = s.get(TuningSession, session_id)
        if sess is None:
            return []
        sweeps = list(
            s.scalars(
                select(Sweep)
                .where(Sweep.target_id == sess.target_id, Sweep.status == "succeeded")
                .order_by(Sweep.id.desc())
            ).all()
        )
    for sw in sweeps:
        r = sw.result or {}
        if r.get("session_id") == session_id:
            return [
                f"clients auto: {r['knee_clients']} (client sweep {sw.id} before tuning: counts "
                f"{r['counts']}, knee {r['knee_clients']} at {r['knee_tps']:.0f} tps, best "
                f"{r['best_tps']:.0f} tps at {r['best_clients']} clients; the session tunes at "
                "the knee, where the configuration and not a queue is measured)"
            ]
    return knee_note(sweeps, body)


def knee_note(sweeps: list[Sweep], body: SessionIn) -> list[str]:
    """A note when the session's clients are far past the knee of the latest sweep of the
    same workload (builtin, scripts, scale) among ``sweeps`` (newest first)."""
    clients = body.workload.clients
    if not isinstance(clients, int):
        return []
    for sw in sweeps:
        r = sw.result or {}
        if sw.knee_clients and _same_workload(sw.request, body.workload):
            if r.get("still_rising") or clients < FAR_PAST_KNEE * sw.knee_clients:
                return []
            return [
                f"clients {clients} is far past the knee of this workload on this target "
                f"({sw.knee_clients} clients, sweep {sw.id}): throughput does not rise past it, "
                "so trials measure lock and CPU queues more than the configuration; consider "
                f'clients {sw.knee_clients} (or "auto")'
            ]
    return []
