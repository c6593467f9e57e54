"""Keep-or-revert verdict from per-second benchmark samples.

How the verdict works, and why
------------------------------
The unit of evidence is the **benchmark run**, not the second. Per-second samples
inside a run are autocorrelated (lag-1 autocorrelation 0.25-0.3 in the recorded TPC-B
runs) and whole runs drift: 16 identical 12 s TPC-B runs had run medians with a CV of
6.5% while seconds inside a run varied ~9%, and runs ten minutes apart differed by up to
14% (DESIGN.md). A test on pooled seconds treats 60 correlated seconds as 60 independent
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

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

Objective = Literal["throughput", "latency_p95"]

ALPHA = 0.03
"""Per-look significance level (one-sided)."""
RUN_SD = 0.06
"""Prior between-run sd of a run's log level (drift), from the recorded pgbench repeats."""
PRIOR_DF = 4.0
"""Weight of that prior in degrees of freedom (as if 4 replicate runs had shown it)."""
TRIM = 0.2
"""Fraction trimmed from each end of a run's log samples."""
_MAX_PHI = 0.9


@dataclass(frozen=True)
class Verdict:
    """The decision on one candidate, with the evidence behind it.

    ``gain`` is always "fraction better" (positive = improvement): for throughput the
    ratio of run levels minus one, for latency one minus the ratio.
    """

    keep: bool
    gain: float
    p_value: float | None
    reason: str
    se: float | None = None  # standard error of the log ratio
    runs: tuple[int, int] = (0, 0)  # (incumbent runs, candidate runs) judged


@dataclass(frozen=True)
class RunStat:
    """One run collapsed to its log level and the variance of that level."""

    centre: float
    within_var: float
    seconds: int


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


def run_stat(samples: Sequence[float], what: str = "run") -> RunStat:
    """Collapse a run's per-second samples (warm-up already removed) to a :class:`RunStat`."""
    x = _clean(samples, what)
    med = float(np.median(x))
    if med <= 0:
        # a run that mostly did nothing: give it a level far below anything real
        return RunStat(centre=math.log(1e-9), within_var=0.0, seconds=int(x.size))
    # zeros (a stalled second) would be -inf in logs; they are outliers, trimming handles them
    y = np.log(np.maximum(x, med * 1e-3))
    n = y.size
    if n < 3:
        return RunStat(centre=float(np.mean(y)), within_var=0.0, seconds=n)
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
    return RunStat(centre=centre, within_var=var, seconds=n)


def _levels(runs: Sequence[Sequence[float]], what: str) -> tuple[np.ndarray, np.ndarray]:
    if len(runs) == 0:
        raise ValueError(f"{what}: need at least one run")
    st = [run_stat(r, f"{what} run {i + 1}") for i, r in enumerate(runs)]
    return np.array([s.centre for s in st]), np.array([s.within_var for s in st])


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
    """Keep the candidate only if it is at least ``min_gain`` better and credibly so.

    ``*_runs`` are benchmark runs in the order they ran, each a list of per-second values
    with warm-up removed: throughput (higher is better) or, for ``latency_p95``, per-second
    p95 latencies (lower is better). ``*_p99`` are per-run p99 latencies for the optional
    constraint that p99 may not worsen by more than ``max_p99_worsening`` (a fraction).
    Raises ValueError on malformed input.
    """
    if objective not in ("throughput", "latency_p95"):
        raise ValueError(f"objective must be 'throughput' or 'latency_p95', not {objective!r}")
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    ci, wi = _levels(incumbent_runs, "incumbent")
    cc, wc = _levels(candidate_runs, "candidate")
    ni, nc = ci.size, cc.size
    sign = 1.0 if objective == "throughput" else -1.0
    d = sign * (float(cc.mean()) - float(ci.mean()))  # log ratio, positive = better
    gain = math.expm1(d) if objective == "throughput" else -math.expm1(-d)

    # moderated per-run variance: prior drift + within-run noise, pooled with replicates
    w_bar = float(np.concatenate([wi, wc]).mean())
    df = (ni - 1) + (nc - 1)
    ss = float(((ci - ci.mean()) ** 2).sum() + ((cc - cc.mean()) ** 2).sum())
    prior_var = run_sd**2 + w_bar
    var = (prior_df * prior_var + ss) / (prior_df + df) if prior_df + df > 0 else prior_var
    var = max(var, w_bar, 1e-12)
    se = math.sqrt(var * (1 / ni + 1 / nc))
    dof = prior_df + df
    t = d / se
    p = float(stats.t.sf(t, dof)) if dof > 0 else float(stats.norm.sf(t))
    runs = (ni, nc)

    if max_p99_worsening is not None and len(incumbent_p99) and len(candidate_p99):
        pi = _clean(incumbent_p99, "incumbent p99")
        pc = _clean(candidate_p99, "candidate p99")
        if pi.min() > 0 and pc.min() > 0:
            worse = math.expm1(float(np.log(pc).mean() - np.log(pi).mean()))
            if worse > max_p99_worsening:
                return Verdict(
                    False, gain, p,
                    f"rejected: p99 latency {worse:+.1%} worse, limit {max_p99_worsening:.0%}",
                    se, runs,
                )  # fmt: skip
    if gain < min_gain:
        why = f"rejected: gain {gain:+.1%} below min_gain {min_gain:.0%} (p={p:.3f})"
        return Verdict(False, gain, p, why, se, runs)
    if p >= alpha:
        why = f"rejected: gain {gain:+.1%} not credible (p={p:.3f} >= {alpha}, {ni}+{nc} runs)"
        return Verdict(False, gain, p, why, se, runs)
    return Verdict(True, gain, p, f"kept: gain {gain:+.1%} (p={p:.3f}, {ni}+{nc} runs)", se, runs)
