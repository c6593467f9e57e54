"""Drives one tuning session against its target: the trial loop of DESIGN.md.

Order of writes is the safety argument: the snapshot is committed before the
first change; the config about to be applied is committed (``applied``) before
each apply; every trial row is committed before the next trial starts. A crash
at any point therefore leaves enough in the metadata DB to resume (replay the
stored trials into a fresh optimizer) or to restore the target.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select, update

from app.db import Database, changed_rows, utcnow
from app.models import Trial, TuningSession
from app.postgres.pgbench import BenchResult, BenchSpec, init_data, run_bench
from app.postgres.target import Snapshot, TargetController, TargetError, mask_dsn
from app.schemas import SessionIn
from app.settings import Settings
from app.tuning import (
    bench_scripts,
    build_space,
    describe,
    hardware_from,
    hints_for,
    make_optimizer,
    measurement,
    rows_from_json,
    rows_to_json,
    start_config,
)
from optimizer.catalogue import CATALOGUE
from optimizer.descent import Candidate, CoordinateDescent, Measurement
from optimizer.verdict import Verdict

log = logging.getLogger(__name__)

LIVE_SAMPLES = 120  # per-second samples kept for the live view


class Cancelled(Exception):
    pass


class LeaseLost(Exception):
    """Another process took the session over: stop without touching the target."""


@dataclass
class Prepared:
    body: SessionIn
    optimizer: CoordinateDescent
    snapshot: Snapshot
    start: dict[str, str]


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
        while not self._done.wait(1.0):
            try:
                self.beat()
            except Exception:  # metadata DB briefly unavailable: keep the run going
                log.warning("heartbeat of session %s failed", self.session_id, exc_info=True)

    def beat(self) -> None:
        now = utcnow()
        values: dict[str, Any] = {
            "lease_expires_at": now + _seconds(self.lease_s),
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


def _seconds(s: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=s)


class SessionRunner:
    def __init__(self, db: Database, settings: Settings, session_id: int, owner: str) -> None:
        self.db, self.settings, self.session_id, self.owner = db, settings, session_id, owner
        self.workdir = Path(settings.work_dir) / "runs" / str(session_id)

    # -- persistence helpers -------------------------------------------------
    def _update(self, **values: Any) -> None:
        with self.db.session() as s:
            n = changed_rows(
                s,
                update(TuningSession)
                .where(TuningSession.id == self.session_id, TuningSession.lease_owner == self.owner)
                .values(**values),
            )
        if n == 0:
            raise LeaseLost

    def _phase(self, phase: str) -> None:
        log.info("session %s: %s", self.session_id, phase)
        self._update(phase=phase)

    # -- entry point ----------------------------------------------------------
    def run(self) -> None:
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
            self.on_finish = body.on_finish
        self._update(status="running", started_at=utcnow(), attempts=TuningSession.attempts + 1)
        with Heartbeat(self.db, self.session_id, self.owner, self.settings.lease_seconds) as hb:
            self.hb = hb
            prepared: Prepared | None = None
            try:
                prepared = self._prepare(ctl, body)
                self._loop(ctl, prepared)
                self._finish(ctl, prepared.snapshot, "succeeded", best=prepared.optimizer.incumbent)
            except LeaseLost:
                log.warning("session %s: lease lost; another process owns it now", self.session_id)
            except Cancelled:
                self._finish(ctl, self._snapshot(), "cancelled")
            except Exception as exc:
                log.exception("session %s failed", self.session_id)
                self._finish(
                    ctl, self._snapshot(), "failed", error=_safe(str(exc) or repr(exc), self.dsn)
                )

    def _snapshot(self) -> Snapshot | None:
        with self.db.session() as s:
            sess = s.get(TuningSession, self.session_id)
            data = sess.snapshot if sess else None
        return Snapshot.from_json(data["target"]) if data else None

    # -- before the first trial ----------------------------------------------
    def _prepare(self, ctl: TargetController, body: SessionIn) -> Prepared:
        data = self.stored_snapshot
        if data is None:
            self._phase("probing the target")
            names = sorted(CATALOGUE)
            probe = ctl.probe(names)
            if not probe.can_alter_system:
                raise TargetError(
                    "the target's user may not run ALTER SYSTEM (superuser or "
                    "GRANT ALTER SYSTEM ON PARAMETER is needed)"
                )
            ram = self.target_hw[0] or probe.ram_bytes
            cpus = self.target_hw[1] or probe.cpus
            snap = ctl.snapshot(names)
            data = {
                "target": snap.to_json(),
                "rows": rows_to_json(probe.settings),
                "hardware": {"ram_bytes": ram, "cpus": cpus},
                "version": probe.version,
            }
            # Committed before any change: the way back exists before we leave.
            self._update(snapshot=data)
        snapshot = Snapshot.from_json(data["target"])
        rows = rows_from_json(data["rows"])
        hw = hardware_from(data["hardware"]["ram_bytes"], data["hardware"]["cpus"])
        space = build_space(body, rows, hw)
        start = start_config(body, space, snapshot.effective, hw)
        opt = make_optimizer(body, space, start, self.seed, hints_for(body, space, hw))
        notes: list[str] = []
        if not ctl.can_restart:
            for knob in space:
                if knob.needs_restart:
                    reason = "needs a restart and the target has no restart_command"
                    opt.exclude(knob.name, reason)
                    notes.append(f"{knob.name} skipped: {reason}")
        replayed = self._replay(opt)
        self._update(start_config=start, notes=notes, trials_planned=opt.planned_trials())
        if replayed:
            log.info("session %s: resumed after %d stored trials", self.session_id, replayed)
        self.hb.check()
        wl = body.workload
        if wl.init:
            self._phase(f"preparing data (pgbench scale {wl.scale})")
            init_data(self.dsn, wl.scale)
        return Prepared(body=body, optimizer=opt, snapshot=snapshot, start=start)

    def _replay(self, opt: CoordinateDescent) -> int:
        """Feed stored trials back in order; the optimizer must ask for exactly them again."""
        with self.db.session() as s:
            trials = s.scalars(
                select(Trial).where(Trial.session_id == self.session_id).order_by(Trial.index)
            ).all()
        for trial in trials:
            cand = opt.suggest()
            if cand is None or cand.index + 1 != trial.index or cand.config != trial.config:
                raise RuntimeError(
                    f"cannot resume: stored trial {trial.index} does not match the optimizer's "
                    "replayed suggestion (was the optimizer changed since?)"
                )
            opt.register(cand, _stored_measurement(trial))
        return len(trials)

    # -- the trial loop ------------------------------------------------------
    def _loop(self, ctl: TargetController, p: Prepared) -> None:
        wl = p.body.workload
        spec = BenchSpec(
            builtin=wl.builtin,
            builtin_weight=wl.builtin_weight,
            scripts=bench_scripts(wl),
            clients=wl.clients,
            jobs=wl.jobs,
            duration_s=wl.duration_s,
            warmup_s=wl.warmup_s,
            protocol=wl.protocol,
            rate=wl.rate,
        )
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
            if budget is not None and elapsed + expected > budget:
                self._note(f"time budget of {budget:.0f} s reached after {len(trial_wall)} trials")
                break
            t0 = time.monotonic()
            self._trial(ctl, p, cand, spec)
            trial_wall.append(time.monotonic() - t0)

    def _trial(self, ctl: TargetController, p: Prepared, cand: Candidate, spec: BenchSpec) -> None:
        started = utcnow()
        timings: dict[str, float] = {}
        self._phase(describe(cand))
        self._update(applied={"config": cand.config, "at": started.isoformat()})
        error: str | None = None
        result: BenchResult | None = None
        t = time.monotonic()
        try:
            applied = ctl.apply(cand.config)
        except TargetError as exc:
            error = f"could not apply: {_safe(str(exc), self.dsn)}"
            applied = None
        timings["apply_s"] = round(time.monotonic() - t, 3)
        self.hb.check()
        if applied is not None:
            if applied.restarted:
                # A restart empties shared_buffers; a cold run must never be
                # compared with a warm one (DESIGN.md: 1,298 vs ~3,700 tps).
                self._phase("warming up after restart")
                t = time.monotonic()
                warm = BenchSpec(
                    **{**spec.__dict__, "duration_s": restart_warmup_s(spec), "warmup_s": 0}
                )
                run_bench(self.dsn, warm, stop=self.hb.stop_bench, workdir=self.workdir)
                timings["warmup_s"] = round(time.monotonic() - t, 3)
                self.hb.check()
                self._phase(describe(cand))
            self.hb.live.clear()
            t = time.monotonic()
            result = run_bench(
                self.dsn,
                spec,
                on_sample=self.hb.sample,
                stop=self.hb.stop_bench,
                workdir=self.workdir,
            )
            timings["bench_s"] = round(time.monotonic() - t, 3)
            self.hb.check()
            if not result.ok:
                error = f"benchmark failed: {_safe(result.error or 'unknown error', self.dsn)}"
        meas = _measurement_of(result, error)
        verdict = p.optimizer.register(cand, meas)
        self._store_trial(
            cand, meas, result, verdict, timings, started, error, p.optimizer.incumbent
        )
        if (
            error
            and "benchmark failed" in error
            and not ctl.wait_until_up(self.settings.target_retry_s)
        ):
            raise TargetError(
                f"the target did not come back within {self.settings.target_retry_s:.0f} s "
                f"after: {error}"
            )

    def _store_trial(
        self,
        cand: Candidate,
        meas: Measurement,
        result: BenchResult | None,
        verdict: Verdict | None,
        timings: dict[str, float],
        started: Any,
        error: str | None,
        incumbent: dict[str, str],
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
            verdict=None if verdict is None else ("keep" if verdict.keep else "revert"),
            gain=verdict.gain if verdict else None,
            p_value=verdict.p_value if verdict else None,
            reason=verdict.reason if verdict else None,
            metrics=result.db_metrics if result else {},
            timings=timings,
            error=error,
            started_at=started,
            finished_at=utcnow(),
        )
        with self.db.session() as s:
            sess = s.get(TuningSession, self.session_id, with_for_update=True)
            if sess is None or sess.lease_owner != self.owner:
                raise LeaseLost
            s.add(trial)
            sess.benchmark_s = (sess.benchmark_s or 0.0) + timings.get("bench_s", 0.0)
            s.flush()
            _summarize(sess, s, incumbent)

    def _note(self, text: str) -> None:
        with self.db.session() as s:
            sess = s.get(TuningSession, self.session_id)
            if sess is not None:
                sess.notes = [*(sess.notes or []), text]

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
                self._phase("restoring the target's settings")
                ctl.revert(snapshot)
                if best is not None and self.on_finish == "apply_best":
                    self._phase("applying the best config")
                    with self.db.session() as s:
                        sess = s.get(TuningSession, self.session_id)
                        start = (sess.start_config or {}) if sess else {}
                    changed = {k: v for k, v in best.items() if start.get(k) != v}
                    if changed:
                        ctl.apply(changed)
                    applied = {"config": changed, "final": True}
        except LeaseLost:
            return
        except Exception as exc:
            log.exception("session %s: restoring the target failed", self.session_id)
            msg = f"restoring the target failed: {_safe(str(exc), self.dsn)}"
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


def restart_warmup_s(spec: BenchSpec) -> int:
    """Seconds of discarded load after a restart, before the measured run.

    Long enough to refill shared_buffers from the OS cache (with the measured run's own
    dropped warm-up that is >= 15 s; DESIGN.md: a cold 12 s run gave 1,298 tps against
    ~3,700 warm), short enough that restarts do not eat the benchmarking budget.
    """
    return min(spec.duration_s, max(10, 2 * spec.warmup_s))


def _measurement_of(result: BenchResult | None, error: str | None) -> Measurement:
    if result is None or error is not None:
        return measurement(result.samples if result else (), error=error or "not measured")
    return measurement(
        result.samples,
        p95_samples=result.latency_p95_samples,
        p95=result.latency_p95_ms,
        p99=result.latency_p99_ms,
    )


def _stored_measurement(trial: Trial) -> Measurement:
    return measurement(
        trial.samples,
        p95_samples=trial.p95_samples,
        p95=trial.latency_p95_ms,
        p99=trial.latency_p99_ms,
        error=trial.error,
    )


def _summarize(sess: TuningSession, s: Any, incumbent: dict[str, str]) -> None:
    """Baseline, best and gain from the stored trials (medians of run medians)."""
    trials = s.scalars(select(Trial).where(Trial.session_id == sess.id).order_by(Trial.index)).all()
    by_config: dict[str, list[float]] = {}
    for t in trials:
        if t.median_tps is not None and t.error is None:
            by_config.setdefault(_key(t.config), []).append(t.median_tps)
    baseline = next((t for t in trials if t.role == "baseline"), None)
    if baseline is not None and _key(baseline.config) in by_config:
        sess.baseline_tps = statistics.median(by_config[_key(baseline.config)])
    sess.best_config = dict(incumbent)
    if _key(incumbent) in by_config:
        sess.best_tps = statistics.median(by_config[_key(incumbent)])
    if sess.baseline_tps and sess.best_tps:
        sess.gain = sess.best_tps / sess.baseline_tps - 1.0


def _key(config: dict[str, str]) -> str:
    return repr(sorted(config.items()))


def _safe(text: str, dsn: str) -> str:
    """Error text with the DSN's password masked, wherever the driver echoed it."""
    masked = mask_dsn(dsn)
    if dsn and dsn != masked:
        text = text.replace(dsn, masked)
    from psycopg.conninfo import conninfo_to_dict

    try:
        password = conninfo_to_dict(dsn).get("password")
    except Exception:
        password = None
    if password:
        text = text.replace(str(password), "***")
    return text


Runner = Callable[[Database, Settings, int, str], None]
