"""The one rule of who holds a target: an active session, sweep, capture or comparison, one
at a time.

A session changes the target's settings and a sweep loads it; either would spoil the
other's measurements, so a target is held by at most one of them. A live capture changes
the target's logging settings and records what runs on it: a session or sweep meanwhile
would be recorded as the user's workload (and would change settings under the capture's
snapshot), so a capture holds its target too, and one capture at a time. A comparison
(``knobtune compare``) applies config after config and measures each: it holds its target
like a session. A held target cannot get another session or sweep, cannot be deleted,
and its managed sandbox keeps running at shutdown (the holder resumes on it after a
restart). The database enforces half of it
too (one active session per target: ``uq_sessions_one_active_per_target``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, cast

from sqlalchemy import literal, select, union_all
from sqlalchemy.orm import Session

from app.db import utcnow
from app.models import (
    ACTIVE_STATUSES,
    Apply,
    Capture,
    Comparison,
    Sweep,
    Target,
    TuningSession,
)

# An apply or rollback in progress (it takes seconds, a restart included) holds its target
# too; one older than this was cut short by a crash and no longer holds anything.
APPLY_ACTIVE = ("applying", "rolling-back")
APPLY_HOLD_S = 600


HolderKind = Literal["session", "sweep", "capture", "comparison", "apply"]


@dataclass(frozen=True)
class Holder:
    kind: HolderKind
    id: int

    def __str__(self) -> str:
        return f"{self.kind} {self.id}" if self.kind != "apply" else f"an apply (#{self.id})"


# The jobs that hold a target, in the order holder() and holders() rank them.
_JOBS: tuple[tuple[HolderKind, Any], ...] = (
    ("session", TuningSession),
    ("sweep", Sweep),
    ("capture", Capture),
    ("comparison", Comparison),
)


def holder(s: Session, target_id: int) -> Holder | None:
    """What holds the target now: its active session, else its active sweep, else its
    active capture, else its active comparison, else an apply in progress, else None."""
    for kind, model in _JOBS:
        row_id = s.scalar(
            select(model.id)
            .where(model.target_id == target_id, model.status.in_(ACTIVE_STATUSES))
            .order_by(model.id)
            .limit(1)
        )
        if row_id is not None:
            return Holder(kind, row_id)
    aid = s.scalar(
        select(Apply.id)
        .where(
            Apply.target_id == target_id,
            Apply.status.in_(APPLY_ACTIVE),
            Apply.created_at > utcnow() - timedelta(seconds=APPLY_HOLD_S),
        )
        .limit(1)
    )
    return Holder("apply", aid) if aid is not None else None


def holders(s: Session) -> dict[int, Holder]:
    """Every held target and its holder, in one narrow query (lists, dashboard, shutdown)."""
    q: Any = union_all(
        *(
            select(model.target_id, model.id, literal(kind)).where(
                model.status.in_(ACTIVE_STATUSES), model.target_id.is_not(None)
            )
            for kind, model in _JOBS
        )
    )
    rank = {kind: i for i, (kind, _) in enumerate(_JOBS)}  # as in holder()
    out: dict[int, Holder] = {}
    for tid, row_id, kind in s.execute(q).all():
        known = out.get(tid)
        if known is None or rank[kind] < rank[known.kind]:
            out[tid] = Holder(cast(HolderKind, kind), row_id)
    return out


def busy_error(name: str, held: Holder, *, then: str = "wait or cancel it") -> str:
    """The message of a refused request on a held target."""
    return f"target {name!r} is busy with {held}; {then}"


def same_server(s: Session, server_id: str | None, but: int | None = None) -> Target | None:
    """The first live target registered for the server ``server_id`` (other than ``but``)."""
    if server_id is None:
        return None
    q = select(Target).where(Target.server_id == server_id, Target.retired_at.is_(None))
    if but is not None:
        q = q.where(Target.id != but)
    found: Target | None = s.scalars(q.order_by(Target.id)).first()
    return found


def server_holder(s: Session, target: Target) -> str | None:
    """Who holds the SERVER behind ``target``, or None: the one-session-per-server rule.

    Two target rows may name one server (e.g. registered before server identities were
    recorded, or through a different DSN): a session, sweep or apply on any of them holds
    it. A server is its system identifier and port (``Target.server_id``). Returns the
    sentence of a 409, e.g. "target 'a' is busy with session 3".
    """
    rows = [target]
    if target.server_id is not None:
        rows = list(
            s.scalars(
                select(Target).where(Target.server_id == target.server_id).order_by(Target.id)
            )
        )
    for row in rows:
        held = holder(s, row.id)
        if held is not None:
            via = "" if row.id == target.id else f" (the same server as target {target.name!r})"
            return f"target {row.name!r}{via} is busy with {held}"
    return None
