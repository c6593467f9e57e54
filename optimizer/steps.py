"""The values a descent steps to along one knob, and the limits failed runs put on them.

A step is multiplicative for sizes and times (x ``step_size`` ** (1 / 2**level): x4 on
the coarse first pass, then x2, x sqrt(2)), additive for bounded reals, the next choice for
enums and bools; multiplicative values are rounded to what a DBA would write. A failed
run (e.g. a server that will not start) forbids its value and everything beyond it, for
the rest of the session.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from optimizer.knobs import Knob
from optimizer.ledger import Value


@dataclass
class Limits:
    """Session-only exclusions learnt from failed runs: values at or beyond them are not tried."""

    below: float = -math.inf  # values <= below are out
    above: float = math.inf  # values >= above are out
    banned: set[int] = field(default_factory=set)  # enum/bool choice indexes that are out


class Steps:
    """Step values of every knob of a space, within the limits learnt so far."""

    def __init__(self, space: tuple[Knob, ...]) -> None:
        self.limits: dict[str, Limits] = {k.name: Limits() for k in space}

    def within(self, knob: Knob, value: Value) -> bool:
        """``value`` is not forbidden by a failed run."""
        lim = self.limits[knob.name]
        if isinstance(value, str):
            return knob.index(value) not in lim.banned
        return lim.below < value < lim.above

    def forbid(self, knob: Knob, value: Value, cur: Value) -> None:
        """A failed run (e.g. the server would not start): never try this value or beyond again."""
        lim = self.limits[knob.name]
        if isinstance(value, str) or isinstance(cur, str):
            i, c = knob.index(str(value)), knob.index(str(cur))
            lo, hi = (i, len(knob.choices)) if i > c else (0, i + 1)
            lim.banned.update(range(lo, hi))
        elif value > cur:
            lim.above = min(lim.above, value)
        else:
            lim.below = max(lim.below, value)

    def toward_limit(self, knob: Knob, tried: set[Value], direction: int) -> Value | None:
        """Between the furthest of ``tried`` (measured, within bounds) and the bound a
        failed value set in ``direction``: their geometric mean, rounded as a step is
        (512MB refused on a 512MB server, 256MB measured: 362MB next). None when there is
        no such bound, the two are within :data:`MIN_BISECT`, or the knob is not sized."""
        return _toward_limit(knob, self.limits[knob.name], tried, direction)

    def step(
        self, knob: Knob, cur: Value, direction: int, p: int | float, distance: int
    ) -> Value | None:
        """The value ``distance`` steps from ``cur``, within bounds, or None if there is none."""
        lim = self.limits[knob.name]
        if knob.kind in ("enum", "bool"):
            i = knob.choices.index(str(cur)) + direction * distance
            if 0 <= i < len(knob.choices) and i not in lim.banned:
                return knob.choices[i]
            return None
        c = float(cur)
        if knob.step == "multiplicative":
            f: float = knob.step_size ** (1.0 / 2**p)
            if c < knob.lower or c <= 0:  # 0 ("off") or a sentinel such as -1 ("auto")
                if direction < 0:
                    return None
                target = max(knob.floor, knob.lower) * f ** (distance - 1)
            else:
                target = c * f ** (direction * distance)
                if target < knob.floor:  # below the first meaningful value: up to it, or off
                    target = knob.floor if direction > 0 else knob.lower
            target = nice(knob, target)
        else:
            step = knob.step_size / 2**p
            target = round(c + direction * distance * step, 10)
        target = min(max(target, knob.lower), knob.upper)
        if knob.kind == "integer":
            target = float(round(target))
        if target == c or not lim.below < target < lim.above:
            return None
        if (target - c) * direction <= 0:
            return None  # clamping moved it the wrong way (current value out of bounds)
        return target


MIN_BISECT = 2.0**0.25
"""toward_limit() stops once the limit is within this factor of the furthest value tried."""


def _toward_limit(knob: Knob, lim: Limits, tried: set[Value], direction: int) -> Value | None:
    if knob.step != "multiplicative" or knob.kind not in ("integer", "real"):
        return None
    edge = lim.above if direction > 0 else lim.below
    ok = [float(v) for v in tried if not isinstance(v, str) and lim.below < float(v) < lim.above]
    if not math.isfinite(edge) or edge <= 0 or not ok:
        return None
    far = max(ok) if direction > 0 else min(ok)
    if far <= 0 or max(edge, far) / min(edge, far) < MIN_BISECT:
        return None
    target = nice(knob, math.sqrt(edge * far))
    if knob.kind == "integer":
        target = float(round(target))
    if not lim.below < target < lim.above or target in tried:
        return None
    return target


def nice(knob: Knob, x: float) -> float:
    """Round a multiplicative step to a value a DBA would write (3 significant bits for sizes)."""
    if x <= 0 or knob.kind != "integer":
        return float(f"{x:.3g}") if x > 0 else x
    fam = knob.unit and knob.unit[-1] == "B"
    if fam:
        if x < 16:
            return float(round(x))
        q = 2.0 ** (math.floor(math.log2(x)) - 3)
        return round(x / q) * q
    if x < 100:
        return float(round(x))
    q = 10.0 ** (math.floor(math.log10(x)) - 1)
    return round(x / q) * q
