"""The walk over knobs: which candidate the coordinate descent evaluates next (issue 43).

:func:`walk` measures the baseline, evaluates the hints together, then walks each knob in
the order its counters give (:func:`tune`: up while kept, with skips and a look-ahead,
down if up kept nothing; coarse to fine over passes), and last the knobs set aside for
their run length on runs that span a checkpoint cycle (:func:`long_phase`). Each candidate
is evaluated by optimizer/evaluation.py; the rules of the walk and the figures behind them
are in the module docstring of optimizer/descent.py.
"""

from __future__ import annotations

from collections.abc import Generator

from optimizer import checkpoints, keep
from optimizer.evaluation import evaluate
from optimizer.evidence import unfinished
from optimizer.knobs import Knob
from optimizer.ledger import Key, Measurement, Value
from optimizer.order import combine, order_knobs
from optimizer.state import State, _Cancel, _Request, _Walk


def walk(s: State) -> _Walk:
    """The whole walk: the baseline, the hints together, the passes over the knobs, then
    the long runs; it ends where the final check begins."""
    base_key = s.key(s.base)
    failures = 0
    while len(s.ledger.runs.get(base_key, [])) < s.settings.baseline_runs:
        m = yield _Request(s.config(s.base), None, None, "baseline", None)
        if (
            isinstance(m, _Cancel)
            or s.ledger.record(base_key, m, s.budget.trials - 1, s.about) is None
        ):
            failures += 1
            if failures >= 2:  # the unchanged server cannot be benchmarked: nothing to do
                gone = [] if isinstance(m, _Cancel) else unfinished(m.streams)
                s.stop_reason = "baseline runs failed" + (
                    f": {', '.join(gone)} never finished within a run; give the "
                    "workload a longer duration_s"
                    if gone
                    else ""
                )
                return
    order_from(s, base_key, "from the baseline's counters", "the baseline")
    joint = {
        n: h
        for n, h in s.hints.items()
        if n not in s.excluded
        and _allowed(s, s.knobs[n], h)
        # a checkpoint knob the runs cannot show does not ride along with the others
        and _blocked(s, s.knobs[n], h) is None
    }
    if s.settings.joint_hints and len(joint) >= 2:
        # all the hints at once: if they help together (a rule of thumb usually does),
        # the effect is large and proven in a few runs; the walk then starts from there
        v = yield from evaluate(s, None, "", joint)
        if v is not None and v.keep:
            for n in joint:
                s.gain_by_knob.pop(n, None)
            # the kept config can exercise other mechanisms than the start config (on
            # TPC-H, work_mem 28 MB and random_page_cost 1.1 spilled where 4 MB did not)
            why = "after the hints were kept, from their runs"
            order_from(s, s.key(s.inc), why, "the hints' config")
    for p in range(s.settings.max_passes):
        s.pass_ = p
        changed = False
        for pos, knob in enumerate(s.order):
            s.pos = pos
            if knob.name not in s.excluded:
                changed = (yield from tune(s, knob, p)) or changed
        if not changed:
            s.stop_reason = "converged: a full pass kept nothing"
            break
    else:
        s.stop_reason = f"max_passes={s.settings.max_passes} reached"
    yield from long_phase(s)


def long_phase(s: State) -> _Walk:
    """The knobs set aside for their run length, on runs that span a checkpoint cycle.

    Runs as long as the incumbent's checkpoint_timeout (the longest cycle a candidate
    other than a longer timeout can have), in whole minutes, when the budget holds a few
    of them and a final check of that length; otherwise each note says what budget
    they need. Not when a timed cycle at the measured WAL rate writes under a WAL segment
    (checkpoints.idle: the knobs have nothing to act on); the notes say so. The
    incumbent is measured again at that length (runs of one length are compared only
    with runs of the same length). If nothing is kept the final check goes back to the
    session's own run length.
    """
    names = [k.name for k in s.order if k.name in s.set_aside]
    if not names or not s.settings.long_runs or not s.wal_rate:
        return
    inc = {**s.server, **s.incumbent}
    # a timed checkpoint's cycle: the longest any candidate short of a longer
    # checkpoint_timeout can have (more max_wal_size only brings it up to the timeout)
    window = float(checkpoints.needed_duration(checkpoints.timeout_seconds(inc)))
    if window <= s.budget.run_s:
        return
    what = ", ".join(names)
    idle = checkpoints.idle(inc, s.wal_rate)
    if idle is not None:
        # a timed cycle writes under a WAL segment: no candidate can change anything, and
        # the long runs would only spend the budget
        for n in names:
            s.set_aside[n] = s.excluded[n] = f"{n} not judged: {idle}"
        s.phases.append(f"long runs not started: {what}; {idle}")
        return
    short = s.budget.run_s
    s.budget.run_s = window
    per_knob = 3  # a candidate run and the incumbent's on each side of it
    need = (len(names) * per_knob + s.settings.final_runs) * window
    # a few long runs, and a final check of at least A B at that length if one is kept
    fits = s.budget.over(per_knob + min(2, s.settings.final_runs))
    length = checkpoints.duration_text(window)
    if fits is not None:
        s.budget.run_s = short
        left = (s.settings.max_benchmark_s or 0.0) - s.budget.bench_s
        note = (
            f"; runs of {length} (a checkpoint cycle at the measured WAL rate) for "
            f"{what} need about {checkpoints.duration_text(need)} of budget, "
            f"{checkpoints.duration_text(max(left, 0.0))} was left"
        )
        for n in names:
            s.set_aside[n] += note
            s.excluded[n] = s.set_aside[n]
        s.phases.append(f"long runs not started: {what}{note}")
        return
    s.phases.append(
        f"long runs: {what} on runs of {length} (a checkpoint every "
        f"{checkpoints.duration_text(checkpoints.cycle_seconds(inc, s.wal_rate))} "
        f"at the measured WAL rate); about {checkpoints.duration_text(need)} of budget"
    )
    for n in names:
        s.set_aside.pop(n, None)
        s.excluded.pop(n, None)
        knob = s.knobs[n]
        s.pos = s.order.index(knob)
        kept = yield from tune(s, knob, 0)
        s.long_kept = s.long_kept or kept
    if not s.long_kept:
        s.budget.run_s = short  # the final check compares what the short runs kept


def order_from(s: State, key: Key, why: str, runs: str) -> None:
    """Busy mechanisms first, idle ones last, by the counters of ``key``'s runs
    (optimizer/order.py); a reordering that moves nothing is not noted again."""
    if not s.settings.order_by_counters:
        return
    counters = combine(s.ledger.counters.get(key, []))
    # a knob excluded for good (not merely set aside for longer runs) is never tried:
    # "tried first" would mislead
    gone = {n for n in s.excluded if n not in s.set_aside}
    ordering = order_knobs([k.name for k in s.space], counters, runs, gone)
    order = tuple(s.knobs[n] for n in ordering.order)
    if not ordering.notes or (s.orderings and order == s.order):
        return
    s.order, s.order_notes = order, ordering.notes
    s.orderings.append(f"search order {why}: " + "; ".join(ordering.notes))


def tune(s: State, knob: Knob, p: int) -> Generator[_Request, Measurement | _Cancel, bool]:
    """Walk one knob: upward while kept, with look-ahead; downward if upward kept nothing."""
    moved = False
    directions = (1, -1)
    hint = s.hints.get(knob.name)
    evaluated = False  # a value of this knob was measured in this call
    blocked: str | None = None  # why a value could not be judged on these runs
    if p == 0 and hint is not None and _allowed(s, knob, hint):
        blocked = _blocked(s, knob, hint)
    if p == 0 and hint is not None and _allowed(s, knob, hint) and blocked is None:
        evaluated = True
        cur = s.inc[knob.name]
        v = yield from evaluate(s, knob, hint)
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
        level = p - s.settings.coarse  # step = step_size ** (1 / 2**level)
        finest = s.settings.max_passes - s.settings.coarse  # the finest refinement
        tried: set[Value] = set()
        while knob.name not in s.excluded:
            value = s.steps.step(knob, s.inc[knob.name], direction, level, ahead + 1)
            if value is None:
                # past a value that failed or was refused: halfway (geometrically)
                # between the furthest one measured (or the incumbent) and that limit,
                # while the gap is wide
                value = s.steps.toward_limit(knob, {*tried, s.inc[knob.name]}, direction)
            if value is None or value in tried:
                break
            tried.add(value)
            ahead += 1
            if s.key({**s.inc, knob.name: value}) in s.ledger.runs:
                worse += 1  # measured before (an earlier pass): never re-run by accident
                if worse > s.settings.look_ahead:
                    break
                continue
            note = _blocked(s, knob, value)
            if note is not None:
                # the runs span no checkpoint cycle of this value: not judged, and no
                # value further along this direction would be either
                blocked = blocked or note
                break
            evaluated = True
            v = yield from evaluate(s, knob, value)
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
            if v.p_value is None or v.gain < -s.settings.cliff:
                worse_before = worse_before or v.p_value is not None
                break  # failed run or cliff: nothing to find past it
            assert v.se is not None
            if keep.log_ratio(s.objective_spec, v.gain) + 1.28 * v.se < 0:
                # clearly worse: one look-ahead past it (a dip), then stop; clearly
                # worse both ways, the incumbent is this knob's best and the budget goes
                # to the next knob (on a reporting mix, look-aheads past steps down to
                # -29% took a 10-minute session's whole budget)
                worse += 1
                if worse > (0 if worse_before else s.settings.look_ahead):
                    worse_before = True
                    break
            else:
                skips += 1  # flat or better-but-unproven: the effect grows one step further
                if skips > s.settings.max_skips:
                    break
    if blocked is not None and not evaluated and not s.trials_by_knob[knob.name]:
        # set aside, never "no effect": the note names the run length it needs (a knob
        # measured in an earlier pass was judged there, and keeps that verdict)
        s.set_aside[knob.name] = blocked
        s.excluded[knob.name] = blocked
    return moved


def _blocked(s: State, knob: Knob, value: Value) -> str | None:
    """Why runs of this length cannot judge ``knob`` at ``value`` against the incumbent
    (optimizer/checkpoints.py), or None."""
    if not s.settings.checkpoint_rule:
        return None
    inc = {**s.server, **s.incumbent}
    return checkpoints.set_aside(
        knob.name,
        inc,
        {**inc, knob.name: knob.format(value)},
        wal_rate=s.wal_rate,
        window_s=s.budget.run_s,
        warmup_s=s.settings.warmup_seconds,
    )


def _allowed(s: State, knob: Knob, value: Value) -> bool:
    """``value`` differs from the incumbent, was never measured here and is not excluded."""
    if value == s.inc[knob.name]:
        return False
    if s.key({**s.inc, knob.name: value}) in s.ledger.runs:
        return False
    return s.steps.within(knob, value)
