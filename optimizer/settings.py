"""The settings of a coordinate descent, as one frozen value (see optimizer/descent.py).

Everything about *how* the descent searches and decides lives here: budget, walk, verdict
and final check. What it searches (the knob space, the start config, hints) is given to
:class:`~optimizer.descent.CoordinateDescent` beside it. A session builds its settings
from its request (app/sessions/plan.py); equal settings and equal measurements give the same
walk, so a resumed session replays into exactly the state it had.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from optimizer.evidence import Objective, as_objective
from optimizer.verdict import ALPHA, RUN_SD

Evidence = Literal["auto", "transactions", "seconds"]

MIN_WALK_RUNS = 3
"""Runs a session needs between its baseline and its final check: one evaluation, C I C."""


class BudgetError(ValueError):
    """The budget cannot hold the baseline, a first evaluation and the final check."""

    def __init__(self, message: str, minimum: float) -> None:
        super().__init__(message)
        self.minimum = minimum


def check_budget(
    *,
    max_trials: int | None,
    max_benchmark_s: float | None,
    run_seconds: float,
    baseline_runs: int = 2,
    final_runs: int = 6,
) -> int:
    """The fewest trials a session needs; :class:`BudgetError` if the budget holds fewer.

    A session needs its baseline, one evaluation (C I C) and its final check: a budget
    that cannot hold them is refused up front rather than ending with an unchecked claim.
    """
    need = baseline_runs + MIN_WALK_RUNS + final_runs
    parts = (
        f"the baseline ({baseline_runs} runs), a first evaluation ({MIN_WALK_RUNS}) and "
        f"the final check ({final_runs})"
    )
    if max_trials is not None and max_trials < need:
        raise BudgetError(
            f"max_trials={max_trials} cannot hold {parts}: give max_trials >= {need}", need
        )
    if max_benchmark_s is not None and max_benchmark_s < need * run_seconds:
        raise BudgetError(
            f"a benchmark time budget of {max_benchmark_s:g} s cannot hold {parts} of "
            f"{run_seconds:g} s each: give at least {need * run_seconds:g} s",
            need * run_seconds,
        )
    return need


@dataclass(frozen=True)
class DescentSettings:
    """How a descent searches and decides (the defaults are the service's; see descent.py).

    ``objective`` may be given as its kind ("throughput", ...): it is stored as an
    :class:`~optimizer.evidence.Objective`. Invalid combinations raise ValueError, a budget
    too small for a session raises :class:`BudgetError`.
    """

    seed: int = 0  # the walk is deterministic; kept so a session records its arguments
    objective: Objective = field(default_factory=lambda: as_objective("throughput"))
    # -- budget
    max_trials: int | None = 30
    max_benchmark_s: float | None = None
    run_seconds: float = 60.0
    warmup_seconds: float = 0.0  # discarded seconds before each run's window (notes only)
    # -- the walk
    max_passes: int = 2
    look_ahead: int = 1
    cliff: float = 0.25
    max_skips: int = 2
    coarse: int = 1
    joint_hints: bool = True
    # knobs that act through checkpoints are judged only on runs that span a checkpoint
    # cycle (optimizer/checkpoints.py), from the WAL rate the runs' counters measured
    checkpoint_rule: bool = True
    # knobs set aside for their run length get runs that span a checkpoint cycle once the
    # short-run walk is over, when the budget (max_benchmark_s) holds them
    long_runs: bool = True
    # busy mechanisms first, idle ones last, from the baseline's counters (optimizer/order.py)
    order_by_counters: bool = True
    # -- the verdict
    min_gain: float = 0.02
    max_p99_worsening: float | None = None
    baseline_runs: int = 2
    max_candidate_runs: int = 6
    alpha: float = ALPHA
    run_sd: float = RUN_SD
    incumbent_window: int = 10
    promising: float = 0.04
    promising_after: int = 4
    learn_noise: bool = True
    adjacent_gap: int = 3
    max_shifts: int = 2
    balance: float = 0.5
    evidence: Evidence = "auto"
    # -- the final check
    final_runs: int = 6

    def __post_init__(self) -> None:
        # a kind given as text becomes the Objective (frozen: set through object)
        object.__setattr__(self, "objective", as_objective(self.objective))
        if (
            self.min_gain < 0
            or self.max_passes < 1
            or self.run_seconds <= 0
            or self.baseline_runs < 1
        ):
            raise ValueError(
                "need min_gain >= 0, max_passes >= 1, run_seconds > 0, baseline_runs >= 1"
            )
        if self.max_candidate_runs < 1 or self.look_ahead < 0 or self.incumbent_window < 1:
            raise ValueError("need max_candidate_runs >= 1, look_ahead >= 0, incumbent_window >= 1")
        if self.final_runs < 0 or self.final_runs % 2:
            raise ValueError("final_runs must be an even number >= 0 (A B B A A B ...)")
        if self.adjacent_gap < 1 or self.max_shifts < 0:
            raise ValueError("need adjacent_gap >= 1 and max_shifts >= 0")
        if self.evidence not in ("auto", "transactions", "seconds"):
            raise ValueError("evidence must be auto, transactions or seconds")

    @property
    def min_trials(self) -> int:
        """The fewest trials a session with these settings needs (BudgetError if more)."""
        return check_budget(
            max_trials=self.max_trials,
            max_benchmark_s=self.max_benchmark_s,
            run_seconds=self.run_seconds,
            baseline_runs=self.baseline_runs,
            final_runs=self.final_runs,
        )
