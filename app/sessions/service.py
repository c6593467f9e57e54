"""Sessions: validate and create (one per target), get, list, cancel; their API shapes."""

from __future__ import annotations

import secrets
import statistics
from typing import Any

import psycopg
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from app.db import Database, utcnow
from app.errors import RequestError, ServiceError, to_id
from app.lease import request_cancel
from app.models import Target, Trial, TuningSession
from app.postgres import overrides
from app.postgres.units import same_value
from app.preflight import PreflightError, check_workload
from app.sessions.plan import build_space, check_session_budget, check_streams, workload_kind
from app.sessions.schemas import Progress, SessionIn, SessionOut, TrialOut
from app.sessions.stream_stats import figures, per_label, per_stream, streams_from_json
from app.sessions.summary import headline, io_line, outcome, resolution_note, run_value, summary
from app.targets.holds import server_holder
from app.targets.probe_data import hardware_from, rows_from_json
from app.targets.recommend import refuse_if_recommend_only
from app.targets.service import ensure_server_id
from app.workloads import workload_for
from app.workloads.base import WorkloadError
from optimizer.catalogue import default_knobs, major_version
from optimizer.objective import objective_kind


def validate_session(target: Target, body: SessionIn) -> None:
    """Raise ServiceError(422) when the request cannot run on this target (409 for a
    recommend-only one: app/targets/recommend.py)."""
    refuse_if_recommend_only(target, "run a session")
    if target.retired_at is not None:
        raise ServiceError(
            422, f"target {target.id} is retired (kept for its history); register the server again"
        )
    rows = rows_from_json((target.probe or {}).get("rows", {}))
    try:
        hw = hardware_from(target.ram_bytes, target.cpus)
        build_space(body, rows, hw, major_version((target.probe or {}).get("version_num")))
        check_session_budget(body)
        # stream names exist once the workload is built: a typo is a 422 now
        check_streams(body, [st.name for st in workload_for(body.workload).streams()])
    except (RequestError, WorkloadError) as exc:
        raise ServiceError(422, str(exc)) from exc


def tuned_knobs(body: SessionIn) -> list[str]:
    """The names of the knobs a request tunes (its own, or the workload's defaults)."""
    entries = body.knobs or default_knobs(workload_kind(body))  # type: ignore[arg-type]
    return [e if isinstance(e, str) else e.name for e in entries]


def _no_overrides(dsn: str, body: SessionIn) -> None:
    """422 when a tuned knob is set per database or role for the workload (or in its
    DSN's options): ALTER SYSTEM would never reach its sessions (app/postgres/overrides.py)."""
    try:
        found = overrides.check(dsn, tuned_knobs(body))
    except psycopg.Error:
        return  # unreachable now: the session fails with its own message
    if found:
        raise ServiceError(422, overrides.refusal(found))


def create_session(
    db: Database, body: SessionIn, *, schedule_id: int | None = None
) -> TuningSession:
    with db.session() as s:
        target = s.get(Target, to_id(body.target_id))
        if target is None:
            raise ServiceError(
                422,
                f"unknown target_id {body.target_id}: register the server first",
                fix="register-target",
            )
        validate_session(target, body)
    ensure_server_id(db, target)  # targets registered before server identities were kept
    with db.session() as s:
        # the server, not the target row: a sweep or a session through another target
        # of the same server holds it too
        held = server_holder(s, target)
        if held is not None:
            raise ServiceError(409, f"{held}; wait or cancel it")
        dsn = target.workload_dsn  # a sandbox's least-privileged benchmark role
        others = list(s.scalars(select(Target.dsn).where(Target.id != target.id)))
    # Before anything is stored or changed: a script that cannot run is a 422 now, not a
    # session failing after it started.
    try:
        # its error masks every target's password
        check_workload(dsn, body.workload, known_dsns=others)
    except PreflightError as exc:
        raise ServiceError(422, str(exc)) from exc
    if not target.sandbox_dir:  # a sandbox's own are removed when the session starts
        _no_overrides(dsn, body)
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
        sess = s.get(TuningSession, to_id(session_id))
        if sess is None:
            raise ServiceError(404, f"no session {session_id}", fix="list-sessions")
        return sess


def list_sessions(
    db: Database, *, status: str | None = None, target_id: int | None = None, limit: int = 100
) -> list[TuningSession]:
    with db.session() as s:
        q = select(TuningSession).order_by(TuningSession.id.desc()).limit(limit)
        if status:
            q = q.where(TuningSession.status == status)
        if target_id is not None:
            q = q.where(TuningSession.target_id == to_id(target_id))
        return list(s.scalars(q).all())


def cancel_session(db: Database, session_id: int) -> TuningSession:
    with db.session() as s:
        # one never started ends now (nothing on the target to restore); a running one is
        # flagged, and its runner restores the target
        outcome = request_cancel(s, TuningSession, to_id(session_id), "cancelling")
        sess = s.get(TuningSession, to_id(session_id))
        if sess is None:
            raise ServiceError(404, f"no session {session_id}")
        if outcome is None:
            raise ServiceError(409, f"session {session_id} is already {sess.status}")
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
    name: str | None = None,
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
    objective = objective_kind(sess.request)
    ci = _interval(sess.gain_ci_low, sess.gain_ci_high)
    if name is None:
        with db.session() as s:
            name = s.scalar(select(Target.name).where(Target.id == sess.target_id))
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
        outcome=outcome(sess.status, sess.gain_status, sess.start_config, sess.best_config),
        gain_p_value=sess.gain_p_value,
        gain_ci=ci,
        gain_text=headline(objective, sess.gain),  # the headline without its interval
        headline=headline(objective, sess.gain, ci),
        summary=summary(
            session_id=sess.id,
            status=sess.status,
            objective=objective,
            gain_status=sess.gain_status,
            gain=sess.gain,
            ci=ci,
            start=sess.start_config,
            best=sess.best_config,
            trials=done,
            error=sess.error,
            resolution=resolution_note(sess.notes),
        ),
        target_name=name,
        per_label=labels,
        per_stream=streams,
        per_label_status=status,
        best_config=sess.best_config,
        start_config=sess.start_config,
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
    with db.session() as s:  # the targets' names in one query (retired ones too)
        ids = {x.target_id for x in sessions}
        rows = s.execute(select(Target.id, Target.name).where(Target.id.in_(ids))).tuples()
        names = {tid: name for tid, name in rows}
    return [session_out(db, x, counts, detail=False, name=names.get(x.target_id)) for x in sessions]


def list_trials(db: Database, session_id: int) -> list[Trial]:
    get_session(db, session_id)
    with db.session() as s:
        return list(
            s.scalars(
                select(Trial).where(Trial.session_id == session_id).order_by(Trial.index)
            ).all()
        )


def trial_rows(db: Database, session_id: int) -> list[dict[str, Any]]:
    """The trial table's columns, shaped like TrialOut (what points_of reads); the dashboard's.

    Narrow on purpose: the per-second samples (the bulk of a trial row) are not
    loaded, so a page costs the same however long the runs were.
    """
    cols = (
        Trial.index,
        Trial.role,
        Trial.knob,
        Trial.value,
        Trial.median_tps,
        Trial.latency_p95_ms,
        Trial.gain,
        Trial.p_value,
        Trial.verdict,
        Trial.reason,
        Trial.error,
        Trial.drift,
        Trial.metrics,
        Trial.started_at,
        Trial.finished_at,
    )
    with db.session() as s:
        rows = (
            s.execute(select(*cols).where(Trial.session_id == session_id).order_by(Trial.index))
            .mappings()
            .all()
        )
    return [
        {
            **row,
            "samples": {"median_tps": row["median_tps"], "latency_p95_ms": row["latency_p95_ms"]},
            "io": io_line(row["metrics"]),
        }
        for row in rows
    ]


def trial_levels(db: Database, session_id: int, request: dict[str, Any]) -> dict[int, float | None]:
    """Each run's level in the objective's unit (ms) by trial index, from its stored
    transactions (summary.run_value); the dashboard's chart and table. Narrow like
    trial_rows: the evidence column only."""
    with db.session() as s:
        rows = s.execute(
            select(Trial.index, Trial.evidence).where(Trial.session_id == session_id)
        ).all()
    return {index: run_value(evidence, request) for index, evidence in rows}


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
        io=io_line(t.metrics),
        timings=t.timings or {},
        error=t.error,
        started_at=t.started_at,
        finished_at=t.finished_at,
    )


def recommendation_base(sess: TuningSession) -> dict[str, str]:
    """What a session's recommendation changes from, per knob of its best config: where it
    started, or, for a session that started from PGTune's values (``start: heuristic``),
    the server's own settings before it. Such a session measured its whole best config,
    PGTune's values in it included, so applying or exporting only what the walk changed
    would give the server a config nobody measured."""
    start, best = sess.start_config or {}, sess.best_config or {}
    if (sess.request or {}).get("start") != "heuristic" or not sess.snapshot:
        return {k: str(start[k]) for k in best if k in start}
    own = sess.snapshot["target"]["effective"]
    rows = rows_from_json(sess.snapshot["rows"])
    base: dict[str, str] = {}
    for k, v in best.items():
        if k in own and k in rows:  # the best's own text where the two mean one value
            base[k] = str(v) if same_value(str(v), own[k], rows[k]) else str(own[k])
    return base


def pair(low: float | None, high: float | None) -> tuple[float, float] | None:
    return (low, high) if low is not None and high is not None else None


def _interval(low: float | None, high: float | None) -> list[float] | None:
    both = pair(low, high)
    return list(both) if both else None
