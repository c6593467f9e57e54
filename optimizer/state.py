"""The mutable state of one coordinate descent, shared by its parts (issue 43).

:class:`~optimizer.descent.CoordinateDescent` is a façade over the walk
(optimizer/walk.py), one candidate's evaluation (optimizer/evaluation.py, its keep rules in
optimizer/keep.py), the final check (optimizer/final_check.py) and the budget
(optimizer/budget.py). They all read and update one :class:`State`: the runs, the
incumbent, what was decided so far. It holds no rules of its own beyond naming a config's
runs (:meth:`State.key`); the messages the parts exchange with the façade (a run to
perform, a cancel, a cut) are defined here too.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from optimizer.budget import Budget
from optimizer.knobs import Config, Knob
from optimizer.ledger import Key, Measurement, RunLedger, Value, _Run
from optimizer.settings import DescentSettings
from optimizer.steps import Steps
from optimizer.verdict import Verdict

RUN_S = "(run_s)"
"""The key entry that marks runs of another length than the session's (see State.key)."""

Role = Literal["baseline", "candidate", "incumbent", "final-baseline", "final-incumbent"]
Claim = Literal["none", "confirmed", "not-credible", "no-change", "unconfirmed"]


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


class State:
    """Everything one descent has measured and decided so far (see the module docstring)."""

    def __init__(
        self,
        space: Sequence[Knob],
        start: Config,
        settings: DescentSettings,
        *,
        hints: Mapping[str, str] | None = None,
        server: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.space: tuple[Knob, ...] = tuple(space)
        self.knobs = {k.name: k for k in self.space}
        self.objective_spec = settings.objective
        self.ledger = RunLedger(settings)  # the runs, their noise, the load shifts
        self.steps = Steps(self.space)  # step values, and limits learnt from failed runs
        self.limits_lat: dict[str, float] = {
            f"p95:{k}": v for k, v in settings.objective.p95_limits.items()
        }
        if settings.max_p99_worsening is not None:
            self.limits_lat["p99"] = settings.max_p99_worsening

        self.base: dict[str, Value] = {}
        for k in self.space:
            self.base[k.name] = k.parse(start.get(k.name, k.default))
        self.inc: dict[str, Value] = dict(self.base)
        self.hints: dict[str, Value] = {}
        for k in self.space:
            if hints and k.name in hints:
                h = k.parse(hints[k.name])
                if not isinstance(h, str):
                    h = min(max(h, k.lower), k.upper)
                    if k.kind == "integer":
                        h = float(round(h))
                self.hints[k.name] = h
        self.excluded: dict[str, str] = {}
        self.server: dict[str, str] = dict(server or {})
        # the order the walk tunes knobs in (optimizer/order.py): set from the baseline's
        # counters, and again from the hints' runs when they are kept
        self.order: tuple[Knob, ...] = self.space
        self.order_notes: tuple[str, ...] = ()  # the latest ordering's, per knob moved
        self.orderings: list[str] = []  # one note per ordering, for the session's notes
        # checkpoint knobs the runs could not show (optimizer/checkpoints.py), with the note
        self.set_aside: dict[str, str] = {}
        self.wal_rate: float | None = None  # bytes/s, the latest run that measured it
        # trials and measured seconds so far, and the measured window of the runs asked for
        # now: the session's, or the long runs' that span a checkpoint cycle (runs of each
        # length are kept apart: key)
        self.budget = Budget(settings)
        self.long_kept = False  # a long run's evaluation kept a value: the check is long too
        self.phases: list[str] = []  # one note per change of run length, for the notes
        self.trials_by_knob: dict[str, int] = {k.name: 0 for k in self.space}
        self.gain_by_knob: dict[str, float] = {}
        self.verdicts: list[tuple[int, str, str, Verdict]] = []
        self.out: Verdict | None = None
        self.pass_ = 0
        self.pos = 0  # index in space of the knob being tuned, for planned_trials()
        self.stop_reason: str | None = None
        self.final: dict[str, list[_Run]] = {}  # role -> runs, once the final check began
        # what the other config's runs said about each jump (notes), and the jumps read
        self.shift_readings: list[str] = []
        self.read: set[tuple[int, int]] = set()
        self.final_left = 0  # runs of the final check still to perform
        self.final_verdict: Verdict | None = None  # the final check's, once it is complete
        self.final_rejected: Config | None = None  # the walk's best, if the final check failed it
        self.about = "the baseline"  # what the current runs are for (shift reports)
        # the evaluation in progress and its latest look; what the walk was deciding when it
        # ended early (a budget) becomes ``undecided``
        self.looking: tuple[str, Verdict] | None = None
        self.undecided: str | None = None
        self.concluding = False
        self.last_config: Config | None = None  # what the server ran last, as far as we know

    @property
    def min_gain(self) -> float:
        return self.settings.min_gain

    @property
    def incumbent(self) -> Config:
        """The best config so far, every knob in PostgreSQL syntax."""
        return self.config(self.inc)

    @property
    def baseline(self) -> Config:
        return self.config(self.base)

    @property
    def moved(self) -> bool:
        """The incumbent differs from the baseline."""
        return self.key(self.inc) != self.key(self.base)

    @property
    def checked(self) -> bool:
        """The final check has runs of both configs."""
        return len(self.final) == 2

    def config(self, values: Mapping[str, Value]) -> Config:
        return {k.name: k.format(values[k.name]) for k in self.space}

    def key(self, values: Mapping[str, Value], run_s: float | None = None) -> Key:
        """A config's runs of one length (the current one unless given): runs of another
        length are other evidence (a checkpoint cycle in one, none in the other)."""
        key = tuple((k.name, values[k.name]) for k in self.space)
        length = self.budget.run_s if run_s is None else run_s
        return key if length == self.settings.run_seconds else (*key, (RUN_S, length))
