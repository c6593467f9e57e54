"""Coordinate descent over PostgreSQL knobs as an ask/tell optimizer.

The walk, one knob at a time in the order given:

* step upward first (x2 for sizes and times, +step for bounded reals, next choice for
  enums/bools) and keep stepping from each kept value while the verdict keeps it;
* a step that is not kept does not end the direction at once. The response is not
  monotonic (work_mem 6MB was 12% slower than 4MB, 16MB 40% faster: docs/architecture.md), and a
  run's noise (~7% of its level) hides most single x2 steps of +4-10%:

  - a step measured flat, or better but not credibly so, is *skipped*: the value one
    step further from the incumbent (x4, then x8; ``max_skips``) is tried, where a real
    trend has a larger effect that is cheaper to prove;
  - a step that is clearly worse (its optimistic 80% bound is below zero) gets one
    **look-ahead** past it (``look_ahead``: the dip above), then the direction ends;
  - a cliff (a loss beyond ``cliff``) ends the direction at once; a failed run (or a
    guard's refusal: a value the server's memory would not hold) forbids that value and
    beyond, and the walk tries a finer step the same way first (x2, then x sqrt(2)), since
    on a small server x4 of shared_buffers can be all of its memory and x2 the best value;
* knobs set aside because the runs span no checkpoint cycle are judged after the walk on
  runs as long as a checkpoint_timeout, when ``max_benchmark_s`` holds them
  (:func:`optimizer.walk.long_phase`); runs of one length are only ever compared with runs
  of the same length.

  In bench/optimizer.py the descent without skip and look-ahead barely leaves the start
  (55-63% of the optimum: the first x2 steps gain 2-4%); with them it reaches 84-87%;
* if nothing was kept upward, the same downward; then the next knob;
* coarse to fine: the first pass steps x4 (twice the additive step; ``coarse=1``), so a
  first move has a larger effect, cheaper to prove, and covers the 8-32x between defaults
  and good memory settings in fewer steps; a pass that changed anything triggers another
  with a finer step (x2, then x sqrt(2)), up to ``max_passes``; the budget
  (``max_trials``, ``max_benchmark_s``) stops everything. ``coarse=0`` is the old x2 walk;
* ``hints`` (e.g. PGTune's config for the machine, when starting from the server's
  current values): first all hinted values at once as one candidate (``knob`` None,
  ``value`` "hints: ..."; ``joint_hints``), proven like any other; then, per knob in the
  first pass, its hinted value is the first candidate and its direction is walked first.
  A rule of thumb that is wrong for the workload is simply rejected and the walk goes on.
  In bench/optimizer.py (40 runs, final check included): 92.8/82.3/91.9% of the optimum
  without hints, 97.2/97.6/96.0% with PGTune hints (x2 steps only, no hints:
  86.5/84.1/84.9%).

The **final check** ends every session whose incumbent differs from the baseline: the two
side by side, ``final_runs`` runs in an A B B A (A B ...) pattern (incumbent first unless
the server already runs the baseline), so drift mostly cancels. Its verdict is the
session's claimed gain (:meth:`overall`): comparing the session's first runs with the
incumbent's runs minutes later let drift and the winner's curse pass for a gain
(bench/e2e.py, W1: +37% claimed, +2% confirmed). Six runs by default: with two each, a
claim of +62% was confirmed as +45% (W2); runs vary ~5-7%.
If the final check measures the walk's best config less than ``min_gain`` better than the
baseline, the incumbent goes back to the baseline: the session recommends no change
(``final_rejected`` keeps what the walk found). The budget (``max_trials``,
``max_benchmark_s``) must hold the baseline, one evaluation and a whole check, else
:class:`BudgetError` gives the minimum. The walk leaves room for the check
(:attr:`final_runs_left`): all of it once something is kept, only its first two runs
(A B) while nothing is. A session that keeps nothing then spends its budget on the walk,
not on a check it never runs (bench/e2e.py CH1, reserving 6 runs from the start: 7
trials, 481 s of a 900 s budget); a keep late in the walk gets the part of the check the
budget still holds, at least A B, and a wider interval that says so. A caller with a
wall-clock budget calls :meth:`conclude` when the time left is about
:attr:`final_runs_left` runs, and :meth:`end_final_check` when it is spent. :attr:`claim`
says how sure the claimed gain is: confirmed, no-change, unconfirmed (the check was cut
by a cancel or a failure before it had both configs) or none.

Every candidate is evaluated group-sequentially with :func:`optimizer.verdict.compare`
(see its docstring): one run first, then a verdict after every run.

* **Rejecting** needs no adjacency: a candidate is rejected as soon as it is futile
  (measured worse, or even its optimistic 80% bound misses ``min_gain``) against the
  incumbent's recent runs (within ``incumbent_window`` trials, since its last shift); given
  up as "not worth proving here" after ``promising_after`` runs below ``promising``; or
  after ``max_candidate_runs``.
* **Keeping** needs time-adjacent evidence: the window is the candidate's runs and the
  incumbent's runs from ``adjacent_gap`` trials before the first candidate run on, and
  it must be interleaved and balanced in time (I C I, then C I ...: every candidate run
  bracketed by incumbent runs, mean times within ``balance`` runs). A window that is not
  balanced only because of its earliest incumbent runs (I I C I) is judged without them
  (I C I; :func:`optimizer.verdict.balanced_window`). A step in the server's
  load between the incumbent's runs and the candidate's then shows up as scatter, not as
  a gain. Issue 14's session kept a no-op work_mem change as +21.9% (p=0.022) from 2
  baseline runs before a load change and 3 candidate runs after it; tests/optimizer/
  test_neighbour.py replays that shape.
* **Shifts**: two consecutive runs of one config (within ``incumbent_window`` trials) more
  than SHIFT_Z noise sds apart mean the load moved. It is recorded (:attr:`shifts`, for the
  session's notes and chart), the config's older runs stop counting as recent, and an
  evaluation whose window holds the shift restarts its window after it and re-measures;
  after ``max_shifts`` shifts it ends undecided (not kept).

Cost and effect (bench/optimizer.py, simulated 60 s runs, 20 seeds): no-op candidates kept
0.4% (1.7% before time adjacency), +15% candidates kept 94%; runs per no-op candidate 2.2
(1.95); with PGTune hints 97.2/97.6/96.0% of the optimum at 40 runs as before, without
hints 92.8/84.1/90.5% (92.8/82.3/91.9%). With a noisy neighbour (x0.6-0.9 a third of the
time, in ~2-minute episodes), 2-4% of whole no-op sessions recommended a change, against
14.5% and 20% before time adjacency (incumbent runs from anywhere in the last 10 trials).
The drift prior is pooled with the replicate runs of the whole session (``learn_noise``).
Judging I I C I on its balanced part (2026-11-27, --no-tpe, against the rule before it): no-op
candidates kept 0.74% (0.86%), +15% 91.5% (91.8%), +5% 23.2% (23.5%); with hints the oltp
surface's 10th percentile 97.2 (88.9), medians unchanged (docs/results/search-quality.md).

Everything is driven by ``suggest()``/``register()`` and is a pure function of the
registered measurements (no randomness; ``seed`` is recorded only), so re-registering the
stored (candidate, measurement) pairs in a new optimizer built with the same arguments
rebuilds exactly the same state and the same next suggestion.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from optimizer import final_check, report
from optimizer.keep import undecided
from optimizer.knobs import Config, Knob, KnobError
from optimizer.ledger import Measurement as Measurement
from optimizer.ledger import Shift
from optimizer.render import Recommendation
from optimizer.report import RESOLUTION as RESOLUTION
from optimizer.settings import DescentSettings as DescentSettings
from optimizer.settings import Evidence
from optimizer.state import _CANCEL, _CUT, State, _Cancel, _Request, _Walk
from optimizer.state import RUN_S as RUN_S
from optimizer.state import Claim as Claim
from optimizer.state import Role as Role
from optimizer.verdict import Verdict
from optimizer.walk import walk


@dataclass(frozen=True)
class Candidate:
    """One benchmark run to perform: the full config of every knob in the space."""

    index: int  # 0-based order of suggestion (= trial number)
    config: Config
    knob: str | None  # the knob that differs from the incumbent (None for baseline/incumbent)
    value: str | None
    role: Role
    # the measured window of this run in seconds when it is not the session's own (a long
    # run for knobs that act through checkpoints); None: ``settings.run_seconds``
    run_s: float | None = None

    @property
    def is_final(self) -> bool:
        """A run of the final check (baseline and incumbent side by side)."""
        return self.role.startswith("final-")


class CoordinateDescent:
    """Noise-aware coordinate descent with an ask/tell interface (see module docstring).

    A façade: the state it keeps is an :class:`optimizer.state.State`; the walk
    (optimizer/walk.py), each evaluation (optimizer/evaluation.py, rules in
    optimizer/keep.py), the final check (optimizer/final_check.py), the budget
    (optimizer/budget.py) and the report (optimizer/report.py) read and update it. This
    class drives them: it turns their requests into :class:`Candidate` runs and feeds the
    measurements back.
    """

    def __init__(
        self,
        space: Sequence[Knob],
        start: Config,
        settings: DescentSettings | None = None,
        *,
        hints: Mapping[str, str] | None = None,
        server: Mapping[str, str] | None = None,
    ) -> None:
        """Search ``space`` from ``start`` (unknown keys ignored: a caller may pass every
        setting it read) as ``settings`` say; ``hints``: a suggested value per knob (e.g.
        PGTune's), tried first when the knob is tuned; ``server``: the server's values of
        settings outside the space (the checkpoint rule reads max_wal_size,
        checkpoint_timeout and checkpoint_completion_target from them)."""
        if not space:
            raise KnobError("the knob space is empty: pick at least one knob")
        names = [k.name for k in space]
        if len(set(names)) != len(names):
            raise KnobError("the knob space lists a knob twice")
        self.settings = settings = settings or DescentSettings()
        self.min_trials = settings.min_trials  # BudgetError if the budget is too small
        self._s = State(space, start, settings, hints=hints, server=server)
        self.space: tuple[Knob, ...] = self._s.space
        self.objective_spec = settings.objective
        self.objective = settings.objective.kind
        self._gen: _Walk = walk(self._s)
        self._next: _Request | None = self._advance(None)
        self._settle()

    @property
    def evidence(self) -> Evidence:
        """What runs are judged on: "auto" until the first usable run settles it."""
        return self._s.ledger.evidence

    @property
    def set_aside(self) -> Mapping[str, str]:
        """Knobs not judged because the runs span no checkpoint cycle: knob -> note."""
        return dict(self._s.set_aside)

    @property
    def wal_rate(self) -> float | None:
        """WAL bytes/s the latest run measured (None: not measured)."""
        return self._s.wal_rate

    @property
    def shifts(self) -> list[Shift]:
        """The load shifts seen, in order."""
        return self._s.ledger.shifts

    @property
    def min_gain(self) -> float:
        return self.settings.min_gain

    # the walk's notes and outcome, for the session (kept in the shared state)

    @property
    def order_notes(self) -> tuple[str, ...]:
        """The latest search ordering's notes, per knob moved (optimizer/order.py)."""
        return self._s.order_notes

    @property
    def orderings(self) -> list[str]:
        """One note per search ordering, for the session's notes."""
        return self._s.orderings

    @property
    def phases(self) -> list[str]:
        """One note per change of run length, for the session's notes."""
        return self._s.phases

    @property
    def stop_reason(self) -> str | None:
        """Why the walk ended (None while it goes on)."""
        return self._s.stop_reason

    @property
    def shift_readings(self) -> list[str]:
        """What the other config's runs said about each jump, for the notes."""
        return self._s.shift_readings

    @property
    def final_verdict(self) -> Verdict | None:
        """The final check's verdict, once it is complete."""
        return self._s.final_verdict

    @property
    def final_rejected(self) -> Config | None:
        """The walk's best config, if the final check failed it (the incumbent went back)."""
        return self._s.final_rejected

    @property
    def undecided(self) -> str | None:
        """What the walk was deciding when it ended early (a budget): its lead so far."""
        return self._s.undecided

    @property
    def _pass(self) -> int:
        """The pass over the knobs the walk is in (0-based)."""
        return self._s.pass_

    # --- ask/tell -----------------------------------------------------------------------------

    def suggest(self) -> Candidate | None:
        """The next run to perform, or None when done. Idempotent until :meth:`register`."""
        if self._next is None:
            return None
        spent = self._s.budget.over(1)
        if spent is not None:
            self._s.stop_reason = self._s.stop_reason or spent
            return None
        r, budget = self._next, self._s.budget
        run_s = None if budget.run_s == self.settings.run_seconds else budget.run_s
        return Candidate(budget.trials, dict(r.config), r.knob, r.value, r.role, run_s)

    def register(self, candidate: Candidate, measurement: Measurement) -> Verdict | None:
        """Feed back the result of ``candidate``; returns the Verdict if it completes an evaluation.

        Raises ValueError if ``candidate`` is not the pending suggestion (a replay that
        diverged, or a result registered twice).
        """
        expected = self.suggest()
        if expected is None:
            raise ValueError("no run is pending: the search is finished or its budget is spent")
        if candidate != expected:
            raise ValueError(
                f"trial {candidate.index} does not match the pending suggestion "
                f"(trial {expected.index}, {expected.role} {expected.knob}={expected.value}); "
                "replay the stored trials in order with the original arguments"
            )
        assert self._next is not None
        s = self._s
        if self._next.about is not None:
            s.trials_by_knob[self._next.about] += 1
        s.budget.spend(candidate.run_s)
        s.last_config = candidate.config
        c = measurement.counters
        if c is not None and not measurement.failed and c.wal_rate is not None:
            s.wal_rate = c.wal_rate
        s.out = None
        self._next = self._advance(measurement)
        self._settle()
        out, s.out = s.out, None
        return out

    def exclude(self, knob: str, reason: str) -> None:
        """Drop ``knob`` for the rest of the session (e.g. it needs a restart that is not allowed).

        Withdraws a pending run that belongs to that knob's evaluation. To replay a session,
        call it again after the same number of registered trials.
        """
        if knob not in self._s.knobs:
            raise KnobError(f"{knob!r} is not in this session's knob space")
        self._s.excluded[knob] = reason
        if self._s.concluding:
            return
        if self._next is not None and (self._next.about == knob or knob in self._next.joint):
            self._next = self._advance(_CANCEL)
            self._settle()

    def conclude(self) -> None:
        """End the walk now and go on to the final check (e.g. the wall-clock budget is short).

        Withdraws the pending run. To replay a session, call it again before the first
        stored final-check trial. Does nothing once the final check has begun.
        """
        if not self._s.concluding:
            self._begin_final("concluded early")

    @property
    def concluding(self) -> bool:
        """The walk is over; what is left is the final check."""
        return self._s.concluding

    @property
    def checked(self) -> bool:
        """The final check has runs of both configs: :meth:`overall` is based on them."""
        return self._s.checked

    @property
    def final_runs_left(self) -> int:
        """Runs the budget must leave for the final check (what the walk may not spend).

        All of the check once the walk has kept something; while it has kept nothing, only
        the check's first two runs, so that a keep in the walk's last evaluation is still
        measured side by side (see the module docstring).
        """
        return final_check.runs_left(self._s)

    def end_final_check(self) -> None:
        """End the final check with the runs it has (a wall-clock budget is spent).

        Its verdict then comes from fewer runs, with the wider interval that gives. Does
        nothing before the check has runs of both configs: cut earlier, it would leave the
        claim unconfirmed, so the caller lets it run on to that point.
        """
        if self._s.concluding and self.checked and self._next is not None:
            self._next = self._advance(_CUT)

    @property
    def claim(self) -> Claim:
        """How sure the session's claimed gain (:meth:`overall`) is.

        ``confirmed``: the final check measured it, credibly; ``not-credible``: the check
        measured at least min_gain but not at the verdict's error rate; ``no-change``: the
        final check found the walk's best less than min_gain better, so nothing is
        recommended; ``unconfirmed``: the incumbent moved but the check did not complete
        (cancel, failure): the figure comes from the walk's runs, drift and the winner's
        curse included; ``none``: nothing was kept.
        """
        return final_check.claim(self._s)

    # --- state -------------------------------------------------------------------------------

    @property
    def incumbent(self) -> Config:
        """The best config so far, every knob in PostgreSQL syntax."""
        return self._s.incumbent

    @property
    def baseline(self) -> Config:
        return self._s.baseline

    @property
    def trials_done(self) -> int:
        return self._s.budget.trials

    @property
    def finished(self) -> bool:
        return self.suggest() is None

    @property
    def excluded(self) -> Mapping[str, str]:
        return dict(self._s.excluded)

    @property
    def verdicts(self) -> list[tuple[int, str, str, Verdict]]:
        """(trial index, knob, value, verdict) for every completed evaluation, in order."""
        return list(self._s.verdicts)

    @property
    def best_gain(self) -> float | None:
        """Measured gain of the incumbent over the baseline (None before any baseline run)."""
        ov = self.overall()
        return ov.gain if ov is not None else None

    def overall(self) -> Verdict | None:
        """The verdict of incumbent vs baseline: the session's claimed gain.

        From the final check's side-by-side runs once it has both; before that (or if the
        budget left no room for it) from all their runs, drift between them included.
        """
        return final_check.overall(self._s)

    def resolution(self) -> str | None:
        """When nothing is recommended: the smallest gain this session's runs could have
        kept (:func:`~optimizer.verdict.detectable_gain`), so that "no change" is not read
        as "no effect". None when a change is recommended or the start config has fewer
        than two runs (no scatter of its own to read)."""
        return report.resolution(self._s)

    def planned_trials(self) -> int:
        """Rough total number of trials for an ETA: what the walk would take, within budget."""
        s = self._s
        if self.suggest() is None:
            return s.budget.trials
        return s.budget.planned(
            active=sum(1 for k in s.space if k.name not in s.excluded),
            later=sum(1 for k in s.order[s.pos + 1 :] if k.name not in s.excluded),
            pass_=s.pass_,
            concluding=s.concluding,
            final_runs_left=self.final_runs_left,
        )

    def recommendation(self, header: Mapping[str, str] | None = None) -> Recommendation:
        """The result so far, ready for :mod:`optimizer.render`."""
        return report.recommendation(self._s, header)

    @property
    def run_seconds_now(self) -> float:
        """The measured window of the runs the walk asks for now (long runs for checkpoint
        knobs; otherwise ``settings.run_seconds``)."""
        return self._s.budget.run_s

    # --- driving the walk and the final check --------------------------------------------------

    def _settle(self) -> None:
        """Go on to the final check when the walk is over or only its room is left."""
        if self._s.concluding:
            return
        if self._next is None:
            self._begin_final(None)
            return
        if self.settings.final_runs and self._s.budget.over(1 + self.final_runs_left):
            self._begin_final("budget left for the final check only")

    def _begin_final(self, why: str | None) -> None:
        s = self._s
        s.concluding = True
        if not s.long_kept:
            s.budget.run_s = self.settings.run_seconds  # nothing long to confirm
        if why is not None:
            s.stop_reason = why
        if s.looking is not None and s.looking[1].gain >= self.min_gain:
            # a lead, not a flat or losing candidate the budget happened to cut
            s.undecided = undecided(*s.looking, self.settings.alpha)
        self._gen.close()  # withdraws the walk's pending run, if any
        self._gen = final_check.final_check(s)
        self._next = self._advance(None)

    def _advance(self, m: Measurement | _Cancel | None) -> _Request | None:
        try:
            return next(self._gen) if m is None else self._gen.send(m)
        except StopIteration:
            return None
