"""Interleaved rounds of configs on one target: the measuring part of a comparison.

Each run is a session's own trial (app/sessions/trial.py ``TrialExecutor``: apply, a
discarded warm-up run, the workload's reset, every stream at once, per-transaction
stats). Each config is applied over the target's settings as they were before the first
run (``snapshot``): where an earlier run set knobs this config leaves alone, the snapshot
is put back first. The settings of every knob named are read as each measured run
begins, so a run's record says what the server ran it with.

:func:`run_rounds` never restores the target at the end: its caller does, in a
``finally`` (a comparison's runner through app/sessions/recovery.py; bench/common.py's
``interleaved`` itself). The statistics are pure: :mod:`optimizer.compare`. Used by
app/compare/runner.py and by the bench scripts (bench/common.py, bench/e2e.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from app.postgres.target import ApplyResult, Snapshot
from app.sessions.summary import io_line
from app.sessions.trial import TrialExecutor, TrialHooks, TrialOutcome
from optimizer.descent import Candidate
from optimizer.evidence import FLOOR, Objective, run_level, unfinished

# (run index, round, config's name, outcome, the settings read as the measured run began)
OnRun = Callable[[int, int, str, TrialOutcome, dict[str, str]], None]


class Reverter(Protocol):
    """What the rounds need of a target besides what the executor applies."""

    def snapshot(self, names: Sequence[str]) -> Snapshot: ...

    def revert(self, snapshot: Snapshot) -> ApplyResult: ...


def run_plan(orders: Sequence[Sequence[str]]) -> list[tuple[int, str]]:
    """(round, config) of every run, in the order they run."""
    return [(r, label) for r, order in enumerate(orders) for label in order]


def knob_names(configs: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Every knob some config sets."""
    return sorted({k for c in configs.values() for k in c})


def run_rounds(
    ctl: Reverter,
    executor: TrialExecutor,
    configs: Mapping[str, Mapping[str, str]],
    orders: Sequence[Sequence[str]],
    snapshot: Snapshot,
    on_run: OnRun,
    *,
    start: int = 0,
) -> None:
    """Run ``orders`` (per round, the configs' names in the order they run) from run
    ``start`` on (a resume: the target's state is then unknown, so the snapshot is put
    back before the first run); ``on_run`` after each run (it may raise to stop).

    Each run is measured as a baseline (no guard refuses or stops it) with its config
    applied over ``snapshot``; a run whose apply restarted the server warms up like any
    (the executor's ``warmup_run_s``).
    """
    plan = run_plan(orders)
    names = knob_names(configs)
    dirty = set(names) if start else set()  # knobs that may differ from the snapshot
    base = executor.hooks
    seen: dict[str, str] = {}
    try:
        for i, (rnd, label) in enumerate(plan):
            if i < start:
                continue
            config = dict(configs[label])
            if dirty - set(config):
                base.on_phase(f"round {rnd + 1} of {len(orders)}, {label}: restoring the snapshot")
                ctl.revert(snapshot)
                dirty = set()
            dirty |= set(config)
            executor.hooks = _hooks(
                base, ctl, names, seen, f"round {rnd + 1} of {len(orders)}", label
            )
            # role "baseline": measured as it is, no guard stops or refuses it
            out = executor.run(Candidate(i, config, None, label, "baseline"), incumbent=config)
            on_run(i, rnd, label, out, dict(seen))
    finally:
        executor.hooks = base


def _hooks(
    base: TrialHooks,
    ctl: Reverter,
    names: Sequence[str],
    seen: dict[str, str],
    where: str,
    label: str,
) -> TrialHooks:
    """The executor's hooks for one run: its phases say which round and config, and the
    settings are read as its measured run begins."""

    def say(text: str) -> str:
        text = text.replace("the baseline config", label)
        return f"{where}, {label}: " + ("measuring" if text == "baseline" else text)

    def began() -> None:
        base.on_run_start()
        seen.clear()
        if names:
            seen.update(ctl.snapshot(names).effective)

    return dataclasses.replace(
        base,
        on_phase=lambda text: base.on_phase(say(text)),
        on_applied=lambda applied, phase: base.on_applied(
            {**applied, "label": label}, None if phase is None else say(phase)
        ),
        on_run_start=began,
    )


def run_record(out: TrialOutcome, objective: Objective) -> dict[str, Any]:
    """What one run measured, JSON-ready: its level by the objective (None: it failed, or
    a designed query never finished in it), its streams' figures, the server's counters."""
    streams = out.measurement.streams
    error = out.error or out.rejected
    level: float | None = None
    gone: list[str] = []
    if error is None and not streams:
        error = "a stream logged no transaction"
    if error is None:
        stat = run_level(streams, objective)
        gone = unfinished(streams)
        level = None if stat.centre <= FLOOR else math.exp(stat.centre)
    metrics = dict(out.result.db_metrics or {}) if out.result is not None else {}
    return {
        "level": level,
        "unfinished": gone,
        "transactions": sum(s.transactions for s in streams),
        "streams": [
            {"name": s.name, "transactions": s.transactions, "failed": s.failed} for s in streams
        ],
        "io": io_line(metrics),
        "metrics": metrics,
        "timings": dict(out.timings),
        "error": error,
        "down": out.down,
        "started_at": out.started.isoformat(),
    }


def levels_by_config(
    runs: Sequence[Mapping[str, Any]], names: Sequence[str], rounds: int
) -> dict[str, list[float | None]]:
    """Per config, its level in each round (None: no run yet, or one without a level)."""
    out: dict[str, list[float | None]] = {n: [None] * rounds for n in names}
    for r in runs:
        name, rnd = r.get("config"), r.get("round")
        if name in out and isinstance(rnd, int) and 0 <= rnd < rounds:
            out[name][rnd] = r.get("level")
    return out
