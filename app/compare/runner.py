"""Runs one comparison under a lease, like a session: claimed, kept alive, resumed, restored.

The scheduler (app/jobs/scheduler.py) claims a queued comparison, or a running one whose
lease ran out (its process died), and runs it here. Order of writes, as for a session:

1. the probe's rows, the configs as resolved for the server as it is now (default and
   pgtune) and the target's **snapshot** are committed before the first change;
2. what the target may be set to is recorded before each apply (``applied``, with
   ``restarting`` before a restart);
3. every run is stored as soon as it ends;
4. at the end, on a cancel or a failure, the snapshot is put back (app/sessions/recovery.py:
   an unreachable target is waited for, and a process resuming the comparison only
   restores), then the levels and gains are stored.

A process that takes a dead one's comparison over first brings the target back (up, its
orphan pgbench ended: ``TargetRecovery.after_crash``), then measures the rest of the
rounds (the stored runs count) and restores at the end; a comparison cancelled while
nobody ran it is restored the same way.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from app.compare.configs import EXTRA_SETTINGS, Resolved, complete, restart_knobs
from app.compare.rounds import run_record, run_rounds
from app.compare.schemas import ComparisonIn
from app.compare.service import figures, names_of, orders_of
from app.db import Database, utcnow
from app.errors import RequestError, errors_text
from app.lease import Cancelled, Heartbeat, LeaseLost, ShuttingDown, write_leased
from app.models import Comparison, Target
from app.objective import objective_of
from app.postgres.benchlock import lock_for
from app.postgres.cgroups import smaller
from app.postgres.dsn import scrub
from app.postgres.target import Snapshot, TargetController, TargetError
from app.sessions.recovery import TargetRecovery
from app.sessions.trial import TrialExecutor, TrialHooks, TrialOutcome
from app.settings import Settings
from app.targets.access import admin_dsn_for
from app.targets.probe_data import rows_to_json
from app.targets.service import controller
from app.workloads import workload_for
from app.workloads.base import WorkloadError
from app.workloads.schemas import kind_for
from optimizer.catalogue import CATALOGUE
from optimizer.evidence import Objective

log = logging.getLogger(__name__)

SNAPSHOT_NAMES = sorted(set(CATALOGUE) | set(EXTRA_SETTINGS))

# Comparisons this process is driving, by metadata DB: a claim after a lease ran out while
# the DB was away must not start a second runner beside the first.
_ACTIVE: set[tuple[str, int]] = set()
_ACTIVE_LOCK = threading.Lock()


class ComparisonError(Exception):
    """The comparison cannot go on (a config cannot be applied, pgbench cannot run)."""


class ComparisonStore:
    """The comparison's row, written by the process that holds its lease."""

    def __init__(
        self, db: Database, comparison_id: int, owner: str, scrub_: Callable[[str], str]
    ) -> None:
        self.db, self.id, self.owner, self.scrub = db, comparison_id, owner, scrub_

    def update(self, **values: Any) -> None:
        if isinstance(values.get("phase"), str):
            values["phase"] = values["phase"][:200]
        if isinstance(values.get("error"), str):
            values["error"] = self.scrub(values["error"])
        write_leased(self.db, Comparison, self.id, self.owner, **values)

    def phase(self, phase: str) -> None:
        log.info("comparison %s: %s", self.id, phase)
        self.update(phase=self.scrub(phase))

    def _append(self, column: str, item: Any) -> None:
        with self.db.session() as s:
            row = s.get(Comparison, self.id, with_for_update=True)
            if row is None or row.lease_owner != self.owner:
                raise LeaseLost  # another process resumed it: its runs, not ours
            setattr(row, column, [*(getattr(row, column) or []), item])

    def note(self, text: str) -> None:
        self._append("notes", self.scrub(text))

    def add_run(self, rec: dict[str, Any]) -> None:
        self._append("runs", rec)


class ComparisonRunner:
    """Runs one claimed comparison in this process (see the module docstring)."""

    def __init__(self, db: Database, settings: Settings, comparison_id: int, owner: str) -> None:
        self.db, self.settings, self.id, self.owner = db, settings, comparison_id, owner
        # pgbench's application_name: a resumed comparison ends an orphan's connections
        self.app_name = f"knobtune-compare-{comparison_id}"
        self.workdir = (Path(settings.work_dir) / "comparisons" / str(comparison_id)).resolve()
        self.dsn = ""
        self.admin_dsn: str | None = None  # the cluster is knobtune's own (admin_dsn_for)
        self.snapshot: Snapshot | None = None
        self.store = ComparisonStore(db, comparison_id, owner, self._safe)

    def _safe(self, text: str) -> str:
        return scrub(text, self.dsn) if self.dsn else text

    def run(self) -> None:
        key = (self.db.url, self.id)
        with _ACTIVE_LOCK:
            if key in _ACTIVE:
                return
            _ACTIVE.add(key)
        try:
            with contextlib.suppress(LeaseLost):
                self._run()
        finally:
            with _ACTIVE_LOCK:
                _ACTIVE.discard(key)

    def _run(self) -> None:
        with self.db.session() as s:
            row = s.get(Comparison, self.id)
            if (
                row is None
                or row.lease_owner != self.owner
                or row.status not in ("queued", "running")
            ):
                return
            target = s.get(Target, row.target_id)
            assert target is not None
            refused = None
            try:
                body: ComparisonIn | None = ComparisonIn.model_validate(row.request)
            except ValidationError as exc:
                body = None
                refused = (
                    f"the stored request is refused by this version of knobtune: "
                    f"{errors_text(exc)}; start a new comparison with a corrected request"
                )
            self.dsn = target.workload_dsn
            self.admin_dsn = admin_dsn_for(target)
            try:
                ctl = controller(target, self.settings)
            except TargetError as exc:  # e.g. a DSN this version refuses: nothing ran
                row.status = row.phase = "failed"
                row.error = self._safe(str(exc))
                row.finished_at = utcnow()
                row.lease_owner, row.lease_expires_at = None, None
                return
            hardware = (target.ram_bytes, target.cpus)
            stored = row.snapshot
            configs = [Resolved.from_json(c) for c in row.configs or []]
            applied = dict(row.applied or {})
            resumed = row.attempts > 0
            cancel = row.cancel_requested
            done = len(row.runs or [])
        if stored is not None:
            self.snapshot = Snapshot.from_json(stored["target"])
        now = utcnow()
        self.store.update(
            status="running",
            heartbeat_at=now,
            attempts=Comparison.attempts + 1,
            **({} if resumed else {"started_at": now}),
        )
        hb = Heartbeat(self.db, Comparison, self.id, self.owner, self.settings.lease_seconds)

        def publish(at: datetime) -> dict[str, Any]:
            return {"heartbeat_at": at}

        hb.publish = publish
        with hb:
            self.hb = hb
            self.recovery = TargetRecovery(
                ctl,
                self.store,
                hb,
                retry_s=self.settings.target_retry_s,
                app_name=f"{self.app_name}-",  # this comparison's pgbench, not number 1x's
            )
            try:
                if applied.get("restore_pending"):
                    # a previous process ended it and waited for the target: only restore
                    self._finish(str(applied.get("status") or "failed"), applied.get("error"))
                    return
                self._drive(
                    ctl,
                    body,
                    refused,
                    configs,
                    hardware,
                    done,
                    cancel=cancel,
                    restarting=bool(applied.get("restarting")),
                    resumed=resumed,
                )
            except ShuttingDown:
                self.recovery.pause(self.snapshot)
            except LeaseLost:
                log.warning("comparison %s: lease lost; another process owns it now", self.id)

    def _drive(
        self,
        ctl: TargetController,
        body: ComparisonIn | None,
        refused: str | None,
        configs: list[Resolved],
        hardware: tuple[int | None, int | None],
        done: int,
        *,
        cancel: bool,
        restarting: bool,
        resumed: bool,
    ) -> None:
        """Everything between the claim and the end, the target restored whatever happens
        (but a lost lease: the process that took the comparison over restores)."""
        try:
            if resumed and self.snapshot is not None:
                self.store.phase("resumed after a crash: bringing the target back")
                self.recovery.after_crash(self.snapshot, restarting=restarting)
            if body is None:
                raise ComparisonError(refused)
            if cancel:
                raise Cancelled
            resolved = self._prepare(ctl, body, configs, hardware)
            self._measure(ctl, body, resolved, done)
        except LeaseLost:
            raise
        except Cancelled:
            self._finish("cancelled")
        except (ComparisonError, RequestError, TargetError, WorkloadError) as exc:
            self._finish("failed", str(exc))
        except BaseException as exc:
            log.exception("comparison %s crashed", self.id)
            self._finish("failed", f"internal error: {exc!r}")
            if not isinstance(exc, Exception):
                raise
        else:
            self._finish("succeeded")

    # -- before the first run -------------------------------------------------------------
    def _prepare(
        self,
        ctl: TargetController,
        body: ComparisonIn,
        configs: list[Resolved],
        hardware: tuple[int | None, int | None],
    ) -> dict[str, dict[str, str]]:
        """The configs by name, resolved for the server as it is now, and the snapshot
        committed before the first change (a resume reads both back)."""
        if self.snapshot is not None:
            return {c.name: dict(c.settings or {}) for c in configs}
        self.store.phase("probing the target")
        probe = ctl.probe(SNAPSHOT_NAMES)
        if not probe.can_alter_system:
            raise TargetError(
                "the target's user may not run ALTER SYSTEM (superuser or GRANT ALTER SYSTEM "
                "ON PARAMETER is needed)"
            )
        ram = hardware[0] or probe.ram_bytes
        cpus = hardware[1] or probe.cpus
        if probe.hardware_note:  # never more than the server may use now (its cgroup)
            ram, cpus = smaller(ram, probe.ram_bytes), smaller(cpus, probe.cpus)
        resolved = complete(
            configs,
            probe.settings,
            ram_bytes=ram,
            cpus=cpus,
            kind=kind_for(body.workload_kind, body.workload),
            version_num=probe.version_num,
            no_restart=None if ctl.can_restart else ctl.no_restart_reason,
        )
        if not ctl.can_restart:
            for c in resolved:
                need = restart_knobs(c.settings or {}, probe.settings)
                if need:
                    raise ComparisonError(
                        f"config {c.name!r} changes {', '.join(need)}, which need(s) a server "
                        f"restart, and {ctl.no_restart_reason}; nothing was changed"
                    )
        snap = ctl.snapshot(SNAPSHOT_NAMES)
        # committed before any change: the way back exists before we leave
        self.store.update(
            snapshot={
                "target": snap.to_json(),
                "rows": rows_to_json(probe.settings),
                "hardware": {"ram_bytes": ram, "cpus": cpus},
                "version": probe.version,
            },
            configs=[c.to_json() for c in resolved],
        )
        self.snapshot = snap
        for c in resolved:
            shown = ", ".join(f"{k}={v}" for k, v in (c.settings or {}).items()) or "no change"
            self.store.note(f"{c.name}: {shown}" + (f" ({c.note})" if c.note else ""))
        return {c.name: dict(c.settings or {}) for c in resolved}

    # -- the rounds -----------------------------------------------------------------------
    def _measure(
        self,
        ctl: TargetController,
        body: ComparisonIn,
        configs: dict[str, dict[str, str]],
        done: int,
    ) -> None:
        assert self.snapshot is not None
        with self.db.session() as s:
            row = s.get(Comparison, self.id)
            assert row is not None
            orders = orders_of(row)
        if not done:
            shown = " | ".join(" ".join(o) for o in orders)
            self.store.note(f"order of the rounds (seed {row.seed}): {shown}")
        wl = body.workload
        # a replay on a sandbox: its superuser makes the copies, as in a session
        workload = workload_for(wl, clients=int(wl.clients), admin_dsn=self.admin_dsn)
        executor = TrialExecutor(
            ctl,
            self.dsn,
            workload,
            duration_s=wl.duration_s,
            warmup_s=wl.warmup_s,
            rate=wl.rate,
            workdir=self.workdir,
            app_name=self.app_name,
            warmup_run_s=body.warmup_s,  # a discarded run after every apply
            stop=self.hb.stop_bench,
            hooks=self._hooks(),
            scrub=self._safe,
            local=ctl.local,
            bench_lock=lock_for(
                self.dsn,
                lock_dir=self.settings.bench_lock_dir,
                work_dir=self.settings.work_dir,
                slots=self.settings.bench_per_host,
                holder=f"comparison {self.id}",
            ),
        )
        self.store.phase("preparing the workload's data")
        prepared = workload.prepare(self.dsn)
        if prepared and not done:
            self.store.note(prepared)
        self.hb.check()
        objective = objective_of(body)

        def on_run(i: int, rnd: int, name: str, out: TrialOutcome, seen: dict[str, str]) -> None:
            self._on_run(i, rnd, name, out, seen, configs, orders, objective)

        try:
            run_rounds(ctl, executor, configs, orders, self.snapshot, on_run, start=done)
        finally:
            with contextlib.suppress(OSError):
                self.workdir.rmdir()

    def _hooks(self) -> TrialHooks:
        store, hb = self.store, self.hb

        def on_applied(applied: dict[str, Any], phase: str | None) -> None:
            if phase is None:
                store.update(applied=applied)
            else:
                store.update(phase=phase, applied=applied)

        return TrialHooks(on_phase=store.phase, on_applied=on_applied, check=hb.check)

    def _on_run(
        self,
        i: int,
        rnd: int,
        name: str,
        out: TrialOutcome,
        seen: dict[str, str],
        configs: dict[str, dict[str, str]],
        orders: list[list[str]],
        objective: Objective,
    ) -> None:
        rec = {
            "index": i,
            "round": rnd,
            "position": orders[rnd].index(name),
            "config": name,
            "applied": configs[name],  # over the snapshot's settings
            "settings": seen,  # read as the measured run began
            **run_record(out, objective),
        }
        if rec["level"] is not None:
            rec["value"] = 1.0 / rec["level"] if objective.lower_is_better else rec["level"]
        rec["error"] = None if rec["error"] is None else self._safe(str(rec["error"]))
        self.store.add_run(rec)
        where = f"round {rnd + 1}, {name}"
        if out.fatal:
            raise ComparisonError(f"{where}: {rec['error']}")
        error = out.error or ""
        if error.startswith("could not apply"):
            if out.down:
                self.recovery.await_target(f" after {name} could not be applied")
            raise ComparisonError(f"config {name!r} {error.removeprefix('could not ')}")
        if out.down and self.snapshot is not None:
            back = self.recovery.after_target_crash(self.snapshot, f"config {name!r}")
            self.store.note(f"{where}: the server went down under it ({error}); {back}")
        elif rec["error"] is not None:
            self.store.note(f"{where}: {rec['error']}; that run has no level")
        elif rec["unfinished"]:
            self.store.note(
                f"{where}: no level (never finished: {', '.join(rec['unfinished'])}); a longer "
                "run holds every query"
            )
        self.hb.check()  # a cancel between runs stops before the next apply

    # -- the end --------------------------------------------------------------------------
    def _finish(self, status: str, error: str | None = None) -> None:
        restored: bool | None = None
        if self.snapshot is not None:
            try:
                self.recovery.restore(self.snapshot, status, error)
                restored = True
            except LeaseLost:
                raise
            except Exception as exc:
                log.exception("comparison %s: restoring the target failed", self.id)
                msg = f"restoring the target failed: {exc}"
                error = f"{error}; {msg}" if error else msg
                status, restored = "failed", False
        with self.db.session() as s:
            row = s.get(Comparison, self.id)
            assert row is not None
            table, gains = figures(row)
            orders = orders_of(row) if names_of(row) else []
            runs = list(row.runs or [])
        if status == "succeeded" and not any(r.get("level") is not None for r in runs):
            errors = [r["error"] for r in runs if r.get("error")]
            status = "failed"
            error = "no run measured a level" + (f"; the first said: {errors[0]}" if errors else "")
        if restored:
            self.store.note(
                "the target's settings were restored (postgresql.auto.conf as before the first run)"
            )
        self.store.update(
            status=status,
            phase="done" if status == "succeeded" else status,
            error=error,
            result={"levels": table, "gains": gains, "orders": orders},
            restored=restored,
            applied=None,
            finished_at=utcnow(),
            lease_owner=None,
            lease_expires_at=None,
        )
