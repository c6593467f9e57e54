"""A session's writes to the metadata DB: retried, guarded by the lease, one trial a commit.

Order of writes is the safety argument (app/sessions/runner.py): every trial row is one
transaction, committed before the next trial starts, with the session's summary and
claim columns beside it. While the metadata DB is unreachable every write is retried
with backoff for up to ``METADATA_RETRY_S`` (the session pauses, nothing is
half-written); beyond that :class:`MetadataUnavailable` is raised. A write that finds
another process holding the lease raises :class:`LeaseLost`.

:meth:`SessionStore.replay` feeds the stored trials back into a fresh optimizer in
order (a resume after a crash, and bench/faults.py's check that a resume would work).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from app.db import Database, changed_rows, db_message, transient, utcnow
from app.lease import LeaseLost
from app.models import Trial, TuningSession
from app.sessions.plan import measurement
from app.sessions.stream_stats import streams_from_json, streams_json
from app.sessions.trial import TrialOutcome
from optimizer.descent import CoordinateDescent, Measurement
from optimizer.verdict import Verdict

log = logging.getLogger(__name__)

METADATA_RETRY_S = 120.0  # how long a session pauses for an unreachable metadata DB

T = TypeVar("T")


class MetadataUnavailable(Exception):
    """The metadata DB stayed unreachable for METADATA_RETRY_S."""


class ReplayMismatch(RuntimeError):
    """A stored trial is not what the replayed optimizer asks for: the session cannot resume."""


class SessionStore:
    """One session's row and trials, written by the process that holds its lease.

    ``owner`` None: a reader (bench/faults.py) that writes nothing.
    """

    def __init__(
        self,
        db: Database,
        session_id: int,
        owner: str | None,
        scrub: Callable[[str], str] = lambda text: text,
    ) -> None:
        self.db, self.session_id, self.owner = db, session_id, owner
        self.scrub = scrub  # notes and errors never carry the DSN's password
        self.retry_s = METADATA_RETRY_S

    # -- retried, guarded writes ------------------------------------------------------------
    def retrying(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, retried with backoff while the metadata DB is unreachable (a pause)."""
        deadline: float | None = None
        delay = 0.5
        while True:
            try:
                return fn()
            except Exception as exc:
                if not transient(exc):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.retry_s
                    log.warning(
                        "session %s: metadata DB unavailable (%s: %s); pausing up to %.0f s",
                        self.session_id,
                        what,
                        db_message(exc),
                        self.retry_s,
                    )
                if now >= deadline:
                    raise MetadataUnavailable(
                        f"the metadata DB was unreachable for {self.retry_s:.0f} s "
                        f"({what}: {db_message(exc)})"
                    ) from None
                time.sleep(min(delay, max(0.0, deadline - now)))
                delay = min(delay * 2, 5.0)

    def update(self, **values: Any) -> None:
        """Set columns of the session while we hold its lease; LeaseLost otherwise."""

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

        if self.retrying("updating the session", write) == 0:
            raise LeaseLost

    def settle(self, opt: CoordinateDescent) -> None:
        """Write the optimizer's best config and claim without a trial: a final check the
        time budget ended decides (no change, or the gain it measured) after its last
        trial was stored, and the API, the exports and apply must say what it decided."""

        def write() -> None:
            with self.db.session() as s:
                sess = s.get(TuningSession, self.session_id, with_for_update=True)
                if sess is None or sess.lease_owner != self.owner:
                    raise LeaseLost
                _State.of(opt).write(sess, s)

        self.retrying("storing the session's result", write)

    def phase(self, phase: str) -> None:
        log.info("session %s: %s", self.session_id, phase)
        self.update(phase=phase)

    def note(self, text: str) -> None:
        def write() -> None:
            with self.db.session() as s:
                sess = s.get(TuningSession, self.session_id)
                if sess is not None:
                    sess.notes = [*(sess.notes or []), self.scrub(text)]

        self.retrying("adding a note", write)

    # -- reads ----------------------------------------------------------------------------
    def stored_trials(self) -> list[Trial]:
        def read() -> list[Trial]:
            with self.db.session() as s:
                return list(
                    s.scalars(
                        select(Trial)
                        .where(Trial.session_id == self.session_id)
                        .order_by(Trial.index)
                    ).all()
                )

        return self.retrying("reading the trials", read)

    def start_config(self) -> dict[str, Any]:
        def read() -> dict[str, Any]:
            with self.db.session() as s:
                sess = s.get(TuningSession, self.session_id)
                return dict(sess.start_config or {}) if sess else {}

        return self.retrying("reading the session", read)

    def trial_stored(self, index: int) -> bool:
        with self.db.session() as s:
            return (
                s.scalar(
                    select(Trial.id).where(
                        Trial.session_id == self.session_id, Trial.index == index
                    )
                )
                is not None
            )

    # -- resume -----------------------------------------------------------------------------
    def replay(
        self, opt: CoordinateDescent, on_trial: Callable[[Trial], None] | None = None
    ) -> int:
        """Feed stored trials back in order; the optimizer must ask for exactly them again.

        Returns how many were replayed; ReplayMismatch if a stored trial is not the
        replayed suggestion. ``on_trial`` sees each stored trial after it was registered.
        """
        trials = self.stored_trials()
        for trial in trials:
            if trial.role.startswith("final-"):
                opt.conclude()  # (a no-op if the walk got there by itself)
            cand = opt.suggest()
            if cand is None or cand.index + 1 != trial.index or cand.config != trial.config:
                raise ReplayMismatch(
                    f"cannot resume: stored trial {trial.index} does not match the optimizer's "
                    "replayed suggestion (was the optimizer changed since?)"
                )
            opt.register(cand, stored_measurement(trial))
            if on_trial is not None:
                on_trial(trial)
        return len(trials)

    # -- one trial ------------------------------------------------------------------------------
    def store_trial(
        self, out: TrialOutcome, verdict: Verdict | None, opt: CoordinateDescent
    ) -> Trial:
        """The trial row, with the session's summary and claim, in one retried transaction."""
        cand, meas, result, rejected = out.candidate, out.measurement, out.result, out.rejected
        # a failure that is not the guard's (rejected runs keep their text in reason)
        error = None if rejected else out.error
        samples = list(meas.samples)
        trial = Trial(
            session_id=self.session_id,
            index=cand.index + 1,
            role=cand.role,
            knob=cand.knob,
            value=cand.value,
            config=cand.config,
            samples=samples,
            p95_samples=list(meas.latency_p95_samples),
            median_tps=statistics.median(samples) if samples else None,
            latency_mean_ms=result.latency_mean_ms if result else None,
            latency_p95_ms=meas.latency_p95_ms,
            latency_p99_ms=meas.latency_p99_ms,
            failed_transactions=result.failed_transactions if result else 0,
            evidence=streams_json(meas.streams),
            verdict=verdict_text(verdict, rejected),
            gain=verdict.gain if verdict and not rejected else None,
            p_value=verdict.p_value if verdict and not rejected else None,
            reason=rejected or (verdict.reason if verdict else None),
            metrics=result.db_metrics if result else {},
            timings={**out.timings, **({"warm_up": out.warmed} if out.warmed else {})},
            error=error,
            started_at=out.started,
            finished_at=utcnow(),
            ci_low=verdict.ci[0] if verdict and verdict.ci and not rejected else None,
            ci_high=verdict.ci[1] if verdict and verdict.ci and not rejected else None,
            drift=any(sh.trial == cand.index for sh in opt.shifts),
            host=out.host,
        )
        state = _State.of(opt)
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
                    sess.benchmark_s = (sess.benchmark_s or 0.0) + out.timings.get("bench_s", 0.0)
                    s.flush()
                    state.write(sess, s)
            except IntegrityError:
                # A retry after a commit whose acknowledgement was lost: the row is there.
                if not retry or not self.trial_stored(cand.index + 1):
                    raise

        self.retrying(f"storing trial {cand.index + 1}", write)
        return trial


def verdict_text(verdict: Verdict | None, rejected: str | None) -> str | None:
    if rejected:
        return "rejected"
    if verdict is None:
        return None  # more runs needed
    return "keep" if verdict.keep else "revert"


@dataclass(frozen=True)
class _State:
    """What the session row says of the optimizer: best config, claim, planned trials."""

    incumbent: dict[str, str]
    claim: dict[str, Any]
    planned: int

    @classmethod
    def of(cls, opt: CoordinateDescent) -> _State:
        # planned: re-estimated after every trial (the check's room grows once something
        # is kept)
        return cls(dict(opt.incumbent), claim_columns(opt), opt.planned_trials())

    def write(self, sess: TuningSession, s: Any) -> None:
        sess.trials_planned = self.planned
        summarize(sess, s, self.incumbent)
        for k, v in self.claim.items():
            setattr(sess, k, v)


def claim_columns(opt: CoordinateDescent) -> dict[str, Any]:
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


def stored_measurement(trial: Trial) -> Measurement:
    """A stored trial as the optimizer was told it (replay)."""
    # A guard's rejection is a failed measurement too (its text is the reason).
    error = trial.error or (trial.reason if trial.verdict == "rejected" else None)
    return measurement(
        trial.samples,
        p95_samples=trial.p95_samples,
        p95=trial.latency_p95_ms,
        p99=trial.latency_p99_ms,
        error=error,
        streams=streams_from_json(trial.evidence),
        metrics=trial.metrics,
    )


def summarize(sess: TuningSession, s: Any, incumbent: dict[str, str]) -> None:
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
