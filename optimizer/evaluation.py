"""One candidate's group-sequential evaluation against the incumbent (issue 43).

:func:`evaluate` asks for runs of the candidate and the incumbent, interleaved
(:func:`optimizer.keep.incumbent_next`), judges the runs after each one
(:func:`judge`, i.e. :func:`optimizer.verdict.compare`) and applies the keep/reject rules of
optimizer/keep.py until they decide; a kept candidate becomes the incumbent.
:func:`load_shifts` tells the load shifts in a window from a config's own scatter (the
final check reads them too). The rules and their reasons are in the module docstring of
optimizer/descent.py.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence

from optimizer import keep
from optimizer.knobs import Knob
from optimizer.ledger import Key, Measurement, Shift, Value, _Run
from optimizer.state import Role, State, _Cancel, _Request
from optimizer.verdict import Verdict, balanced_window, compare


def evaluate(
    s: State, knob: Knob | None, value: Value, joint: Mapping[str, Value] | None = None
) -> Generator[_Request, Measurement | _Cancel, Verdict | None]:
    """Group-sequential evaluation of one candidate; None if withdrawn by exclude().

    ``knob=None`` with ``joint`` evaluates several knobs changed at once (the hints).
    """
    if knob is None:
        assert joint is not None
        cand_vals = {**s.inc, **joint}
        name: str | None = None
        text = "hints: " + ", ".join(f"{n}={s.knobs[n].format(v)}" for n, v in joint.items())
    else:
        cand_vals = {**s.inc, knob.name: value}
        name, text = knob.name, knob.format(value)
    cfg = s.config(cand_vals)
    key, inc_key = s.key(cand_vals), s.key(s.inc)
    s.about = text if name is None else f"{name}={text}"
    cand: list[_Run] = []
    inc_failures = 0
    since = -1  # runs before this trial are not time-adjacent evidence (see below)
    moved = 0  # load shifts seen during this evaluation
    last: Role | None = None
    while True:
        window_inc = [r for r in s.ledger.runs.get(inc_key, []) if r.index >= since]
        window_cand = [r for r in cand if r.index >= since]
        if cand:
            v = None
            if window_inc and window_cand:
                # time-adjacent: incumbent and candidate interleaved and balanced in time.
                # An incumbent run too many at the window's start (I I C I after the
                # baseline) unbalances it: its balanced part (I C I) is judged, while the
                # next run still balances the whole window (fewer runs: less power)
                judged = balanced_window(window_inc, window_cand, s.settings.balance)
                v = judge(s, (inc_key, key), judged, window_cand)
                # a shift between two runs inside the window (earlier ones do no harm:
                # the window's runs all come after them)
                found, pending = load_shifts(s, since, (inc_key, key))
                decision, v = keep.read_window(v, found, pending)
                if decision == "restart":
                    moved += len(found)
                    since = max(sh.trial for sh in found)
                elif decision == "keep":
                    s.inc = cand_vals
                    if name is not None:
                        g = s.gain_by_knob.get(name, 0.0)
                        s.gain_by_knob[name] = (1 + g) * (1 + v.gain) - 1
                    return finish(s, name, text, v)
            if v is None or not v.adjacent:
                # no adjacent evidence yet: the recent incumbent runs can still show
                # that the candidate is not worth more runs (rejecting needs no adjacency)
                recent = s.ledger.recent(inc_key, s.budget.trials)
                if recent:
                    v = keep.not_kept(judge(s, (inc_key, key), recent, cand))
            if v is not None:
                s.looking = (s.about, v)
                balanced = len(window_inc) >= len(window_cand)
                end = keep.ends(
                    v, runs=len(cand), balanced=balanced, shifts=moved, settings=s.settings
                )
                if end is not None:
                    return finish(s, name, text, end)
        if cand and keep.incumbent_next(window_inc, window_cand, last, s.settings.balance):
            m = yield _Request(s.config(s.inc), None, None, "incumbent", name, tuple(joint or ()))
            last = "incumbent"
            if isinstance(m, _Cancel):
                s.looking = None
                return None
            if s.ledger.record(inc_key, m, s.budget.trials - 1, s.about) is None:
                inc_failures += 1
                if inc_failures >= 2:
                    return finish(s, name, text, keep.INCUMBENT_FAILED)
            continue
        m = yield _Request(cfg, name, text, "candidate", name, tuple(joint or ()))
        last = "candidate"
        if isinstance(m, _Cancel):
            s.looking = None
            return None
        if s.ledger.record(key, m, s.budget.trials - 1, s.about) is None:
            if knob is not None:
                s.steps.forbid(knob, value, s.inc[knob.name])
            return finish(s, name, text, keep.failed_candidate(m))
        cand.append(s.ledger.runs[key][-1])
        if since < 0:
            # the incumbent's runs just before the first candidate run are adjacent
            # (a candidate rejected after one run may sit in between)
            since = cand[0].index - s.settings.adjacent_gap


def judge(s: State, keys: tuple[Key, Key], inc: Sequence[_Run], cand: Sequence[_Run]) -> Verdict:
    """:func:`optimizer.verdict.compare` with the session's settings and learnt noise
    (``keys``: the two configs, whose runs the noise estimate leaves out)."""
    run_sd, prior_df = s.ledger.noise(keys)
    return compare(
        inc,
        cand,
        min_gain=s.min_gain,
        alpha=s.settings.alpha,
        run_sd=run_sd,
        prior_df=prior_df,
        lower_is_better=s.objective_spec.lower_is_better,
        limits=s.limits_lat,
        balance=s.settings.balance,
    )


def load_shifts(
    s: State, since: int, pair: tuple[Key, Key], *, after: bool = False
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
    for sh in s.ledger.shifts:
        if (sh.trial <= since if after else sh.earlier < since) or sh.key not in pair:
            continue
        other = pair[1] if sh.key == pair[0] else pair[0]
        witness = s.ledger.witness(sh, other)
        if witness is None:
            if (sh.change < 0) == (sh.key == pair[0]):
                pending.append(sh)
            continue
        host = sh.moved_alike(witness)
        if (sh.trial, sh.earlier) not in s.read:
            s.read.add((sh.trial, sh.earlier))
            s.shift_readings.append(sh.reading(witness, host))
        if host:
            found.append(sh)
    return found, pending


def finish(s: State, name: str | None, text: str, v: Verdict) -> Verdict:
    """Record the verdict that ends an evaluation (the façade returns it from register)."""
    s.verdicts.append((s.budget.trials - 1, name or "", text, v))
    s.out = v
    s.looking = None
    return v
