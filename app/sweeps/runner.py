"""Runs one client sweep under a lease, like a session: claimed, kept alive, resumed.

The scheduler (app/jobs/scheduler.py) claims a queued sweep, or a running one whose lease
ran out (its process died), and runs it here. A heartbeat renews the lease and notices a
cancel; every finished run is stored at once. A sweep resumed after a crash keeps its
stored runs and measures the rest of its plan (:func:`app.sweeps.measure.measure`,
``done``), after ending the dead process's pgbench connections; a plan that no longer
fits the stored runs fails the sweep with that reason. A sweep changes no setting, so
nothing is ever restored.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import psycopg
from pydantic import ValidationError

from app.db import Database
from app.errors import errors_text
from app.lease import LeasedRunner, LeaseLost
from app.models import Sweep, Target
from app.postgres.benchlock import lock_for
from app.postgres.dsn import scrub
from app.postgres.target import TargetController, TargetError
from app.settings import Settings
from app.sweeps.measure import SweepError, measure
from app.sweeps.schemas import SweepIn

log = logging.getLogger(__name__)


class SweepRunner(LeasedRunner[Sweep]):
    """Runs one claimed sweep in this process: heartbeat, cancel, persisted runs, resume."""

    def __init__(self, db: Database, settings: Settings, sweep_id: int, owner: str) -> None:
        super().__init__(db, Sweep, sweep_id, owner, settings.lease_seconds)
        self.settings, self.sweep_id = settings, sweep_id
        self.app_name = f"knobtune-sweep-{sweep_id}"

    # -- lease-guarded writes -------------------------------------------------------------
    def _on_run(self, rec: dict[str, Any]) -> None:
        with self.db.session() as s:
            sw = s.get(Sweep, self.sweep_id, with_for_update=True)
            if sw is None or sw.lease_owner != self.owner:
                raise LeaseLost  # another process resumed it: its runs, not ours
            sw.runs = [*(sw.runs or []), rec]

    def _on_phase(self, phase: str) -> None:
        self.phase = phase

    # -- the job (LeasedRunner.run) -------------------------------------------------------
    def _run(self) -> None:
        with self.db.session() as s:
            sw = self.held(s)
            if sw is None:
                return
            target = s.get(Target, sw.target_id)
            assert target is not None
            dsn, cpus = target.workload_dsn, target.cpus
            try:
                body = SweepIn.model_validate(sw.request)  # today's checks (scripts' \shell)
            except ValidationError as exc:
                refused = f"the stored request is refused: {errors_text(exc)}; nothing was run"
                self.end_loaded(sw, "failed", refused)
                return
            done = list(sw.runs or [])
            resumed = sw.attempts > 0
            cancel = sw.cancel_requested
        if cancel:
            self.finish("cancelled")
            return
        self.start(resumed=resumed)
        if resumed:
            self._end_orphans(dsn)
        hb = self.heartbeat()
        # absolute: pgbench runs inside its run directory and is given log paths under it
        workdir = (Path(self.settings.work_dir) / "sweeps" / str(self.sweep_id)).resolve()
        try:
            with hb:
                result = measure(
                    dsn,
                    body,
                    cpus=cpus,
                    stop=hb.stop_bench,
                    on_run=self._on_run,
                    on_phase=self._on_phase,
                    workdir=workdir,
                    app_name=self.app_name,
                    done=done,
                    bench_lock=lock_for(
                        dsn,
                        lock_dir=self.settings.bench_lock_dir,
                        work_dir=self.settings.work_dir,
                        slots=self.settings.bench_per_host,
                        holder=f"sweep {self.sweep_id}",
                    ),
                )
            if hb.lost.is_set():  # the process that took it over finishes the sweep
                raise LeaseLost
        except SweepError as exc:
            self.finish("failed", error=scrub(str(exc), dsn))
            return
        except LeaseLost:
            raise
        except Exception as exc:
            if hb.lost.is_set():
                raise LeaseLost from None
            log.exception("sweep %s crashed", self.sweep_id)
            self.finish("failed", error=scrub(f"internal error: {exc}", dsn))
            return
        finally:
            with contextlib.suppress(OSError):
                workdir.rmdir()
        status = "cancelled" if result["stopped"] else "succeeded"
        error = None
        if status == "succeeded" and result["knee_clients"] is None:
            # every run failed: the record stays, and says why
            status = "failed"
            errors = [r.get("error") for r in result.get("runs", []) if r.get("error")]
            error = "no run succeeded" + (f"; the first said: {errors[0]}" if errors else "")
        if resumed and status == "succeeded":
            result["resumed"] = True  # the runs before the crash are part of it
        self.finish(
            status,
            error=error,
            result=result,
            knee_clients=result["knee_clients"],
            best_clients=result["best_clients"],
            best_tps=result["best_tps"],
        )

    def _end_orphans(self, dsn: str) -> None:
        """The dead process's pgbench may still load the target: end its connections."""
        try:
            ended = TargetController(dsn).terminate_clients(self.app_name)
        except (TargetError, psycopg.Error, OSError) as exc:
            log.warning(
                "sweep %s: could not end orphan pgbench connections: %s", self.sweep_id, exc
            )
            return
        if ended:
            log.info("sweep %s: ended %d orphan pgbench connections", self.sweep_id, ended)
