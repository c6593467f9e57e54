"""The budget accounting of a coordinate descent: trials and measured seconds spent.

``max_trials`` and ``max_benchmark_s`` (optimizer/settings.py) bound a session; a
:class:`Budget` counts what the registered runs spent, says whether more runs still fit and
how many, and estimates the session's total for an ETA. The check that a budget can hold a
session at all is :func:`optimizer.settings.check_budget` (``BudgetError``).
"""

from __future__ import annotations

from optimizer.settings import DescentSettings


class Budget:
    """Trials and measured seconds spent, and the length of the runs asked for now."""

    def __init__(self, settings: DescentSettings) -> None:
        self.settings = settings
        self.trials = 0
        self.bench_s = 0.0  # measured seconds of the runs registered so far
        # the measured window of the runs asked for now: the session's, or the long runs'
        # that span a checkpoint cycle
        self.run_s = settings.run_seconds

    def spend(self, run_s: float | None) -> None:
        """One run registered (``run_s``: its measured window, None: the session's)."""
        self.trials += 1
        self.bench_s += run_s or self.settings.run_seconds

    def over(self, more: int) -> str | None:
        """Why ``more`` runs (of the current length) beyond those done would exceed the
        budget, or None if they fit."""
        if self.settings.max_trials is not None and self.trials + more > self.settings.max_trials:
            return "trial budget spent"
        if (
            self.settings.max_benchmark_s is not None
            and self.bench_s + more * self.run_s > self.settings.max_benchmark_s + 1e-9
        ):
            return "benchmark time budget spent"
        return None

    def room(self) -> int | None:
        """How many more runs (of the current length) the budgets hold; None: no limit."""
        rooms = []
        if self.settings.max_trials is not None:
            rooms.append(self.settings.max_trials - self.trials)
        if self.settings.max_benchmark_s is not None:
            left = self.settings.max_benchmark_s - self.bench_s
            rooms.append(int(left / self.run_s + 1e-9))
        return max(min(rooms), 0) if rooms else None

    def planned(
        self, *, active: int, later: int, pass_: int, concluding: bool, final_runs_left: int
    ) -> int:
        """Rough total number of trials for an ETA while the search goes on: ``active``
        knobs in the space, ``later`` of them after the one being tuned in pass ``pass_``."""
        per_knob = 6  # typical on the simulated surfaces: ~2 runs per step, ~3 steps per knob
        left = (
            per_knob * (later + 1) + (self.settings.max_passes - pass_ - 1) * active * per_knob // 2
        )
        if self.trials < self.settings.baseline_runs:
            left += self.settings.baseline_runs - self.trials
        if concluding:
            left = final_runs_left
        estimate = self.trials + left + (0 if concluding else final_runs_left)
        if self.settings.max_trials is not None:
            estimate = min(estimate, self.settings.max_trials)
        if self.settings.max_benchmark_s is not None:
            estimate = min(
                estimate, int(self.settings.max_benchmark_s // self.settings.run_seconds)
            )
        return max(estimate, self.trials + 1)
