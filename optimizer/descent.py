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
  (:meth:`_long_phase`); runs of one length are only ever compared with runs of the same
  length.

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

import math
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from optimizer import checkpoints
from optimizer.evidence import unfinished
from optimizer.knobs import Config, Knob, KnobError
from optimizer.ledger import Key, RunLedger, Shift, Value, _Run
from optimizer.ledger import Measurement as Measurement
from optimizer.order import combine, order_knobs
from optimizer.render import KnobNote, Recommendation
from optimizer.settings import DescentSettings as DescentSettings
from optimizer.settings import Evidence
from optimizer.steps import Steps
from optimizer.verdict import Verdict, balanced_window, compare, detectable_gain

RUN_S = "(run_s)"
"""The key entry that marks runs of another length than the session's (see _key)."""

RESOLUTION = "what these runs could show"
"""How the note on the smallest effect a session could see begins (exports find it by it)."""

Role = Literal["baseline", "candidate", "incumbent", "final-baseline", "final-incumbent"]
Claim = Literal["none", "confirmed", "not-credible", "no-change", "unconfirmed"]


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


@dataclass(frozen=True)
class _Request:
    config: Config
    knob: str | None
    value: str | None
    role: Role
    about: str | None  # the knob whose evaluation this run belongs to
    joint: tuple[str, ...] = ()  # the knobs of a joint (hints) evaluation


class _Cancel:
    """Sent into the walk instead of a measurement when the pending run is withdrawn."""


class _Cut(_Cancel):
    """Sent into the final check to end it with the runs it has (the budget is spent)."""


_CANCEL = _Cancel()
_CUT = _Cut()
_Walk = Generator[_Request, Measurement | _Cancel, None]


class CoordinateDescent:
    """Noise-aware coordinate descent with an ask/tell interface (see module docstring)."""

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
        self.space: tuple[Knob, ...] = tuple(space)
        self._knobs = {k.name: k for k in self.space}
        self.objective_spec = settings.objective
        self.objective = settings.objective.kind
        self._ledger = RunLedger(settings)  # the runs, their noise, the load shifts
        self._steps = Steps(self.space)  # step values, and limits learnt from failed runs
        self._limits_lat: dict[str, float] = {
            f"p95:{k}": v for k, v in settings.objective.p95_limits.items()
        }
        if settings.max_p99_worsening is not None:
            self._limits_lat["p99"] = settings.max_p99_worsening

        self._baseline: dict[str, Value] = {}
        for k in self.space:
            self._baseline[k.name] = k.parse(start.get(k.name, k.default))
        self._inc: dict[str, Value] = dict(self._baseline)
        self._hints: dict[str, Value] = {}
        for k in self.space:
            if hints and k.name in hints:
                h = k.parse(hints[k.name])
                if not isinstance(h, str):
                    h = min(max(h, k.lower), k.upper)
                    if k.kind == "integer":
                        h = float(round(h))
                self._hints[k.name] = h
        self._excluded: dict[str, str] = {}
        self._server: dict[str, str] = dict(server or {})
        # the order the walk tunes knobs in (optimizer/order.py): set from the baseline's
        # counters, and again from the hints' runs when they are kept
        self._order: tuple[Knob, ...] = self.space
        self.order_notes: tuple[str, ...] = ()  # the latest ordering's, per knob moved
        self.orderings: list[str] = []  # one note per ordering, for the session's notes
        # checkpoint knobs the runs could not show (optimizer/checkpoints.py), with the note
        self._set_aside: dict[str, str] = {}
        self._wal_rate: float | None = None  # bytes/s, the latest run that measured it
        # the measured window of the runs asked for now: the session's, or the long runs'
        # that span a checkpoint cycle (runs of each length are kept apart: _key)
        self._run_s = settings.run_seconds
        self._bench_s = 0.0  # measured seconds of the runs registered so far
        self._long_kept = False  # a long run's evaluation kept a value: the check is long too
        self.phases: list[str] = []  # one note per change of run length, for the notes
        self._trials = 0
        self._trials_by_knob: dict[str, int] = {k.name: 0 for k in self.space}
        self._gain_by_knob: dict[str, float] = {}
        self._verdicts: list[tuple[int, str, str, Verdict]] = []
        self._out: Verdict | None = None
        self._pass = 0
        self._pos = 0  # index in space of the knob being tuned, for planned_trials()
        self.stop_reason: str | None = None
        self._final: dict[str, list[_Run]] = {}  # role -> runs, once the final check began
        # what the other config's runs said about each jump (notes), and the jumps read
        self.shift_readings: list[str] = []
        self._read: set[tuple[int, int]] = set()
        self._final_left = 0  # runs of the final check still to perform
        self.final_verdict: Verdict | None = None  # the final check's, once it is complete
        self.final_rejected: Config | None = None  # the walk's best, if the final check failed it
        self._about = "the baseline"  # what the current runs are for (shift reports)
        # the evaluation in progress and its latest look; what the walk was deciding when it
        # ended early (a budget) becomes ``undecided``
        self._looking: tuple[str, Verdict] | None = None
        self.undecided: str | None = None
        self._concluding = False
        self._last_config: Config | None = None  # what the server ran last, as far as we know
        self._gen: _Walk = self._walk()
        self._next: _Request | None = self._advance(None)
        self._settle()

    @property
    def evidence(self) -> Evidence:
        """What runs are judged on: "auto" until the first usable run settles it."""
        return self._ledger.evidence

    @property
    def set_aside(self) -> Mapping[str, str]:
        """Knobs not judged because the runs span no checkpoint cycle: knob -> note."""
        return dict(self._set_aside)

    @property
    def wal_rate(self) -> float | None:
        """WAL bytes/s the latest run measured (None: not measured)."""
        return self._wal_rate

    @property
    def shifts(self) -> list[Shift]:
        """The load shifts seen, in order."""
        return self._ledger.shifts

    @property
    def min_gain(self) -> float:
        return self.settings.min_gain

    # --- ask/tell -----------------------------------------------------------------------------

    def suggest(self) -> Candidate | None:
        """The next run to perform, or None when done. Idempotent until :meth:`register`."""
        if self._next is None:
            return None
        spent = self._over_budget(1)
        if spent is not None:
            self.stop_reason = self.stop_reason or spent
            return None
        r = self._next
        run_s = None if self._run_s == self.settings.run_seconds else self._run_s
        return Candidate(self._trials, dict(r.config), r.knob, r.value, r.role, run_s)

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
        if self._next.about is not None:
            self._trials_by_knob[self._next.about] += 1
        self._trials += 1
        self._bench_s += candidate.run_s or self.settings.run_seconds
        self._last_config = candidate.config
        c = measurement.counters
        if c is not None and not measurement.failed and c.wal_rate is not None:
            self._wal_rate = c.wal_rate
        self._out = None
        self._next = self._advance(measurement)
        self._settle()
        out, self._out = self._out, None
        return out

    def exclude(self, knob: str, reason: str) -> None:
        """Drop ``knob`` for the rest of the session (e.g. it needs a restart that is not allowed).

        Withdraws a pending run that belongs to that knob's evaluation. To replay a session,
        call it again after the same number of registered trials.
        """
        if knob not in self._knobs:
            raise KnobError(f"{knob!r} is not in this session's knob space")
        self._excluded[knob] = reason
        if self._concluding:
            return
        if self._next is not None and (self._next.about == knob or knob in self._next.joint):
            self._next = self._advance(_CANCEL)
            self._settle()

    def conclude(self) -> None:
        """End the walk now and go on to the final check (e.g. the wall-clock budget is short).

        Withdraws the pending run. To replay a session, call it again before the first
        stored final-check trial. Does nothing once the final check has begun.
        """
        if not self._concluding:
            self._begin_final("concluded early")

    @property
    def concluding(self) -> bool:
        """The walk is over; what is left is the final check."""
        return self._concluding

    @property
    def checked(self) -> bool:
        """The final check has runs of both configs: :meth:`overall` is based on them."""
        return len(self._final) == 2

    @property
    def final_runs_left(self) -> int:
        """Runs the budget must leave for the final check (what the walk may not spend).

        All of the check once the walk has kept something; while it has kept nothing, only
        the check's first two runs, so that a keep in the walk's last evaluation is still
        measured side by side (see the module docstring).
        """
        if self._concluding:
            return self._final_left
        return self.settings.final_runs if self._moved else min(2, self.settings.final_runs)

    def end_final_check(self) -> None:
        """End the final check with the runs it has (a wall-clock budget is spent).

        Its verdict then comes from fewer runs, with the wider interval that gives. Does
        nothing before the check has runs of both configs: cut earlier, it would leave the
        claim unconfirmed, so the caller lets it run on to that point.
        """
        if self._concluding and self.checked and self._next is not None:
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
        if self.final_verdict is not None:
            if self.final_rejected is not None:
                return "no-change"
            return "confirmed" if self.final_verdict.keep else "not-credible"
        return "unconfirmed" if self._moved else "none"

    # --- state -------------------------------------------------------------------------------

    @property
    def incumbent(self) -> Config:
        """The best config so far, every knob in PostgreSQL syntax."""
        return self._config(self._inc)

    @property
    def baseline(self) -> Config:
        return self._config(self._baseline)

    @property
    def trials_done(self) -> int:
        return self._trials

    @property
    def finished(self) -> bool:
        return self.suggest() is None

    @property
    def excluded(self) -> Mapping[str, str]:
        return dict(self._excluded)

    @property
    def verdicts(self) -> list[tuple[int, str, str, Verdict]]:
        """(trial index, knob, value, verdict) for every completed evaluation, in order."""
        return list(self._verdicts)

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
        short = self.settings.run_seconds
        base = self._ledger.runs.get(self._key(self._baseline, short), [])
        if not base:
            return None
        inc = self._ledger.runs.get(self._key(self._inc), []) or self._ledger.runs.get(
            self._key(self._inc, short), []
        )
        if not self._moved or not inc:
            return Verdict(False, 0.0, None, "incumbent is the baseline", None, (len(base), 0))
        keys = (self._key(self._baseline), self._key(self._inc))
        if self.checked:
            base, inc = self._final["final-baseline"], self._final["final-incumbent"]
        return self._judge(keys, base, inc)

    def resolution(self) -> str | None:
        """When nothing is recommended: the smallest gain this session's runs could have
        kept (:func:`~optimizer.verdict.detectable_gain`), so that "no change" is not read
        as "no effect". None when a change is recommended or the start config has fewer
        than two runs (no scatter of its own to read)."""
        if self.claim not in ("none", "no-change"):
            return None
        key = self._key(self._baseline, self.settings.run_seconds)
        base = self._ledger.runs.get(key, [])
        if len(base) < 2:
            return None
        # the most runs the walk gave one candidate (the final check's are not a candidate's)
        nc = max([1, *(v.runs[1] for _t, _k, _x, v in self._verdicts)])
        run_sd, prior_df = self._ledger.noise((key,))
        lower = self.objective_spec.lower_is_better
        gain = detectable_gain(
            base, nc, min_gain=self.min_gain, alpha=self.settings.alpha, run_sd=run_sd,
            prior_df=prior_df, lower_is_better=lower,
        )  # fmt: skip
        centres = [r.stat.centre for r in base]
        mean = sum(centres) / len(centres)
        sd = math.sqrt(sum((c - mean) ** 2 for c in centres) / (len(centres) - 1))
        better = "less time" if lower else "better"
        floor = " (the session's min_gain)" if gain <= self.min_gain else ""
        return (
            f"{RESOLUTION}: a change had to measure about {gain:.0%} {better}{floor} "
            f"to be kept with {nc} run(s) of a candidate against the start config's "
            f"{len(base)} (runs of the start config spread by {math.expm1(sd):.0%} (sd), "
            f"the server's run-to-run noise); smaller effects were not ruled out"
        )

    def planned_trials(self) -> int:
        """Rough total number of trials for an ETA: what the walk would take, within budget."""
        if self.suggest() is None:
            return self._trials
        per_knob = 6  # typical on the simulated surfaces: ~2 runs per step, ~3 steps per knob
        active = sum(1 for k in self.space if k.name not in self._excluded)
        later = sum(1 for k in self._order[self._pos + 1 :] if k.name not in self._excluded)
        left = (
            per_knob * (later + 1)
            + (self.settings.max_passes - self._pass - 1) * active * per_knob // 2
        )
        if self._trials < self.settings.baseline_runs:
            left += self.settings.baseline_runs - self._trials
        if self._concluding:
            left = self.final_runs_left
        estimate = self._trials + left + (0 if self._concluding else self.final_runs_left)
        if self.settings.max_trials is not None:
            estimate = min(estimate, self.settings.max_trials)
        if self.settings.max_benchmark_s is not None:
            estimate = min(
                estimate, int(self.settings.max_benchmark_s // self.settings.run_seconds)
            )
        return max(estimate, self._trials + 1)

    def recommendation(self, header: Mapping[str, str] | None = None) -> Recommendation:
        """The result so far, ready for :mod:`optimizer.render`."""
        notes = []
        for k in self.space:
            notes.append(
                KnobNote(
                    name=k.name,
                    original=k.format(self._baseline[k.name]),
                    recommended=k.format(self._inc[k.name]),
                    gain=self._gain_by_knob.get(k.name),
                    trials=self._trials_by_knob[k.name],
                    needs_restart=k.needs_restart,
                    durability_unsafe=k.durability_unsafe,
                    excluded=None if k.name in self._set_aside else self._excluded.get(k.name),
                    not_judged=self._set_aside.get(k.name),
                )
            )
        ov = self.overall()
        return Recommendation(
            original=self.baseline,
            recommended=self.incumbent,
            notes=tuple(notes),
            overall_gain=ov.gain if ov is not None and ov.runs[1] > 0 else None,
            overall_p_value=ov.p_value if ov is not None else None,
            objective=self.objective,
            trials=self._trials,
            header=dict(header or {}),
            gain_status=self.claim,
            overall_ci=ov.ci if ov is not None and ov.runs[1] > 0 else None,
        )

    # --- internals ---------------------------------------------------------------------------

    @property
    def _moved(self) -> bool:
        """The incumbent differs from the baseline."""
        return self._key(self._inc) != self._key(self._baseline)

    def _over_budget(self, more: int) -> str | None:
        """Why ``more`` runs (of the current length) beyond those done would exceed the
        budget, or None if they fit."""
        if self.settings.max_trials is not None and self._trials + more > self.settings.max_trials:
            return "trial budget spent"
        if (
            self.settings.max_benchmark_s is not None
            and self._bench_s + more * self._run_s > self.settings.max_benchmark_s + 1e-9
        ):
            return "benchmark time budget spent"
        return None

    def _room(self) -> int | None:
        """How many more runs (of the current length) the budgets hold; None: no limit."""
        rooms = []
        if self.settings.max_trials is not None:
            rooms.append(self.settings.max_trials - self._trials)
        if self.settings.max_benchmark_s is not None:
            left = self.settings.max_benchmark_s - self._bench_s
            rooms.append(int(left / self._run_s + 1e-9))
        return max(min(rooms), 0) if rooms else None

    @property
    def run_seconds_now(self) -> float:
        """The measured window of the runs the walk asks for now (long runs for checkpoint
        knobs; otherwise ``settings.run_seconds``)."""
        return self._run_s

    def _settle(self) -> None:
        """Go on to the final check when the walk is over or only its room is left."""
        if self._concluding:
            return
        if self._next is None:
            self._begin_final(None)
            return
        if self.settings.final_runs and self._over_budget(1 + self.final_runs_left):
            self._begin_final("budget left for the final check only")

    def _begin_final(self, why: str | None) -> None:
        self._concluding = True
        if not self._long_kept:
            self._run_s = self.settings.run_seconds  # nothing long to confirm
        if why is not None:
            self.stop_reason = why
        if self._looking is not None and self._looking[1].gain >= self.min_gain:
            # a lead, not a flat or losing candidate the budget happened to cut
            self.undecided = _undecided(*self._looking, self.settings.alpha)
        self._gen.close()  # withdraws the walk's pending run, if any
        self._gen = self._final_check()
        self._next = self._advance(None)

    def _final_check(self) -> _Walk:
        """Incumbent and baseline side by side, A B B A ..., to state the gain without drift."""
        if not self._moved or not self.settings.final_runs:
            return
        keys = {"final-incumbent": self._inc, "final-baseline": self._baseline}
        # start with what the server already runs: one restart fewer
        last = self._last_config
        first: Role = "final-baseline" if last == self.baseline else "final-incumbent"
        second: Role = "final-incumbent" if first == "final-baseline" else "final-baseline"
        order = [first, second, second, first] * (self.settings.final_runs // 4)
        order += [first, second][: self.settings.final_runs % 4]
        room = self._room()
        if room is not None:  # a late keep: what the budget holds (>= 2, see final_runs_left)
            order = order[:room]
        self._final_left = len(order)
        self._about = "the final check"
        for role in order:
            values = keys[role]
            m = yield _Request(self._config(values), None, None, role, None)
            if isinstance(m, _Cut):
                self._final_left = 0
                break
            self._final_left -= 1
            if isinstance(m, _Cancel):
                return
            run = self._ledger.record(self._key(values), m, self._trials - 1, self._about)
            if run is not None:
                self._final.setdefault(role, []).append(run)
        v = self.overall()
        if self.checked and v is not None:
            moved = self._final_shifts()
            self.final_verdict = replace(v, shift=bool(moved))
            if v.gain < self.min_gain or (moved and not v.keep):
                # Side by side, not even min_gain better than what the server ran: no change
                # is worth recommending. (Not "credibly better" again: with 3 runs each that
                # discarded real +9% gains half the time in bench/optimizer.py.) But when
                # the load moved during the check, a gain it cannot show credibly is not
                # recommended either: bench/neighbour.py's one false recommendation was a
                # not-credible check across three load shifts.
                self.final_rejected = self.incumbent
                self._inc = dict(self._baseline)

    def _final_shifts(self) -> list[Shift]:
        """Load shifts inside the final check (its interval already counts them as noise)."""
        first = min(r.index for runs in self._final.values() for r in runs)
        keys = (self._key(self._baseline), self._key(self._inc))
        found, pending = self._load_shifts(first, keys, after=True)
        return found + pending

    def _load_shifts(
        self, since: int, pair: tuple[Key, Key], *, after: bool = False
    ) -> tuple[list[Shift], list[Shift]]:
        """The jumps in runs of ``pair`` (incumbent, candidate) from trial ``since`` on
        (``after``: past it), as (the load moved, not known yet). A jump the other config's
        runs around it did not share is that config's own scatter: not a shift (its runs
        all count, and their spread widens the verdict's interval); each reading is noted
        once. Not known yet counts only a jump that could flatter the candidate (the
        incumbent's runs down, the candidate's up): one the other way cannot make a false
        keep, and waiting on it would stall a config that jumps every other run."""
        found: list[Shift] = []
        pending: list[Shift] = []
        for sh in self.shifts:
            if (sh.trial <= since if after else sh.earlier < since) or sh.key not in pair:
                continue
            other = pair[1] if sh.key == pair[0] else pair[0]
            witness = self._ledger.witness(sh, other)
            if witness is None:
                if (sh.change < 0) == (sh.key == pair[0]):
                    pending.append(sh)
                continue
            host = sh.moved_alike(witness)
            if (sh.trial, sh.earlier) not in self._read:
                self._read.add((sh.trial, sh.earlier))
                self.shift_readings.append(sh.reading(witness, host))
            if host:
                found.append(sh)
        return found, pending

    def _advance(self, m: Measurement | _Cancel | None) -> _Request | None:
        try:
            return next(self._gen) if m is None else self._gen.send(m)
        except StopIteration:
            return None

    def _config(self, values: Mapping[str, Value]) -> Config:
        return {k.name: k.format(values[k.name]) for k in self.space}

    def _key(self, values: Mapping[str, Value], run_s: float | None = None) -> Key:
        """A config's runs of one length (the current one unless given): runs of another
        length are other evidence (a checkpoint cycle in one, none in the other)."""
        key = tuple((k.name, values[k.name]) for k in self.space)
        length = self._run_s if run_s is None else run_s
        return key if length == self.settings.run_seconds else (*key, (RUN_S, length))

    def _judge(
        self,
        keys: tuple[Key, Key],
        inc: Sequence[_Run],
        cand: Sequence[_Run],
    ) -> Verdict:
        run_sd, prior_df = self._ledger.noise(keys)
        return compare(
            inc,
            cand,
            min_gain=self.min_gain,
            alpha=self.settings.alpha,
            run_sd=run_sd,
            prior_df=prior_df,
            lower_is_better=self.objective_spec.lower_is_better,
            limits=self._limits_lat,
            balance=self.settings.balance,
        )

    def _walk(self) -> _Walk:
        base_key = self._key(self._baseline)
        failures = 0
        while len(self._ledger.runs.get(base_key, [])) < self.settings.baseline_runs:
            m = yield _Request(self._config(self._baseline), None, None, "baseline", None)
            if (
                isinstance(m, _Cancel)
                or self._ledger.record(base_key, m, self._trials - 1, self._about) is None
            ):
                failures += 1
                if failures >= 2:  # the unchanged server cannot be benchmarked: nothing to do
                    gone = [] if isinstance(m, _Cancel) else unfinished(m.streams)
                    self.stop_reason = "baseline runs failed" + (
                        f": {', '.join(gone)} never finished within a run; give the "
                        "workload a longer duration_s"
                        if gone
                        else ""
                    )
                    return
        self._order_from(base_key, "from the baseline's counters", "the baseline")
        joint = {
            n: h
            for n, h in self._hints.items()
            if n not in self._excluded
            and self._allowed(self._knobs[n], h)
            # a checkpoint knob the runs cannot show does not ride along with the others
            and self._blocked(self._knobs[n], h) is None
        }
        if self.settings.joint_hints and len(joint) >= 2:
            # all the hints at once: if they help together (a rule of thumb usually does),
            # the effect is large and proven in a few runs; the walk then starts from there
            v = yield from self._evaluate(None, "", joint)
            if v is not None and v.keep:
                for n in joint:
                    self._gain_by_knob.pop(n, None)
                # the kept config can exercise other mechanisms than the start config (on
                # TPC-H, work_mem 28 MB and random_page_cost 1.1 spilled where 4 MB did not)
                why = "after the hints were kept, from their runs"
                self._order_from(self._key(self._inc), why, "the hints' config")
        for p in range(self.settings.max_passes):
            self._pass = p
            changed = False
            for pos, knob in enumerate(self._order):
                self._pos = pos
                if knob.name not in self._excluded:
                    changed = (yield from self._tune(knob, p)) or changed
            if not changed:
                self.stop_reason = "converged: a full pass kept nothing"
                break
        else:
            self.stop_reason = f"max_passes={self.settings.max_passes} reached"
        yield from self._long_phase()

    def _long_phase(self) -> _Walk:
        """The knobs set aside for their run length, on runs that span a checkpoint cycle.

        Runs as long as the incumbent's checkpoint_timeout (the longest cycle a candidate
        other than a longer timeout can have), in whole minutes, when the budget holds a few
        of them and a final check of that length; otherwise each note says what budget
        they need. The
        incumbent is measured again at that length (runs of one length are compared only
        with runs of the same length). If nothing is kept the final check goes back to the
        session's own run length.
        """
        names = [k.name for k in self._order if k.name in self._set_aside]
        if not names or not self.settings.long_runs or not self._wal_rate:
            return
        inc = {**self._server, **self.incumbent}
        # a timed checkpoint's cycle: the longest any candidate short of a longer
        # checkpoint_timeout can have (more max_wal_size only brings it up to the timeout)
        window = float(checkpoints.needed_duration(checkpoints.timeout_seconds(inc)))
        if window <= self._run_s:
            return
        short = self._run_s
        self._run_s = window
        per_knob = 3  # a candidate run and the incumbent's on each side of it
        need = (len(names) * per_knob + self.settings.final_runs) * window
        # a few long runs, and a final check of at least A B at that length if one is kept
        fits = self._over_budget(per_knob + min(2, self.settings.final_runs))
        what = ", ".join(names)
        length = checkpoints.duration_text(window)
        if fits is not None:
            self._run_s = short
            left = (self.settings.max_benchmark_s or 0.0) - self._bench_s
            note = (
                f"; runs of {length} (a checkpoint cycle at the measured WAL rate) for "
                f"{what} need about {checkpoints.duration_text(need)} of budget, "
                f"{checkpoints.duration_text(max(left, 0.0))} was left"
            )
            for n in names:
                self._set_aside[n] += note
                self._excluded[n] = self._set_aside[n]
            self.phases.append(f"long runs not started: {what}{note}")
            return
        self.phases.append(
            f"long runs: {what} on runs of {length} (a checkpoint every "
            f"{checkpoints.duration_text(checkpoints.cycle_seconds(inc, self._wal_rate))} "
            f"at the measured WAL rate); about {checkpoints.duration_text(need)} of budget"
        )
        for n in names:
            self._set_aside.pop(n, None)
            self._excluded.pop(n, None)
            knob = self._knobs[n]
            self._pos = self._order.index(knob)
            kept = yield from self._tune(knob, 0)
            self._long_kept = self._long_kept or kept
        if not self._long_kept:
            self._run_s = short  # the final check compares what the short runs kept

    def _order_from(self, key: Key, why: str, runs: str) -> None:
        """Busy mechanisms first, idle ones last, by the counters of ``key``'s runs
        (optimizer/order.py); a reordering that moves nothing is not noted again."""
        if not self.settings.order_by_counters:
            return
        counters = combine(self._ledger.counters.get(key, []))
        # a knob excluded for good (not merely set aside for longer runs) is never tried:
        # "tried first" would mislead
        gone = {n for n in self._excluded if n not in self._set_aside}
        ordering = order_knobs([k.name for k in self.space], counters, runs, gone)
        order = tuple(self._knobs[n] for n in ordering.order)
        if not ordering.notes or (self.orderings and order == self._order):
            return
        self._order, self.order_notes = order, ordering.notes
        self.orderings.append(f"search order {why}: " + "; ".join(ordering.notes))

    def _tune(self, knob: Knob, p: int) -> Generator[_Request, Measurement | _Cancel, bool]:
        """Walk one knob: upward while kept, with look-ahead; downward if upward kept nothing."""
        moved = False
        directions = (1, -1)
        hint = self._hints.get(knob.name)
        evaluated = False  # a value of this knob was measured in this call
        blocked: str | None = None  # why a value could not be judged on these runs
        if p == 0 and hint is not None and self._allowed(knob, hint):
            blocked = self._blocked(knob, hint)
        if p == 0 and hint is not None and self._allowed(knob, hint) and blocked is None:
            evaluated = True
            cur = self._inc[knob.name]
            v = yield from self._evaluate(knob, hint)
            if v is None:
                return moved
            if isinstance(hint, str) or isinstance(cur, str):
                up = knob.index(str(hint)) > knob.index(str(cur))
            else:
                up = hint > cur
            # walk on from the hint in the direction it went; if it was not kept, that
            # direction is still the more likely one
            directions = (1, -1) if up else (-1, 1)
            moved = v.keep
        worse_before = False  # the other direction ended on clearly worse steps
        for direction in directions:
            if moved and direction != directions[0]:
                break  # a kept step upward means down is the wrong way
            ahead = 0  # steps beyond the incumbent already tried without a keep
            worse = skips = 0
            level = p - self.settings.coarse  # step = step_size ** (1 / 2**level)
            finest = self.settings.max_passes - self.settings.coarse  # the finest refinement
            tried: set[Value] = set()
            while knob.name not in self._excluded:
                value = self._steps.step(knob, self._inc[knob.name], direction, level, ahead + 1)
                if value is None:
                    # past a value that failed or was refused: halfway (geometrically)
                    # between the furthest one measured (or the incumbent) and that limit,
                    # while the gap is wide
                    value = self._steps.toward_limit(
                        knob, {*tried, self._inc[knob.name]}, direction
                    )
                if value is None or value in tried:
                    break
                tried.add(value)
                ahead += 1
                if self._key({**self._inc, knob.name: value}) in self._ledger.runs:
                    worse += 1  # measured before (an earlier pass): never re-run by accident
                    if worse > self.settings.look_ahead:
                        break
                    continue
                note = self._blocked(knob, value)
                if note is not None:
                    # the runs span no checkpoint cycle of this value: not judged, and no
                    # value further along this direction would be either
                    blocked = blocked or note
                    break
                evaluated = True
                v = yield from self._evaluate(knob, value)
                if v is None:  # withdrawn by exclude()
                    return moved
                if v.keep:
                    moved, ahead, worse, skips = True, 0, 0, 0
                    tried.clear()
                    continue
                if v.p_value is None and level < finest:
                    # a failed run or a guard's refusal (the server would not hold it): a
                    # smaller step the same way may still fit (shared_buffers x4 on a small
                    # server is all of its memory, x2 half of it)
                    level += 1
                    ahead = 0
                    continue
                if v.p_value is None or v.gain < -self.settings.cliff:
                    worse_before = worse_before or v.p_value is not None
                    break  # failed run or cliff: nothing to find past it
                assert v.se is not None
                if self._log_ratio(v.gain) + 1.28 * v.se < 0:
                    # clearly worse: one look-ahead past it (a dip), then stop; clearly
                    # worse both ways, the incumbent is this knob's best and the budget goes
                    # to the next knob (on a reporting mix, look-aheads past steps down to
                    # -29% took a 10-minute session's whole budget)
                    worse += 1
                    if worse > (0 if worse_before else self.settings.look_ahead):
                        worse_before = True
                        break
                else:
                    skips += 1  # flat or better-but-unproven: the effect grows one step further
                    if skips > self.settings.max_skips:
                        break
        if blocked is not None and not evaluated and not self._trials_by_knob[knob.name]:
            # set aside, never "no effect": the note names the run length it needs (a knob
            # measured in an earlier pass was judged there, and keeps that verdict)
            self._set_aside[knob.name] = blocked
            self._excluded[knob.name] = blocked
        return moved

    def _blocked(self, knob: Knob, value: Value) -> str | None:
        """Why runs of this length cannot judge ``knob`` at ``value`` against the incumbent
        (optimizer/checkpoints.py), or None."""
        if not self.settings.checkpoint_rule:
            return None
        inc = {**self._server, **self.incumbent}
        return checkpoints.set_aside(
            knob.name,
            inc,
            {**inc, knob.name: knob.format(value)},
            wal_rate=self._wal_rate,
            window_s=self._run_s,
            warmup_s=self.settings.warmup_seconds,
        )

    def _evaluate(
        self, knob: Knob | None, value: Value, joint: Mapping[str, Value] | None = None
    ) -> Generator[_Request, Measurement | _Cancel, Verdict | None]:
        """Group-sequential evaluation of one candidate; None if withdrawn by exclude().

        ``knob=None`` with ``joint`` evaluates several knobs changed at once (the hints).
        """
        if knob is None:
            assert joint is not None
            cand_vals = {**self._inc, **joint}
            name: str | None = None
            text = "hints: " + ", ".join(
                f"{n}={self._knobs[n].format(v)}" for n, v in joint.items()
            )
        else:
            cand_vals = {**self._inc, knob.name: value}
            name, text = knob.name, knob.format(value)
        cfg = self._config(cand_vals)
        key, inc_key = self._key(cand_vals), self._key(self._inc)
        self._about = text if name is None else f"{name}={text}"
        cand: list[_Run] = []
        inc_failures = 0
        since = -1  # runs before this trial are not time-adjacent evidence (see below)
        moved = 0  # load shifts seen during this evaluation
        last: Role | None = None
        while True:
            window_inc = [r for r in self._ledger.runs.get(inc_key, []) if r.index >= since]
            window_cand = [r for r in cand if r.index >= since]
            if cand:
                v = None
                if window_inc and window_cand:
                    # time-adjacent: incumbent and candidate interleaved and balanced in time.
                    # An incumbent run too many at the window's start (I I C I after the
                    # baseline) unbalances it: its balanced part (I C I) is judged, while the
                    # next run still balances the whole window (fewer runs: less power)
                    judged = balanced_window(window_inc, window_cand, self.settings.balance)
                    v = self._judge((inc_key, key), judged, window_cand)
                    # a shift between two runs inside the window (earlier ones do no harm:
                    # the window's runs all come after them)
                    found, pending = self._load_shifts(since, (inc_key, key))
                    if pending and not found and v.keep:
                        # a jump whose cause the other config's next run will tell
                        why = v.reason.replace("kept", "not kept yet (a jump to tell first)", 1)
                        v = replace(v, keep=False, reason=why)
                    elif found:
                        # the server's load moved inside the window: decide nothing on it;
                        # start the window again after the latest shift and re-measure
                        moved += len(found)
                        since = max(sh.trial for sh in found)
                        why = v.reason.replace("kept", "not kept yet (the load moved)", 1)
                        v = replace(v, keep=False, shift=True, reason=why)
                    elif v.keep and v.adjacent:
                        self._inc = cand_vals
                        if name is not None:
                            g = self._gain_by_knob.get(name, 0.0)
                            self._gain_by_knob[name] = (1 + g) * (1 + v.gain) - 1
                        return self._finish(name, text, v)
                if v is None or not v.adjacent:
                    # no adjacent evidence yet: the recent incumbent runs can still show
                    # that the candidate is not worth more runs (rejecting needs no adjacency)
                    recent = self._ledger.recent(inc_key, self._trials)
                    if recent:
                        v = self._not_kept(self._judge((inc_key, key), recent, cand))
                if v is not None:
                    assert v.se is not None
                    self._looking = (self._about, v)
                    d = self._log_ratio(v.gain)
                    # futile: measured worse, or even an optimistic bound (80%) misses min_gain
                    if v.gain < 0 or d + 1.28 * v.se < self._log_ratio(self.min_gain):
                        return self._finish(name, text, self._not_kept(v))
                    if moved > self.settings.max_shifts:
                        why = (
                            f"undecided: the server's load moved {moved} times while "
                            f"measuring ({v.gain:+.1%} on the last window); not kept"
                        )
                        return self._finish(name, text, replace(v, keep=False, reason=why))
                    balanced = len(window_inc) >= len(window_cand)
                    if len(cand) >= self.settings.max_candidate_runs and balanced:
                        return self._finish(name, text, self._not_kept(v))
                    if len(cand) >= self.settings.max_candidate_runs + 2 * self.settings.max_shifts:
                        return self._finish(name, text, self._not_kept(v))
                    if (
                        len(cand) >= self.settings.promising_after
                        and v.gain < self.settings.promising
                    ):
                        # better, but by too little to confirm cheaply: let the walk look further
                        return self._finish(name, text, self._not_kept(v))
            if cand and self._incumbent_next(window_inc, window_cand, last):
                m = yield _Request(
                    self._config(self._inc), None, None, "incumbent", name, tuple(joint or ())
                )
                last = "incumbent"
                if isinstance(m, _Cancel):
                    self._looking = None
                    return None
                if self._ledger.record(inc_key, m, self._trials - 1, self._about) is None:
                    inc_failures += 1
                    if inc_failures >= 2:
                        v = Verdict(False, 0.0, None, "rejected: incumbent re-run failed twice")
                        return self._finish(name, text, v)
                continue
            m = yield _Request(cfg, name, text, "candidate", name, tuple(joint or ()))
            last = "candidate"
            if isinstance(m, _Cancel):
                self._looking = None
                return None
            if self._ledger.record(key, m, self._trials - 1, self._about) is None:
                if knob is not None:
                    self._steps.forbid(knob, value, self._inc[knob.name])
                gone = unfinished(m.streams)
                why = m.error or (
                    "run failed"
                    if m.failed
                    else f"{', '.join(gone)} never finished within the run (a longer "
                    "duration_s gives every query time to finish)"
                    if gone
                    else "no usable samples"
                )
                return self._finish(name, text, Verdict(False, 0.0, None, f"rejected: {why}"))
            cand.append(self._ledger.runs[key][-1])
            if since < 0:
                # the incumbent's runs just before the first candidate run are adjacent
                # (a candidate rejected after one run may sit in between)
                since = cand[0].index - self.settings.adjacent_gap

    def _incumbent_next(self, inc: Sequence[_Run], cand: Sequence[_Run], last: Role | None) -> bool:
        """Whether the next run of an evaluation measures the incumbent (else the candidate).

        A keep needs the window balanced in time (:func:`optimizer.verdict.compare`): an
        incumbent run after the last candidate run, then whichever side's mean time lags
        (I C I, then C I, C I ...: every candidate run bracketed). Once balanced, the side
        with fewer runs goes next, on a tie the one that did not run last.
        """
        if not cand:
            return False
        if not inc or inc[-1].index < cand[-1].index:
            return True
        ti = sum(r.index for r in inc) / len(inc)
        tc = sum(r.index for r in cand) / len(cand)
        if abs(ti - tc) > self.settings.balance:
            return ti < tc
        if len(inc) != len(cand):
            return len(inc) < len(cand)
        return last == "candidate"

    def _log_ratio(self, gain: float) -> float:
        """The log ratio of levels behind a gain (a fraction better) for this objective."""
        return self.objective_spec.log_ratio(min(max(gain, -0.999), 0.999))

    def _not_kept(self, v: Verdict) -> Verdict:
        """An evaluation ended without a keep (its verdict may have been credible but not
        time-adjacent, or shifted)."""
        if not v.reason.startswith("kept"):
            return replace(v, keep=False)
        # a credible gain that was not kept says why, never "kept" (C2 stored "revert"
        # with "kept: gain +47.0% (p=0.025)" from a verdict set to keep=False on its way)
        return replace(
            v, keep=False, reason=v.reason.replace("kept", "not kept (no adjacent runs)", 1)
        )

    def _finish(self, name: str | None, text: str, v: Verdict) -> Verdict:
        self._verdicts.append((self._trials - 1, name or "", text, v))
        self._out = v
        self._looking = None
        return v

    def _allowed(self, knob: Knob, value: Value) -> bool:
        """``value`` differs from the incumbent, was never measured here and is not excluded."""
        if value == self._inc[knob.name]:
            return False
        if self._key({**self._inc, knob.name: value}) in self._ledger.runs:
            return False
        return self._steps.within(knob, value)


def _undecided(about: str, v: Verdict, alpha: float) -> str:
    """The note for an evaluation the walk ended before its verdict: its estimate so far,
    labelled as not confirmed, so that a lead the budget cut off is not lost."""
    ni, nc = v.runs
    p = "" if v.p_value is None else f", p={v.p_value:.3g}"
    ci = "" if v.ci is None else f" (95% CI {v.ci[0]:+.1%} to {v.ci[1]:+.1%}{p})"
    return (
        f"undecided when the walk ended: {about} measured {v.gain:+.1%}{ci} over {nc} "
        f"run(s) against {ni}; a keep needs p < {alpha:g} on time-adjacent runs. Not kept "
        "and not confirmed: a longer budget would decide it"
    )
