"""Apply a finished session's recommendation to its target, verify it, and roll it back.

The target's own controller (app/postgres/target/) does the work: ``snapshot`` before,
``apply`` (ALTER SYSTEM, reload, a restart where a knob needs one and the target has a
restart method, each value verified on a fresh connection; on any failure the previous
entries are back), ``revert`` for the way back. This module decides what to change, shows
the diff first, records every apply in the metadata DB (``applies``) and refuses a rollback
over changes somebody else made since, unless confirmed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import select

from app.db import Database, utcnow
from app.errors import ServiceError
from app.models import ACTIVE_STATUSES, Apply, Target, TuningSession
from app.postgres.target import (
    ConnectError,
    RestartUnavailable,
    Snapshot,
    TargetController,
    TargetError,
)
from app.postgres.units import same_value
from app.sessions.schemas import (
    ApplyIn,
    ApplyOut,
    KnobChange,
    KnobCheck,
    RestartOutcome,
    RollbackIn,
)
from app.sessions.service import get_session, recommendation_base
from app.settings import Settings
from app.targets.holds import server_holder
from app.targets.recommend import refuse_if_recommend_only
from app.targets.service import controller, get_target
from optimizer.knobs import SettingRow
from optimizer.render import status_label

NOTHING = ("none", "no-change")  # gain statuses that recommend nothing


def recommended_changes(sess: TuningSession) -> dict[str, str]:
    """The knobs the session recommends changing: its best config where it differs from
    :func:`recommendation_base` (where it started, or the server's own for a session that
    started from PGTune's values)."""
    if sess.gain_status in NOTHING:
        return {}
    base = recommendation_base(sess)
    return {k: str(v) for k, v in (sess.best_config or {}).items() if base.get(k) != str(v)}


def _read(ctl: TargetController, names: Sequence[str]) -> tuple[Snapshot, dict[str, SettingRow]]:
    """The server's ALTER SYSTEM entries, effective values and pg_settings rows of ``names``."""
    snap = ctl.snapshot(names)
    return snap, ctl.probe(names).settings


def _unreachable(target: Target, exc: TargetError) -> ServiceError:
    return ServiceError(
        409, f"target {target.name!r} is not reachable: {exc}; check that it is up and try again"
    )


def _fmt(changes: Sequence[KnobChange]) -> str:
    return ", ".join(f"{c.knob} {c.current} -> {c.new}" for c in changes)


def _out(
    ap: Apply | None,
    sess: TuningSession,
    target: Target,
    *,
    status: str,
    message: str,
    changes: Sequence[KnobChange] = (),
    restart: RestartOutcome = "none",
    pending: Sequence[str] = (),
    verified: Sequence[KnobCheck] = (),
    warnings: Sequence[str] = (),
    changed_since: Mapping[str, list[str | None]] | None = None,
) -> ApplyOut:
    return ApplyOut(
        id=ap.id if ap is not None else None,
        session_id=sess.id,
        target_id=target.id,
        target_name=target.name,
        status=status,
        message=message,
        changes=list(changes),
        restart=restart,
        pending_restart=list(pending),
        verified=list(verified),
        warnings=list(warnings),
        changed_since=dict(changed_since or {}),
        error=ap.error if ap is not None else None,
        created_at=ap.created_at if ap is not None else None,
        rolled_back_at=ap.rolled_back_at if ap is not None else None,
    )


def _checks(
    wanted: Mapping[str, str], snap: Snapshot, rows: Mapping[str, SettingRow]
) -> list[KnobCheck]:
    """What pg_settings says after the change, knob by knob."""
    out = []
    for knob, value in wanted.items():
        row = rows.get(knob)
        pending = bool(row is not None and row.pending_restart)
        ok = row is not None and same_value(value, row.setting, row)
        out.append(
            KnobCheck(
                knob=knob,
                expected=value,
                effective=snap.effective.get(knob),
                ok=ok,
                pending_restart=pending,
            )
        )
    return out


def _check_target(db: Database, sess: TuningSession, target: Target) -> None:
    refuse_if_recommend_only(target, "be applied to or rolled back")
    if sess.status in ACTIVE_STATUSES:
        raise ServiceError(
            409, f"session {sess.id} is still {sess.status}; apply it once it has finished"
        )
    if target.retired_at is not None:
        raise ServiceError(409, f"target {target.id} is retired: there is no server to apply to")
    with db.session() as s:
        held = server_holder(s, target)  # the server, through whichever target row
    if held is not None:
        raise ServiceError(409, f"{held}; try again once it is done")


# -- apply ---------------------------------------------------------------------------------
def apply_session(db: Database, settings: Settings, session_id: int, body: ApplyIn) -> ApplyOut:
    sess = get_session(db, session_id)
    target = get_target(db, sess.target_id)
    _check_target(db, sess, target)
    wanted = recommended_changes(sess)
    if not wanted:
        return _out(
            None,
            sess,
            target,
            status="nothing-to-do",
            message=f"Session {sess.id} recommends no change: there is nothing to apply.",
        )
    claim = sess.gain_status
    if claim != "confirmed" and not body.force and not body.dry_run:
        raise ServiceError(
            409,
            f"session {sess.id}'s gain is {status_label(claim) or 'not measured'}, not "
            "confirmed by the final check: it may be noise or drift. Apply it anyway with "
            "force=true (CLI: --force), or run a longer session",
        )
    ctl = controller(target, settings, restart=body.restart)
    try:
        now, rows = _read(ctl, list(wanted))
    except TargetError as exc:
        raise _unreachable(target, exc) from exc
    start = sess.start_config or {}
    changes = []
    for knob, value in wanted.items():
        row = rows.get(knob)
        if row is None:
            raise ServiceError(
                422, f"{knob} is not a setting of {target.name!r} any more; nothing was changed"
            )
        changes.append(
            KnobChange(
                knob=knob,
                current=now.effective.get(knob),
                new=value,
                session_start=start.get(knob),
                needs_restart=row.context == "postmaster",
                changes=not same_value(value, row.setting, row),
            )
        )
    warnings = [
        f"{c.knob} is {c.current} on the server now, the session started from "
        f"{c.session_start}: its gain was measured against {c.session_start}"
        for c in changes
        if c.session_start is not None
        and c.current is not None
        and not same_value(c.session_start, c.current, rows[c.knob])
    ]
    if claim != "confirmed":
        warnings.append(f"the session's gain is {status_label(claim) or 'not measured'}")
    todo = [c for c in changes if c.changes]
    restart_knobs = [c.knob for c in todo if c.needs_restart]
    restart: RestartOutcome = "none"
    if restart_knobs:
        restart = "will-restart" if ctl.can_restart else "pending"
    if not todo:
        return _out(
            None,
            sess,
            target,
            status="nothing-to-do",
            message=f"{target.name} already runs session {sess.id}'s recommended values.",
            changes=changes,
            warnings=warnings,
        )
    how = {
        "none": "with a reload",
        "will-restart": f"with a restart of the server (for {', '.join(restart_knobs)})",
        "pending": f"with a reload; {', '.join(restart_knobs)} would wait for the next restart",
    }[restart]
    if body.dry_run:
        return _out(
            None,
            sess,
            target,
            status="dry-run",
            message=f"Dry run: applying session {sess.id} would change {len(todo)} setting(s) "
            f"on {target.name} {how}: {_fmt(todo)}. Nothing was changed.",
            changes=changes,
            restart=restart,
            pending=restart_knobs if restart == "pending" else (),
            warnings=warnings,
        )
    config = {c.knob: c.new for c in todo}
    with db.session() as s:
        held = server_holder(s, target)
        if held is not None:
            raise ServiceError(409, f"{held}; try again once it is done")
        ap = Apply(
            session_id=sess.id,
            target_id=target.id,
            status="applying",
            config=config,
            changes=[c.model_dump() for c in changes],
            before=now.to_json(),
            verified=[],
            restarted=False,
            pending_restart=[],
            created_at=utcnow(),
        )
        s.add(ap)
    try:
        res = ctl.apply(config, allow_pending=True)
        after, rows_after = _read(ctl, list(config))
    except TargetError as exc:
        _finish(db, ap.id, status="failed", error=str(exc))
        if isinstance(exc, ConnectError):
            raise _unreachable(target, exc) from exc
        raise ServiceError(422, f"nothing was applied: {exc}") from exc
    verified = _checks(config, after, rows_after)
    pending = sorted(set(res.pending_restart) | {v.knob for v in verified if v.pending_restart})
    _finish(
        db,
        ap.id,
        status="applied",
        after=after.to_json(),
        verified=[v.model_dump() for v in verified],
        restarted=res.restarted,
        pending_restart=pending,
    )
    ap = _get_apply(db, ap.id)
    done: RestartOutcome = "restarted" if res.restarted else "pending" if pending else "none"
    msg = (
        f"Applied session {sess.id}'s recommendation to {target.name}: {len(todo)} setting(s) "
        f"changed {'with a restart' if res.restarted else 'with a reload'}, each checked in "
        "pg_settings."
    )
    if pending:
        msg += (
            f" {', '.join(pending)} take(s) effect at the server's next restart (pending_restart "
            "in pg_settings): restart it when convenient."
        )
    msg += f" To undo: knobtune rollback {sess.id}."
    return _out(
        ap,
        sess,
        target,
        status="applied",
        message=msg,
        changes=changes,
        restart=done,
        pending=pending,
        verified=verified,
        warnings=warnings,
    )


def _finish(db: Database, apply_id: int, **values: object) -> None:
    with db.session() as s:
        ap = s.get(Apply, apply_id)
        assert ap is not None
        for k, v in values.items():
            setattr(ap, k, v)
        ap.finished_at = utcnow()


def _get_apply(db: Database, apply_id: int) -> Apply:
    with db.session() as s:
        ap = s.get(Apply, apply_id)
        assert ap is not None
        return ap


# -- rollback -------------------------------------------------------------------------------
def _latest_applied(db: Database, sess: TuningSession) -> Apply:
    with db.session() as s:
        ap = s.scalars(
            select(Apply)
            .where(Apply.session_id == sess.id, Apply.status == "applied")
            .order_by(Apply.id.desc())
            .limit(1)
        ).first()
        if ap is None:
            raise ServiceError(
                409, f"session {sess.id} has no apply to roll back (knobtune apply {sess.id} first)"
            )
        later = s.scalars(
            select(Apply)
            .where(Apply.target_id == ap.target_id, Apply.status == "applied", Apply.id > ap.id)
            .order_by(Apply.id.desc())
            .limit(1)
        ).first()
        if later is not None:
            raise ServiceError(
                409,
                f"session {later.session_id} was applied to this target after session "
                f"{sess.id}: roll that back first (knobtune rollback {later.session_id})",
            )
        return ap


def changed_since(after: Snapshot, now: Snapshot) -> dict[str, list[str | None]]:
    """Settings that differ between right after the apply and now: name -> [after, now].

    Every ALTER SYSTEM entry counts (somebody else's change too), and the effective value
    of each knob the apply set (a change in postgresql.conf, then a reload).
    """
    out: dict[str, list[str | None]] = {}
    for name in sorted(set(after.auto_conf) | set(now.auto_conf)):
        a, b = after.auto_conf.get(name), now.auto_conf.get(name)
        if a != b:
            out[name] = [a, b]
    for name, value in after.effective.items():
        if name not in out and now.effective.get(name) != value:
            out[name] = [value, now.effective.get(name)]
    return out


def rollback_session(
    db: Database, settings: Settings, session_id: int, body: RollbackIn
) -> ApplyOut:
    sess = get_session(db, session_id)
    target = get_target(db, sess.target_id)
    _check_target(db, sess, target)
    ap = _latest_applied(db, sess)
    before = Snapshot.from_json(ap.before or {})
    after = Snapshot.from_json(ap.after or {})
    names = list(ap.config)
    ctl = controller(target, settings)
    try:
        now, rows = _read(ctl, names)
    except TargetError as exc:
        raise _unreachable(target, exc) from exc
    moved = changed_since(after, now)
    # Our knobs go back to their entries before the apply; anything else stays as it is now.
    goal = dict(now.auto_conf)
    for name in names:
        if name in before.auto_conf:
            goal[name] = before.auto_conf[name]
        else:
            goal.pop(name, None)
    back = {n: before.effective[n] for n in names if n in before.effective}
    changes = [
        KnobChange(
            knob=n,
            current=now.effective.get(n),
            new=back[n],
            session_start=(sess.start_config or {}).get(n),
            needs_restart=rows[n].context == "postmaster" if n in rows else False,
            changes=n not in rows or not same_value(back[n], rows[n].setting, rows[n]),
        )
        for n in back
    ]
    moved_text = "; ".join(f"{k}: {a} -> {b}" for k, (a, b) in moved.items())
    if moved and not body.confirm and not body.dry_run:
        raise ServiceError(
            409,
            f"the server's settings changed since session {sess.id} was applied ({moved_text} "
            "as [after the apply -> now]). Rolling back puts the apply's knobs back as they "
            "were before it and leaves every other setting as it is now; confirm with "
            "confirm=true (CLI: --yes)",
        )
    if body.dry_run:
        extra = f" Changed since the apply: {moved_text}." if moved else ""
        return _out(
            ap,
            sess,
            target,
            status="dry-run",
            message=f"Dry run: rolling back session {sess.id} would put back "
            f"{_fmt([c for c in changes if c.changes]) or 'nothing (already as before)'} on "
            f"{target.name}.{extra} Nothing was changed.",
            changes=changes,
            changed_since=moved,
        )
    with db.session() as s:
        row = s.get(Apply, ap.id)
        assert row is not None
        row.status = "rolling-back"
    pending: list[str] = []
    try:
        res = ctl.revert(Snapshot(auto_conf=goal, effective=back))
        restarted = res.restarted
    except RestartUnavailable:
        # entries are back; a knob the apply restarted for waits for the next restart
        restarted = False
    except TargetError as exc:
        _finish(db, ap.id, status="applied", error=f"rollback failed: {exc}")
        if isinstance(exc, ConnectError):
            raise _unreachable(target, exc) from exc
        raise ServiceError(422, f"the rollback did not complete: {exc}") from exc
    final, rows_final = _read(ctl, names)
    verified = _checks(back, final, rows_final)
    pending = [v.knob for v in verified if v.pending_restart]
    with db.session() as s:
        row = s.get(Apply, ap.id)
        assert row is not None
        row.status, row.rolled_back_at, row.error = "rolled-back", utcnow(), None
    ap = _get_apply(db, ap.id)
    msg = (
        f"Rolled back session {sess.id} on {target.name}: "
        f"{_fmt([c for c in changes if c.changes]) or 'nothing to put back'}"
        f"{' with a restart' if restarted else ''}, each checked in pg_settings."
    )
    if pending:
        msg += f" {', '.join(pending)} return(s) to the old value at the next restart."
    return _out(
        ap,
        sess,
        target,
        status="rolled-back",
        message=msg,
        changes=changes,
        restart="restarted" if restarted else "pending" if pending else "none",
        pending=pending,
        verified=verified,
        changed_since=moved,
    )


def list_applies(
    db: Database,
    session_id: int,
    *,
    sess: TuningSession | None = None,
    target: Target | None = None,
) -> list[ApplyOut]:
    """The session's applies, newest first, as recorded (one query given both rows)."""
    sess = sess or get_session(db, session_id)
    target = target or get_target(db, sess.target_id)
    with db.session() as s:
        rows = list(
            s.scalars(
                select(Apply).where(Apply.session_id == sess.id).order_by(Apply.id.desc())
            ).all()
        )
    return [
        _out(
            ap,
            sess,
            target,
            status=ap.status,
            message=_recorded_message(ap),
            changes=[KnobChange.model_validate(c) for c in ap.changes or []],
            restart="restarted" if ap.restarted else "pending" if ap.pending_restart else "none",
            pending=ap.pending_restart or [],
            verified=[KnobCheck.model_validate(v) for v in ap.verified or []],
        )
        for ap in rows
    ]


def _recorded_message(ap: Apply) -> str:
    when = f"{ap.created_at:%Y-%m-%d %H:%M} UTC"
    if ap.status == "rolled-back" and ap.rolled_back_at is not None:
        return f"applied {when}, rolled back {ap.rolled_back_at:%Y-%m-%d %H:%M} UTC"
    if ap.status == "failed":
        return f"apply failed {when}: {ap.error}"
    return f"{ap.status} {when}"
