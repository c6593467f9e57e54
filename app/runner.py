"""Drives one tuning session against its target: the trial loop of DESIGN.md.

Order of writes is the safety argument: the snapshot is committed before the
first change; the config about to be applied is committed (``applied``) before
each apply, and marked ``restarting`` before a restart; every trial row is
committed before the next trial starts. A crash at any point therefore leaves
enough in the metadata DB to resume (replay the stored trials into a fresh
optimizer) or to restore the target.

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
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError

from app.db import Database, changed_rows, utcnow
from app.evidence import bench_spec, stream_stat, streams_from_json, streams_json
from app.models import Trial, TuningSession
from app.postgres.dsn import scrub
from app.postgres.pgbench import BenchResult, BenchSpec, ProgressSample, run_streams
from app.postgres.target import ConnectError, Snapshot, TargetController, TargetError
from app.schemas import SessionIn
from app.settings import Settings
from app.tuning import (
    describe,
    measurement,
    rows_to_json,
    session_optimizer,
)
from app.workloads import workload_for
from app.workloads.base import Stream, Workload, WorkloadError
from optimizer.catalogue import CATALOGUE
from optimizer.descent import Candidate, CoordinateDescent, Measurement
from optimizer.evidence import StreamStat
from optimizer.guard import (
    MEMORY_SETTINGS,
    ThroughputWatch,
    guard_window,
    memory_guard,
    warmed_up,
)
from optimizer.verdict import Verdict

log = logging.getLogger(__name__)

LIVE_SAMPLES = 120  # per-second samples kept for the live view
METADATA_RETRY_S = 120.0  # how long a session pauses for an unreachable metadata DB
RESTORE_WAIT_S = 3600.0  # how long the final restore waits for an unreachable target
INCUMBENT_RUNS = 3  # recent incumbent runs whose median level the performance guard uses
# Names read from the target: the catalogue, and what the memory guard needs besides.
SNAPSHOT_NAMES = sorted(set(CATALOGUE) | set(MEMORY_SETTINGS))

# Sessions this process is driving, by metadata DB. The claim loop may hand out a session
# again when its lease ran out while the DB was away; the runner already at work keeps it.
_ACTIVE: set[tuple[str, int]] = set()
_ACTIVE_LOCK = threading.Lock()

T = TypeVar("T")


class Cancelled(Exception):
    pass


class LeaseLost(Exception):
    """Another process took the session over: stop without touching the target."""


class MetadataUnavailable(Exception):
    """The metadata DB stayed unreachable for METADATA_RETRY_S."""


class TargetDown(TargetError):
    """The target stopped answering and did not come back within target_retry_s."""


class BenchUnavailable(Exception):
    """pgbench cannot run on this host (missing, log directory unwritable): no trial can."""


@dataclass
class Prepared:
    body: SessionIn
    optimizer: CoordinateDescent
    snapshot: Snapshot
    start: dict[str, str]
    ram_bytes: int
    streams: list[Stream]  # of one run, all started at once
    workload: Workload  # resets its data before each measured run


def _transient(exc: BaseException) -> bool:
    """A metadata DB error that a retry may cure (connection lost, server down, locked)."""
    return isinstance(exc, OperationalError | InterfaceError)


def _db_message(exc: BaseException) -> str:
    # The driver's message only: SQLAlchemy's str() appends the statement and parameters.
    orig = getattr(exc, "orig", None)
    return str(orig or exc).strip().splitlines()[0] if str(orig or exc).strip() else repr(exc)


class Heartbeat:
    """Renews the lease, publishes live samples and notices a cancel, once a second."""

    def __init__(self, db: Database, session_id: int, owner: str, lease_s: float) -> None:
        self.db, self.session_id, self.owner, self.lease_s = db, session_id, owner, lease_s
        self.live: deque[float] = deque(maxlen=LIVE_SAMPLES)
        self.phase: str | None = None
        self.cancel = threading.Event()  # user asked to cancel
        self.lost = threading.Event()  # lease taken by another process
        self.stop_bench = threading.Event()  # either of the above: stop pgbench now
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"heartbeat-{session_id}", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=10)

    def sample(self, _t: float, tps: float) -> None:
        self.live.append(tps)

    def _loop(self) -> None:
        failing = False
        while not self._done.wait(1.0):
            try:
                self.beat()
                if failing:
                    log.warning("heartbeat of session %s works again", self.session_id)
                failing = False
            except Exception as exc:  # metadata DB briefly unavailable: keep the run going
                if not failing:  # once per outage, not once a second
                    log.warning(
                        "heartbeat of session %s failed: %s", self.session_id, _db_message(exc)
                    )
                failing = True

    def beat(self) -> None:
        now = utcnow()
        values: dict[str, Any] = {
            "lease_expires_at": now + timedelta(seconds=self.lease_s),
            "live": {"tps": list(self.live), "at": now.isoformat()},
        }
        with self.db.session() as s:
            res = s.execute(
                update(TuningSession)
                .where(TuningSession.id == self.session_id, TuningSession.lease_owner == self.owner)
                .values(**values)
                .returning(TuningSession.cancel_requested)
            ).first()
        if res is None:
            self.lost.set()
            self.stop_bench.set()
        elif res[0]:
            self.cancel.set()
            self.stop_bench.set()

    def check(self) -> None:
        if self.lost.is_set():
            raise LeaseLost
        if self.cancel.is_set():
            raise Cancelled


class SessionRunner:
    def __init__(self, db: Database, settings: Settings, session_id: int, owner: str) -> None:
        self.db, self.settings, self.session_id, self.owner = db, settings, session_id, owner
        # absolute: pgbench runs inside its run directory and is given log paths under it
        self.workdir = (Path(settings.work_dir) / "runs" / str(session_id)).resolve()
        # pgbench's application_name prefix: lets a resumed session end an orphan's connections
        self.app_name = f"knobtune-pgbench-s{session_id}"
        self.snapshot: Snapshot | None = None  # in memory too: restoring needs no metadata DB
        self._levels: dict[str, list[float]] = {}  # config -> run medians of successful runs
        self._failures: dict[str, list[int]] = {}  # config -> failed transactions per run
        self._last_error: str | None = None

    # -- persistence helpers -------------------------------------------------
    def _retrying(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, retried with backoff while the metadata DB is unreachable (a pause)."""
        deadline: float | None = None
        delay = 0.5
        while True:
            try:
                return fn()
            except Exception as exc:
                if not _transient(exc):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + METADATA_RETRY_S
                    log.warning(
                        "session %s: metadata DB unavailable (%s: %s); pausing up to %.0f s",
                        self.session_id,
                        what,
                        _db_message(exc),
                        METADATA_RETRY_S,
                    )
                if now >= deadline:
                    raise MetadataUnavailable(
                        f"the metadata DB was unreachable for {METADATA_RETRY_S:.0f} s "
                        f"({what}: {_db_message(exc)})"
                    ) from None
                time.sleep(min(delay, max(0.0, deadline - now)))
                delay = min(delay * 2, 5.0)

    def _update(self, **values: Any) -> None:
        def write() -> int:
            with self.db.session() as s:
                return changed_rows(
                    s,
                    update(TuningSession)
                    .where(
                        TuningSession.id == self.session_id, TuningSession.lease_owner == self.owner
                    )
                    .values(**values),
                )

        if self._retrying("updating the session", write) == 0:
            raise LeaseLost

    def _phase(self, phase: str) -> None:
        log.info("session %s: %s", self.session_id, phase)
        self._update(phase=phase)

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

    def _load(self) -> tuple[SessionIn, TargetController]:
        with self.db.session() as s:
            sess = s.get(TuningSession, self.session_id)
            assert sess is not None
            target = sess.target
            body = SessionIn.model_validate(sess.request)
            ctl = TargetController(
                target.dsn,
                restart_command=target.restart_command,
                data_dir=Path(target.data_dir) if target.data_dir else None,
            )
            self.dsn, self.seed = target.dsn, sess.seed
            self.target_hw = (target.ram_bytes, target.cpus)
            self.stored_snapshot = sess.snapshot
            self.stored_applied: dict[str, Any] = dict(sess.applied or {})
            self.resumed = sess.attempts > 0
            self.on_finish = body.on_finish
            self.local = ctl.local  # the host's load is ours to see only for a local target
        if self.stored_snapshot is not None:
            self.snapshot = Snapshot.from_json(self.stored_snapshot["target"])
        return body, ctl

    def _run(self) -> None:
        body, ctl = self._retrying("loading the session", self._load)
        self._update(status="running", started_at=utcnow(), attempts=TuningSession.attempts + 1)
        with Heartbeat(self.db, self.session_id, self.owner, self.settings.lease_seconds) as hb:
            self.hb = hb
            try:
                self._drive(ctl, body)
            except LeaseLost:
                log.warning("session %s: lease lost; another process owns it now", self.session_id)
            except MetadataUnavailable as exc:
                self._abandon(ctl, str(exc))

    def _drive(self, ctl: TargetController, body: SessionIn) -> None:
        pending = self.stored_applied.get("restore_pending")
        try:
            if pending:
                # A previous process failed the session and waited for the target to
                # restore it: carry on with exactly that.
                self._finish(
                    ctl,
                    self.snapshot,
                    str(self.stored_applied.get("status") or "failed"),
                    error=self.stored_applied.get("error"),
                )
                return
            prepared = self._prepare(ctl, body)
            self._loop(ctl, prepared)
            if prepared.optimizer.final_verdict is not None:
                self._note(_final_check_text(prepared.optimizer))
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

    def _abandon(self, ctl: TargetController, why: str) -> None:
        """Without a metadata DB nothing can be recorded: restore the target and step back.

        The session stays 'running' with a lease that runs out, so a process resumes it
        (replaying the stored trials) once the DB is back.
        """
        log.error("session %s: %s; restoring the target and pausing", self.session_id, why)
        if self.snapshot is None:
            return
        try:
            ctl.revert(self.snapshot)
        except Exception:
            log.exception("session %s: restoring the target failed", self.session_id)

    def _safe(self, text: str) -> str:
        return scrub(text, self.dsn)

    # -- before the first trial ----------------------------------------------
    def _prepare(self, ctl: TargetController, body: SessionIn) -> Prepared:
        if body.workload.clients == "auto":
            from app.sweep import auto_clients

            self._phase("client sweep (clients: auto): finding the knee")
            cpus = self.target_hw[1]
            stop = self.hb.stop_bench
            body = auto_clients(self.db, self.session_id, body, self.dsn, cpus, stop, self.workdir)
            self.hb.check()
            self._update(request=body.model_dump(mode="json"))  # a resume tunes at that knee
        data = self.stored_snapshot
        if data is None:
            self._phase("probing the target")
            probe = ctl.probe(SNAPSHOT_NAMES)
            if not probe.can_alter_system:
                raise TargetError(
                    "the target's user may not run ALTER SYSTEM (superuser or "
                    "GRANT ALTER SYSTEM ON PARAMETER is needed)"
                )
            ram = self.target_hw[0] or probe.ram_bytes
            cpus = self.target_hw[1] or probe.cpus
            snap = ctl.snapshot(SNAPSHOT_NAMES)
            data = {
                "target": snap.to_json(),
                "rows": rows_to_json(probe.settings),
                "hardware": {"ram_bytes": ram, "cpus": cpus},
                "version": probe.version,
            }
            # Committed before any change: the way back exists before we leave.
            self._update(snapshot=data)
        snapshot = Snapshot.from_json(data["target"])
        self.snapshot = snapshot
        built = session_optimizer(body, data, self.seed, can_restart=ctl.can_restart)
        opt, start, notes, hw = built.optimizer, built.start, built.notes, built.hardware
        from app.sweep import session_notes

        notes = [*session_notes(self.db, self.session_id, body), *notes]
        replayed = self._replay(opt)
        self._shifts_noted = len(opt.shifts)  # a resumed session noted these already
        self._evidence_noted = replayed > 0 and opt.evidence != "auto"  # noted before a crash
        self._update(start_config=start, notes=notes, trials_planned=opt.planned_trials())
        if replayed:
            log.info("session %s: resumed after %d stored trials", self.session_id, replayed)
        self.hb.check()
        if self.resumed:
            self._recover_target(ctl, snapshot)
        wl = body.workload
        workload = workload_for(wl, clients=int(wl.clients))  # an int by now: "auto" resolved
        streams = workload.streams()
        self._phase("preparing the workload's data")
        # WorkloadError fails the session with its message (it says what to change)
        prepared_note = workload.prepare(self.dsn)
        if prepared_note:
            self._note(prepared_note)
        return Prepared(
            body=body,
            optimizer=opt,
            snapshot=snapshot,
            start=start,
            ram_bytes=hw.ram_bytes,
            streams=streams,
            workload=workload,
        )

    def _replay(self, opt: CoordinateDescent) -> int:
        """Feed stored trials back in order; the optimizer must ask for exactly them again."""
        trials = self._retrying("reading the trials", self._stored_trials)
        for trial in trials:
            if trial.role.startswith("final-"):
                opt.conclude()  # (a no-op if the walk got there by itself)
            cand = opt.suggest()
            if cand is None or cand.index + 1 != trial.index or cand.config != trial.config:
                raise RuntimeError(
                    f"cannot resume: stored trial {trial.index} does not match the optimizer's "
                    "replayed suggestion (was the optimizer changed since?)"
                )
            opt.register(cand, _stored_measurement(trial))
            if trial.error is None and trial.verdict != "rejected":
                self._remember(trial.config, trial.samples, trial.failed_transactions)
        return len(trials)

    def _stored_trials(self) -> list[Trial]:
        with self.db.session() as s:
            return list(
                s.scalars(
                    select(Trial).where(Trial.session_id == self.session_id).order_by(Trial.index)
                ).all()
            )

    def _recover_target(self, ctl: TargetController, snapshot: Snapshot) -> None:
        """After a crash of the previous process: the target up, its orphan pgbench gone."""
        if not ctl.is_up():
            if self.stored_applied.get("restarting") and ctl.can_restart:
                # Our restart was under way when the process died: its pg_ctl may still
                # finish; if not, the candidate may not boot and nobody rolled it back.
                self._phase("the target is down after an interrupted restart: waiting for it")
                if not ctl.wait_until_up(min(self.settings.target_retry_s, 60.0)):
                    self._phase("starting the target with the snapshot's settings")
                    what = ctl.recover_offline(snapshot)
                    self._note(f"resumed after a crash during a restart: {what}")
            else:
                self._await_target(ctl, " when the session was resumed")
        try:
            ended = ctl.terminate_clients(self.app_name)
        except (TargetError, psycopg.Error):  # e.g. no right to end them: they end by themselves
            ended = 0
        if ended:
            log.info("session %s: ended %d orphan pgbench connections", self.session_id, ended)

    # -- the trial loop ------------------------------------------------------
    def _loop(self, ctl: TargetController, p: Prepared) -> None:
        wl = p.body.workload
        specs = [
            bench_spec(st, duration_s=wl.duration_s, warmup_s=wl.warmup_s, rate=wl.rate)
            for st in p.streams
        ]
        began = time.monotonic()
        trial_wall: list[float] = []
        while True:
            self.hb.check()
            cand = p.optimizer.suggest()
            if cand is None:
                break
            budget = p.body.time_budget_s
            elapsed = time.monotonic() - began
            expected = statistics.median(trial_wall) if trial_wall else float(wl.duration_s)
            opt = p.optimizer
            if budget is not None and not opt.concluding:
                # leave the time for the final check (all of it once something is kept)
                reserve = opt.final_runs_left * statistics.fmean(trial_wall or [expected])
                if elapsed + expected + reserve > budget:
                    opt.conclude()
                    done = len(trial_wall)
                    self._note(
                        f"time budget: final check of the best config after {done} trials"
                        if opt.suggest() is not None
                        else f"time budget of {budget:.0f} s reached after {done} trials"
                    )
                    continue
            elif budget is not None and elapsed + expected > budget and opt.checked:
                # a keep late in the walk: its check ends with the side-by-side runs it has
                # (its interval is wider for it); never before it has both configs
                opt.end_final_check()
                self._note(f"time budget: final check ended after {len(trial_wall)} trials")
                continue
            t0 = time.monotonic()
            if self._trial(ctl, p, cand, specs):
                trial_wall.append(time.monotonic() - t0)

    def _trial(
        self, ctl: TargetController, p: Prepared, cand: Candidate, specs: list[BenchSpec]
    ) -> bool:
        """One trial, stored before returning; False if it was rejected without a run.

        Every stream of the workload runs at once; the first feeds the live chart and the
        performance guard, and its result carries the per-second samples stored.
        """
        spec = specs[0]
        started = utcnow()
        timings: dict[str, float] = {}
        if cand.role == "candidate":
            reason = self._memory_check(p, cand)
            if reason is not None:
                self._reject(p, cand, None, timings, started, reason)
                return False
        label = _label(cand)
        self._phase(f"applying {label}")
        applied_at = {"config": cand.config, "at": started.isoformat(), "trial": cand.index + 1}
        self._update(applied=applied_at)

        def restarting() -> None:
            self._update(
                phase=f"restarting the target for {label}",
                applied={**applied_at, "restarting": True},
            )

        error: str | None = None
        result: BenchResult | None = None
        stats: tuple[StreamStat, ...] = ()
        down = False
        t = time.monotonic()
        try:
            applied = ctl.apply(cand.config, on_restart=restarting)
        except ConnectError as exc:
            error = f"could not apply: the target is unreachable: {self._safe(str(exc))}"
            applied, down = None, True
        except (TargetError, psycopg.Error) as exc:
            # psycopg.Error: the server went away in the middle of the apply
            error = f"could not apply: {self._safe(str(exc).strip())}"
            applied = None
            down = not ctl.is_up()  # also a failed restart whose recovery failed too
        timings["apply_s"] = round(time.monotonic() - t, 3)
        self.hb.check()
        if applied is not None:
            if applied.restarted:
                # A restart empties shared_buffers; a cold run must never be
                # compared with a warm one (DESIGN.md: 1,298 vs ~3,700 tps).
                self._update(phase="warming up after restart", applied=applied_at)
                t = time.monotonic()
                self._warm_up(specs)
                timings["warmup_s"] = round(time.monotonic() - t, 3)
                self.hb.check()
            shifted = p.optimizer.shifts and p.optimizer.shifts[-1].trial == cand.index - 1
            # a load shift was just seen: say so while the session re-measures
            self._phase(
                describe(cand) + (" (the server's load moved: re-measuring)" if shifted else "")
            )
            try:
                t = time.monotonic()
                p.workload.reset(self.dsn)  # every measured run on the same data
                timings["reset_s"] = round(time.monotonic() - t, 3)
            except WorkloadError as exc:
                error = self._safe(str(exc))
                down = not ctl.is_up()
        if applied is not None and error is None:
            self.hb.live.clear()
            watch = self._watch(cand, spec, p.optimizer.incumbent)
            t = time.monotonic()
            results = run_streams(
                self.dsn,
                specs,
                on_sample=self.hb.sample,
                stop=self.hb.stop_bench,
                workdir=self.workdir,
                watch=watch,
                app_name=self.app_name,
            )
            timings["bench_s"] = round(time.monotonic() - t, 3)
            self.hb.check()
            result = _combined(p.streams, results)
            if result.early_stop is not None:
                self._reject(p, cand, result, timings, started, result.early_stop)
                self._restore_incumbent(ctl, p)
                return True
            if not result.ok:
                error = f"benchmark failed: {self._safe(result.error or 'unknown error')}"
                down = not result.fatal and not ctl.is_up()
            stats = _stream_stats(p.streams, results, float(spec.warmup_s))
        meas = _measurement_of(result, error, stats)
        verdict = p.optimizer.register(cand, meas)
        self._store_trial(cand, meas, result, verdict, timings, started, error, p.optimizer)
        if error is None:
            return True
        self._last_error = error
        if result is not None and result.fatal:
            raise BenchUnavailable(f"trial {cand.index + 1}: {error}")
        if down:
            self._note(f"trial {cand.index + 1}: the target went down ({error})")
            self._await_target(ctl, f" after trial {cand.index + 1} ({error})")
            self._restore_incumbent(ctl, p)
        elif result is not None:
            self._note(f"trial {cand.index + 1}: {error}")
        return True

    def _warm_up(self, specs: list[BenchSpec]) -> None:
        """Discarded load after a restart until throughput levels off (at most one run)."""
        seen: list[float] = []

        def level(s: ProgressSample) -> str | None:
            seen.append(s.tps)
            return "warm" if warmed_up(seen) else None

        run_streams(
            self.dsn,
            [dataclasses.replace(spec, warmup_s=0) for spec in specs],
            stop=self.hb.stop_bench,
            workdir=self.workdir,
            watch=level,
            app_name=self.app_name,
        )

    # -- guards ----------------------------------------------------------------
    def _memory_check(self, p: Prepared, cand: Candidate) -> str | None:
        effective = p.snapshot.effective  # knobs outside the space keep these values
        return memory_guard(
            {**effective, **cand.config},
            {**effective, **p.optimizer.incumbent},
            ram_bytes=p.ram_bytes,
            clients=sum(st.clients for st in p.streams),
        )

    def _watch(
        self, cand: Candidate, spec: BenchSpec, incumbent: dict[str, str]
    ) -> Callable[[ProgressSample], str | None] | None:
        """The performance guard of a candidate run (baseline and incumbent runs set the level)."""
        if cand.role != "candidate":
            return None
        key = _key(incumbent)
        levels = self._levels.get(key, [])[-INCUMBENT_RUNS:]
        # Failed transactions reject a candidate only when the incumbent had none:
        # a workload that always has some (serialization failures) is not a collapse.
        fail_free = not any(self._failures.get(key, [])[-INCUMBENT_RUNS:])
        w = ThroughputWatch(
            reference=statistics.median(levels) if levels else None,
            warmup_s=spec.warmup_s,
            window=guard_window(spec.duration_s - spec.warmup_s),
        )

        def observe(s: ProgressSample) -> str | None:
            return w.observe(s.time_s, s.tps, s.failed if fail_free else None)

        return observe

    def _remember(self, config: dict[str, str], samples: list[Any], failed: int) -> None:
        if samples:
            self._levels.setdefault(_key(config), []).append(statistics.median(samples))
            self._failures.setdefault(_key(config), []).append(failed or 0)

    def _reject(
        self,
        p: Prepared,
        cand: Candidate,
        result: BenchResult | None,
        timings: dict[str, float],
        started: Any,
        reason: str,
    ) -> None:
        log.info("session %s: trial %d rejected: %s", self.session_id, cand.index + 1, reason)
        meas = measurement(result.samples if result else (), error=reason)
        verdict = p.optimizer.register(cand, meas)
        self._store_trial(
            cand, meas, result, verdict, timings, started, None, p.optimizer, rejected=reason
        )

    # -- the target going away -----------------------------------------------
    def _await_target(self, ctl: TargetController, why: str) -> None:
        """Poll the target with backoff for target_retry_s; TargetDown if it stays away."""
        limit = self.settings.target_retry_s
        deadline = time.monotonic() + limit
        self._phase(f"waiting for the target to come back (up to {limit:.0f} s)")
        delay = 0.5
        while not ctl.is_up():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TargetDown(f"the target did not come back within {limit:.0f} s{why}")
            self.hb.stop_bench.wait(min(delay, left))  # a cancel ends the wait at once
            self.hb.check()
            delay = min(delay * 2, 10.0)

    def _restore_incumbent(self, ctl: TargetController, p: Prepared) -> None:
        inc = p.optimizer.incumbent
        self._phase("applying the incumbent config again")
        applied_at = {"config": inc, "at": utcnow().isoformat(), "incumbent": True}
        self._update(applied=applied_at)

        def restarting() -> None:
            self._update(
                phase="restarting the target for the incumbent config",
                applied={**applied_at, "restarting": True},
            )

        ctl.apply(inc, on_restart=restarting)

    # -- storing ---------------------------------------------------------------
    def _store_trial(
        self,
        cand: Candidate,
        meas: Measurement,
        result: BenchResult | None,
        verdict: Verdict | None,
        timings: dict[str, float],
        started: Any,
        error: str | None,
        opt: CoordinateDescent,
        *,
        rejected: str | None = None,
    ) -> None:
        opt_samples = list(meas.samples)
        trial = Trial(
            session_id=self.session_id,
            index=cand.index + 1,
            role=cand.role,
            knob=cand.knob,
            value=cand.value,
            config=cand.config,
            samples=opt_samples,
            p95_samples=list(meas.latency_p95_samples),
            median_tps=statistics.median(opt_samples) if opt_samples else None,
            latency_mean_ms=result.latency_mean_ms if result else None,
            latency_p95_ms=meas.latency_p95_ms,
            latency_p99_ms=meas.latency_p99_ms,
            failed_transactions=result.failed_transactions if result else 0,
            evidence=streams_json(meas.streams),
            verdict=_verdict_text(verdict, rejected),
            gain=verdict.gain if verdict and not rejected else None,
            p_value=verdict.p_value if verdict and not rejected else None,
            reason=rejected or (verdict.reason if verdict else None),
            metrics=result.db_metrics if result else {},
            timings=timings,
            error=error,
            started_at=started,
            finished_at=utcnow(),
            ci_low=verdict.ci[0] if verdict and verdict.ci and not rejected else None,
            ci_high=verdict.ci[1] if verdict and verdict.ci and not rejected else None,
            drift=any(sh.trial == cand.index for sh in opt.shifts),
            host=_host_load() if self.local else {},
        )
        incumbent = opt.incumbent
        claim = _claim(opt)
        # re-estimated after every trial: the check's room grows once something is kept
        planned = opt.planned_trials()
        first = True

        def write() -> None:
            nonlocal first
            retry, first = not first, False
            try:
                with self.db.session() as s:
                    sess = s.get(TuningSession, self.session_id, with_for_update=True)
                    if sess is None or sess.lease_owner != self.owner:
                        raise LeaseLost
                    s.add(trial)
                    sess.trials_planned = planned
                    sess.benchmark_s = (sess.benchmark_s or 0.0) + timings.get("bench_s", 0.0)
                    s.flush()
                    _summarize(sess, s, incumbent)
                    for k, v in claim.items():
                        setattr(sess, k, v)
            except IntegrityError:
                # A retry after a commit whose acknowledgement was lost: the row is there.
                if not retry or not self._trial_stored(cand.index + 1):
                    raise

        self._retrying(f"storing trial {cand.index + 1}", write)
        for sh in opt.shifts[self._shifts_noted :]:
            self._note(sh.text())
        self._shifts_noted = len(opt.shifts)
        if not self._evidence_noted and opt.evidence != "auto":
            self._evidence_noted = True
            self._note(_evidence_text(opt.evidence, trial.median_tps))
        if error is None and not rejected:
            self._remember(cand.config, opt_samples, trial.failed_transactions)

    def _trial_stored(self, index: int) -> bool:
        with self.db.session() as s:
            return (
                s.scalar(
                    select(Trial.id).where(
                        Trial.session_id == self.session_id, Trial.index == index
                    )
                )
                is not None
            )

    def _note(self, text: str) -> None:
        def write() -> None:
            with self.db.session() as s:
                sess = s.get(TuningSession, self.session_id)
                if sess is not None:
                    sess.notes = [*(sess.notes or []), self._safe(text)]

        self._retrying("adding a note", write)

    # -- the end -------------------------------------------------------------
    def _finish(
        self,
        ctl: TargetController,
        snapshot: Snapshot | None,
        status: str,
        *,
        best: dict[str, str] | None = None,
        error: str | None = None,
    ) -> None:
        applied: dict[str, Any] | None = None
        try:
            if snapshot is not None:
                self._restore(ctl, snapshot, status, error)
                if best is not None and self.on_finish == "apply_best":
                    self._phase("applying the best config")
                    start = self._retrying("reading the session", self._start_config)
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
            self._update(
                status=status,
                phase="done" if status == "succeeded" else status,
                error=error,
                applied=applied,
                finished_at=utcnow(),
                lease_owner=None,
                lease_expires_at=None,
                live=None,
            )

    def _start_config(self) -> dict[str, Any]:
        with self.db.session() as s:
            sess = s.get(TuningSession, self.session_id)
            return dict(sess.start_config or {}) if sess else {}

    def _restore(
        self, ctl: TargetController, snapshot: Snapshot, status: str, error: str | None
    ) -> None:
        """Revert to the snapshot; an unreachable target is waited for (RESTORE_WAIT_S).

        Meanwhile the session stays active, so the target is not handed to a new
        session (whose snapshot would capture our candidate), and the pending
        outcome is recorded so that a process resuming it only restores.
        """
        self._phase("restoring the target's settings")
        deadline = time.monotonic() + RESTORE_WAIT_S
        delay = 1.0
        waiting = False
        while True:
            try:
                ctl.revert(snapshot)
                if waiting:
                    self._note("the target came back; its settings were restored")
                return
            except (ConnectError, psycopg.OperationalError) as exc:
                if not isinstance(exc, ConnectError) and ctl.is_up():
                    raise  # not the server going away: a real failure of the revert
                if time.monotonic() >= deadline:
                    raise TargetError(
                        f"the target stayed unreachable for {RESTORE_WAIT_S:.0f} s, so its "
                        "settings were NOT restored; put back these postgresql.auto.conf "
                        f"entries by hand: {snapshot.auto_conf or '(none: remove all)'} "
                        f"({exc})"
                    ) from None
                if not waiting:
                    waiting = True
                    outcome = error or status
                    self._update(
                        phase="the target is unreachable: its settings will be restored "
                        "once it is back",
                        error=f"{outcome}; the target is unreachable: its settings will be "
                        "restored once it is back",
                        applied={"restore_pending": True, "status": status, "error": error},
                    )
            if self.hb.lost.wait(delay):
                raise LeaseLost
            delay = min(delay * 2, 30.0)


def _verdict_text(verdict: Verdict | None, rejected: str | None) -> str | None:
    if rejected:
        return "rejected"
    if verdict is None:
        return None  # more runs needed
    return "keep" if verdict.keep else "revert"


def _final_check_text(opt: CoordinateDescent) -> str:
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
    why = "below min_gain" if v.gain < opt.min_gain else "not credible while the load moved"
    return (
        f"{text}, {why}: recommending no change (the walk's best was {changed}; "
        "a longer session or longer runs may prove it)"
    )


def _claim(opt: CoordinateDescent) -> dict[str, Any]:
    """The session's claim columns: its gain as the verdict measured it, and how sure it is.

    The gain is the verdict's (the difference of the runs' robust levels), not the ratio of
    median tps shown beside it: under a changing load the two can disagree even in sign,
    and the figure that carries the interval and the decision is the verdict's.
    """
    ov = opt.overall()
    measured = ov is not None and ov.runs[1] > 0
    gain = {"gain": ov.gain} if ov is not None and measured else {}
    return {
        **gain,
        "gain_status": opt.claim,
        "gain_p_value": ov.p_value if ov is not None and measured else None,
        "gain_ci_low": ov.ci[0] if ov is not None and measured and ov.ci else None,
        "gain_ci_high": ov.ci[1] if ov is not None and measured and ov.ci else None,
    }


def _host_load() -> dict[str, Any]:
    """The service host's load when a run ended (the target is on it): backs drift notes."""
    one, five, _ = os.getloadavg()
    return {"load1": round(one, 2), "load5": round(five, 2), "cpus": os.cpu_count()}


def _label(cand: Candidate) -> str:
    if cand.role in ("baseline", "final-baseline"):
        return "the baseline config"
    if cand.role in ("incumbent", "final-incumbent"):
        return "the incumbent config"
    return f"{cand.knob}={cand.value}" if cand.knob else str(cand.value)


def _combined(streams: list[Stream], results: list[BenchResult]) -> BenchResult:
    """One result for the trial row: the first stream's, with every stream's failure.

    A failure of any stream fails the run; streams ended because another one failed or
    was stopped early come back stopped, and only the one that failed says why.
    """
    first = results[0]
    if len(results) == 1:
        return first
    errors = [
        f"stream {st.name!r}: {r.error}"
        for st, r in zip(streams, results, strict=True)
        if not r.ok and not r.stopped and r.early_stop is None
    ]
    out = dataclasses.replace(
        first,
        failed_transactions=sum(r.failed_transactions for r in results),
        fatal=any(r.fatal for r in results),
        db_metrics=first.db_metrics,
    )
    if first.early_stop is not None:
        return out
    if errors:
        out.ok, out.error, out.stopped = False, "; ".join(errors), False
    return out


def _stream_stats(
    streams: list[Stream], results: list[BenchResult], warmup_s: float
) -> tuple[StreamStat, ...]:
    """Every stream's transactions; () when a log is empty (the per-second level decides)."""
    stats = []
    for st, r in zip(streams, results, strict=True):
        stat = stream_stat(st, r, warmup_s)
        if stat is None:
            return ()
        stats.append(stat)
    return tuple(stats)


def _evidence_text(evidence: str, median_tps: float | None) -> str:
    rate = f" (first run: {median_tps:.1f} tps)" if median_tps is not None else ""
    if evidence == "transactions":
        return (
            f"runs are judged from their transactions{rate}: per script or query, mean "
            "latency by designed share (slow or multi-stream workloads, query-time objectives)"
        )
    return f"runs are judged from their per-second throughput samples{rate}"


def _measurement_of(
    result: BenchResult | None, error: str | None, streams: tuple[StreamStat, ...] = ()
) -> Measurement:
    if result is None or error is not None:
        return measurement(result.samples if result else (), error=error or "not measured")
    return measurement(
        result.samples,
        p95_samples=result.latency_p95_samples,
        p95=result.latency_p95_ms,
        p99=result.latency_p99_ms,
        streams=streams,
    )


def _stored_measurement(trial: Trial) -> Measurement:
    # A guard's rejection is a failed measurement too (its text is the reason).
    error = trial.error or (trial.reason if trial.verdict == "rejected" else None)
    return measurement(
        trial.samples,
        p95_samples=trial.p95_samples,
        p95=trial.latency_p95_ms,
        p99=trial.latency_p99_ms,
        error=error,
        streams=streams_from_json(trial.evidence),
    )


def _summarize(sess: TuningSession, s: Any, incumbent: dict[str, str]) -> None:
    """Baseline, best and gain from the stored trials (medians of run medians).

    From the final check's side-by-side runs when there are any (see optimizer.descent:
    the session's first runs against the best config's runs minutes later let drift and
    the winner's curse pass for a gain).
    """
    trials = s.scalars(select(Trial).where(Trial.session_id == sess.id).order_by(Trial.index)).all()
    final = [t for t in trials if t.role.startswith("final-")]
    if {t.role for t in final if t.median_tps is not None} == {"final-baseline", "final-incumbent"}:
        trials = final
    by_config: dict[str, list[float]] = {}
    for t in trials:
        if t.median_tps is not None and t.error is None and t.verdict != "rejected":
            by_config.setdefault(_key(t.config), []).append(t.median_tps)
    baseline = next((t for t in trials if t.role.endswith("baseline")), None)
    if baseline is not None and _key(baseline.config) in by_config:
        sess.baseline_tps = statistics.median(by_config[_key(baseline.config)])
    sess.best_config = dict(incumbent)
    if _key(incumbent) in by_config:
        sess.best_tps = statistics.median(by_config[_key(incumbent)])
    if sess.baseline_tps and sess.best_tps:
        sess.gain = sess.best_tps / sess.baseline_tps - 1.0


def _key(config: dict[str, str]) -> str:
    return repr(sorted(config.items()))
