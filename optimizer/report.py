"""What a coordinate descent reports: its recommendation and, when it recommends nothing,
the smallest effect its runs could have shown (issue 43).

Read from the descent's :class:`~optimizer.state.State` and its claimed gain
(optimizer/final_check.py); rendered by optimizer/render.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from optimizer.final_check import claim, overall
from optimizer.render import KnobNote, Recommendation
from optimizer.state import State
from optimizer.verdict import detectable_gain

RESOLUTION = "what these runs could show"
"""How the note on the smallest effect a session could see begins (exports find it by it)."""


def resolution(s: State) -> str | None:
    """When nothing is recommended: the smallest gain this session's runs could have
    kept (:func:`~optimizer.verdict.detectable_gain`), so that "no change" is not read
    as "no effect". None when a change is recommended or the start config has fewer
    than two runs (no scatter of its own to read)."""
    if claim(s) not in ("none", "no-change"):
        return None
    key = s.key(s.base, s.settings.run_seconds)
    base = s.ledger.runs.get(key, [])
    if len(base) < 2:
        return None
    # the most runs the walk gave one candidate (the final check's are not a candidate's)
    nc = max([1, *(v.runs[1] for _t, _k, _x, v in s.verdicts)])
    run_sd, prior_df = s.ledger.noise((key,))
    lower = s.objective_spec.lower_is_better
    gain = detectable_gain(
        base, nc, min_gain=s.min_gain, alpha=s.settings.alpha, run_sd=run_sd,
        prior_df=prior_df, lower_is_better=lower,
    )  # fmt: skip
    centres = [r.stat.centre for r in base]
    mean = sum(centres) / len(centres)
    sd = math.sqrt(sum((c - mean) ** 2 for c in centres) / (len(centres) - 1))
    better = "less time" if lower else "better"
    floor = " (the session's min_gain)" if gain <= s.min_gain else ""
    return (
        f"{RESOLUTION}: a change had to measure about {gain:.0%} {better}{floor} "
        f"to be kept with {nc} run(s) of a candidate against the start config's "
        f"{len(base)} (runs of the start config spread by {math.expm1(sd):.0%} (sd), "
        f"the server's run-to-run noise); smaller effects were not ruled out"
    )


def recommendation(s: State, header: Mapping[str, str] | None = None) -> Recommendation:
    """The result so far, ready for :mod:`optimizer.render`."""
    notes = []
    for k in s.space:
        notes.append(
            KnobNote(
                name=k.name,
                original=k.format(s.base[k.name]),
                recommended=k.format(s.inc[k.name]),
                gain=s.gain_by_knob.get(k.name),
                trials=s.trials_by_knob[k.name],
                needs_restart=k.needs_restart,
                durability_unsafe=k.durability_unsafe,
                excluded=None if k.name in s.set_aside else s.excluded.get(k.name),
                not_judged=s.set_aside.get(k.name),
            )
        )
    ov = overall(s)
    return Recommendation(
        original=s.baseline,
        recommended=s.incumbent,
        notes=tuple(notes),
        overall_gain=ov.gain if ov is not None and ov.runs[1] > 0 else None,
        overall_p_value=ov.p_value if ov is not None else None,
        objective=s.objective_spec.kind,
        trials=s.budget.trials,
        header=dict(header or {}),
        gain_status=claim(s),
        overall_ci=ov.ci if ov is not None and ov.runs[1] > 0 else None,
    )
