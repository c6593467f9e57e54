"""An independent comparison of named configs: interleaved rounds, levels, paired gains.

``knobtune compare`` (app/compare/) runs every config once per round on one target, in
an order shuffled anew for each round from a recorded seed: randomized interleaved trials
(Abedi and Brecht, ICPE 2017). Whatever drifts during a comparison (a cache filling,
autovacuum, the host's other jobs) then falls on every config alike, and no config
always runs first or last. This module is the part without I/O:

* :func:`round_orders`: each round's order, from the seed (reproducible);
* :func:`summarize`: each config's median level over its runs, with a bootstrap 95%
  interval (levels are "higher is better"; for a time objective the figure shown is the
  time, 1 / level);
* :func:`paired_gain`: a config against the reference from the per-round log ratios of
  their levels: gain = exp(mean(log C_r - log R_r)) - 1 (for a time, the fraction of time
  saved), its 95% interval and the two-sided p-value of a paired t test. Pairing within a
  round cancels slow drift. It uses the verdict's t distribution (optimizer/verdict.py)
  but not its keep rule: the verdict's test is one-sided and moderated by a prior drift
  (a decision to keep); a comparison reports what its rounds show, both ways;
* :func:`check_config`: a config's settings against the catalogue and the server's own
  ``pg_settings`` rows (names, values, the server's limits, memory), one message for all
  of its problems.

Pure: numpy/scipy only.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from optimizer.catalogue import CATALOGUE
from optimizer.knobs import Config, Knob, KnobError, KnobValueError, SettingRow, unit_family
from optimizer.verdict import t_ppf, t_sf

ALPHA = 0.05
"""A gain whose p-value is at least this is reported as not significant."""
BOOTSTRAP = 10_000
"""Bootstrap resamples of a config's median level."""
# Settings that allocate memory: a value above the server's memory is refused outright
# (a sanity ceiling, not a model of what fits: a comparison is where a user tries 75%).
ALLOCATING = ("shared_buffers", "wal_buffers", "work_mem", "maintenance_work_mem")
ALLOCATING_OR_UNSET = ("autovacuum_work_mem",)  # -1: use maintenance_work_mem
MAX_VALUE_CHARS = 200
_WIDE = float(2**31 - 1)  # a range for a pg_settings row without min_val/max_val


def round_orders(n: int, rounds: int, seed: int) -> list[list[int]]:
    """Per round, the order in which the ``n`` configs run: a fresh random permutation
    of ``range(n)`` for each round, from ``seed``."""
    if n < 1 or rounds < 0:
        raise ValueError(f"need at least one config and no negative rounds ({n}, {rounds})")
    rng = np.random.default_rng(seed)
    return [[int(i) for i in rng.permutation(n)] for _ in range(rounds)]


@dataclass(frozen=True)
class PairedGain:
    """A config against the reference, from the rounds where both ran completely."""

    gain: float | None  # fraction better (a time objective: fraction of time saved)
    ci95: tuple[float, float] | None
    p_value: float | None  # two-sided; None with fewer than 2 rounds or no spread at all
    rounds: int  # rounds in which both have a level

    @property
    def significant(self) -> bool:
        return self.p_value is not None and self.p_value < ALPHA

    def to_json(self) -> dict[str, Any]:
        """Rounded as the published results show them (gain 4 places, p 5)."""
        return {
            "gain": None if self.gain is None else round(self.gain, 4),
            "ci95": None if self.ci95 is None else [round(x, 4) for x in self.ci95],
            "p_value": None if self.p_value is None else round(self.p_value, 5),
            "rounds": self.rounds,
        }


def paired_gain(
    c: Sequence[float | None], ref: Sequence[float | None], lower_is_better: bool = False
) -> PairedGain:
    """Gain of ``c`` over ``ref`` from per-round log ratios of their levels (higher is
    better; None: that round's run had no level), over the rounds where both have one.

    ``lower_is_better``: the objective is a time; the gain is the fraction of time saved.
    Given any positive quantity (a latency, a volume), the "gain" is its paired change:
    the geometric mean of the rounds' ratios, minus 1.
    """
    if len(c) != len(ref):
        raise ValueError(f"{len(c)} rounds against {len(ref)}: pair them round by round")
    pairs = [(x, y) for x, y in zip(c, ref, strict=True) if x is not None and y is not None]
    for x, y in pairs:
        if not (x > 0 and y > 0 and math.isfinite(x) and math.isfinite(y)):
            raise ValueError(f"levels must be positive and finite, not {x!r} / {y!r}")
    if not pairs:
        return PairedGain(None, None, None, 0)
    d = np.log([x for x, _ in pairs]) - np.log([y for _, y in pairs])
    n = int(d.size)
    mean = float(d.mean())
    sd = float(d.std(ddof=1)) if n > 1 else 0.0
    half, p = 0.0, None
    if n > 1 and sd > 0:
        se = sd / math.sqrt(n)
        half = t_ppf(0.975, n - 1) * se
        p = min(1.0, 2.0 * t_sf(abs(mean) / se, n - 1))

    def gain(x: float) -> float:
        return -math.expm1(-x) if lower_is_better else math.expm1(x)

    return PairedGain(gain(mean), (gain(mean - half), gain(mean + half)), p, n)


def gain_text(est: PairedGain | Mapping[str, Any]) -> str:
    """A paired gain as text: "+12.3% [+4.0%, +21.2%] p=0.012", "not significant" added
    when p >= ALPHA, "not measured" without a complete round."""
    g = est.to_json() if isinstance(est, PairedGain) else est
    if g["gain"] is None:
        return "not measured"
    low, high = g["ci95"]
    p = g["p_value"]
    text = f"{g['gain']:+.1%} [{low:+.1%}, {high:+.1%}]"
    if p is None:
        return text + (" (one round)" if g["rounds"] < 2 else " (no spread between rounds)")
    text += f" p={p:.2g}"
    return text if p < ALPHA else text + " not significant"


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def summarize(
    levels: Mapping[str, Sequence[float | None]], lower_is_better: bool = False, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """Per config: the median complete run in the objective's units (tps; for a time
    objective ms, the level being 1 / time) with a bootstrap 95% interval, every run
    (None: no level) and how many had no level."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, Any]] = {}
    unit = "ms" if lower_is_better else "tps"
    for label, runs in levels.items():
        xs = [x for x in runs if x is not None]
        if not xs:
            out[label] = {
                "unit": unit,
                "median": None,
                "ci95": None,
                "runs": list(runs),
                "incomplete_runs": len(runs),
            }
            continue
        arr = 1.0 / np.array(xs) if lower_is_better else np.array(xs)
        boots = np.median(rng.choice(arr, size=(BOOTSTRAP, arr.size), replace=True), axis=1)
        out[label] = {
            "unit": unit,
            "median": _sig(float(np.median(arr))),
            "ci95": [
                _sig(float(np.percentile(boots, 2.5))),
                _sig(float(np.percentile(boots, 97.5))),
            ],
            "runs": [None if x is None else _sig(1.0 / x if lower_is_better else x) for x in runs],
            "incomplete_runs": len(runs) - len(xs),
        }
    return out


# -- the settings of a config ------------------------------------------------------------
def _limit(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_config(
    settings: Mapping[str, str],
    rows: Mapping[str, SettingRow],
    *,
    ram_bytes: int | None = None,
    allow_unsafe: bool = False,
) -> Config:
    """The settings, checked: every name a catalogue knob the server has, every value one
    PostgreSQL accepts for it (its type, units and enum values, within the server's
    min_val/max_val), no memory setting above the server's memory (``ram_bytes``), no
    durability-unsafe knob without ``allow_unsafe``. Returns them with names lower-cased;
    raises :class:`KnobError` naming every problem and what to change."""
    problems: list[str] = []
    out: Config = {}
    for raw, value in settings.items():
        name = str(raw).strip().lower()
        spec = CATALOGUE.get(name)
        if spec is None:
            close = difflib.get_close_matches(name, list(CATALOGUE), n=2, cutoff=0.6)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            problems.append(f"{str(raw)[:100]!r} is not a knob knobtune compares{hint}")
            continue
        if name in out:
            problems.append(f"{name} is given twice")
            continue
        if not isinstance(value, str) or not value.strip() or len(value) > MAX_VALUE_CHARS:
            problems.append(f"{name}: give its value as text of 1-{MAX_VALUE_CHARS} characters")
            continue
        if spec.durability_unsafe and not allow_unsafe:
            problems.append(
                f"{name} is durability-unsafe ({spec.description}); remove it or allow_unsafe "
                "(a crash during the comparison may then lose commits)"
            )
            continue
        row = rows.get(name)
        if row is None:
            problems.append(f"the server has no setting {name} (another PostgreSQL version)")
            continue
        text = value.strip()
        low, high = _limit(row.min_val), _limit(row.max_val)
        try:
            knob = Knob.from_row(row)
            if knob.kind in ("integer", "real"):  # its messages show the server's range
                knob = dataclasses.replace(
                    knob,
                    lower=-_WIDE if low is None else low,
                    upper=_WIDE if high is None else high,
                )
            parsed = knob.parse(text)
        except (KnobError, KnobValueError) as exc:
            problems.append(str(exc))
            continue
        if isinstance(parsed, float):
            sentinel = name in ALLOCATING_OR_UNSET and parsed == -1
            if not sentinel and (
                (low is not None and parsed < low) or (high is not None and parsed > high)
            ):
                shown = [knob.format(x) for x in (low, high) if x is not None]
                problems.append(
                    f"{name} = {text!r} is outside what the server accepts ({' to '.join(shown)})"
                )
                continue
            family = unit_family(row.unit)
            if (
                ram_bytes
                and family is not None
                and family[0] == "memory"
                and name in ALLOCATING + ALLOCATING_OR_UNSET
                and parsed * family[1] > ram_bytes
            ):
                problems.append(
                    f"{name} = {text!r} ({_gib(parsed * family[1])}) is more than the server's "
                    f"memory ({_gib(ram_bytes)}); give a smaller value"
                )
                continue
        out[name] = text
    if problems:
        raise KnobError("; ".join(problems))
    return out
