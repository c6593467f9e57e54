"""Client sweep analysis: where throughput stops rising with concurrency (the knee).

A benchmark is only as good as its concurrency: past the knee, more clients queue on
locks and CPUs instead of doing more work, and a tuner measures those queues, not the
configuration. The sweep runs the workload at increasing client counts, each count
at least twice (interleaved, so drift cannot pass for a knee), and this module reads
the runs.

Statistics, as in :mod:`optimizer.verdict`: the **run** is the unit of evidence. Each
run is one log level (its per-second samples are never pooled across runs). Every
count has >= 2 runs, so the spread of replicate runs around their count's mean is
pooled over all counts and moderated by the verdict's drift prior (``RUN_SD`` worth
``PRIOR_DF`` runs): a sweep of 5 counts x 2 runs has 5 degrees of freedom of its own.

* **best**: the count with the highest mean log level.
* **knee**: the smallest count that the best does *not* beat by the verdict's rule,
  i.e. the best is not both at least ``tolerance`` better and credibly better
  (one-sided t test, ``alpha``). A count 3% below the best is within; one 20% below
  with tight runs is not; one 8% below on noisy runs stays within (the evidence cannot
  tell it from the best), which the point's ``p_value`` shows.
* **latency climb**: the smallest count whose p99 latency is credibly at least
  ``latency_climb`` (default +50%) above the lowest p99 seen at fewer or equal clients.
* **advice**: a connection-pool size (the knee), the cost of a new connection per
  transaction measured at the knee (``pgbench -C``), and a warning when
  ``max_connections`` is far above the knee.

Pure: numpy/scipy only, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optimizer.verdict import ALPHA, PRIOR_DF, RUN_SD, special, t_ppf, t_sf

TOLERANCE = 0.05
"""A count within this fraction of the best throughput is "at the best"."""
LATENCY_CLIMB = 0.5
"""p99 latency this much (fraction) above its lowest so far "climbs"."""
MAX_CONN_FACTOR = 4
"""max_connections at least this many times the knee is "far above" it."""
RESERVED_CONNECTIONS = 3
"""Connections a sweep leaves free besides superuser_reserved_connections (its own probes)."""
CLIENTS_PER_CPU = 8
"""Default cap of a sweep: this many clients per CPU (past it, any workload queues)."""


@dataclass(frozen=True)
class SweepRun:
    """One run at one client count. ``tps`` None: the run failed (kept for the record)."""

    clients: int
    tps: float | None
    within_var: float = 0.0  # variance of the run's log level from its own seconds
    latency_mean_ms: float | None = None
    latency_p95_ms: float | None = None
    latency_p99_ms: float | None = None
    failed_transactions: int = 0


@dataclass(frozen=True)
class PointStat:
    """One client count, summarised over its runs."""

    clients: int
    runs: int  # successful runs
    failed_runs: int
    tps: float | None  # geometric mean of the runs' levels
    tps_low: float | None  # 95% interval of that level (moderated run variance)
    tps_high: float | None
    shortfall: float | None  # fraction below the best's level (0 for the best)
    p_value: float | None  # of "the best is no better than this count"
    within_best: bool
    unsteady: bool  # its runs disagreed far beyond the others': never taken as the knee
    latency_mean_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None  # geometric mean over runs
    failed_transactions: int


@dataclass(frozen=True)
class SweepAnalysis:
    points: list[PointStat]
    best_clients: int | None
    best_tps: float | None
    knee_clients: int | None
    knee_tps: float | None
    latency_climb_clients: int | None  # None: p99 never credibly climbed
    run_sd: float  # moderated between-run sd of a log level, as used
    dof: float
    tolerance: float
    still_rising: bool  # the knee is the largest count measured: the real one may lie beyond
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ConnectionCost:
    """Throughput at the knee with a persistent connection vs a new one per transaction."""

    clients: int
    tps_persistent: float
    tps_new_connection: float

    @property
    def throughput_loss(self) -> float:
        """Fraction of throughput lost to connecting per transaction."""
        return 1.0 - self.tps_new_connection / self.tps_persistent

    @property
    def ms_per_connection(self) -> float:
        """Extra time per transaction (per client), i.e. the cost of one new connection.

        In a closed loop each client's transaction takes clients / tps seconds.
        """
        c = self.clients
        return max(0.0, (c / self.tps_new_connection - c / self.tps_persistent) * 1000.0)


@dataclass(frozen=True)
class Advice:
    pool_size: int | None
    warnings: list[str]
    lines: list[str]  # everything, in reading order (the warnings included)


# -- the series of client counts ---------------------------------------------------------
def client_cap(
    max_connections: int, cpus: int | None, superuser_reserved: int = 3, per_cpu: int = 0
) -> int:
    """The largest count a default sweep tries: what the server lets pgbench open (leaving
    room for the sweep's own connections), and at most ``per_cpu`` clients per CPU."""
    usable = max_connections - superuser_reserved - RESERVED_CONNECTIONS
    if usable < 1:
        raise ValueError(
            f"max_connections={max_connections} leaves no connection for a benchmark "
            f"(superuser_reserved_connections={superuser_reserved})"
        )
    per = per_cpu or CLIENTS_PER_CPU
    by_cpu = per * cpus if cpus else usable
    return max(1, min(usable, by_cpu))


def doubling_series(cap: int) -> list[int]:
    """1, 2, 4, ... up to ``cap``, ending on ``cap`` itself."""
    if cap < 1:
        raise ValueError("the largest client count must be >= 1")
    out, c = [], 1
    while c < cap:
        out.append(c)
        c *= 2
    out.append(cap)
    return out


def run_order(counts: Sequence[int], repeats: int) -> list[int]:
    """The order to measure: up, down, up, ... ``repeats`` passes. Each count's runs then
    straddle the sweep's midpoint in time, so a linear drift shifts every count alike
    instead of looking like a knee."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    up = sorted(set(counts))
    if not up or up[0] < 1:
        raise ValueError("client counts must be >= 1")
    out: list[int] = []
    for r in range(repeats):
        out += up if r % 2 == 0 else up[::-1]
    return out


# -- analysis --------------------------------------------------------------------------
def _gmean(values: Sequence[float | None]) -> float | None:
    v = [x for x in values if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None


def _mean(values: Sequence[float | None]) -> float | None:
    v = [x for x in values if x is not None and math.isfinite(x)]
    return sum(v) / len(v) if v else None


def _pool(
    groups: list[np.ndarray], within: float, run_sd: float, prior_df: float
) -> tuple[float, float]:
    """Pooled replicate variance of run levels, shrunk toward the drift prior."""
    ss = sum(float(((g - g.mean()) ** 2).sum()) for g in groups if g.size > 1)
    df = float(sum(g.size - 1 for g in groups))
    prior = run_sd**2 + within
    var = (prior_df * prior + ss) / (prior_df + df) if prior_df + df > 0 else prior
    return max(var, within, 1e-12), prior_df + df


def _moderated(
    groups: dict[int, np.ndarray], within: float, run_sd: float, prior_df: float
) -> tuple[float, float, dict[int, float]]:
    """The pooled variance of the steady counts, and the unsteady counts' own variances.

    A count whose runs disagree far beyond the other counts' spread (F test at 1% against
    the pool of the others) straddled a change in the host's load (others' jobs starting
    or ending). Pooled in, that one pair would set the noise of every count; it is left
    out of the pool and judged on its own spread instead.
    """
    own: dict[int, float] = {}
    for c, g in groups.items():
        if g.size < 2:
            continue
        rest = [h for k, h in groups.items() if k != c]
        var_rest, dof_rest = _pool(rest, within, run_sd, prior_df)
        s2 = float(np.var(g, ddof=1))
        if s2 > var_rest * float(special().fdtri(g.size - 1, dof_rest, 0.99)):
            own[c] = s2
    var, dof = _pool([g for c, g in groups.items() if c not in own], within, run_sd, prior_df)
    return var, dof, own


def analyse(
    runs: Sequence[SweepRun],
    *,
    tolerance: float = TOLERANCE,
    alpha: float = ALPHA,
    latency_climb: float = LATENCY_CLIMB,
    run_sd: float = RUN_SD,
    prior_df: float = PRIOR_DF,
) -> SweepAnalysis:
    """The knee, the best and the latency climb of a sweep's runs (any order).

    Raises ValueError on malformed input (no runs, counts < 1, negative tps).
    """
    if not runs:
        raise ValueError("a sweep needs at least one run")
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    if not 0 <= tolerance < 1:
        raise ValueError("tolerance must be in [0, 1)")
    by: dict[int, list[SweepRun]] = {}
    for r in runs:
        if r.clients < 1:
            raise ValueError(f"client counts must be >= 1, got {r.clients}")
        if r.tps is not None and (not math.isfinite(r.tps) or r.tps < 0):
            raise ValueError(f"tps must be finite and >= 0, got {r.tps}")
        by.setdefault(r.clients, []).append(r)
    counts = sorted(by)
    ok = {c: [r for r in by[c] if r.tps is not None and r.tps > 0] for c in counts}
    levels = {c: np.log(np.array([r.tps for r in ok[c]], dtype=float)) for c in counts}
    measured = [c for c in counts if levels[c].size]
    within_all = [r.within_var for c in measured for r in ok[c]]
    within = float(np.mean(within_all)) if within_all else 0.0
    var, dof, own = _moderated({c: levels[c] for c in measured}, within, run_sd, prior_df)
    tcrit = t_ppf(0.975, dof)
    notes: list[str] = []
    for c in own:
        lo, hi = (math.exp(float(v)) for v in (levels[c].min(), levels[c].max()))
        notes.append(
            f"the runs at {c} clients disagree ({lo:.0f} vs {hi:.0f} tps), far beyond the "
            "other counts' spread: the host's load probably changed during the sweep; that "
            "count is judged on its own spread and is not taken as the knee"
        )

    def var_of(c: int) -> float:
        return max(var, own.get(c, 0.0))

    best = max(measured, key=lambda c: float(levels[c].mean())) if measured else None
    stat: dict[int, PointStat] = {}
    for c in counts:
        y, rs = levels[c], by[c]
        n = int(y.size)
        common: dict[str, Any] = {
            "clients": c,
            "runs": n,
            "failed_runs": len(rs) - n,
            "latency_mean_ms": _mean([r.latency_mean_ms for r in ok[c]]),
            "latency_p95_ms": _gmean([r.latency_p95_ms for r in ok[c]]),
            "latency_p99_ms": _gmean([r.latency_p99_ms for r in ok[c]]),
            "failed_transactions": sum(r.failed_transactions for r in rs),
            "unsteady": c in own,
        }
        if not n or best is None:
            stat[c] = PointStat(
                tps=None, tps_low=None, tps_high=None, shortfall=None, p_value=None,
                within_best=False, **common,
            )  # fmt: skip
            continue
        m = float(y.mean())
        half = tcrit * math.sqrt(var_of(c) / n)
        yb = levels[best]
        d = float(yb.mean()) - m  # log ratio best / this count, >= 0
        if c == best:
            p, within_best = None, True
        else:
            se = math.sqrt(var_of(best) / yb.size + var_of(c) / n)
            p = t_sf(d / se, dof)
            # the verdict's rule: the best "wins" only if enough better AND credibly so
            within_best = not (math.expm1(d) >= tolerance and p < alpha)
        stat[c] = PointStat(
            tps=math.exp(m), tps_low=math.exp(m - half), tps_high=math.exp(m + half),
            shortfall=-math.expm1(-d), p_value=p, within_best=within_best, **common,
        )  # fmt: skip

    # an unsteady count's level is unknown, not "within": the knee is a steady count
    knee = next((c for c in measured if stat[c].within_best and c not in own), best)
    # only the largest count reached the best: the curve had not flattened yet
    still_rising = knee is not None and knee == measured[-1] and len(measured) > 1
    if best is not None and knee is not None:
        if still_rising:
            notes.append(
                f"throughput still rose at the largest count measured ({best} clients): "
                "the knee may lie beyond it; sweep higher if the server allows"
            )
        if knee == measured[0] and len(measured) > 1:
            notes.append(
                f"throughput did not credibly rise past {knee} client(s): the workload is "
                "serialised (locks, a single hot row) or the host was already saturated"
            )
        last = stat[measured[-1]]
        if last.shortfall is not None and last.shortfall >= max(tolerance, 0.1):
            notes.append(
                f"past the knee throughput fell: {measured[-1]} clients gave "
                f"{last.shortfall:.0%} less than the best ({best} clients)"
            )
    for c in counts:
        if stat[c].failed_runs:
            notes.append(f"{stat[c].failed_runs} run(s) at {c} clients failed and are left out")

    climb = _latency_climb(counts, ok, latency_climb, alpha, run_sd, prior_df)
    return SweepAnalysis(
        points=[stat[c] for c in counts],
        best_clients=best,
        best_tps=stat[best].tps if best is not None else None,
        knee_clients=knee,
        knee_tps=stat[knee].tps if knee is not None else None,
        latency_climb_clients=climb,
        run_sd=math.sqrt(var),
        dof=dof,
        tolerance=tolerance,
        still_rising=still_rising,
        notes=notes,
    )


def _latency_climb(
    counts: list[int],
    ok: dict[int, list[SweepRun]],
    climb: float,
    alpha: float,
    run_sd: float,
    prior_df: float,
) -> int | None:
    """Smallest count whose p99 is credibly >= (1 + climb) x the lowest p99 at <= clients."""
    logs = {
        c: np.log(
            np.array([r.latency_p99_ms for r in ok[c] if r.latency_p99_ms and r.latency_p99_ms > 0])
        )
        for c in counts
    }
    have = [c for c in counts if logs[c].size]
    if len(have) < 2:
        return None
    # p99 of short runs is noisier than throughput: the pooled spread speaks for itself,
    # with the throughput prior (doubled) as its floor of belief
    var, dof = _pool([logs[c] for c in have], 0.0, 2 * run_sd, prior_df)
    lowest = have[0]
    for c in have[1:]:
        y, yl = logs[c], logs[lowest]
        d = float(y.mean() - yl.mean()) - math.log1p(climb)
        se = math.sqrt(var * (1 / y.size + 1 / yl.size))
        if t_sf(d / se, dof) < alpha:
            return c
        if float(y.mean()) < float(logs[lowest].mean()):
            lowest = c
    return None


# -- advice ---------------------------------------------------------------------------
def advise(
    analysis: SweepAnalysis,
    *,
    max_connections: int | None = None,
    cost: ConnectionCost | None = None,
    factor: int = MAX_CONN_FACTOR,
) -> Advice:
    """A pool size, the cost of connecting per transaction, and max_connections' margin."""
    knee = analysis.knee_clients
    lines: list[str] = []
    warnings: list[str] = []
    if knee is None or analysis.knee_tps is None:
        return Advice(None, [], ["no count was measured: no advice"])
    best = analysis.best_clients
    point = next(p for p in analysis.points if p.clients == knee)
    short = point.shortfall or 0.0
    if knee == best:
        lines.append(
            f"knee: {knee} clients, the best throughput ({analysis.knee_tps:.0f} tps); "
            f"run-to-run sd {analysis.run_sd:.1%}"
        )
    else:
        lines.append(
            f"knee: {knee} clients ({analysis.knee_tps:.0f} tps, {short:.0%} below the best, "
            f"{analysis.best_tps or 0:.0f} tps at {best} clients): the best is not credibly "
            f"more than {analysis.tolerance:.0%} better (run-to-run sd {analysis.run_sd:.1%})"
        )
    if short > 2 * analysis.tolerance:
        lines.append(
            f"the knee is uncertain: runs varied by {analysis.run_sd:.0%} (sd), so a "
            f"{short:.0%} shortfall cannot be told from the noise; a quieter host, longer runs "
            "or more repeats narrow it (the true knee may be higher)"
        )
    beyond = " or more (throughput was still rising)" if analysis.still_rising else ""
    lines.append(
        f"connection pool: about {knee} server connections{beyond} for this workload "
        f"(e.g. PgBouncer default_pool_size = {knee}); more concurrent transactions queue "
        "on the server's CPUs and locks instead of finishing sooner: let them queue in the pool"
    )
    if analysis.latency_climb_clients is not None:
        lines.append(f"p99 latency starts to climb at {analysis.latency_climb_clients} clients")
    if cost is not None:
        lines.append(
            f"a new connection per transaction (pgbench -C) at {cost.clients} clients: "
            f"{cost.tps_new_connection:.0f} vs {cost.tps_persistent:.0f} tps "
            f"({cost.throughput_loss:.0%} less throughput, about "
            f"{cost.ms_per_connection:.1f} ms per connection): keep connections open "
            "(a pooler) rather than connecting per request"
        )
    if (
        max_connections is not None
        and not analysis.still_rising
        and (max_connections >= factor * knee)
    ):
        text = (
            f"max_connections = {max_connections} is {max_connections / knee:.0f}x the knee "
            f"({knee}): every backend costs memory (work_mem per sort, per backend) and "
            "snapshot work for every other one; with a pool of about "
            f"{knee}, max_connections can be much lower (the pool plus admin headroom)"
        )
        warnings.append(text)
        lines.append("WARNING: " + text)
    lines += analysis.notes
    return Advice(knee, warnings, lines)
