"""Drives one tuning session against its target: the trial loop (docs/architecture.md).

Order of writes is the safety argument: the snapshot is committed before the
first change; the config about to be applied is committed (``applied``) before
each apply, and marked ``restarting`` before a restart; every trial row is
committed before the next trial starts. A crash at any point therefore leaves
enough in the metadata DB to resume (replay the stored trials into a fresh
optimizer) or to restore the target.

The parts: :class:`~app.sessions.trial.TrialExecutor` measures one candidate and returns an
outcome; :class:`~app.sessions.store.SessionStore` writes (retried, lease-guarded);
:class:`~app.sessions.recovery.TargetRecovery` brings the target back;
:class:`~app.lease.Heartbeat` keeps the lease. :class:`SessionRunner` is the
loop between them: prepare, replay, ask/tell, budgets, notes, finish. Its target and
executor come from a :class:`RunEnv`, which tests replace with simulated ones
(tests/app/runs/fake.py) to check this bookkeeping in seconds.

Guards and faults (README, "Reliability"):

* A candidate that would not fit the target's RAM (``optimizer.guard.memory_guard``)
  is never applied; one whose throughput collapses or whose transactions fail
  (``ThroughputWatch``) is stopped early and the incumbent is applied again. Both
  are stored with verdict ``"rejected"``, the guard's text as ``reason`` and no
  ``error``, and registered as failed measurements, so the descent narrows that
  knob's bound. Failures (apply error, pgbench failed, target down) keep the
  text in ``error``.
* The target goes down: the trial is stored as failed, the runner polls it with
  backoff for ``target_retry_s``, then applies the incumbent and goes on, or
  fails the session. The final restore waits for an unreachable target (up to
  ``RESTORE_WAIT_S``) while the session keeps the target busy.
* The server dies under a trial's config (the OOM killer took the postmaster): the
  config is a suspect. Its trial is stored as a crash (``error`` starts with
  :data:`CRASH_PREFIX`) and registered as failed, so the descent never tries that value or
  beyond again and never recommends it; the server gets a few seconds to restart itself,
  else postgresql.auto.conf gets the snapshot's entries while it is down and it is
  started through its restart method (``TargetRecovery.after_target_crash``); without
  one, the phase and the error tell the operator what to put back. Then the incumbent.
* The metadata DB goes away: every write is retried with backoff for up to
  ``METADATA_RETRY_S`` (the session pauses, nothing is half-written: a trial is
  one transaction); beyond that the target is restored without the DB and the
  session is left for a process to resume once the DB is back.
* A crash during a restart: the next process sees ``applied.restarting``; if the
  target is still down it is started with the snapshot's entries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import psycopg
from pydantic import ValidationError

from app.db import Database, utcnow
from app.errors import errors_text
from app.lease import Cancelled, Heartbeat, LeaseLost, ShuttingDown
from app.models import Target, Trial, TuningSession
from app.postgres import overrides
from app.postgres.benchlock import HostBenchLock, lock_for
from app.postgres.cgroups import smaller
from app.postgres.dsn import scrub
from app.postgres.roles import WorkloadRoleError, cannot_check, check_workload_role
from app.postgres.target import PoolFill, Snapshot, TargetError
from app.sessions.crashes import CRASH_NOTE
from app.sessions.plan import session_optimizer
from app.sessions.recovery import SessionTarget, TargetRecovery
from app.sessions.schemas import SessionIn
from app.sessions.store import MetadataUnavailable, SessionStore
from app.sessions.trial import TrialExecutor, TrialHooks, TrialOutcome
from app.settings import Settings
from app.sweeps.auto import auto_clients
from app.sweeps.service import session_notes
from app.targets.access import admin_dsn_for
from app.targets.probe_data import rows_to_json
from app.targets.service import controller
from app.workloads import workload_for
from app.workloads.base import WorkloadError
from app.workloads.schemas import WorkloadIn
from optimizer.catalogue import CATALOGUE
from optimizer.checkpoints import CHECKPOINT_KNOBS, duration_text
from optimizer.descent import Candidate, CoordinateDescent
from optimizer.guard import MEMORY_SETTINGS
from optimizer.knobs import Config

log = logging.getLogger(__name__)

# Names read from the target: the catalogue, and what the memory guard needs besides.
SNAPSHOT_NAMES = sorted(set(CATALOGUE) | set(MEMORY_SETTINGS))

# Sessions this process is driving, by metadata DB. The claim loop may hand out a session
# again when its lease ran out while the DB was away; the runner already at work keeps it.
_ACTIVE: set[tuple[str, int]] = set()
_ACTIVE_LOCK = threading.Lock()


class BenchUnavailable(Exception):
    """pgbench cannot run on this host (missing, log directory unwritable): no trial can."""


class Executor(Protocol):
    """What the loop needs to measure candidates (TrialExecutor, or a simulated one)."""

    def prepare(self) -> str | None: ...

    def run(
        self, cand: Candidate, *, incumbent: Config, remeasuring: bool = False
    ) -> TrialOutcome: ...

    def remember(self, config: Config, samples: list[Any], failed: int) -> None: ...


@dataclass
class ExecutorArgs:
    """What a session gives its executor besides the target and the workload."""

    dsn: str
    effective: dict[str, str]  # the snapshot's values (knobs outside the space keep them)
    ram_bytes: int
    workdir: Path
    app_name: str
    stop: threading.Event
    hooks: TrialHooks
    scrub: Callable[[str], str]
    local: bool
    bench_lock: HostBenchLock | None = None
    knobs: tuple[str, ...] = ()  # the tuned knobs: none may be overridden for the workload
    # a sandbox's superuser DSN (app.targets.access.admin_dsn_for): knobtune's own
    # statements on its own cluster (removing overrides of the tuned knobs, a replay's
    # copies); None on a client's server
    admin_dsn: str | None = None


class RunEnv:
    """The world a session runs in: real targets and pgbench. Tests substitute simulated ones."""

    def clock(self) -> float:
        return time.monotonic()

    def target(self, row: Target, settings: Settings) -> SessionTarget:
        return controller(row, settings)

    def executor(self, target: SessionTarget, wl: WorkloadIn, args: ExecutorArgs) -> Executor:
        # an int by now: clients "auto" was resolved before
        # a replay on knobtune's own cluster: its superuser makes the copies (its
        # benchmark role may not create databases)
        workload = workload_for(wl, clients=int(wl.clients), admin_dsn=args.admin_dsn)
        executor = _WorkloadExecutor(
            target,
            args.dsn,
            workload,
            duration_s=wl.duration_s,
            warmup_s=wl.warmup_s,
            rate=wl.rate,
            effective=args.effective,
            ram_bytes=args.ram_bytes,
            workdir=args.workdir,
            app_name=args.app_name,
            stop=args.stop,
            hooks=args.hooks,
            scrub=args.scrub,
            local=args.local,
            bench_lock=args.bench_lock,
            meter=target.memory_meter(),
        )
        executor.knobs, executor.admin_dsn = args.knobs, args.admin_dsn
        return executor


class _WorkloadExecutor(TrialExecutor):
    knobs: tuple[str, ...] = ()
    admin_dsn: str | None = None

    def _overrides(self) -> str | None:
        """Tuned knobs set per database or role for the workload (app/postgres/overrides.py):
        a client's server refuses the session; knobtune's own sandbox removes them (a note)."""
        try:
            found = overrides.check(self.dsn, self.knobs)
        except psycopg.Error as exc:
            raise WorkloadError(f"cannot check the workload's settings: {exc}") from None
        if not found:
            return None
        if self.admin_dsn is None:
            raise WorkloadError(overrides.refusal(found))
        return overrides.clear(self.admin_dsn, found)

    def prepare(self) -> str | None:
        # never as a role that reaches the server's host, checked again before each run
        # (a role may be granted more after registration): app/postgres/roles.py
        try:
            check_workload_role(self.dsn)
        except (WorkloadRoleError, psycopg.Error) as exc:
            said = str(exc) if isinstance(exc, WorkloadRoleError) else cannot_check(self.dsn, exc)
            raise WorkloadError(said) from None
        # WorkloadError fails the session with its message (it says what to change)
        notes = [self._overrides(), self.workload.prepare(self.dsn)]
        return "; ".join(n for n in notes if n) or None


@dataclass
class Prepared:
    body: SessionIn
    optimizer: CoordinateDescent
    snapshot: Snapshot
    start: dict[str, str]
    executor: Executor


@dataclass
class Loaded:
    """The session's row as the runner starts it."""

    body: SessionIn | None  # None: the stored request fails today's checks (``refused``)
    dsn: str
    seed: int
    hardware: tuple[int | None, int | None]  # the target's declared RAM and CPUs
    snapshot: dict[str, Any] | None
    applied: dict[str, Any]
    resumed: bool
    refused: str | None = None
    noted: bool = False  # an earlier attempt wrote notes
    crashes: list[str] = dataclasses.field(default_factory=list)  # earlier runners' crash notes
    admin_dsn: str | None = None  # a sandbox's superuser (ExecutorArgs.admin_dsn)


class SessionRunner:
    def __init__(
        self,
        db: Database,
        settings: Settings,
        session_id: int,
        owner: str,
        env: RunEnv | None = None,
    ) -> None:
        self.db, self.settings, self.session_id, self.owner = db, settings, session_id, owner
        self.env = env or RunEnv()
        self.lease_s = settings.lease_seconds
        # absolute: pgbench runs inside its run directory and is given log paths under it
        self.workdir = (Path(settings.work_dir) / "runs" / str(session_id)).resolve()
        # pgbench's application_name prefix: lets a resumed session end an orphan's connections
        self.app_name = f"knobtune-pgbench-s{session_id}"
        self.snapshot: Snapshot | None = None  # in memory too: restoring needs no metadata DB
        self.dsn = ""
        self.store = SessionStore(db, session_id, owner, self._safe)
        self._last_error: str | None = None
        self._shifts_noted = 0
        self._readings_noted = 0
        self._aside_noted = 0  # checkpoint knobs set aside, noted
        self._orders_noted = 0  # the search orders the counters set (opt.orderings), noted
        self._phases_noted = 0  # changes of run length (opt.phases), noted
        self._evidence_noted = False

    def _safe(self, text: str) -> str:
        return scrub(text, self.dsn) if self.dsn else text

    # -- entry point ----------------------------------------------------------
    def run(self) -> None:
        key = (self.db.url, self.session_id)
        with _ACTIVE_LOCK:
            if key in _ACTIVE:
                log.info("session %s is already driven by this process", self.session_id)
                return
            _ACTIVE.add(key)
        try:
            self._run()
        finally:
            with _ACTIVE_LOCK:
                _ACTIVE.discard(key)

    def _load(self) -> tuple[Loaded, SessionTarget]:
        with self.db.session() as s:
            sess = s.get(TuningSession, self.session_id)
            assert sess is not None
            target = sess.target
            body: SessionIn | None = None
            refused = None
            try:
                # Stored requests pass today's checks too: a script stored before \shell
                # was refused must never run now.
                body = SessionIn.model_validate(sess.request)
            except ValidationError as exc:
                refused = (
                    "the stored request is refused by this version of knobtune: "
                    f"{errors_text(exc)}; no benchmark was run for it. Start a new session "
                    "with a corrected request"
                )
            loaded = Loaded(
                body=body,
                refused=refused,
                # workloads run as the target's benchmark role where it has one (sandboxes)
                dsn=target.workload_dsn,
                seed=sess.seed,
                hardware=(target.ram_bytes, target.cpus),
                snapshot=sess.snapshot,
                applied=dict(sess.applied or {}),
                resumed=sess.attempts > 0,
                noted=bool(sess.notes),
                crashes=[n for n in sess.notes or [] if str(n).startswith(CRASH_NOTE)],
                admin_dsn=admin_dsn_for(target),
            )
            ctl = self.env.target(target, self.settings)
        return loaded, ctl

    def _run(self) -> None:
        loaded, ctl = self.store.retrying("loading the session", self._load)
        self.loaded, self.dsn = loaded, loaded.dsn
        if loaded.snapshot is not None:
            self.snapshot = Snapshot.from_json(loaded.snapshot["target"])
        self.store.update(
            status="running", started_at=utcnow(), attempts=TuningSession.attempts + 1
        )

        hb = Heartbeat(self.db, TuningSession, self.session_id, self.owner, self.lease_s)

        def live(now: datetime) -> dict[str, Any]:
            return {"live": {"tps": list(hb.live), "at": now.isoformat()}}

        hb.publish = live
        with hb:
            self.hb = hb
            self.recovery = TargetRecovery(
                ctl,
                self.store,
                hb,
                retry_s=self.settings.target_retry_s,
                app_name=self.app_name,
            )
            try:
                if loaded.body is None:
                    # restores the target if a previous process had changed it
                    log.warning("session %s: %s", self.session_id, loaded.refused)
                    self._finish(
                        ctl, self.snapshot, "failed", error=self._safe(loaded.refused or "")
                    )
                else:
                    self._drive(ctl, loaded.body)
            except ShuttingDown:
                self.recovery.pause(self.snapshot)
            except LeaseLost:
                log.warning("session %s: lease lost; another process owns it now", self.session_id)
            except MetadataUnavailable as exc:
                self.recovery.abandon(self.snapshot, str(exc))

    def _drive(self, ctl: SessionTarget, body: SessionIn) -> None:
        applied = self.loaded.applied
        try:
            if applied.get("restore_pending"):
                # A previous process failed the session and waited for the target to
                # restore it: carry on with exactly that.
                self._finish(
                    ctl,
                    self.snapshot,
                    str(applied.get("status") or "failed"),
                    error=applied.get("error"),
                )
                return
            prepared = self._prepare(ctl, body)
            self._loop(prepared)
            # the loop can end on a decision no trial carried (a final check the budget cut)
            self.store.settle(prepared.optimizer)
            if prepared.optimizer.undecided:  # a lead the budget cut off, labelled as such
                self.store.note(prepared.optimizer.undecided)
            if prepared.optimizer.final_verdict is not None:
                self.store.note(final_check_text(prepared.optimizer))
            resolution = prepared.optimizer.resolution()
            if resolution:  # nothing recommended: how small an effect these runs could see
                self.store.note(resolution)
            reason = prepared.optimizer.stop_reason or ""
            if reason.startswith("baseline runs failed"):
                why = reason.partition(": ")[2] or (
                    f"last error: {self._last_error}" if self._last_error else ""
                )
                what = "the baseline could not be measured twice in a row"
                raise TargetError(f"{what} ({why})" if why else what)
            self._finish(ctl, prepared.snapshot, "succeeded", best=prepared.optimizer.incumbent)
        except (LeaseLost, MetadataUnavailable):
            raise
        except Cancelled:
            self._finish(ctl, self.snapshot, "cancelled")
        except Exception as exc:
            log.exception("session %s failed", self.session_id)
            self._finish(ctl, self.snapshot, "failed", error=self._safe(str(exc) or repr(exc)))

    # -- before the first trial ----------------------------------------------
    def _prepare(self, ctl: SessionTarget, body: SessionIn) -> Prepared:
        store, loaded = self.store, self.loaded
        if body.workload.clients == "auto":
            store.phase("client sweep (clients: auto): finding the knee")
            cpus = loaded.hardware[1]
            stop = self.hb.stop_bench
            lock = bench_lock(self.settings, self.dsn, f"session {self.session_id} (client sweep)")
            body = auto_clients(
                self.db, self.session_id, body, self.dsn, cpus, stop, self.workdir, bench_lock=lock
            )
            self.hb.check()
            store.update(request=body.model_dump(mode="json"))  # a resume tunes at that knee
        data = loaded.snapshot
        if data is None:
            store.phase("probing the target")
            probe = ctl.probe(SNAPSHOT_NAMES)
            if not probe.can_alter_system:
                raise TargetError(
                    "the target's user may not run ALTER SYSTEM (superuser or "
                    "GRANT ALTER SYSTEM ON PARAMETER is needed)"
                )
            ram = loaded.hardware[0] or probe.ram_bytes
            cpus = loaded.hardware[1] or probe.cpus
            if probe.hardware_note:
                # Never more than the server may use now: a cgroup limit set or lowered
                # since the target was registered counts (app/postgres/cgroups.py).
                ram, cpus = smaller(ram, probe.ram_bytes), smaller(cpus, probe.cpus)
            snap = ctl.snapshot(SNAPSHOT_NAMES)
            data = {
                "target": snap.to_json(),
                "rows": rows_to_json(probe.settings),
                "hardware": {"ram_bytes": ram, "cpus": cpus},
                "version": probe.version,
            }
            # Committed before any change: the way back exists before we leave.
            store.update(snapshot=data)
        snapshot = Snapshot.from_json(data["target"])
        self.snapshot = snapshot
        built = session_optimizer(
            body, data, loaded.seed, can_restart=ctl.can_restart, no_restart=ctl.no_restart_reason
        )
        opt, start, notes, hw = built.optimizer, built.start, built.notes, built.hardware
        notes = [*session_notes(self.db, self.session_id, body), *notes, plan_text(opt, built.held)]
        done: list[Trial] = []  # successful stored runs: the performance guard's levels
        replayed = store.replay(opt, done.append)
        self._shifts_noted = len(opt.shifts)  # a resumed session noted these already
        self._readings_noted = len(opt.shift_readings)
        self._aside_noted = len(opt.set_aside)
        self._orders_noted = len(opt.orderings)
        self._phases_noted = len(opt.phases)
        self._evidence_noted = replayed > 0 and opt.evidence != "auto"  # noted before a crash
        # A resumed session keeps what its earlier attempt noted (the counts above skip
        # those notes; writing the start notes again erased them).
        store.update(
            start_config=start,
            trials_planned=opt.planned_trials(),
            # a crash before the first start is noted before the plan (it counts them)
            **({} if loaded.resumed and loaded.noted else {"notes": [*loaded.crashes, *notes]}),
        )
        if replayed:
            log.info("session %s: resumed after %d stored trials", self.session_id, replayed)
        self.hb.check()
        if loaded.resumed:
            self.recovery.after_crash(snapshot, restarting=bool(loaded.applied.get("restarting")))
        executor = self.env.executor(
            ctl,
            body.workload,
            ExecutorArgs(
                dsn=self.dsn,
                effective=snapshot.effective,
                ram_bytes=hw.ram_bytes,
                workdir=self.workdir,
                app_name=self.app_name,
                stop=self.hb.stop_bench,
                hooks=self._hooks(),
                scrub=self._safe,
                local=ctl.local,  # the host's load is ours to see only for a local target
                bench_lock=bench_lock(self.settings, self.dsn, f"session {self.session_id}"),
                knobs=tuple(k.name for k in opt.space),
                admin_dsn=loaded.admin_dsn,
            ),
        )
        for trial in done:
            if trial.error is None and trial.verdict != "rejected":
                executor.remember(trial.config, trial.samples, trial.failed_transactions)
        store.phase("preparing the workload's data")
        prepared_note = executor.prepare()
        if prepared_note:
            store.note(prepared_note)
        return Prepared(body=body, optimizer=opt, snapshot=snapshot, start=start, executor=executor)

    def _hooks(self) -> TrialHooks:
        store, hb = self.store, self.hb

        def on_applied(applied: dict[str, Any], phase: str | None) -> None:
            if phase is None:
                store.update(applied=applied)
            else:
                store.update(phase=phase, applied=applied)

        return TrialHooks(
            on_phase=store.phase,
            on_applied=on_applied,
            on_run_start=hb.live.clear,
            on_sample=hb.sample,
            check=hb.check,
        )

    # -- the trial loop ------------------------------------------------------
    def _loop(self, p: Prepared) -> None:
        wl, clock = p.body.workload, self.env.clock
        began = clock()
        trial_wall: list[float] = []
        while True:
            self.hb.check()
            cand = p.optimizer.suggest()
            if cand is None:
                break
            budget = p.body.time_budget_s
            elapsed = clock() - began
            opt = p.optimizer
            # a long run (checkpoint knobs) takes its extra seconds on top of a trial's wall
            extra = opt.run_seconds_now - opt.settings.run_seconds
            usual = statistics.median(trial_wall) if trial_wall else float(wl.duration_s)
            expected = usual + extra
            if budget is not None and not opt.concluding:
                # leave the time for the final check (all of it once something is kept)
                reserve = opt.final_runs_left * (statistics.fmean(trial_wall or [usual]) + extra)
                if elapsed + expected + reserve > budget:
                    opt.conclude()
                    done = len(trial_wall)
                    self.store.note(
                        f"time budget: final check of the best config after {done} trials"
                        if opt.suggest() is not None
                        else f"time budget of {budget:.0f} s reached after {done} trials"
                    )
                    continue
            elif budget is not None and elapsed + expected > budget and opt.checked:
                # a keep late in the walk: its check ends with the side-by-side runs it has
                # (its interval is wider for it); never before it has both configs
                opt.end_final_check()
                self.store.note(f"time budget: final check ended after {len(trial_wall)} trials")
                continue
            t0 = clock()
            if self._trial(p, cand):
                wall = clock() - t0
                if cand.run_s:  # counted as if its run had the session's own length
                    wall -= cand.run_s - opt.settings.run_seconds
                trial_wall.append(wall)

    def _trial(self, p: Prepared, cand: Candidate) -> bool:
        """One trial, stored before returning; False if it was rejected without a run.

        Every stream of the workload runs at once; the first feeds the live chart and the
        performance guard, and its result carries the per-second samples stored.
        """
        opt = p.optimizer
        shifted = bool(opt.shifts) and opt.shifts[-1].trial == cand.index - 1
        out = p.executor.run(cand, incumbent=opt.incumbent, remeasuring=shifted)
        # The server went down with this config in force (applied, then the run or the
        # reset failed): a suspect. Recorded against it as a failed trial (the descent
        # never tries that value, or beyond, again, so it is never recommended).
        crashed = out.down and out.error is not None and not out.error.startswith("could not apply")
        if crashed:
            out.error = f"{CRASH_PREFIX}: {out.error}"
            out.measurement = dataclasses.replace(out.measurement, error=out.error)
        if out.rejected is not None:
            log.info(
                "session %s: trial %d rejected: %s", self.session_id, cand.index + 1, out.rejected
            )
        pool_before = opt.incumbent.get(POOL_KNOB)
        verdict = opt.register(cand, out.measurement)
        trial = self.store.store_trial(out, verdict, opt)
        shared = out.turn.text() if out.turn is not None else None
        if shared:
            self.store.note(f"trial {cand.index + 1}: {shared}")
        if opt.incumbent.get(POOL_KNOB) != pool_before:
            self._note_pool(p, cand, opt.incumbent.get(POOL_KNOB))
        self._note_optimizer(opt, trial.median_tps)
        if out.rejected is not None:
            if out.stopped_early:
                self.recovery.restore_incumbent(opt.incumbent)
            return out.ran
        error = out.error
        if error is None:
            return True
        self._last_error = error
        if out.fatal:
            raise BenchUnavailable(f"trial {cand.index + 1}: {error}")
        if crashed and p.snapshot is not None:
            what = crash_label(cand, p.start)
            done = self.recovery.after_target_crash(p.snapshot, what)
            kept = [
                f"{k}={v}"
                for k, v in cand.config.items()
                if k in MEMORY_SETTINGS and k != cand.knob and p.start.get(k) != v
            ]
            also = (
                f"; it also holds memory settings kept earlier ({', '.join(kept)}), which may be "
                "what ran the server out of memory"
                if kept
                else ""
            )
            self.store.note(
                f"trial {cand.index + 1}: the server crashed under {what} ({error}); that config "
                f"is recorded as a crash and never recommended or tried again{also}; {done}"
            )
            self.recovery.restore_incumbent(opt.incumbent)
        elif out.down:
            self.store.note(f"trial {cand.index + 1}: the target went down ({error})")
            self.recovery.await_target(f" after trial {cand.index + 1} ({error})")
            self.recovery.restore_incumbent(opt.incumbent)
        elif out.result is not None:
            self.store.note(f"trial {cand.index + 1}: {error}")
        return True

    def _note_pool(self, p: Prepared, cand: Candidate, value: str | None) -> None:
        """A kept shared_buffers is confirmed only on a warm pool: say how full it was.

        The pool is read after the run that completed the keep, when that run had the
        kept value (a restart empties the pool, so another config's run says nothing).
        """
        if value is None or value == p.start.get(POOL_KNOB):
            return  # back to the server's own value: nothing new to confirm
        fill: PoolFill | None = None
        other_run = cand.config.get(POOL_KNOB) != value
        if not other_run:
            try:
                fill = self.recovery.target.buffer_pool()
            except Exception:  # a note is never worth failing a session for
                log.exception("session %s: reading the buffer pool failed", self.session_id)
        text = pool_note(value, fill, other_run=other_run)
        if text:
            self.store.note(f"trial {cand.index + 1}: {text}")

    def _note_optimizer(self, opt: CoordinateDescent, median_tps: float | None) -> None:
        """Notes of what the optimizer saw: load shifts, and what runs are judged on."""
        for sh in opt.shifts[self._shifts_noted :]:
            self.store.note(sh.text())
        self._shifts_noted = len(opt.shifts)
        # what the other config's runs then said about each jump (the load, or scatter)
        for text in opt.shift_readings[self._readings_noted :]:
            self.store.note(text)
        self._readings_noted = len(opt.shift_readings)
        # the counters ordered the walk (optimizer/order.py)
        for note in opt.orderings[self._orders_noted :]:
            self.store.note(note)
        self._orders_noted = len(opt.orderings)
        # runs of another length (long runs for the checkpoint knobs), or why not
        for note in opt.phases[self._phases_noted :]:
            self.store.note(note)
        self._phases_noted = len(opt.phases)
        # checkpoint knobs the runs cannot show (optimizer/checkpoints.py): never "no effect"
        for note in list(opt.set_aside.values())[self._aside_noted :]:
            self.store.note(note)
        self._aside_noted = len(opt.set_aside)
        if not self._evidence_noted and opt.evidence != "auto":
            self._evidence_noted = True
            self.store.note(evidence_text(opt.evidence, median_tps))

    # -- the end -------------------------------------------------------------
    def _finish(
        self,
        ctl: SessionTarget,
        snapshot: Snapshot | None,
        status: str,
        *,
        best: dict[str, str] | None = None,
        error: str | None = None,
    ) -> None:
        applied: dict[str, Any] | None = None
        try:
            if snapshot is not None:
                self.recovery.restore(snapshot, status, error)
                body = self.loaded.body
                if best is not None and body is not None and body.on_finish == "apply_best":
                    self.store.phase("applying the best config")
                    start = self.store.start_config()
                    changed = {k: v for k, v in best.items() if start.get(k) != v}
                    if changed:
                        ctl.apply(changed)
                    applied = {"config": changed, "final": True}
        except (LeaseLost, MetadataUnavailable):
            raise
        except Exception as exc:
            log.exception("session %s: restoring the target failed", self.session_id)
            msg = f"restoring the target failed: {self._safe(str(exc))}"
            error = f"{error}; {msg}" if error else msg
            status = "failed"
            applied = {"config": None, "unknown": True}
        with contextlib.suppress(LeaseLost):
            self.store.update(
                status=status,
                phase="done" if status == "succeeded" else status,
                error=error,
                applied=applied,
                finished_at=utcnow(),
                lease_owner=None,
                lease_expires_at=None,
                live=None,
            )


def bench_lock(settings: Settings, dsn: str, holder: str) -> HostBenchLock:
    """The host-wide benchmark lock of a target (app/postgres/benchlock.py)."""
    return lock_for(
        dsn,
        lock_dir=settings.bench_lock_dir,
        work_dir=settings.work_dir,
        slots=settings.bench_per_host,
        holder=holder,
    )


POOL_KNOB = "shared_buffers"
WARM_POOL = 0.9  # a pool this full (or holding all the data) is in its steady state


def _size(n: float) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n / 1024:.0f}kB"


def pool_note(value: str, fill: PoolFill | None, *, other_run: bool = False) -> str | None:
    """The note on a kept shared_buffers: how full the pool was, or that nobody knows.

    Memory use reaches its steady state when the pool is full, or holds all the data; a
    keep measured before then is unconfirmed (issue 29: 6GB kept on 30 s runs, before the
    pool filled; minutes later the OOM killer took the server).
    """
    if fill is None:
        why = (
            "the run that decided it was of another config (a restart empties the pool)"
            if other_run
            else "the server did not say"
        )
        return (
            f"{POOL_KNOB}={value} kept; how full its pool was is not known ({why}): "
            "unconfirmed until the pool is warm"
        )
    data = _size(fill.data_bytes)
    if fill.measured:
        assert fill.used_bytes is not None
        if fill.fill >= WARM_POOL or fill.used_bytes >= WARM_POOL * fill.data_bytes:
            return None
        return (
            f"{POOL_KNOB}={value} kept on runs that filled {fill.fill:.0%} of the pool "
            f"(pg_buffercache; {data} of data): unconfirmed until the pool is warm "
            "(longer runs fill it)"
        )
    if fill.data_bytes < fill.pool_bytes:
        return (
            f"{POOL_KNOB}={value} kept: all the data ({data}) fits in the pool, so it never "
            f"fills beyond {fill.fill:.0%}; how warm it was is not measured (pg_buffercache "
            "is not installed in the target's database)"
        )
    return (
        f"{POOL_KNOB}={value} kept on runs whose pool fill was not measured (pg_buffercache "
        f"is not installed in the target's database; {data} of data is more than the pool "
        "holds): unconfirmed until the pool is warm (longer runs fill it)"
    )


CRASH_PREFIX = "the server crashed under this config"


def crash_label(cand: Candidate, start: Mapping[str, str]) -> str:
    """The config a crash happened under, as its changes from the server's own values."""
    changed = [f"{k}={v}" for k, v in cand.config.items() if start.get(k) != v]
    if not changed:
        return "the server's own settings"
    return ", ".join(changed)


def final_check_text(opt: CoordinateDescent) -> str:
    v = opt.final_verdict
    assert v is not None
    a, b = v.runs
    p = f", p={v.p_value:.2g}" if v.p_value is not None else ""
    text = (
        f"final check, best config against the start side by side ({a} + {b} runs): "
        f"{v.gain:+.1%}{p}"
    )
    if v.shift:
        text += " (the server's load moved during the check: its interval counts that as noise)"
    if opt.final_rejected is None:
        return text + (", credible" if v.keep else ", not credible at the verdict's error rate")
    changed = ", ".join(f"{k}={x}" for k, x in opt.final_rejected.items() if opt.baseline[k] != x)
    why = (
        "below min_gain" if v.gain < opt.settings.min_gain else "not credible while the load moved"
    )
    return (
        f"{text}, {why}: recommending no change (the walk's best was {changed}; "
        "a longer session or longer runs may prove it)"
    )


def plan_text(opt: CoordinateDescent, held: Sequence[str] = ()) -> str:
    """The session's plan, as its first notes say it: the knobs, the run lengths they are
    judged on, and the budget (``held``: knobs applied with the start, never tuned)."""
    st = opt.settings
    names = [k.name for k in opt.space if k.name not in held]
    long = [n for n in names if n in CHECKPOINT_KNOBS]
    budget = (
        f"; budget {duration_text(st.max_benchmark_s)} of runs"
        if st.max_benchmark_s is not None
        else ""
    )
    text = f"plan: {len(names)} knob(s) on runs of {duration_text(st.run_seconds)}{budget}"
    if long and st.checkpoint_rule:
        text += (
            f"; {', '.join(long)} act through checkpoints: each is judged on these runs "
            "when they span a checkpoint cycle at the measured WAL rate, else after the "
            "others on runs as long as a checkpoint_timeout, when the budget holds them "
            "(else the notes say what budget they need)"
        )
    return text


def evidence_text(evidence: str, median_tps: float | None) -> str:
    rate = f" (first run: {median_tps:.1f} tps)" if median_tps is not None else ""
    if evidence == "transactions":
        return (
            f"runs are judged from their transactions{rate}: per script or query, mean "
            "latency by designed share (slow or multi-stream workloads, query-time objectives)"
        )
    return f"runs are judged from their per-second throughput samples{rate}"
