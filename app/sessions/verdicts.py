"""Which candidate runs a stored verdict judged: the one reading of it that the dashboard,
the export, the chart and the CLI's live view share.

The optimizer evaluates a candidate over several runs and decides after any of them
(optimizer/descent.py); the session stores the verdict on the run that decided it
(app/sessions/store.py). That run is the evaluation's last candidate run or an incumbent
re-run after it (C I I: a keep lands on the last I), so a reader that shows the verdict
beside the candidate has to find the candidate's runs.
"""

from __future__ import annotations

from collections.abc import Iterable


def judged_runs(trials: Iterable[tuple[int, str, str | None]]) -> dict[int, tuple[int, ...]]:
    """(index, role, verdict) of a session's trials in order -> for each trial whose verdict
    ended an evaluation, the indexes of that evaluation's candidate runs, in order.

    A keep or revert ends an evaluation wherever it lands. A "rejected" ends it on a
    candidate run (that run failed or a guard refused it); on an incumbent re-run it is a
    guard's word about that run alone, and the evaluation goes on. Candidate runs of an
    evaluation the walk ended before a verdict (the budget, the final check) are in none.
    """
    out: dict[int, tuple[int, ...]] = {}
    pending: list[int] = []
    for index, role, verdict in trials:
        if role == "candidate":
            pending.append(index)
        if verdict in ("keep", "revert") or (verdict is not None and role == "candidate"):
            if pending:
                out[index] = tuple(pending)
            pending = []
    return out


def moved_verdicts(trials: Iterable[tuple[int, str, str | None]]) -> dict[int, int]:
    """(index, role, verdict) of a session's trials in order -> for each verdict decided on
    an incumbent re-run (C I I), the candidate run that shows it: its evaluation's last.
    A reader moves the verdict there and lets the re-run name it; every other verdict
    stands on its own run."""
    return {i: runs[-1] for i, runs in judged_runs(trials).items() if runs[-1] != i}
