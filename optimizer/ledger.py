"""What a session's runs say: each run's level, the run-to-run noise, and load shifts.

:class:`RunLedger` keeps the successful runs of every config a descent measured (keyed by
the config's values), levels each run by the objective (per transaction or per second,
settled by the first usable run when ``evidence`` is "auto"), pools the replicate runs
into the between-run noise the verdict uses, and records a **shift** when two consecutive
runs of one config are further apart than the noise allows (the server's load moved).
It decides nothing: :class:`~optimizer.descent.CoordinateDescent` asks it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from optimizer.counters import ServerCounters
from optimizer.evidence import FLOOR, StreamStat, run_level
from optimizer.settings import DescentSettings, Evidence
from optimizer.verdict import PRIOR_DF, SHIFT_Z, Run, RunStat, run_stat, shifts

Value = float | str
Key = tuple[tuple[str, Value], ...]

LOW_RATE_TPS = 20.0
"""Below this many transactions a second (the first run's median per-second throughput),
"auto" evidence judges runs from their transactions: a one-second sample of a slow
workload holds a handful of transactions (counting noise CV >= 22%, and 0-3 per second
for 0.5-3 s queries: issue 13), while above it the per-second path is the one measured
in bench/optimizer.py and bench/neighbour.py (A/A 0.9%, no-op sessions 2.5-3.0%)."""


@dataclass(frozen=True)
class Measurement:
    """The result of one benchmark run."""

    samples: tuple[float, ...]  # per-second throughput, warm-up removed
    latency_p95_ms: float | None = None
    latency_p99_ms: float | None = None
    latency_p95_samples: tuple[float, ...] = ()  # per-second p95, for objective latency_p95
    failed: bool = False  # pgbench aborted, server did not start: the candidate is rejected
    error: str | None = None
    # per-transaction evidence per stream; when present the run's level comes from it
    # (optimizer/evidence.py) and the per-second samples are for display only
    streams: tuple[StreamStat, ...] = ()
    # the server's I/O counters over the run (WAL rate for the checkpoint rule, the
    # baseline's for the search order); None where they were not measured
    counters: ServerCounters | None = None


@dataclass(frozen=True)
class _Run(Run):
    """A run of this session: :class:`~optimizer.verdict.Run` with its trial index as time."""

    @property
    def index(self) -> int:
        return int(self.t)


@dataclass(frozen=True)
class Shift:
    """Runs of one config that moved more than the noise allows: either the server's load
    changed, or the config scatters on its own (:meth:`RunLedger.witness` tells which)."""

    trial: int  # the later run's trial index
    earlier: int  # the earlier run's trial index
    change: float  # fraction the later run is above (+) or below (-) the earlier
    allowed: float  # the change the noise allows (SHIFT_Z sds of a difference)
    about: str  # what was being evaluated
    key: Key  # the config whose runs moved

    def text(self) -> str:
        return (
            f"runs {self.earlier + 1} and {self.trial + 1} of one config differ by "
            f"{self.change:+.0%} (noise allows about +-{self.allowed:.0%}) while evaluating "
            f"{self.about}: the server's load moved, or that config scatters on its own; "
            "nothing is decided until the other config's next run tells which"
        )

    def moved_alike(self, witness: float) -> bool:
        """Whether the other config's change (``witness``) shows the same move: the same
        direction and at least half its size, in logs (a load change moves both)."""
        if math.isnan(witness):
            return True
        d = math.log1p(self.change)
        return math.copysign(1.0, d) * math.log1p(witness) > abs(d) / 2

    def reading(self, witness: float, host: bool) -> str:
        """What the other config's runs around it said (``witness``: their change)."""
        runs = f"runs {self.earlier + 1} and {self.trial + 1} ({self.change:+.0%})"
        if math.isnan(witness):
            return (
                f"{runs}: the other config has no run before them to tell; taken as the "
                "server's load moving, re-measuring after it"
            )
        if host:
            return (
                f"{runs}: the other config's runs around them moved too ({witness:+.0%}): "
                "the server's load moved; re-measuring after it"
            )
        return (
            f"{runs}: the other config's runs around them moved {witness:+.0%}: that "
            "config scatters on its own (not the load); all its runs count, their spread "
            "widening the interval"
        )


class RunLedger:
    """The successful runs of a session by config, their noise, and the load shifts seen."""

    def __init__(self, settings: DescentSettings) -> None:
        self.settings = settings
        self.objective = settings.objective
        # what runs are judged on; "auto" is settled by the first run (see evidence_for)
        self.evidence: Evidence = settings.evidence
        if self._needs_transactions():
            self.evidence = "transactions"
        self.runs: dict[Key, list[_Run]] = {}
        # the server's counters of those runs, by config: what the search order reads
        self.counters: dict[Key, list[ServerCounters]] = {}
        self.shifts: list[Shift] = []  # load shifts seen, in order
        self._shifted_at: dict[Key, int] = {}  # config -> trial of its latest shift

    def _needs_transactions(self) -> bool:
        """Query times and objectives over several streams exist only per transaction."""
        obj = self.objective
        per_stream = obj.primary is not None or bool(obj.weights) or bool(obj.p95_limits)
        return obj.kind not in ("throughput", "latency_p95") or per_stream

    def evidence_for(self, m: Measurement) -> Evidence:
        """Settle "auto" on the first usable run: transactions for several streams or a
        slow workload (below LOW_RATE_TPS), else per-second samples. Deterministic given
        the runs, so a replayed session settles the same way."""
        if self.evidence == "auto" and m.streams and not m.failed:
            rate = statistics.median(m.samples) if m.samples else 0.0
            slow = rate < LOW_RATE_TPS
            self.evidence = "transactions" if len(m.streams) > 1 or slow else "seconds"
        return self.evidence

    def level(self, m: Measurement) -> RunStat | None:
        """The run's level by the objective; None if it carries no usable evidence."""
        if m.streams and self.evidence_for(m) == "transactions":
            st = run_level(m.streams, self.objective)
            return st if st.centre > FLOOR else None
        kind = self.objective.kind
        if kind == "throughput":
            vals: tuple[float, ...] = tuple(m.samples)
        elif kind == "latency_p95":
            vals = m.latency_p95_samples or (
                (m.latency_p95_ms,) if m.latency_p95_ms is not None else ()
            )
        else:
            return None  # query times need per-transaction evidence
        if not vals or any(not math.isfinite(v) or v < 0 for v in vals):
            return None
        return run_stat(vals, lower_is_better=self.objective.lower_is_better)

    def record(self, key: Key, m: Measurement, trial: int, about: str) -> _Run | None:
        """Store a successful run of trial ``trial``; None if it failed or has no evidence.

        ``about``: what was being evaluated, for a shift this run reveals.
        """
        if m.failed:
            return None
        stat = self.level(m)
        if stat is None:
            return None
        latency: dict[str, float] = {}
        if m.latency_p99_ms is not None and m.latency_p99_ms > 0:
            latency["p99"] = math.log(m.latency_p99_ms)
        for s in m.streams:
            if s.p95_ms is not None and s.p95_ms > 0:
                latency[f"p95:{s.name}"] = math.log(s.p95_ms)
        run = _Run(float(trial), stat, latency)
        runs = self.runs.setdefault(key, [])
        if runs and run.index - runs[-1].index <= self.settings.incumbent_window:
            for a, b, _z in shifts([runs[-1], run], self.settings.run_sd):
                self._shift(a, b, about, key)
                self._shifted_at[key] = run.index  # older runs no longer describe it
        runs.append(run)
        if m.counters is not None:
            self.counters.setdefault(key, []).append(m.counters)
        return run

    def _shift(self, a: Run, b: Run, about: str, key: Key) -> Shift:
        run_sd = self.settings.run_sd
        sd = math.sqrt(2 * run_sd**2 + a.stat.within_var + b.stat.within_var)
        allowed = math.expm1(SHIFT_Z * sd)
        sh = Shift(
            trial=int(b.t),
            earlier=int(a.t),
            change=math.expm1(b.stat.centre - a.stat.centre),
            allowed=allowed,
            about=about,
            key=key,
        )
        if all((x.trial, x.earlier) != (sh.trial, sh.earlier) for x in self.shifts):
            self.shifts.append(sh)
        return sh

    def witness(self, sh: Shift, other: Key) -> float | None:
        """How ``other``'s runs moved across the shift: the change from its last run before
        the shift's earlier run to its first run after the later one (None: no such run
        after it yet; NaN: none before it, so none can tell).

        A change of the server's load moves every config alike; runs of one config that
        jump while the other's around them stay put are that config's own scatter. On C2,
        PGTune's 256MB pool ran 149-373 tps from run to run, with no restart between some,
        while a 512MB pool's runs interleaved with them held 460-519.
        """
        runs = self.runs.get(other, [])
        before = [r for r in runs if r.index < sh.earlier]
        after = [r for r in runs if r.index > sh.trial]
        if not before:
            return math.nan  # nothing can tell: taken as the load, as it may be
        if not after:
            return None
        return math.expm1(after[0].stat.centre - before[-1].stat.centre)

    def recent(self, key: Key, trials: int) -> list[_Run]:
        """The config's runs recent enough to compare with, ``trials`` runs into the session:
        within ``incumbent_window`` trials (slow drift makes old runs stale) and since its
        last load shift."""
        s = self.settings
        oldest = max(trials - s.incumbent_window, self._shifted_at.get(key, 0))
        runs = [r for r in self.runs.get(key, []) if r.index >= oldest]
        return runs[-s.max_candidate_runs :]

    def noise(self, skip: Sequence[Key]) -> tuple[float, float]:
        """Between-run sd and its weight in df: the prior pooled with this session's replicates.

        Every config measured more than once (other than the two being compared) shows the
        machine's run-to-run drift; pooling them gives the verdict many degrees of freedom
        instead of the prior's 4 once the session is under way.
        """
        ss = w_sum = 0.0
        df = n = 0
        for key, runs in self.runs.items():
            if key in skip or len(runs) < 2:
                continue
            c = [r.stat.centre for r in runs]
            mean = sum(c) / len(c)
            ss += sum((x - mean) ** 2 for x in c)
            df += len(c) - 1
            w_sum += sum(r.stat.within_var for r in runs)
            n += len(runs)
        run_sd = self.settings.run_sd
        if df == 0 or not self.settings.learn_noise:
            return run_sd, PRIOR_DF
        between = max(ss / df - w_sum / n, 0.0)
        var = (PRIOR_DF * run_sd**2 + df * between) / (PRIOR_DF + df)
        return math.sqrt(var), PRIOR_DF + df
