"""Domain operations behind the REST API and the CLI: targets, sessions, exports."""

from __future__ import annotations

import json
import logging
import secrets
import shutil
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError

from app.db import Database, utcnow
from app.evidence import figures, per_label, per_stream, streams_from_json
from app.models import ACTIVE_STATUSES, Schedule, Target, Trial, TuningSession
from app.postgres.sandbox import PostgresNotInstalled, Sandbox, SandboxError, free_port
from app.postgres.target import ConnectError, TargetController, TargetError, mask_dsn
from app.preflight import PreflightError, check_workload
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
from app.tuning import (
    RequestError,
    build_space,
    check_session_budget,
    check_streams,
    gain_text,
    hardware_from,
    rows_from_json,
    rows_to_json,
)
from app.workloads import workload_for
from app.workloads.base import WorkloadError
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
        if sandbox is not None:
            sandbox.keep()  # the service starts and stops it from now on
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
        retired_at=target.retired_at,
    )


def list_targets(db: Database, *, include_retired: bool = False) -> list[Target]:
    """Targets one may use; retired ones (kept for their sessions' history) on request."""
    with db.session() as s:
        q = select(Target).order_by(Target.id)
        if not include_retired:
            q = q.where(Target.retired_at.is_(None))
        return list(s.scalars(q).all())


HistoryChoice = Literal["keep", "drop"]


def delete_target(db: Database, target_id: int, history: HistoryChoice | None = None) -> None:
    """Delete a target; one with sessions needs ``history``: keep them (retire) or drop them.

    Never loses tuning history silently: without a choice, a target with sessions is
    refused (409) with both ways out. Retiring hides the target from lists and forms,
    frees its name, and stops and removes a managed sandbox; its sessions stay visible.
    """
    with db.session() as s:
        t = s.get(Target, _id(target_id))
        if t is None or t.retired_at is not None:
            raise ServiceError(404, f"no target {target_id}; GET /api/v1/targets lists them")
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
        sessions = list(
            s.scalars(select(TuningSession).where(TuningSession.target_id == _id(target_id)))
        )
        if sessions and history is None:
            raise ServiceError(
                409,
                f"target {target_id} has {len(sessions)} session(s) of tuning history: "
                f"DELETE /api/v1/targets/{target_id}?history=keep retires the target and "
                f"keeps its sessions and trials; ?history=drop deletes them with the target",
            )
        sandbox_dir = t.sandbox_dir
        if sessions and history == "keep":
            t.retired_at = utcnow()
            # The name is free for a new target; the suffix keeps it unique and readable.
            t.name = f"{t.name[:180]} (retired #{t.id})"
            t.sandbox_dir = None
        else:
            for sess in sessions:
                s.delete(sess)
            s.flush()  # sessions (and their trials) before the row they point to
            s.delete(t)
        # A retired target must not be tuned again by a recurring schedule either.
        s.execute(delete(Schedule).where(Schedule.target_id == t.id))
    if sandbox_dir:
        _destroy_sandbox_dir(Path(sandbox_dir))


def _destroy_sandbox_dir(root: Path) -> None:
    try:
        Sandbox.open(root).destroy()
    except Exception:
        log.warning("could not stop sandbox %s cleanly; removing its files", root)
        shutil.rmtree(root, ignore_errors=True)


def start_sandboxes(db: Database) -> None:
    """Start the managed sandboxes again with the service, or unregister the lost ones.

    A sandbox whose files are gone, or that will not start, is retired (or deleted when it
    has no history): a target listed as idle that nothing can connect to is never left.
    """
    for t in list_targets(db):
        if not t.sandbox_dir:
            continue
        root = Path(t.sandbox_dir)
        try:
            sb = Sandbox.open(root)
            try:
                sb.start()
            except SandboxError:
                if "could not bind" not in sb.log_tail(50):
                    raise
                # Someone took its port while the service was down: move it.
                sb.move_to(free_port())
                sb.start()
                with db.session() as s:
                    row = s.get(Target, t.id)
                    if row is not None:
                        row.dsn, row.restart_command = sb.dsn, sb.restart_command
            continue
        except Exception as exc:
            reason = " ".join(str(exc).split())[:500]
        log.warning("sandbox of target %s (%s) cannot start: %s", t.name, root, reason)
        try:
            delete_target(db, t.id, "keep")
        except ServiceError as exc:
            # A session holds it: that session fails on its own, then the target can go.
            log.warning("target %s stays registered: %s", t.name, exc)


def stop_sandboxes(db: Database, work_dir: Path) -> None:
    """At shutdown: stop the idle managed sandboxes under this service's work_dir.

    Their files stay; start_sandboxes() starts them at the next start. A target with an
    active session keeps running: a runner thread may still be measuring on it, and the
    session resumes on it after the restart.
    """
    with db.session() as s:
        busy = set(
            s.scalars(
                select(TuningSession.target_id).where(TuningSession.status.in_(ACTIVE_STATUSES))
            )
        )
    for t in list_targets(db):
        if t.id in busy:
            continue
        if t.sandbox_dir and Path(t.sandbox_dir).is_relative_to(work_dir):
            try:
                Sandbox.open(Path(t.sandbox_dir)).stop()
            except Exception:
                log.warning("could not stop sandbox of target %s", t.name, exc_info=True)


# -- sessions -------------------------------------------------------------------------
def validate_session(target: Target, body: SessionIn) -> None:
    """Raise ServiceError(422) when the request cannot run on this target."""
    if target.retired_at is not None:
        raise ServiceError(
            422, f"target {target.id} is retired (kept for its history); register the server again"
        )
    rows = rows_from_json((target.probe or {}).get("rows", {}))
    try:
        hw = hardware_from(target.ram_bytes, target.cpus)
        build_space(body, rows, hw)
        check_session_budget(body)
        # stream names exist once the workload is built: a typo is a 422 now
        check_streams(body, [st.name for st in workload_for(body.workload).streams()])
    except (RequestError, WorkloadError) as exc:
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
        dsn = target.dsn
    # Before anything is stored or changed: a script that cannot run is a 422 now, not a
    # session failing after it started.
    try:
        check_workload(dsn, body.workload)
    except PreflightError as exc:
        raise ServiceError(422, str(exc)) from exc
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
    db: Database,
    sess: TuningSession,
    counts: dict[int, tuple[int, float | None]] | None = None,
    *,
    detail: bool = True,
) -> SessionOut:
    """A session for the API; ``detail``: with the per-label and per-stream tables."""
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
    labels, streams, status = (
        best_vs_start(sess, list_trials(db, sess.id)) if detail else (None, None, None)
    )
    return SessionOut(
        id=sess.id,
        target_id=sess.target_id,
        status=sess.status,
        phase=sess.phase,
        progress=Progress(trials_done=done, trials_planned=planned, elapsed_s=elapsed, eta_s=eta),
        baseline_tps=sess.baseline_tps,
        best_tps=sess.best_tps,
        gain=sess.gain,
        gain_status=sess.gain_status,
        gain_p_value=sess.gain_p_value,
        gain_ci=_interval(sess.gain_ci_low, sess.gain_ci_high),
        gain_text=gain_text(str(sess.request.get("objective", "throughput")), sess.gain),
        per_label=labels,
        per_stream=streams,
        per_label_status=status,
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


def best_vs_start(
    sess: TuningSession, trials: list[Trial]
) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None, str | None]:
    """The best config against the start per stream and label, from the runs' transactions.

    From the final check's side-by-side runs when it ran (final-baseline vs
    final-incumbent); otherwise from every successful run of the start and of the best
    config, minutes apart, and marked "not confirmed". (None, None, None) without evidence.
    """
    ok = [t for t in trials if t.error is None and t.verdict != "rejected" and t.evidence]
    before = [s for t in ok if t.role == "final-baseline" for s in streams_from_json(t.evidence)]
    after = [s for t in ok if t.role == "final-incumbent" for s in streams_from_json(t.evidence)]
    status = "measured by the final check, side by side"
    if not (before and after):
        start, best = sess.start_config, sess.best_config
        if not start:
            return None, None, None
        before = [s for t in ok if t.config == start for s in streams_from_json(t.evidence)]
        after = []
        if best and best != start:
            after = [s for t in ok if t.config == best for s in streams_from_json(t.evidence)]
        status = "not confirmed: the final check did not run; runs minutes apart"
    if not before:
        return None, None, None
    table = per_stream("start", before) + per_stream("best", after)
    if not after:
        # no change recommended: the start's own per-query times are still worth reading
        status = "no change recommended: the start config's times"
    return [c.to_json() for c in per_label(before, after)], table, status


def sessions_out(db: Database, sessions: list[TuningSession]) -> list[SessionOut]:
    counts = _trial_counts(db, [x.id for x in sessions])
    return [session_out(db, x, counts, detail=False) for x in sessions]


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
        streams=[figures(st) for st in streams_from_json(t.evidence)],
        index=t.index,
        role=t.role,
        knob=t.knob,
        value=t.value,
        config=t.config,
        samples=summary,
        verdict=t.verdict,
        gain=t.gain,
        p_value=t.p_value,
        ci=_interval(t.ci_low, t.ci_high),
        drift=bool(t.drift),
        host=t.host or {},
        reason=t.reason,
        metrics=t.metrics or {},
        timings=t.timings or {},
        error=t.error,
        started_at=t.started_at,
        finished_at=t.finished_at,
    )


def _pair(low: float | None, high: float | None) -> tuple[float, float] | None:
    return (low, high) if low is not None and high is not None else None


def _interval(low: float | None, high: float | None) -> list[float] | None:
    pair = _pair(low, high)
    return list(pair) if pair else None


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
    objective = str(sess.request.get("objective", "throughput"))
    said = gain_text(objective, sess.gain)
    if said and objective != "throughput":
        # the claim line below gives "fraction better"; for times, say it as time saved
        header["objective"] = f"{objective}: {said} (a gain below is the fraction of time saved)"
    labels, streams, status = best_vs_start(sess, trials)
    header.update(evidence_header(labels, streams, status))
    return Recommendation.from_trials(
        objective=objective,
        original=sess.start_config,
        recommended=sess.best_config,
        trials=_verdict_rows(trials, sess.start_config),
        overall_gain=sess.gain,
        overall_p_value=sess.gain_p_value,
        header=header,
        unsafe=unsafe,
        gain_status=sess.gain_status,
        overall_ci=_pair(sess.gain_ci_low, sess.gain_ci_high),
        check=_check_text(trials),
    )


def _verdict_rows(
    trials: list[Trial], start: dict[str, str]
) -> list[tuple[str | tuple[str, ...] | None, str | None, float | None]]:
    """(knobs, verdict, gain) per trial, each verdict on the candidate it is about.

    A verdict decided on an incumbent re-run (C I I: the keep lands on the last I) belongs
    to the candidate before it: that knob was kept, with that gain.
    """
    rows: list[list[Any]] = []
    last: int | None = None
    for t in trials:
        rows.append([_changed_knobs(t, start), t.verdict, t.gain])
        if t.role == "candidate":
            last = len(rows) - 1
        elif t.verdict in ("keep", "revert") and last is not None:
            rows[last][1:], rows[-1][1:] = [t.verdict, t.gain], [None, None]
    return [(k, v, g) for k, v, g in rows]


def _changed_knobs(t: Trial, start: dict[str, str]) -> str | tuple[str, ...] | None:
    """The knob a trial changed; for several at once (the hints), every one it changed."""
    if t.knob is not None or t.role != "candidate":
        return t.knob
    return tuple(k for k, v in t.config.items() if start.get(k) != v)


def _check_text(trials: list[Trial]) -> str | None:
    runs = [t for t in trials if t.role.startswith("final-") and t.median_tps is not None]
    a = sum(t.role == "final-baseline" for t in runs)
    return f"{a} + {len(runs) - a} side-by-side runs" if runs else None


def evidence_header(
    labels: list[dict[str, Any]] | None, streams: list[dict[str, Any]] | None, status: str | None
) -> dict[str, str]:
    """Per-label and per-stream lines for an export's header (comments in conf and sql)."""
    out: dict[str, str] = {}
    for row in streams or []:
        out[f"stream {row['stream']} ({row['config']})"] = stream_line(row)
    if labels:
        out["mean latency per label, best vs start"] = status or ""
        for c in labels:
            out[f"  {c['stream']}/{c['label']}"] = label_line(c)
    return out


def _ms(x: Any) -> str:
    return "-" if x is None else f"{float(x):.3g} ms"


def stream_line(row: Mapping[str, Any]) -> str:
    tps = "-" if row.get("tps") is None else f"{row['tps']:.4g}"
    failed = "-" if row.get("failed") is None else f"{row['failed']:g}"
    return (
        f"tps {tps}, mean {_ms(row.get('mean_ms'))}, p95 {_ms(row.get('p95_ms'))}, "
        f"p99 {_ms(row.get('p99_ms'))}, failed {failed} ({row.get('runs', 0)} runs)"
    )


def label_line(c: Mapping[str, Any]) -> str:
    change = "-" if c.get("change") is None else f"{c['change']:+.1%}"
    ci = c.get("ci")
    interval = f" [{ci[0] - 1:+.1%}, {ci[1] - 1:+.1%}]" if ci else ""
    return f"{_ms(c.get('before_ms'))} -> {_ms(c.get('after_ms'))} {change}{interval}"


def export(db: Database, session_id: int, fmt: str) -> str:
    rec = recommendation(db, session_id)
    if fmt == "sql":
        return render_sql(rec)
    if fmt == "json":
        doc = json.loads(render_json(rec))
        sess = get_session(db, session_id)
        labels, streams, status = best_vs_start(sess, list_trials(db, session_id))
        objective = str(sess.request.get("objective", "throughput"))
        doc["gain_text"] = gain_text(objective, sess.gain)
        doc["per_label"], doc["per_stream"], doc["per_label_status"] = labels, streams, status
        return json.dumps(doc, indent=2, allow_nan=False) + "\n"
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
