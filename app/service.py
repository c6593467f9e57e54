"""Domain operations behind the REST API and the CLI: targets, sessions, exports."""

from __future__ import annotations

import logging
import secrets
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from app.db import Database, utcnow
from app.models import ACTIVE_STATUSES, Schedule, Target, Trial, TuningSession
from app.postgres.sandbox import PostgresNotInstalled, Sandbox, SandboxError
from app.postgres.target import ConnectError, TargetController, TargetError, mask_dsn
from app.schemas import (
    Progress,
    ScheduleIn,
    ScheduleOut,
    SessionIn,
    SessionOut,
    TargetIn,
    TargetOut,
    TrialOut,
)
from app.settings import Settings
from app.tuning import RequestError, build_space, hardware_from, rows_from_json, rows_to_json
from optimizer.catalogue import CATALOGUE
from optimizer.render import Recommendation, render_conf, render_json, render_sql

log = logging.getLogger(__name__)


@dataclass
class ServiceError(Exception):
    """An error the user can fix: an HTTP status and a message that says what to change."""

    status: int
    message: str

    def __str__(self) -> str:
        return self.message


_ID_MAX = 2**63 - 1  # the metadata DB's integers are 64-bit at most


def _id(n: int) -> int:
    """An id as a query parameter; one no 64-bit column can hold matches nothing (0).

    SQLite's driver raises on Python ints beyond 64 bits: looking one up must be
    "not found", not a server error.
    """
    return n if -_ID_MAX - 1 <= n <= _ID_MAX else 0


# -- targets ---------------------------------------------------------------------
def create_target(db: Database, settings: Settings, body: TargetIn) -> Target:
    with db.session() as s:
        if s.scalar(select(Target.id).where(Target.name == body.name)) is not None:
            raise ServiceError(409, f"a target named {body.name!r} exists; pick another name")
    sandbox: Sandbox | None = None
    dsn, restart, data_dir = body.dsn or "", body.restart_command, body.data_dir
    if body.sandbox:
        root = (
            Path(settings.work_dir).resolve()
            / "sandboxes"
            / f"{body.name.replace(' ', '_')}-{secrets.token_hex(3)}"
        )
        try:
            sandbox = Sandbox.create(root)
        except (PostgresNotInstalled, SandboxError) as exc:
            raise ServiceError(422, str(exc)) from exc
        dsn, restart, data_dir = sandbox.dsn, sandbox.restart_command, str(sandbox.data_dir)
    try:
        ctl = TargetController(
            dsn, restart_command=restart, data_dir=Path(data_dir) if data_dir else None
        )
        probe = ctl.probe(sorted(CATALOGUE))
        if not probe.can_alter_system:
            raise ServiceError(
                422,
                "the target's user may not run ALTER SYSTEM: connect as a superuser, or "
                "GRANT ALTER SYSTEM ON PARAMETER <knob> TO <user> for each knob (PostgreSQL 15+)",
            )
        ram = body.ram_bytes or probe.ram_bytes
        cpus = body.cpus or probe.cpus
        if not ram or not cpus:
            raise ServiceError(
                422, "the target is not on this host: declare its ram_bytes and cpus"
            )
        target = Target(
            name=body.name,
            dsn=dsn,
            restart_command=restart,
            data_dir=data_dir,
            ram_bytes=ram,
            cpus=cpus,
            sandbox_dir=str(sandbox.root) if sandbox else None,
            probe={
                "version": probe.version,
                "version_num": probe.version_num,
                "local": probe.local,
                "rows": rows_to_json(probe.settings),
            },
            created_at=utcnow(),
        )
        with db.session() as s:
            s.add(target)
        return target
    except ConnectError as exc:
        _drop_sandbox(sandbox)
        raise ServiceError(422, f"cannot connect to the target: {exc}") from exc
    except TargetError as exc:
        _drop_sandbox(sandbox)
        raise ServiceError(422, str(exc)) from exc
    except IntegrityError as exc:
        _drop_sandbox(sandbox)
        raise ServiceError(409, f"a target named {body.name!r} exists; pick another name") from exc
    except BaseException:
        _drop_sandbox(sandbox)
        raise


def _drop_sandbox(sandbox: Sandbox | None) -> None:
    if sandbox is not None:
        sandbox.destroy()


def get_target(db: Database, target_id: int) -> Target:
    with db.session() as s:
        t = s.get(Target, _id(target_id))
        if t is None:
            raise ServiceError(404, f"no target {target_id}; GET /api/v1/targets lists them")
        return t


def _busy_session(s: Any, target_id: int) -> int | None:
    sid: int | None = s.scalar(
        select(TuningSession.id).where(
            TuningSession.target_id == _id(target_id), TuningSession.status.in_(ACTIVE_STATUSES)
        )
    )
    return sid


def target_out(db: Database, target: Target) -> TargetOut:
    with db.session() as s:
        busy = _busy_session(s, target.id)
    return TargetOut(
        id=target.id,
        name=target.name,
        dsn=mask_dsn(target.dsn),
        restart_command=target.restart_command,
        data_dir=target.data_dir,
        ram_bytes=target.ram_bytes,
        cpus=target.cpus,
        sandbox=target.sandbox_dir is not None,
        server_version=(target.probe or {}).get("version"),
        busy_session_id=busy,
        created_at=target.created_at,
    )


def list_targets(db: Database) -> list[Target]:
    with db.session() as s:
        return list(s.scalars(select(Target).order_by(Target.id)).all())


def delete_target(db: Database, target_id: int) -> None:
    with db.session() as s:
        t = s.get(Target, _id(target_id))
        if t is None:
            raise ServiceError(404, f"no target {target_id}")
        busy = _busy_session(s, target_id)
        if busy is not None:
            raise ServiceError(
                409, f"target {target_id} is busy with session {busy}; cancel it first"
            )
        from app.sweep import busy_sweep

        sweeping = busy_sweep(s, t.id)
        if sweeping is not None:
            raise ServiceError(
                409, f"target {target_id} is busy with sweep {sweeping}; cancel it first"
            )
        # Finished sessions keep their history: detach them by deleting them
        # only when the user deletes the target.
        for sess in s.scalars(
            select(TuningSession).where(TuningSession.target_id == _id(target_id))
        ):
            s.delete(sess)
        sandbox_dir = t.sandbox_dir
        s.delete(t)
    if sandbox_dir:
        try:
            Sandbox.open(Path(sandbox_dir)).destroy()
        except Exception:
            log.warning("could not stop sandbox %s cleanly; removing its files", sandbox_dir)
            shutil.rmtree(sandbox_dir, ignore_errors=True)


def start_sandboxes(db: Database) -> None:
    """Managed sandboxes do not survive a reboot of the service's host: start them again."""
    for t in list_targets(db):
        if t.sandbox_dir and Path(t.sandbox_dir).exists():
            try:
                sb = Sandbox.open(Path(t.sandbox_dir))
                if not sb.is_running():
                    sb.start()
            except Exception:
                log.warning("could not start sandbox of target %s", t.name, exc_info=True)


# -- sessions -------------------------------------------------------------------------
def validate_session(target: Target, body: SessionIn) -> None:
    """Raise ServiceError(422) when the request cannot run on this target."""
    rows = rows_from_json((target.probe or {}).get("rows", {}))
    try:
        hw = hardware_from(target.ram_bytes, target.cpus)
        build_space(body, rows, hw)
    except RequestError as exc:
        raise ServiceError(422, str(exc)) from exc


def create_session(
    db: Database, body: SessionIn, *, schedule_id: int | None = None
) -> TuningSession:
    with db.session() as s:
        target = s.get(Target, _id(body.target_id))
        if target is None:
            raise ServiceError(
                422, f"unknown target_id {body.target_id}: register it with POST /api/v1/targets"
            )
        validate_session(target, body)
        busy = _busy_session(s, target.id)
        if busy is not None:
            raise ServiceError(
                409, f"target {target.name!r} is busy with session {busy}; wait or cancel it"
            )
        from app.sweep import busy_sweep  # a sweep holds its target like a session

        sweeping = busy_sweep(s, target.id)
        if sweeping is not None:
            raise ServiceError(
                409, f"target {target.name!r} is busy with sweep {sweeping}; wait or cancel it"
            )
    sess = TuningSession(
        target_id=body.target_id,
        schedule_id=schedule_id,
        status="queued",
        phase="queued",
        request=body.model_dump(mode="json"),
        seed=body.seed if body.seed is not None else secrets.randbelow(2**31),
        benchmark_s=0.0,
        notes=[],
        cancel_requested=False,
        attempts=0,
        created_at=utcnow(),
    )
    try:
        with db.session() as s:
            s.add(sess)
    except IntegrityError as exc:
        # The partial unique index lost a race with another request/process.
        raise ServiceError(
            409, f"target {body.target_id} just got another session; retry later"
        ) from exc
    return sess


def get_session(db: Database, session_id: int) -> TuningSession:
    with db.session() as s:
        sess = s.get(TuningSession, _id(session_id))
        if sess is None:
            raise ServiceError(404, f"no session {session_id}; GET /api/v1/sessions lists them")
        return sess


def list_sessions(
    db: Database, *, status: str | None = None, target_id: int | None = None, limit: int = 100
) -> list[TuningSession]:
    with db.session() as s:
        q = select(TuningSession).order_by(TuningSession.id.desc()).limit(limit)
        if status:
            q = q.where(TuningSession.status == status)
        if target_id is not None:
            q = q.where(TuningSession.target_id == _id(target_id))
        return list(s.scalars(q).all())


def cancel_session(db: Database, session_id: int) -> TuningSession:
    with db.session() as s:
        sess = s.get(TuningSession, _id(session_id), with_for_update=True)
        if sess is None:
            raise ServiceError(404, f"no session {session_id}")
        if sess.status not in ACTIVE_STATUSES:
            raise ServiceError(409, f"session {session_id} is already {sess.status}")
        if sess.status == "queued" and sess.lease_owner is None:
            # Never started: nothing on the target to restore.
            sess.status, sess.phase, sess.finished_at = "cancelled", "cancelled", utcnow()
        else:
            sess.cancel_requested = True
            sess.phase = "cancelling"
        return sess


def _trial_counts(db: Database, session_ids: list[int]) -> dict[int, tuple[int, float | None]]:
    """Trials done and mean trial wall time per session, in one query (no N+1)."""
    if not session_ids:
        return {}
    with db.session() as s:
        rows = s.execute(
            select(
                Trial.session_id,
                func.count(Trial.id),
                func.min(Trial.started_at),
                func.max(Trial.finished_at),
            )
            .where(Trial.session_id.in_(session_ids))
            .group_by(Trial.session_id)
        ).all()
    out: dict[int, tuple[int, float | None]] = {}
    for sid, n, first, last in rows:
        # min/max keep the column's type: aware datetimes, never strings.
        per = (last - first).total_seconds() / n if n and first and last else None
        out[sid] = (n, per)
    return out


def session_out(
    db: Database, sess: TuningSession, counts: dict[int, tuple[int, float | None]] | None = None
) -> SessionOut:
    counts = counts if counts is not None else _trial_counts(db, [sess.id])
    done, per_trial = counts.get(sess.id, (0, None))
    elapsed = None
    if sess.started_at is not None:
        end = sess.finished_at or utcnow()
        elapsed = round((end - sess.started_at).total_seconds(), 1)
    planned = sess.trials_planned
    eta = None
    if sess.status == "running" and planned is not None:
        duration = float(sess.request.get("workload", {}).get("duration_s", 60))
        eta = round(max(planned - done, 0) * (per_trial or duration), 1)
    live = (sess.live or {}).get("tps", []) if sess.status == "running" else []
    return SessionOut(
        id=sess.id,
        target_id=sess.target_id,
        status=sess.status,
        phase=sess.phase,
        progress=Progress(trials_done=done, trials_planned=planned, elapsed_s=elapsed, eta_s=eta),
        baseline_tps=sess.baseline_tps,
        best_tps=sess.best_tps,
        gain=sess.gain,
        best_config=sess.best_config,
        live_tps=live,
        error=sess.error,
        attempts=sess.attempts,
        notes=sess.notes or [],
        request=sess.request,
        created_at=sess.created_at,
        started_at=sess.started_at,
        finished_at=sess.finished_at,
    )


def sessions_out(db: Database, sessions: list[TuningSession]) -> list[SessionOut]:
    counts = _trial_counts(db, [x.id for x in sessions])
    return [session_out(db, x, counts) for x in sessions]


def list_trials(db: Database, session_id: int) -> list[Trial]:
    get_session(db, session_id)
    with db.session() as s:
        return list(
            s.scalars(
                select(Trial).where(Trial.session_id == session_id).order_by(Trial.index)
            ).all()
        )


def trial_out(t: Trial) -> TrialOut:
    samples = t.samples or []
    summary: dict[str, Any] = {
        "n": len(samples),
        "median_tps": t.median_tps,
        "mean_tps": round(statistics.fmean(samples), 2) if samples else None,
        "min_tps": min(samples) if samples else None,
        "max_tps": max(samples) if samples else None,
        "latency_mean_ms": t.latency_mean_ms,
        "latency_p95_ms": t.latency_p95_ms,
        "latency_p99_ms": t.latency_p99_ms,
        "failed_transactions": t.failed_transactions,
        "per_second": samples,
    }
    return TrialOut(
        index=t.index,
        role=t.role,
        knob=t.knob,
        value=t.value,
        config=t.config,
        samples=summary,
        verdict=t.verdict,
        gain=t.gain,
        p_value=t.p_value,
        reason=t.reason,
        metrics=t.metrics or {},
        timings=t.timings or {},
        error=t.error,
        started_at=t.started_at,
        finished_at=t.finished_at,
    )


# -- export -------------------------------------------------------------------------
def recommendation(db: Database, session_id: int) -> Recommendation:
    sess = get_session(db, session_id)
    if sess.start_config is None or sess.best_config is None:
        raise ServiceError(
            409, f"session {session_id} has no measured config yet; poll until a trial is done"
        )
    trials = list_trials(db, session_id)
    target = get_target(db, sess.target_id)
    header: dict[str, object] = {
        "session": sess.id,
        "target": target.name,
        "server": (target.probe or {}).get("version", "?"),
        "status": sess.status,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    from app.sweep import export_header  # the target's last client sweep, as comments

    header.update(export_header(db, target.id))
    unsafe = sorted(
        k for k in sess.best_config if k in CATALOGUE and CATALOGUE[k].durability_unsafe
    )
    if sess.request.get("allow_unsafe") and unsafe:
        # Flagged in every export even when the value stayed as it was: the session
        # was allowed to trade crash safety for speed, and the reader must know.
        header["WARNING"] = (
            "allow_unsafe: this session tuned durability-unsafe knobs ("
            + ", ".join(f"{k}={sess.best_config[k]}" for k in unsafe)
            + "); a crash can lose committed transactions or corrupt data where they are off"
        )
    return Recommendation.from_trials(
        original=sess.start_config,
        recommended=sess.best_config,
        trials=[(t.knob, t.verdict, t.gain) for t in trials],
        overall_gain=sess.gain,
        header=header,
        unsafe=unsafe,
    )


def export(db: Database, session_id: int, fmt: str) -> str:
    rec = recommendation(db, session_id)
    if fmt == "sql":
        return render_sql(rec)
    if fmt == "json":
        return render_json(rec)
    return render_conf(rec)


# -- schedules --------------------------------------------------------------------------
def create_schedule(db: Database, body: ScheduleIn) -> Schedule:
    from app.scheduler import cron_trigger

    if body.cron is not None:
        try:
            cron_trigger(body.cron)
        except ValueError as exc:
            raise ServiceError(422, f"bad cron {body.cron!r}: {exc} (e.g. '0 2 * * sun')") from exc
    target = get_target(db, body.session.target_id)
    validate_session(target, body.session)
    sc = Schedule(
        target_id=target.id,
        cron=body.cron,
        interval_s=body.interval_s,
        request=body.session.model_dump(mode="json"),
        enabled=True,
        created_at=utcnow(),
    )
    with db.session() as s:
        s.add(sc)
    return sc


def schedule_out(sc: Schedule, next_fire: Any) -> ScheduleOut:
    return ScheduleOut(
        id=sc.id,
        target_id=sc.target_id,
        cron=sc.cron,
        interval_s=sc.interval_s,
        enabled=sc.enabled,
        last_fired_at=sc.last_fired_at,
        last_result=sc.last_result,
        next_fire_at=next_fire,
        request=sc.request,
    )


def list_schedules(db: Database) -> list[Schedule]:
    with db.session() as s:
        return list(s.scalars(select(Schedule).order_by(Schedule.id)).all())


def delete_schedule(db: Database, schedule_id: int) -> None:
    with db.session() as s:
        sc = s.get(Schedule, _id(schedule_id))
        if sc is None:
            raise ServiceError(404, f"no schedule {schedule_id}")
        s.delete(sc)
