"""Changing the target's settings: a :class:`Snapshot` of them before, apply (ALTER SYSTEM,
reload or restart, verify the effective values, roll back what did not take effect),
revert to a snapshot, and which knobs cannot be applied on this target at all.

Every change goes through ``ALTER SYSTEM`` (composed with ``sql.Identifier`` and
``sql.Literal``, never string formatting), so a revert is a matter of restoring
``postgresql.auto.conf`` entries (app/postgres/target/conf_files.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from app.postgres.target.conf_files import ConfFiles, alter
from app.postgres.target.connection import Conn, Connector, _pg_message
from app.postgres.target.errors import ApplyError, PrivilegeError, RestartUnavailable
from app.postgres.target.probe import Prober, pending_restart, setting_rows
from app.postgres.target.restarts import Restarter, _RestartFailed
from app.postgres.units import same_value
from optimizer.knobs import SettingRow

log = logging.getLogger(__name__)


@dataclass
class Snapshot:
    """The target's state before a session: ALTER SYSTEM entries and effective values."""

    auto_conf: dict[str, str]  # name -> value text as written in postgresql.auto.conf
    effective: dict[str, str]  # name -> current_setting(name), PostgreSQL syntax with units

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "auto_conf": dict(self.auto_conf), "effective": dict(self.effective)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Snapshot:
        auto, eff = d.get("auto_conf"), d.get("effective")
        if not isinstance(auto, dict) or not isinstance(eff, dict):
            raise ValueError("a snapshot needs 'auto_conf' and 'effective' objects")
        return cls(
            auto_conf={str(k): str(v) for k, v in auto.items()},
            effective={str(k): str(v) for k, v in eff.items()},
        )


@dataclass
class ApplyResult:
    restarted: bool
    seconds: float
    effective: dict[str, str]  # name -> current_setting(name) after the change
    # written, taking effect at the next restart (apply(..., allow_pending=True) only)
    pending_restart: list[str] = field(default_factory=list)


class Changer:
    """Applies and reverts settings of one target (callers serialize: TargetController)."""

    def __init__(
        self,
        db: Connector,
        files: ConfFiles,
        prober: Prober,
        restarts: Restarter,
        *,
        verify_timeout_s: float = 10.0,
    ) -> None:
        self._db = db
        self._files = files
        self._prober = prober
        self._restarts = restarts
        self.verify_timeout_s = verify_timeout_s

    def skip_reasons(self, names: Sequence[str]) -> dict[str, str]:
        """Knobs among ``names`` that cannot be applied on this target, with the reason.

        A knob that needs a restart is listed when there is no restart method.
        """
        probe = self._prober.probe(names)
        out: dict[str, str] = {n: "not a setting of this server" for n in probe.missing}
        for name, row in probe.settings.items():
            if row.context == "internal":
                out[name] = "read-only (set at build or initdb time)"
            elif row.context == "postmaster" and not self._restarts.can_restart:
                out[name] = f"needs a restart and {self._restarts.no_restart_reason}"
            elif name in probe.alter_system_denied:
                out[name] = "the target's user may not ALTER SYSTEM this setting"
        return out

    def snapshot(self, names: Sequence[str]) -> Snapshot:
        """ALTER SYSTEM entries and effective values of ``names`` (unknown names are skipped)."""
        names = [n.strip().lower() for n in names]
        with self._db.connect() as conn:
            self._files.resolve_data_dir(conn)
            auto = self._files.auto_conf(conn)
            rows = conn.execute(
                "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
                [names],
            ).fetchall()
        return Snapshot(auto_conf=auto, effective={str(r[0]): str(r[1]) for r in rows})

    def apply(
        self,
        config: Mapping[str, str],
        *,
        on_restart: Callable[[], None] | None = None,
        allow_pending: bool = False,
    ) -> ApplyResult:
        """ALTER SYSTEM SET each knob, reload (restart if needed), verify the effective values.

        ``on_restart`` is called just before a restart (the entries are written and
        validated), e.g. to record that the server is about to go down; an exception
        from it aborts before the restart. ``allow_pending``: a knob that needs a restart
        the target cannot do here is written anyway and left pending (listed in the
        result, not verified) instead of refusing the whole config.

        Raises ApplyError (after restoring the previous entries; the server is up),
        RestartUnavailable (nothing changed), PrivilegeError, ConnectError.
        """
        t0 = time.monotonic()
        wanted = self._check_config(config)
        if not wanted:
            return ApplyResult(restarted=False, seconds=0.0, effective={})
        what = ", ".join(f"{k}={v!r}" for k, v in wanted.items())
        with self._db.connect() as conn:
            self._files.resolve_data_dir(conn)
            rows = setting_rows(conn, list(wanted))
            unknown = [name for name in config if name.strip().lower() not in rows]
            if unknown:
                raise ApplyError(
                    f"unknown setting(s) {', '.join(map(repr, unknown))}; nothing was changed"
                )
            readonly = [n for n in wanted if rows[n].context == "internal"]
            if readonly:
                raise ApplyError(f"read-only setting(s) {', '.join(readonly)}; nothing was changed")
            restart_knobs = [
                n
                for n in wanted
                if rows[n].context == "postmaster"
                and not same_value(wanted[n], rows[n].setting, rows[n])
            ]
            if restart_knobs and not self._restarts.can_restart and not allow_pending:
                raise RestartUnavailable(
                    f"{', '.join(restart_knobs)} need(s) a server restart and "
                    f"{self._restarts.no_restart_reason}; nothing was changed"
                )
            before = self._files.auto_conf(conn)
            done: list[str] = []
            for name, value in wanted.items():
                try:
                    alter(conn, name, value)
                except psycopg.Error as exc:
                    self._files.restore_entries(conn, before, done)
                    msg = f"{name} = {value!r} was rejected by the server: {_pg_message(exc)}"
                    if isinstance(exc, pg_errors.InsufficientPrivilege):
                        raise PrivilegeError(msg + "; nothing was changed") from None
                    raise ApplyError(msg + "; nothing was changed") from None
                done.append(name)
            self._files.reload(conn)
            # A fresh backend: this one applies the reload only after its next query.
            with self._db.connect() as fresh:
                problems = self._files.file_errors(fresh, list(wanted))
                pending = pending_restart(fresh, list(wanted))
            if problems:
                self._files.restore_entries(conn, before, done)
                self._files.reload(conn)
                raise ApplyError(
                    f"{what} was not applied: {'; '.join(problems)}; previous entries restored"
                )
            for name in pending:
                if name not in restart_knobs:
                    restart_knobs.append(name)
            if restart_knobs and not self._restarts.can_restart and not allow_pending:
                self._files.restore_entries(conn, before, done)
                self._files.reload(conn)
                raise RestartUnavailable(
                    f"{', '.join(restart_knobs)} need(s) a server restart and "
                    f"{self._restarts.no_restart_reason}; previous entries restored"
                )
        pending = restart_knobs if restart_knobs and not self._restarts.can_restart else []
        restart = bool(restart_knobs) and not pending
        if restart:
            self._restarts.restart_or_recover(before, list(wanted), what, on_restart)
        check = {k: v for k, v in wanted.items() if k not in pending}
        mismatched, effective = self._verify(check, rows)
        if mismatched:
            note = self._rollback(before, list(wanted), restart=restart)
            raise ApplyError(
                f"{what} did not take effect ({'; '.join(mismatched)}): a per-database or "
                f"per-role setting, or the DSN's options, may override it. {note}"
            )
        return ApplyResult(
            restarted=restart,
            seconds=time.monotonic() - t0,
            effective=effective,
            pending_restart=list(pending),
        )

    def _check_config(self, config: Mapping[str, str]) -> dict[str, str]:
        wanted: dict[str, str] = {}
        for name, value in config.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise ApplyError(f"setting names and values must be text, got {name!r}: {value!r}")
            wanted[name.strip().lower()] = value
        return wanted

    def _verify(
        self, wanted: Mapping[str, str], rows: Mapping[str, SettingRow]
    ) -> tuple[list[str], dict[str, str]]:
        """Poll new connections until the effective values match (normalized, not as text).

        ConfFiles.reload already waited for the reload, so a mismatch that outlasts a short
        grace period is real (a per-role setting, PGOPTIONS, ...).
        """
        deadline = time.monotonic() + min(self.verify_timeout_s, 1.0)
        while True:
            with self._db.connect() as conn:
                cur = {
                    r[0]: (str(r[1]), str(r[2]))
                    for r in conn.execute(
                        "SELECT name, setting, current_setting(name) FROM pg_settings "
                        "WHERE name = ANY(%s)",
                        [list(wanted)],
                    ).fetchall()
                }
            mismatched = [
                f"{n} is {cur[n][1]!r}, expected {v!r}"
                for n, v in wanted.items()
                # Strings are stored as given or canonicalized in ways we cannot
                # predict (time zones, lists); only typed values are compared.
                if n in cur
                and rows[n].vartype != "string"
                and not same_value(v, cur[n][0], rows[n])
            ]
            if not mismatched or time.monotonic() >= deadline:
                return mismatched, {n: cur[n][1] for n in wanted if n in cur}
            time.sleep(0.05)

    def _rollback(self, before: Mapping[str, str], names: Sequence[str], *, restart: bool) -> str:
        with self._db.connect() as conn:
            self._files.restore_entries(conn, before, names)
            self._files.reload(conn)
        if restart and self._restarts.can_restart:
            try:
                self._restarts.run()
            except _RestartFailed as exc:
                return f"Previous entries restored, but the restart failed: {exc}"
            return "Previous entries restored and the server restarted."
        return "Previous entries restored."

    def revert(self, snapshot: Snapshot) -> ApplyResult:
        """Make postgresql.auto.conf exactly as in ``snapshot``; reload, restart if needed."""
        t0 = time.monotonic()
        with self._db.connect() as conn:
            self._files.resolve_data_dir(conn)
            current = self._files.auto_conf(conn)
            changed = [n for n in current if n not in snapshot.auto_conf]
            changed += [n for n, v in snapshot.auto_conf.items() if current.get(n) != v]
            if changed:
                self._files.restore_entries(conn, snapshot.auto_conf, changed)
                self._files.reload(conn)
        with self._db.connect() as fresh:
            restart_knobs = self._restart_needed(fresh, snapshot, changed)
        if restart_knobs:
            if not self._restarts.can_restart:
                raise RestartUnavailable(
                    f"previous entries restored, but {', '.join(restart_knobs)} only take(s) "
                    f"effect after a restart and {self._restarts.no_restart_reason}"
                )
            problem = self._files.validate_pending(restart_knobs)
            if problem:
                raise ApplyError(f"the snapshot's configuration would not start: {problem}")
            try:
                self._restarts.run()
            except _RestartFailed as exc:
                raise ApplyError(f"revert: restart failed: {exc}") from None
        effective = self._settle(snapshot)
        return ApplyResult(
            restarted=bool(restart_knobs), seconds=time.monotonic() - t0, effective=effective
        )

    def _restart_needed(self, conn: Conn, snapshot: Snapshot, changed: Sequence[str]) -> list[str]:
        """Postmaster knobs whose running value differs from the snapshot's.

        A restart that was already pending before the session (an edited file,
        not yet restarted) is not ours to carry out, so pending_restart alone
        does not count for knobs the snapshot knows.
        """
        names = sorted(set(snapshot.effective) | set(changed))
        rows = setting_rows(conn, names)
        out: list[str] = []
        for name, row in rows.items():
            if row.context != "postmaster" or not row.pending_restart:
                continue
            if name in snapshot.effective:
                if not same_value(snapshot.effective[name], row.setting, row):
                    out.append(name)
            elif name in changed:
                out.append(name)
        return out

    def _settle(self, snapshot: Snapshot) -> dict[str, str]:
        """Effective values after a revert; waits briefly for them to match the snapshot."""
        names = list(snapshot.effective)
        deadline = time.monotonic() + min(self.verify_timeout_s, 3.0)
        while True:
            with self._db.connect() as conn:
                rows = setting_rows(conn, names)
                eff = {
                    str(r[0]): str(r[1])
                    for r in conn.execute(
                        "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
                        [names],
                    ).fetchall()
                }
            differ = [
                n
                for n, v in snapshot.effective.items()
                if n in rows and n in eff and not same_value(v, eff[n], rows[n])
            ]
            if not differ or time.monotonic() >= deadline:
                if differ:
                    log.warning("after revert, %s differ from the snapshot", ", ".join(differ))
                return eff
            time.sleep(0.05)
