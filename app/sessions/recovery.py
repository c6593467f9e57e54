"""Bringing a session's target back: after it went down, after a crash, at the end.

* The target goes down during a trial: :meth:`TargetRecovery.await_target` polls it with
  backoff for ``target_retry_s`` (a cancel ends the wait), then the session applies the
  incumbent again (:meth:`restore_incumbent`), or fails with :class:`TargetDown`.
* The server dies under a trial's config (:meth:`after_target_crash`): the config is a
  suspect; the server is started again with the snapshot's entries through its restart
  method (or the operator is told what to do), then the incumbent is applied again.
* A crash of the previous process (:meth:`after_crash`): if the target is down after an
  interrupted restart, wait for it, else start it with the snapshot's entries; then end
  the orphan pgbench connections the dead process left.
* The end (:meth:`restore`): revert to the snapshot; an unreachable target is waited for
  (``RESTORE_WAIT_S``) while the session keeps the target busy, and the pending outcome
  is recorded so that a process resuming the session only restores.
* The metadata DB is gone (:meth:`abandon`): revert without recording anything.
* The service is stopping (:meth:`pause`): revert, say so; the next start resumes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import psycopg

from app.db import utcnow
from app.lease import Heartbeat
from app.postgres.memory import MemoryMeter
from app.postgres.target import (
    ApplyResult,
    ConnectError,
    PoolCounter,
    PoolFill,
    Probe,
    Snapshot,
    TargetError,
)

log = logging.getLogger(__name__)

RESTORE_WAIT_S = 3600.0  # how long the final restore waits for an unreachable target
# how long a server that went down under a trial gets to come back by itself (crash
# recovery takes seconds) before knobtune rolls its config back and starts it
CRASH_GRACE_S = 5.0


class TargetDown(TargetError):
    """The target stopped answering and did not come back within target_retry_s."""


class SessionTarget(Protocol):
    """What a session needs of its target: TargetController, or a fake in tests."""

    local: bool
    no_restart_reason: str  # why there is no restart method (shown when a knob needs one)

    @property
    def can_restart(self) -> bool: ...

    def probe(self, names: Sequence[str]) -> Probe: ...

    def snapshot(self, names: Sequence[str]) -> Snapshot: ...

    def apply(
        self, config: Mapping[str, str], *, on_restart: Callable[[], None] | None = None
    ) -> ApplyResult: ...

    def revert(self, snapshot: Snapshot) -> ApplyResult: ...

    def is_up(self) -> bool: ...

    def wait_until_up(self, timeout_s: float) -> bool: ...

    def recover_offline(self, snapshot: Snapshot) -> str: ...

    def terminate_clients(self, application_prefix: str) -> int: ...

    def buffer_pool(self) -> PoolFill | None: ...

    def memory_meter(self) -> MemoryMeter | None: ...

    def pool_counter(self) -> contextlib.AbstractContextManager[PoolCounter | None]: ...


class RecoveryStore(Protocol):
    """Where a recovery says what it does: a session's store (app/sessions/store.py), or a
    comparison's (app/compare/runner.py)."""

    def phase(self, phase: str) -> None: ...

    def update(self, **values: Any) -> None: ...

    def note(self, text: str) -> None: ...


class TargetRecovery:
    def __init__(
        self,
        target: SessionTarget,
        store: RecoveryStore,
        hb: Heartbeat,
        *,
        retry_s: float,
        app_name: str,
    ) -> None:
        self.target, self.store, self.hb = target, store, hb
        self.retry_s, self.app_name = retry_s, app_name
        self.restore_wait_s = RESTORE_WAIT_S

    def await_target(self, why: str) -> None:
        """Poll the target with backoff for retry_s; TargetDown if it stays away."""
        limit = self.retry_s
        deadline = time.monotonic() + limit
        self.store.phase(f"waiting for the target to come back (up to {limit:.0f} s)")
        delay = 0.5
        while not self.target.is_up():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TargetDown(f"the target did not come back within {limit:.0f} s{why}")
            self.hb.stop_bench.wait(min(delay, left))  # a cancel ends the wait at once
            self.hb.check()
            delay = min(delay * 2, 10.0)

    def restore_incumbent(self, incumbent: dict[str, str]) -> None:
        self.store.phase("applying the incumbent config again")
        applied_at = {"config": incumbent, "at": utcnow().isoformat(), "incumbent": True}
        self.store.update(applied=applied_at)

        def restarting() -> None:
            self.store.update(
                phase="restarting the target for the incumbent config",
                applied={**applied_at, "restarting": True},
            )

        self.target.apply(incumbent, on_restart=restarting)

    def after_target_crash(self, snapshot: Snapshot, what: str) -> str:
        """The server died under a trial's config (``what``): roll it back, start it again.

        A server that restarts itself (the postmaster's crash recovery after a backend was
        killed) is back within seconds, the suspect config still in force: the session then
        applies the incumbent over it. A postmaster that died stays down: with a restart
        method, postgresql.auto.conf gets the snapshot's entries while it is down (where the
        data directory is on this host) and the server is started with them
        (``recover_offline``); without one, the operator is told exactly what to do, and the
        session waits for the server as for any target that went away. Returns what was
        done; raises TargetDown when the server stays down.
        """
        ctl = self.target
        self.store.phase(f"the target went down under {what}: waiting for it to restart itself")
        if ctl.wait_until_up(min(self.retry_s, CRASH_GRACE_S)):
            return "the server restarted by itself (crash recovery)"
        self.hb.check()
        entries = ", ".join(f"{k} = '{v}'" for k, v in snapshot.auto_conf.items()) or "none"
        if not ctl.can_restart:
            self.store.phase(
                f"the target is down since it crashed under {what}, and {ctl.no_restart_reason}: "
                "the operator must put back the snapshot's postgresql.auto.conf entries "
                f"({entries}) and start the server; waiting for it"
            )
            self.await_target(
                f" after it crashed under {what}; {ctl.no_restart_reason}: put back the "
                f"snapshot's postgresql.auto.conf entries ({entries}) and start the server"
            )
            return "the server was started again by someone else"
        self.store.phase(
            f"the target crashed under {what}: rolling it back to the snapshot's settings "
            "and starting it again"
        )
        try:
            done = ctl.recover_offline(snapshot)
        except TargetError as exc:
            raise TargetDown(
                f"the target crashed under {what} and could not be started again with the "
                f"snapshot's settings: {exc}; put back the snapshot's postgresql.auto.conf "
                f"entries ({entries}) and start the server"
            ) from None
        self.hb.check()
        return done

    def after_crash(self, snapshot: Snapshot, *, restarting: bool) -> None:
        """After a crash of the previous process: the target up, its orphan pgbench gone.

        ``restarting``: the previous process recorded a restart under way.
        """
        ctl = self.target
        if not ctl.is_up():
            if restarting and ctl.can_restart:
                # Our restart was under way when the process died: its pg_ctl may still
                # finish; if not, the candidate may not boot and nobody rolled it back.
                self.store.phase("the target is down after an interrupted restart: waiting for it")
                if not ctl.wait_until_up(min(self.retry_s, 60.0)):
                    self.store.phase("starting the target with the snapshot's settings")
                    what = ctl.recover_offline(snapshot)
                    self.store.note(f"resumed after a crash during a restart: {what}")
            else:
                self.await_target(" when the session was resumed")
        try:
            ended = ctl.terminate_clients(self.app_name)
        except (TargetError, psycopg.Error):  # e.g. no right to end them: they end by themselves
            ended = 0
        if ended:
            log.info("%s: ended %d orphan pgbench connections", self.hb.what, ended)

    def restore(self, snapshot: Snapshot, status: str, error: str | None) -> None:
        """Revert to the snapshot; an unreachable target is waited for (restore_wait_s).

        Meanwhile the session stays active, so the target is not handed to a new
        session (whose snapshot would capture our candidate), and the pending
        outcome is recorded so that a process resuming it only restores.
        """
        self.store.phase("restoring the target's settings")
        deadline = time.monotonic() + self.restore_wait_s
        delay = 1.0
        waiting = False
        while True:
            try:
                self.target.revert(snapshot)
                if waiting:
                    self.store.note("the target came back; its settings were restored")
                return
            except (ConnectError, psycopg.OperationalError) as exc:
                if not isinstance(exc, ConnectError) and self.target.is_up():
                    raise  # not the server going away: a real failure of the revert
                if time.monotonic() >= deadline:
                    raise TargetError(
                        f"the target stayed unreachable for {self.restore_wait_s:.0f} s, so its "
                        "settings were NOT restored; put back these postgresql.auto.conf "
                        f"entries by hand: {snapshot.auto_conf or '(none: remove all)'} "
                        f"({exc})"
                    ) from None
                if not waiting:
                    waiting = True
                    outcome = error or status
                    self.store.update(
                        phase="the target is unreachable: its settings will be restored "
                        "once it is back",
                        error=f"{outcome}; the target is unreachable: its settings will be "
                        "restored once it is back",
                        applied={"restore_pending": True, "status": status, "error": error},
                    )
            if self.hb.lost.wait(delay):
                self.hb.check()  # ShuttingDown or LeaseLost: the pending restore is recorded
            delay = min(delay * 2, 30.0)

    def abandon(self, snapshot: Snapshot | None, why: str) -> None:
        """Without a metadata DB nothing can be recorded: restore the target and step back.

        The session stays 'running' with a lease that runs out, so a process resumes it
        (replaying the stored trials) once the DB is back.
        """
        log.error("%s: %s; restoring the target and pausing", self.hb.what, why)
        if snapshot is None:
            return
        try:
            self.target.revert(snapshot)
        except Exception:
            log.exception("%s: restoring the target failed", self.hb.what)

    def pause(self, snapshot: Snapshot | None) -> None:
        """The service is stopping (SIGTERM): put the target back and step back.

        The work stays 'running' and the scheduler releases its lease once this returns,
        so the next start (or another process) resumes it at once, replaying the stored
        runs. A restore the stop cut short was recorded as pending: the resume finishes it.
        """
        self.abandon(snapshot, "the service is stopping")
        with contextlib.suppress(Exception):  # the metadata DB may be what went away
            self.store.phase("paused: the service stopped; its next start resumes here")
