"""Keep-or-revert verdict from per-second benchmark samples.

How the verdict works, and why
------------------------------
The unit of evidence is the **benchmark run**, not the second. Per-second samples
inside a run are autocorrelated (lag-1 autocorrelation 0.25-0.3 in the recorded TPC-B
runs) and whole runs drift: 16 identical 12 s TPC-B runs had run medians with a CV of
6.5% while seconds inside a run varied ~9%, and runs ten minutes apart differed by up to
14% (docs/architecture.md). A test on pooled seconds treats 60 correlated seconds as 60 independent
observations and calls that drift "significant": the textbook rule "keep if the median
went up" keeps a no-op change about half the time.

So each run is collapsed to one number and its own uncertainty:

* centre = 20%-trimmed mean of the log per-second samples. It estimates the log median
  (the objective) but is ~1.5x more efficient than the sample median and ignores
  outlier seconds (checkpoint stalls);
* within-run variance of that centre from the winsorised spread, inflated by
  (1 + phi) / (1 - phi) for the run's lag-1 autocorrelation phi (the AR(1) effective
  sample size).

The two configs are then compared on run centres with a one-sided Student t test whose
per-run variance is *moderated*: between-run drift is a prior (sd 6% of the run level,
worth 4 degrees of freedom; the recorded TPC-B repeats give 4.8%, the sort-heavy
repeats 8%) pooled with the replicate runs actually observed, plus each run's within-run
variance. One run per side is therefore judged against the drift the machine is known to
have, instead of against zero, and more replicates let the data speak.

A candidate is kept only when the estimated gain is at least ``min_gain`` **and** the
p-value of "no improvement" is below ``alpha``. The coordinate descent calls this same
function after every run of a candidate (a group-sequential design: stop early when the
evidence is clear either way, add interleaved runs while it is not); ``alpha`` = 0.03 is
the per-look level. Figures from bench/optimizer.py (simulated runs of 60 s, per-second
CV 25%, AR(1) 0.3, between-run drift sd 5%, 2% outlier seconds):

* no-op candidates kept over whole descent sessions: 1.7% (3.0% with drift sd 8% and
  AR(1) 0.5); "keep if the median rose": 50%;
* +15% candidates kept: 94%; +5%: 26% (a +5% step is not provable in a few runs);
* recorded pgbench runs (tests/data/pgbench-noise.json): identical TPC-B configs kept
  0 of 56 single-run pairs and 0 of 12 two-run pairs; the real +40% work_mem effect is
  kept in 25 of 32 single-run pairs and with all runs (gain +44.6%).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Literal, TypeVar

import numpy as np


@functools.cache
def special() -> ModuleType:
    """scipy.special, imported on first use. Not scipy.stats: the same t and normal
    distribution functions (scipy.stats computes them with these) without the 1-3 s its
    import costs. And not at import: scipy.special still takes 0.2-0.3 s of CPU, which a CLI
    call that judges no run (status, export) need not pay."""
    import scipy.special

    module: ModuleType = scipy.special
    return module


Objective = Literal["throughput", "latency_p95"]


def t_sf(t: float, dof: float) -> float:
    """P(T > t) for Student's t with ``dof`` degrees of freedom (any real dof > 0)."""
    return float(special().stdtr(dof, -t))


def t_ppf(q: float, dof: float) -> float:
    """The ``q`` quantile of Student's t with ``dof`` degrees of freedom."""
    return float(special().stdtrit(dof, q))


ALPHA = 0.03
"""Per-look significance level (one-sided)."""
RUN_SD = 0.06
"""Prior between-run sd of a run's log level (drift), from the recorded pgbench repeats."""
PRIOR_DF = 4.0
"""Weight of that prior in degrees of freedom (as if 4 replicate runs had shown it)."""
TRIM = 0.2
"""Fraction trimmed from each end of a run's log samples."""
SHIFT_Z = 3.0
"""Two runs of one config this many noise sds apart: the server's load moved (a shift)."""
_MAX_PHI = 0.9


@dataclass(frozen=True)
class Verdict:
    """The decision on one candidate, with the evidence behind it.

    ``gain`` is always "fraction better" (positive = improvement): for throughput the
    ratio of run levels minus one, for latencies and query times the fraction of time
    saved. ``ci`` is its 95% interval. ``adjacent``: the estimate rests on runs of both
    configs interleaved and balanced in time (see :func:`compare`), so a shift in load
    between them cannot pass for an effect. ``shift``: runs of one config moved more than
    the noise allows while it was measured (see :func:`shifts`).
    """

    keep: bool
    gain: float
    p_value: float | None
    reason: str
    se: float | None = None  # standard error of the log ratio
    runs: tuple[int, int] = (0, 0)  # (incumbent runs, candidate runs) judged
    ci: tuple[float, float] | None = None
    adjacent: bool = False
    shift: bool = False


@dataclass(frozen=True)
class RunStat:
    """One run collapsed to its log level (higher is better) and the variance of that level."""

    centre: float
    within_var: float
    seconds: int  # seconds (per-second evidence) or transactions (per-transaction evidence)


@dataclass(frozen=True)
class Run:
    """A run as the verdict sees it: when it ran, its level, and latencies for constraints."""

    t: float  # when it ran (the trial number: runs are about equally long)
    stat: RunStat
    # log latencies (higher is worse) by name, for limits such as {"p99": 0.1}
    latency: Mapping[str, float] = field(default_factory=dict)


def _clean(samples: Sequence[float], what: str) -> np.ndarray:
    try:
        x = np.asarray(samples, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: samples must be numbers") from exc
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"{what}: a run needs at least one per-second sample")
    if not np.all(np.isfinite(x)) or np.any(x < 0):
        raise ValueError(f"{what}: samples must be finite and non-negative")
    return x


def run_stat(
    samples: Sequence[float], what: str = "run", *, lower_is_better: bool = False
) -> RunStat:
    """Collapse a run's per-second samples (warm-up already removed) to a :class:`RunStat`.

    ``lower_is_better`` (per-second latencies): the level is the negated log, so that a
    higher level is always better.
    """
    x = _clean(samples, what)
    sign = -1.0 if lower_is_better else 1.0
    med = float(np.median(x))
    if med <= 0:
        # a run that mostly did nothing: give it a level far below anything real
        return RunStat(centre=sign * math.log(1e-9), within_var=0.0, seconds=int(x.size))
    # zeros (a stalled second) would be -inf in logs; they are outliers, trimming handles them
    y = np.log(np.maximum(x, med * 1e-3))
    n = y.size
    # Counting noise: a run's throughput is at best as exact as a Poisson count of its
    # transactions, var(log rate) >= 1/N. At thousands of tps this is nil; at 10 tps over
    # 2 s (short test runs, long queries) it dominates what 2-3 samples can show.
    floor = 1.0 / max(float(np.sum(x)), 1.0) if not lower_is_better else 0.0
    if n < 3:
        return RunStat(centre=sign * float(np.mean(y)), within_var=floor, seconds=n)
    k = math.floor(TRIM * n)
    ys = np.sort(y)
    centre = float(np.mean(ys[k : n - k]))
    lo, hi = ys[k], ys[n - k - 1]
    w = np.clip(y, lo, hi)  # winsorised series, kept in time order for the autocorrelation
    s2 = float(np.var(w, ddof=1))
    d = w - w.mean()
    denom = float(np.dot(d, d))
    phi = float(np.dot(d[:-1], d[1:]) / denom) if denom > 0 else 0.0
    phi = min(max(phi, 0.0), _MAX_PHI)
    # Tukey-McLaughlin: var(trimmed mean) ~ winsorised variance / (n (1 - 2g)^2),
    # times the AR(1) factor because n correlated seconds carry less information
    g = k / n
    var = s2 / (n * (1 - 2 * g) ** 2) * (1 + phi) / (1 - phi)
    return RunStat(centre=sign * centre, within_var=max(var, floor), seconds=n)


def _gain(d: float, lower_is_better: bool) -> float:
    return -math.expm1(-d) if lower_is_better else math.expm1(d)


def compare(
    incumbent: Sequence[Run],
    candidate: Sequence[Run],
    *,
    min_gain: float = 0.02,
    alpha: float = ALPHA,
    run_sd: float = RUN_SD,
    prior_df: float = PRIOR_DF,
    lower_is_better: bool = False,
    limits: Mapping[str, float] | None = None,
    balance: float = 0.5,
) -> Verdict:
    """Keep the candidate only if it is at least ``min_gain`` better and credibly so.

    A one-sided t test on the run levels: the effect is the difference of the two
    configs' mean levels, its variance moderated: the prior between-run drift (``run_sd``,
    worth ``prior_df`` degrees of freedom) pooled with the runs' scatter around their
    config's mean, plus the runs' own within-run variance.

    The verdict is ``adjacent`` when the two configs' runs are interleaved in time (some
    incumbent run before some candidate run and vice versa) and balanced (their mean times
    at most half a run apart: A B A, B A B, A B B A, A B A B A ...). Then a linear drift
    cancels in the difference, and a step in the server's load inside the window shows up
    as scatter (wider uncertainty) instead of as an effect. (A fitted time trend would
    cancel the drift too, but it spends the one degree of freedom that shows a step in
    A B A.) ``limits``: latency names (``Run.latency``) and the worsening each may have,
    as fractions.
    """
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    if not incumbent or not candidate:
        raise ValueError("need at least one run of each config")
    runs = [*incumbent, *candidate]
    y = np.array([r.stat.centre for r in runs])
    w = np.array([r.stat.within_var for r in runs])
    c = np.array([0.0] * len(incumbent) + [1.0] * len(candidate))
    adjacent = _adjacent(incumbent, candidate, balance)
    x = np.column_stack([np.ones_like(y), c])
    inv = np.linalg.inv(x.T @ x)
    beta = inv @ x.T @ y
    resid = y - x @ beta
    df = len(runs) - 2
    var = _moderated_var(float(resid @ resid), df, float(w.mean()), run_sd, prior_df)
    se = math.sqrt(var * float(inv[1, 1]))
    return _decide(
        incumbent, candidate, float(beta[1]), se, prior_df + df, adjacent,
        min_gain=min_gain, alpha=alpha, lower_is_better=lower_is_better, limits=limits,
    )  # fmt: skip


def _adjacent(incumbent: Sequence[Run], candidate: Sequence[Run], balance: float) -> bool:
    """Interleaved in time (an incumbent run before some candidate run and vice versa)
    and balanced (mean times at most ``balance`` runs apart): see :func:`compare`."""
    ti = [r.t for r in incumbent]
    tc = [r.t for r in candidate]
    interleaved = min(ti) < max(tc) and min(tc) < max(ti)
    return interleaved and abs(sum(ti) / len(ti) - sum(tc) / len(tc)) <= balance


R = TypeVar("R", bound=Run)


def balanced_window(incumbent: Sequence[R], candidate: Sequence[Run], balance: float) -> list[R]:
    """The incumbent's runs to judge ``candidate`` against: all of them when the window is
    interleaved and balanced in time, else without its earliest ones, as few as balance it.

    I I C I (two baseline runs, a candidate, an incumbent re-run) is judged as I C I, so a
    clear gain is kept after four runs instead of five: on a session of 330 s runs the
    fifth is the one a 30-minute budget does not hold. A run is dropped only while an
    incumbent run stays before the first candidate run, so every candidate run stays
    bracketed; when no such trim balances the window, all runs are returned (the verdict
    is then not adjacent).
    """
    inc = sorted(incumbent, key=lambda r: r.t)
    if not inc or not candidate:
        return inc
    first = min(r.t for r in candidate)
    for k in range(len(inc)):
        part = inc[k:]
        if part[0].t >= first:  # no incumbent run before the first candidate run is left
            break
        if _adjacent(part, candidate, balance):
            return part
    return inc


def _moderated_var(rss: float, df: int, w_bar: float, run_sd: float, prior_df: float) -> float:
    """A run level's variance: the prior drift (``run_sd``, worth ``prior_df`` degrees of
    freedom) plus the mean within-run variance ``w_bar``, pooled with the runs' scatter
    (``rss`` on ``df`` degrees of freedom); never below ``w_bar``."""
    prior_var = run_sd**2 + w_bar
    var = (prior_df * prior_var + rss) / (prior_df + df) if prior_df + df > 0 else prior_var
    return max(var, w_bar, 1e-12)


def detectable_gain(
    incumbent: Sequence[Run],
    candidate_runs: int,
    *,
    min_gain: float = 0.02,
    alpha: float = ALPHA,
    run_sd: float = RUN_SD,
    prior_df: float = PRIOR_DF,
    lower_is_better: bool = False,
) -> float:
    """The smallest gain :func:`compare` keeps for a candidate of ``candidate_runs`` runs
    against ``incumbent``, if the candidate's runs scatter as the incumbent's do.

    What a session that kept nothing could have seen: effects below it were not ruled
    out. The variance is :func:`compare`'s (the prior pooled with the incumbent's scatter,
    scaled to both sides' degrees of freedom, plus the within-run variance), and the gain
    is where the one-sided t test reaches ``alpha``; never below ``min_gain``.
    """
    if not incumbent or candidate_runs < 1:
        raise ValueError("need at least one run of the incumbent and one of a candidate")
    ni, nc = len(incumbent), candidate_runs
    y = np.array([r.stat.centre for r in incumbent])
    w_bar = float(np.mean([r.stat.within_var for r in incumbent]))
    df = ni + nc - 2
    rss = float(((y - y.mean()) ** 2).sum()) * df / (ni - 1) if ni > 1 else 0.0
    se = math.sqrt(_moderated_var(rss, df, w_bar, run_sd, prior_df) * (1 / ni + 1 / nc))
    q = t_ppf(1 - alpha, prior_df + df) if prior_df + df > 0 else float(special().ndtri(1 - alpha))
    return max(_gain(q * se, lower_is_better), min_gain)


def adjacent_pairs(
    incumbent: Sequence[Run], candidate: Sequence[Run], gap: float = 2.0
) -> list[tuple[Run, Run]]:
    """Each candidate run (in time order) with the nearest unused incumbent run at most
    ``gap`` trials away: the runs a paired comparison sets side by side."""
    free = sorted(incumbent, key=lambda r: r.t)
    out = []
    for c in sorted(candidate, key=lambda r: r.t):
        near = [i for i in free if abs(i.t - c.t) <= gap]
        if near:
            best = min(near, key=lambda i: (abs(i.t - c.t), i.t))
            free.remove(best)
            out.append((best, c))
    return out


def compare_paired(
    incumbent: Sequence[Run],
    candidate: Sequence[Run],
    *,
    min_gain: float = 0.02,
    alpha: float = ALPHA,
    run_sd: float = RUN_SD,
    prior_df: float = PRIOR_DF,
    lower_is_better: bool = False,
    limits: Mapping[str, float] | None = None,
) -> Verdict:
    """:func:`compare` on differences of runs next to each other in time: a measured
    alternative, not what the descent uses.

    Where whole runs drift and runs next to each other drift together, the difference of
    adjacent runs carries less of the drift than the difference of two groups' means.
    The variance of a difference is moderated like :func:`compare`'s: the unpaired prior
    (2 x ``run_sd``^2, worth ``prior_df`` degrees of freedom, no credit for the pairing
    until the data show it) pooled with the observed differences' scatter, plus the
    runs' within-run variance. Runs with no partner within 2 trials are not used; with no
    pair at all this is :func:`compare`.

    Why the descent does not use it: on the recorded long-query runs
    (bench/optimizer.py --recorded, windows of adjacent runs, up to 3 per side) it was no
    better overall. Quiet host, +27% effect: kept 10 of 11 either way, a no-op 1 of 12
    paired against 0 of 12; quiet, +13%: 7 of 11 against 4 of 11; niced, +17.5%: 4 of 11
    against 7 of 11.
    """
    pairs = adjacent_pairs(incumbent, candidate)
    if not pairs:
        return compare(
            incumbent, candidate, min_gain=min_gain, alpha=alpha, run_sd=run_sd,
            prior_df=prior_df, lower_is_better=lower_is_better, limits=limits,
        )  # fmt: skip
    d = np.array([c.stat.centre - i.stat.centre for i, c in pairs])
    w = float(np.mean([i.stat.within_var + c.stat.within_var for i, c in pairs]))
    n = d.size
    rss = float(((d - d.mean()) ** 2).sum())
    prior_var = 2 * run_sd**2 + w
    var = max((prior_df * prior_var + rss) / (prior_df + n - 1), w, 1e-12)
    inc, cand = [i for i, _ in pairs], [c for _, c in pairs]
    return _decide(
        inc, cand, float(d.mean()), math.sqrt(var / n), prior_df + n - 1, True,
        min_gain=min_gain, alpha=alpha, lower_is_better=lower_is_better, limits=limits,
    )  # fmt: skip


def _decide(
    incumbent: Sequence[Run],
    candidate: Sequence[Run],
    d: float,
    se: float,
    dof: float,
    adjacent: bool,
    *,
    min_gain: float,
    alpha: float,
    lower_is_better: bool,
    limits: Mapping[str, float] | None,
) -> Verdict:
    """Keep or not from the log effect ``d`` and its standard error (t with ``dof``)."""
    ni, nc = len(incumbent), len(candidate)
    tstat = d / se
    p = t_sf(tstat, dof) if dof > 0 else float(special().ndtr(-tstat))
    q = t_ppf(0.975, dof) if dof > 0 else 1.96
    gain = _gain(d, lower_is_better)
    ci = (_gain(d - q * se, lower_is_better), _gain(d + q * se, lower_is_better))
    n = (ni, nc)

    def verdict(keep: bool, reason: str) -> Verdict:
        return Verdict(keep, gain, p, reason, se, n, ci, adjacent)

    for name, limit in (limits or {}).items():
        li = [r.latency[name] for r in incumbent if name in r.latency]
        lc = [r.latency[name] for r in candidate if name in r.latency]
        if len(li) == ni and len(lc) == nc:
            worse = math.expm1(float(np.mean(lc) - np.mean(li)))
            if worse > limit:
                return verdict(
                    False, f"rejected: {name} latency {worse:+.1%} worse, limit {limit:.0%}"
                )
    if gain < min_gain:
        return verdict(
            False, f"rejected: gain {gain:+.1%} below min_gain {min_gain:.0%} (p={p:.3f})"
        )
    if p >= alpha:
        return verdict(
            False, f"rejected: gain {gain:+.1%} not credible (p={p:.3f} >= {alpha}, {ni}+{nc} runs)"
        )
    return verdict(True, f"kept: gain {gain:+.1%} (p={p:.3f}, {ni}+{nc} runs)")


def shifts(series: Sequence[Run], run_sd: float = RUN_SD) -> list[tuple[Run, Run, float]]:
    """Consecutive runs of one config (in time order) further apart than noise allows.

    Returns (earlier, later, z) for each pair with ``|z| > SHIFT_Z``, where ``z`` is their
    difference in units of the prior noise of a difference (``run_sd`` each, plus their
    within-run variances). The prior, not the session's learnt noise: a shift must not
    excuse itself by inflating the noise it is measured against.
    """
    ordered = sorted(series, key=lambda r: r.t)
    out = []
    for a, b in itertools.pairwise(ordered):
        sd = math.sqrt(2 * run_sd**2 + a.stat.within_var + b.stat.within_var)
        z = (b.stat.centre - a.stat.centre) / sd
        if abs(z) > SHIFT_Z:
            out.append((a, b, z))
    return out


def judge(
    incumbent_runs: Sequence[Sequence[float]],
    candidate_runs: Sequence[Sequence[float]],
    *,
    min_gain: float = 0.02,
    objective: Objective = "throughput",
    alpha: float = ALPHA,
    run_sd: float = RUN_SD,
    prior_df: float = PRIOR_DF,
    max_p99_worsening: float | None = None,
    incumbent_p99: Sequence[float] = (),
    candidate_p99: Sequence[float] = (),
) -> Verdict:
    """:func:`compare` on runs of per-second samples, grouped (no time term).

    ``*_runs`` are benchmark runs in the order they ran, each a list of per-second values
    with warm-up removed: throughput (higher is better) or, for ``latency_p95``, per-second
    p95 latencies (lower is better). ``*_p99`` are per-run p99 latencies for the optional
    constraint that p99 may not worsen by more than ``max_p99_worsening`` (a fraction).
    Raises ValueError on malformed input.
    """
    if objective not in ("throughput", "latency_p95"):
        raise ValueError(f"objective must be 'throughput' or 'latency_p95', not {objective!r}")
    lower = objective == "latency_p95"
    if len(incumbent_runs) == 0:
        raise ValueError("incumbent: need at least one run")
    if len(candidate_runs) == 0:
        raise ValueError("candidate: need at least one run")

    def runs(side: Sequence[Sequence[float]], p99: Sequence[float], what: str) -> list[Run]:
        out = []
        for i, r in enumerate(side):
            st = run_stat(r, f"{what} run {i + 1}", lower_is_better=lower)
            lat = {}
            if max_p99_worsening is not None and len(p99) == len(side):
                v = float(_clean(p99, f"{what} p99")[i])
                if v > 0:
                    lat["p99"] = math.log(v)
            out.append(Run(float(i), st, lat))
        return out

    inc = runs(incumbent_runs, incumbent_p99, "incumbent")
    cand = runs(candidate_runs, candidate_p99, "candidate")
    ok = all("p99" in r.latency for r in inc + cand)
    return compare(
        inc,
        cand,
        min_gain=min_gain,
        alpha=alpha,
        run_sd=run_sd,
        prior_df=prior_df,
        lower_is_better=lower,
        limits={"p99": max_p99_worsening} if max_p99_worsening is not None and ok else None,
    )
