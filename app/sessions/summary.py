"""A session's result in plain words: what was found, how sure it is, what to do next.

One sentence per result for the dashboard, the CLI and the API (``SessionOut.summary``),
and one figure per result in the objective's own units: "query time -34.1%", never
"+34.1% ... query time -34.1%" (the verdict's gain is "fraction better"; for a time,
better means lower). ``io_line``: a trial's server counters in one line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from app.objective import objective_of
from app.postgres.units import readable
from app.sessions.stream_stats import streams_from_json
from optimizer.counters import ServerCounters
from optimizer.counters import summary as counters_summary
from optimizer.descent import RESOLUTION
from optimizer.evidence import FLOOR, run_level
from optimizer.objective import gain_words, in_units, lower_is_better, objective_kind


def headline(objective: str, gain: float | None, ci: Sequence[float] | None = None) -> str | None:
    """ "throughput +12.0% (95% CI +4.0% to +20.1%)", "query time (total) -23.0% (...)"."""
    if gain is None:
        return None
    text = gain_words(objective, gain)
    if ci:
        lo, hi = sorted((in_units(objective, ci[0]), in_units(objective, ci[1])))
        text += f" (95% CI {lo:+.1%} to {hi:+.1%})"
    return text


def changed_knobs(start: Mapping[str, str] | None, best: Mapping[str, str] | None) -> str:
    """ "work_mem 4MB -> 27.9MB, random_page_cost 4 -> 1.1" ('' when nothing changed)."""
    start, best = start or {}, best or {}
    return ", ".join(
        f"{k} {readable(str(start.get(k, '?')))} -> {readable(str(v))}"
        for k, v in best.items()
        if start.get(k) != v
    )


OUTCOMES = ("confirmed", "no-change", "unconfirmed", "failed", "cancelled")
"""A finished session's outcome (None while it is queued or running):

- ``confirmed``: a better config, confirmed by the final check: apply it;
- ``no-change``: nothing to recommend (nothing kept, below min_gain, or not credible);
- ``unconfirmed``: a config was found, but the final check did not complete;
- ``failed``: the session failed (the target was restored);
- ``cancelled``: someone cancelled it (the target was restored).

The API's ``SessionOut.outcome`` and the CLI's exit status both come from :func:`outcome`,
and :func:`summary` draws the same lines (tests/app/cli/test_exit_codes.py checks it)."""


def outcome(
    status: str,
    gain_status: str | None,
    start: Mapping[str, str] | None,
    best: Mapping[str, str] | None,
) -> str | None:
    """The outcome of a session (one of :data:`OUTCOMES`), None while it is not finished."""
    if status in ("failed", "cancelled"):
        return status
    if status != "succeeded":
        return None
    if not changed_knobs(start, best):
        return "no-change"
    if gain_status == "confirmed":
        return "confirmed"
    if gain_status == "unconfirmed":
        return "unconfirmed"
    return "no-change"  # none, no-change, not-credible: keep the current settings


def summary(
    *,
    session_id: int,
    status: str,
    objective: str,
    gain_status: str | None,
    gain: float | None,
    ci: Sequence[float] | None,
    start: Mapping[str, str] | None,
    best: Mapping[str, str] | None,
    trials: int,
    error: str | None = None,
    resolution: str | None = None,
) -> str:
    """One plain paragraph: what was found, how sure it is, and what to do next.

    ``resolution``: the session's note on the smallest effect its runs could have shown
    (:func:`resolution_note`), said where nothing is recommended."""
    if status == "queued":
        return "Waiting to start: the session runs as soon as the scheduler picks it up."
    said = headline(objective, gain, ci)
    changes = changed_knobs(start, best)
    if status == "running":
        found = (
            f" So far the best config is {changes} ({said}, not yet checked)." if changes else ""
        )
        return (
            f"Running: {trials} benchmark run(s) so far.{found} The verdict comes from the "
            "final check at the end; the target is restored unless you asked otherwise."
        )
    if status == "failed":
        return (
            f"The session failed: {error or 'see the notes'}. The target was restored to its "
            "settings from before the session. Next: fix what the error names and start again."
        )
    ended = "Cancelled: the target was restored. " if status == "cancelled" else ""
    if gain_status == "confirmed" and changes:
        return (
            f"{ended}Found a better configuration: {changes} gives {said}, confirmed by the "
            "final check (the start and the best config run side by side). Next: compare it "
            f"with the server's settings and apply it: knobtune apply {session_id} --dry-run, "
            f"then knobtune apply {session_id} (or the Apply button on its page); or download "
            "postgresql.conf."
        )
    if gain_status == "not-credible":
        return (
            f"{ended}No change recommended: the best config ({changes}) measured {said} in the "
            "final check, which is within this server's run-to-run noise. Next: keep your "
            "settings; to resolve a small effect, run a longer session (longer runs, more "
            "final-check runs)."
        )
    if gain_status == "unconfirmed" and changes:
        return (
            f"{ended}Unconfirmed: the search found {changes} at {said}, but the final check did "
            "not complete, so that figure compares runs minutes apart and may be drift. Next: "
            "run the session again with room for the final check before applying anything."
        )
    seen = f" {resolution[0].upper()}{resolution[1:]}." if resolution else ""
    if gain_status == "no-change":
        return (
            f"{ended}No change recommended: the final check did not show the search's best "
            f"config better than your current one by more than the noise and min_gain.{seen} "
            "Next: keep your settings; try other knobs or a workload closer to production."
        )
    return (
        f"{ended}No change recommended: nothing beat the current config by more than the "
        f"noise in {trials} benchmark run(s).{seen} Next: keep your settings; try other "
        "knobs, or a longer session if you expect a small effect."
    )


def resolution_note(notes: Sequence[object] | None) -> str | None:
    """The session's note on the smallest effect its runs could have shown, if any
    (optimizer/descent.py ``resolution``: written when nothing is recommended)."""
    seen = [str(n) for n in notes or [] if str(n).startswith(RESOLUTION)]
    return seen[-1] if seen else None


def run_value(evidence: Mapping[str, Any] | None, request: Mapping[str, Any]) -> float | None:
    """A run's level in the objective's own unit (ms) from its stored transactions.

    The same level the verdict judged (optimizer.evidence.run_level); None for throughput
    (its chart plots the median tps), a run without evidence, or one in which a designed
    query never finished.
    """
    if not lower_is_better(objective_kind(request)):
        return None
    streams = streams_from_json(evidence)
    if not streams:
        return None
    obj = objective_of(request)
    try:
        level = run_level(streams, obj)
    except ValueError:
        return None
    if level.centre <= FLOOR + 1.0:
        return None
    return math.exp(-level.centre)


def note_kind(text: str) -> str:
    """ "warning" for a note that asks for attention, "note" for one that only informs."""
    low = text.lower()
    return "warning" if any(w in low for w in _WARNING_WORDS) else "note"


_WARNING_WORDS = (
    "warning",
    "skipped",
    "went down",
    "failed",
    "far past",
    "load moved",
    "not credible",
    "unsafe",
    "rejected",
    "did not",
    "cannot",
    "could not",
    "error",
    "lost",
    "crash",
    "unconfirmed",
    "recommending no change",
)


def io_line(metrics: Mapping[str, Any] | None) -> str | None:
    """A trial's server counters in one line, as the studies read iostat (None: none)."""
    return counters_summary(ServerCounters.from_metrics(metrics))
