"""A session whose runner crashes: counted, retried a few times, then failed, never a loop.

A crash is an exception out of :meth:`SessionRunner.run` (the runner fails a session with
its reason for everything it expects: a target that stays down, pgbench failing, a
cancel). Such an exception repeats on every attempt more often than not: a row this
version cannot read, a target whose DSN no key opens. Before, the lease ran out and the
next claim crashed again, for good, the target keeping a trial's settings.

Now each crash is a note on the session (``CRASH_NOTE``: the notes are the count, in the
metadata DB, and tell the user what happened) and the lease is given up, so that any
process tries again at its next poll. The ``CRASH_LIMIT``-th crash fails the session with
the reason; the target is put back to the session's snapshot where this process can reach
it, else the error lists the postgresql.auto.conf entries to put back by hand.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import update

from app.db import Database, changed_rows, utcnow
from app.models import Target, TuningSession
from app.postgres.dsn import scrub
from app.postgres.target import Snapshot
from app.sessions.recovery import SessionTarget
from app.settings import Settings

log = logging.getLogger(__name__)

CRASH_LIMIT = 3  # crashes of one session's runner before the session is failed
CRASH_NOTE = "the runner crashed"  # the notes that count them start with this


def crash_count(notes: list[Any] | None) -> int:
    return sum(1 for n in notes or [] if isinstance(n, str) and n.startswith(CRASH_NOTE))


def session_crashed(
    db: Database,
    settings: Settings,
    session_id: int,
    owner: str,
    exc: BaseException,
    target_of: Callable[[Target, Settings], SessionTarget],
) -> str | None:
    """Record a crash of the runner of ``session_id``, driven by ``owner``.

    Returns "retry" (the lease given up), "failed" (the limit reached: the session failed,
    its target restored or the entries to restore said), or None when the lease is no
    longer ours (another process drives the session now). ``target_of``: the sessions'
    RunEnv.target, which opens the target to restore it. Never raises: it runs where the
    crash was caught, and a second failure there must not hide the first.
    """
    try:
        return _crashed(db, settings, session_id, owner, exc, target_of)
    except Exception:
        log.exception("session %s: recording the runner's crash failed", session_id)
        return None


def _crashed(
    db: Database,
    settings: Settings,
    session_id: int,
    owner: str,
    exc: BaseException,
    target_of: Callable[[Target, Settings], SessionTarget],
) -> str | None:
    with db.session() as s:
        sess = s.get(TuningSession, session_id, with_for_update=True)
        if sess is None or sess.lease_owner != owner or sess.status not in ("queued", "running"):
            return None
        dsn = sess.target.dsn
        reason = scrub(str(exc) or repr(exc), dsn).strip().splitlines()[0]
        n = crash_count(sess.notes) + 1
        sess.notes = [*(sess.notes or []), f"{CRASH_NOTE} ({n} of {CRASH_LIMIT}): {reason}"]
        if n < CRASH_LIMIT:
            # any process may try again at its next poll, not after the lease ran out
            sess.lease_owner, sess.lease_expires_at = None, None
            log.warning("session %s: runner crash %d of %d: %s", session_id, n, CRASH_LIMIT, reason)
            return "retry"
        data = sess.snapshot
        ctl: SessionTarget | None = None
        ctl_error: str | None = None
        try:
            ctl = target_of(sess.target, settings)
        except Exception as e:  # the very cause of the crashes, often
            ctl_error = scrub(str(e) or repr(e), dsn)
    restored, said = _restore(ctl, ctl_error, data, dsn)
    error = (
        f"the runner crashed {n} times on this session (last: {reason}); "
        f"it was stopped rather than retried again; {said}"
    )
    log.error("session %s: %s", session_id, error)
    with db.session() as s:
        changed_rows(
            s,
            update(TuningSession)
            .where(TuningSession.id == session_id, TuningSession.lease_owner == owner)
            .values(
                status="failed",
                phase="failed",
                error=error,
                applied=None if restored else {"config": None, "unknown": True},
                finished_at=utcnow(),
                lease_owner=None,
                lease_expires_at=None,
                live=None,
            ),
        )
    return "failed"


def _restore(
    ctl: SessionTarget | None, ctl_error: str | None, data: dict[str, Any] | None, dsn: str
) -> tuple[bool, str]:
    """Put the target back to the snapshot: whether it is as it was, and what was done or
    what to do by hand."""
    if data is None:
        return True, "its target was not changed (no snapshot had been taken)"
    try:
        snap = Snapshot.from_json(data["target"])
    except (KeyError, TypeError, ValueError) as e:
        return False, f"its target's snapshot cannot be read ({e}): check its settings by hand"
    entries = ", ".join(f"{k} = '{v}'" for k, v in snap.auto_conf.items())
    by_hand = (
        "put back the snapshot's postgresql.auto.conf entries by hand "
        f"({entries or 'none: ALTER SYSTEM RESET ALL'}) and reload the server"
    )
    if ctl is None:
        return False, f"its target's settings were NOT restored ({ctl_error}): {by_hand}"
    try:
        ctl.revert(snap)
    except Exception as e:
        return False, f"its target's settings were NOT restored ({scrub(str(e), dsn)}): {by_hand}"
    return True, "its target's settings were restored to the snapshot"
