"""Client sweeps as a user sees them: create (one holder per target), get, list, cancel;
what a sweep adds to a session's notes and exports.

The measurement is :mod:`app.sweeps.measure` (no DB); a sweep is run, kept alive and
resumed by the scheduler (:mod:`app.sweeps.runner`), like a session.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from app.db import Database, utcnow
from app.errors import ServiceError, to_id
from app.lease import request_cancel
from app.models import Sweep, Target, TuningSession
from app.sessions.schemas import SessionIn
from app.sweeps.auto import jobs_capped_text
from app.sweeps.measure import SweepError, plan_counts, server_facts
from app.sweeps.schemas import SweepIn, SweepOut
from app.targets.holds import server_holder
from app.targets.recommend import refuse_if_recommend_only
from app.targets.service import ensure_server_id

FAR_PAST_KNEE = 2  # a session's clients at least this many times a known knee gets a note


def create_sweep(db: Database, target_id: int, body: SweepIn) -> Sweep:
    """A queued sweep of the target; the scheduler claims and runs it (like a session)."""
    with db.session() as s:
        found = s.get(Target, to_id(target_id))
    if found is not None:
        refuse_if_recommend_only(found, "run a client sweep (a benchmark on it)")
        ensure_server_id(db, found)  # targets registered before server identities were kept
    if body.clients:
        # a count the server cannot take is the user's to fix now, not a failed job later
        dsn = found.workload_dsn if found is not None else None
        if dsn is not None:
            try:
                plan_counts(body, server_facts(dsn), None)
            except SweepError as exc:
                raise ServiceError(422, str(exc)) from None
    with db.session() as s:
        # FOR UPDATE on PostgreSQL: two POSTs for one target take turns at the check below
        target = s.get(Target, to_id(target_id), with_for_update=True)
        if target is None or target.retired_at is not None:
            raise ServiceError(404, f"no target {target_id}", fix="list-targets")
        held = server_holder(s, target)  # the server, not the target row
        if held is not None:
            raise ServiceError(409, f"{held}; wait or cancel it")
        sw = Sweep(
            target_id=target.id,
            status="queued",
            phase="queued",
            request=body.model_dump(mode="json"),
            runs=[],
            cancel_requested=False,
            attempts=0,
            created_at=utcnow(),
        )
        s.add(sw)
    return sw


def get_sweep(db: Database, sweep_id: int) -> Sweep:
    with db.session() as s:
        sw = s.get(Sweep, to_id(sweep_id))
        if sw is None:
            raise ServiceError(404, f"no sweep {sweep_id}", fix="list-sweeps")
        return sw


def list_sweeps(db: Database, target_id: int | None = None, limit: int = 100) -> list[Sweep]:
    with db.session() as s:
        q = select(Sweep).order_by(Sweep.id.desc()).limit(limit)
        if target_id is not None:
            q = q.where(Sweep.target_id == to_id(target_id))
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
    with db.session() as s:
        stopping = "cancelling (nothing to restore: a sweep changes no setting)"
        outcome = request_cancel(s, Sweep, to_id(sweep_id), stopping)
        sw = s.get(Sweep, to_id(sweep_id))
        if sw is None:
            raise ServiceError(404, f"no sweep {sweep_id}")
        if outcome is None:
            raise ServiceError(409, f"sweep {sweep_id} is already {sw.status}")
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


def export_header(db: Database, target_id: int) -> dict[str, str]:
    """Lines for a session's exported config: the target's last sweep and its advice."""
    sw = latest_knee(db, target_id)
    return sweep_header(sw) if sw is not None else {}


def sweep_header(sw: Sweep) -> dict[str, str]:
    """A sweep's knee, pool advice and warnings as export header lines."""
    if sw.result is None:
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
                + (f"; {capped}" if (capped := jobs_capped_text(r)) else "")
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
