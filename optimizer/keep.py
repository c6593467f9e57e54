"""The keep/reject rules of one candidate's evaluation, as pure functions (issue 43).

:func:`optimizer.verdict.compare` says what a window of runs shows; these rules say what
the coordinate descent does with it (optimizer/evaluation.py runs the evaluation, the
module docstring of optimizer/descent.py says why the rules are what they are):

* :func:`read_window`: a verdict on time-adjacent runs keeps the candidate, unless a load
  shift inside the window (or a jump not yet told apart) says to wait or start again;
* :func:`ends`: the verdict that ends an evaluation without a keep (futile, the load moved
  too often, too many runs, not promising enough), or None to measure on;
* :func:`incumbent_next`: which config the next run measures;
* :func:`not_kept`, :func:`failed_candidate`, :func:`undecided`: the reasons given.

Each takes the evidence and returns the decision with its reason; none records anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from optimizer.evidence import Objective, unfinished
from optimizer.ledger import Measurement, Shift, _Run
from optimizer.settings import DescentSettings
from optimizer.verdict import Verdict

Window = Literal["keep", "restart", "go on"]
"""What a time-adjacent window decides: keep the candidate, restart the window after the
latest load shift, or go on to the rules that end an evaluation (:func:`ends`)."""


def log_ratio(objective: Objective, gain: float) -> float:
    """The log ratio of levels behind a gain (a fraction better) for this objective."""
    return objective.log_ratio(min(max(gain, -0.999), 0.999))


def read_window(
    v: Verdict, found: Sequence[Shift], pending: Sequence[Shift]
) -> tuple[Window, Verdict]:
    """What the verdict ``v`` on a time-adjacent window decides, given the load shifts
    ``found`` between two of its runs and the jumps ``pending`` (not told apart yet)."""
    if pending and not found and v.keep:
        # a jump whose cause the other config's next run will tell
        why = v.reason.replace("kept", "not kept yet (a jump to tell first)", 1)
        return "go on", replace(v, keep=False, reason=why)
    if found:
        # the server's load moved inside the window: decide nothing on it; start the
        # window again after the latest shift and re-measure
        why = v.reason.replace("kept", "not kept yet (the load moved)", 1)
        return "restart", replace(v, keep=False, shift=True, reason=why)
    if v.keep and v.adjacent:
        return "keep", v
    return "go on", v


def ends(
    v: Verdict,
    *,
    runs: int,
    balanced: bool,
    shifts: int,
    settings: DescentSettings,
) -> Verdict | None:
    """The verdict that ends an evaluation without a keep, or None to measure on.

    ``v``: the latest look (time-adjacent, or against the incumbent's recent runs: rejecting
    needs no adjacency); ``runs``: the candidate's runs so far; ``balanced``: the window has
    as many incumbent runs as candidate runs; ``shifts``: the load shifts seen while
    measuring it.
    """
    assert v.se is not None
    objective = settings.objective
    d = log_ratio(objective, v.gain)
    # futile: measured worse, or even an optimistic bound (80%) misses min_gain
    if v.gain < 0 or d + 1.28 * v.se < log_ratio(objective, settings.min_gain):
        return not_kept(v)
    if shifts > settings.max_shifts:
        why = (
            f"undecided: the server's load moved {shifts} times while "
            f"measuring ({v.gain:+.1%} on the last window); not kept"
        )
        return replace(v, keep=False, reason=why)
    if runs >= settings.max_candidate_runs and balanced:
        return not_kept(v)
    if runs >= settings.max_candidate_runs + 2 * settings.max_shifts:
        return not_kept(v)
    if runs >= settings.promising_after and v.gain < settings.promising:
        # better, but by too little to confirm cheaply: let the walk look further
        return not_kept(v)
    return None


def incumbent_next(
    inc: Sequence[_Run], cand: Sequence[_Run], last: str | None, balance: float
) -> bool:
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
    if abs(ti - tc) > balance:
        return ti < tc
    if len(inc) != len(cand):
        return len(inc) < len(cand)
    return last == "candidate"


def not_kept(v: Verdict) -> Verdict:
    """An evaluation ended without a keep (its verdict may have been credible but not
    time-adjacent, or shifted)."""
    if not v.reason.startswith("kept"):
        return replace(v, keep=False)
    # a credible gain that was not kept says why, never "kept" (C2 stored "revert"
    # with "kept: gain +47.0% (p=0.025)" from a verdict set to keep=False on its way)
    return replace(v, keep=False, reason=v.reason.replace("kept", "not kept (no adjacent runs)", 1))


INCUMBENT_FAILED = Verdict(False, 0.0, None, "rejected: incumbent re-run failed twice")
"""The verdict when the incumbent's re-runs fail twice during an evaluation."""


def failed_candidate(m: Measurement) -> Verdict:
    """The verdict on a candidate whose run gave no usable measurement."""
    gone = unfinished(m.streams)
    why = m.error or (
        "run failed"
        if m.failed
        else f"{', '.join(gone)} never finished within the run (a longer "
        "duration_s gives every query time to finish)"
        if gone
        else "no usable samples"
    )
    return Verdict(False, 0.0, None, f"rejected: {why}")


def undecided(about: str, v: Verdict, alpha: float) -> str:
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
