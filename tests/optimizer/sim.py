"""Simulated pgbench runs on known response surfaces, shared by tests and bench/optimizer.py.

Noise model (per run of ``seconds`` per-second samples, warm-up already dropped):

* per-second log noise: AR(1) with coefficient ``ar`` (0.3: the recorded pgbench runs show
  0.25-0.3) and stationary sd ``cv`` (~25% CV);
* between-run drift: the run's log level follows its own AR(1) across runs (``drift_ar``)
  with stationary sd ``drift_sd`` (5%: a run is within about +-8% of the true level 90%
  of the time; docs/architecture.md measured a 6.5% CV of run medians and 14% apart over 10 min);
* outlier seconds: with probability ``outlier_p`` a second collapses to 10-50% (a
  checkpoint stall);
* a noisy neighbour (off by default): another job on the machine starts with probability
  ``neighbour_on`` per second and stops with ``neighbour_off`` per second; while it runs,
  throughput is multiplied by a factor drawn per episode from ``neighbour_effect`` (0.6-0.9:
  docs/architecture.md saw TPC-B shift 25% within a minute when other jobs moved the load from 4 to
  10). Time passes between runs too (``gap_seconds`` per run: apply, restart, warm-up).

The true level of a config is its median throughput: the noise is median-neutral.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from optimizer.catalogue import GB, MB, Hardware, knob_space
from optimizer.descent import CoordinateDescent, Measurement
from optimizer.evidence import summarize_stream
from optimizer.heuristic import DbType
from optimizer.knobs import Config, Knob
from optimizer.settings import DescentSettings


@dataclass(frozen=True)
class Noise:
    cv: float = 0.25
    ar: float = 0.3
    drift_sd: float = 0.05
    drift_ar: float = 0.7
    outlier_p: float = 0.02
    seconds: int = 60
    neighbour_on: float = 0.0
    neighbour_off: float = 1 / 120
    neighbour_effect: tuple[float, float] = (0.6, 0.9)
    gap_seconds: int = 5


NEIGHBOUR = Noise(neighbour_on=1 / 240, neighbour_off=1 / 120)
"""A neighbour that runs about a third of the time, in episodes of about 2 minutes."""


class Bench:
    """A noisy benchmark machine: ``run(level)`` returns per-second samples of one run."""

    def __init__(self, noise: Noise, seed: int) -> None:
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.drift = float(self.rng.normal(0.0, noise.drift_sd))
        self.runs = 0
        self.busy = 1.0  # the neighbour's factor on throughput (1.0: no neighbour)
        self.busy_seconds = 0  # seconds with a neighbour, for reports

    def _neighbour(self, seconds: int) -> np.ndarray:
        """The neighbour's factor for each of the next ``seconds`` seconds."""
        nz, rng = self.noise, self.rng
        out = np.ones(seconds)
        if nz.neighbour_on <= 0:
            return out
        for i in range(seconds):
            if self.busy == 1.0 and rng.random() < nz.neighbour_on:
                self.busy = float(rng.uniform(*nz.neighbour_effect))
            elif self.busy != 1.0 and rng.random() < nz.neighbour_off:
                self.busy = 1.0
            out[i] = self.busy
        return out

    def factors(self) -> np.ndarray:
        """Multiplicative noise of one run's seconds: drift, AR(1), stalls, the neighbour."""
        nz, rng = self.noise, self.rng
        self._neighbour(nz.gap_seconds)
        self.drift = nz.drift_ar * self.drift + math.sqrt(1 - nz.drift_ar**2) * float(
            rng.normal(0.0, nz.drift_sd)
        )
        z = rng.normal(0.0, nz.cv * math.sqrt(1 - nz.ar**2), nz.seconds)
        e = np.empty(nz.seconds)
        prev = float(rng.normal(0.0, nz.cv))
        for i in range(nz.seconds):
            prev = nz.ar * prev + z[i]
            e[i] = prev
        x = np.exp(self.drift + e)
        stall = rng.random(nz.seconds) < nz.outlier_p
        x[stall] *= rng.uniform(0.1, 0.5, int(stall.sum()))
        nb = self._neighbour(nz.seconds)
        self.busy_seconds += int(np.count_nonzero(nb < 1.0))
        self.runs += 1
        return x * nb

    def run(self, level: float) -> tuple[float, ...]:
        return tuple(float(v) for v in level * self.factors())

    def measure(self, level: float) -> Measurement:
        return Measurement(samples=self.run(level))


class StepBench(Bench):
    """No noise beyond a little jitter, and one step in load: every run from ``at`` on is
    ``factor`` times faster (a neighbour stopped), whatever the config."""

    def __init__(self, at: int, factor: float, seed: int = 0) -> None:
        super().__init__(Noise(cv=0.05, drift_sd=0.01, outlier_p=0.0), seed)
        self.at, self.factor = at, factor

    def run(self, level: float) -> tuple[float, ...]:
        step = self.factor if self.runs >= self.at else 1.0
        return tuple(float(v) for v in level * step * self.factors())


@dataclass(frozen=True)
class Mix:
    """A workload of long transactions: scripts with mean latencies (ms) at the base level."""

    latency_ms: Mapping[str, float]
    weights: Mapping[str, float]
    clients: int = 2
    cv: float = 0.3  # one transaction's latency around its script's mean (lognormal)


REPORTING_MIX = Mix(
    latency_ms={"agg": 500.0, "join": 1500.0, "sort": 3000.0},
    weights={"agg": 1.0, "join": 1.0, "sort": 1.0},
)
"""The reporting mix of issue 13: 0.5-3 s queries at 2 clients, ~1 transaction a second."""


class TxBench(Bench):
    """Runs of long transactions: per-transaction evidence and per-second counts.

    Each client runs transactions back to back; a script is drawn by weight; its latency
    is its mean, divided by the config's level (1.0 = the base level), times the run's
    noise factor at the time it starts (drift, AR(1) seconds, the neighbour: a slower
    second makes what starts in it slower) and a lognormal per-transaction factor.
    """

    def __init__(self, noise: Noise, seed: int, mix: Mix = REPORTING_MIX) -> None:
        super().__init__(noise, seed)
        self.mix = mix

    def transactions(self, level: float) -> tuple[list[float], list[float], list[str]]:
        """(start s, latency ms, label) of every transaction that started in the run."""
        f = self.factors()
        names = list(self.mix.weights)
        p = np.array([self.mix.weights[n] for n in names], dtype=float)
        p /= p.sum()
        sigma = math.sqrt(math.log(1 + self.mix.cv**2))
        starts: list[float] = []
        lats: list[float] = []
        labels: list[str] = []
        for _ in range(self.mix.clients):
            t = 0.0
            while t < len(f):
                name = names[int(self.rng.choice(len(names), p=p))]
                speed = float(f[min(int(t), len(f) - 1)])
                jitter = float(self.rng.lognormal(-(sigma**2) / 2, sigma))
                lat = self.mix.latency_ms[name] / level / speed * jitter
                starts.append(t)
                lats.append(lat)
                labels.append(name)
                t += lat / 1000.0
        return starts, lats, labels

    def measure_tx(self, level: float) -> Measurement:
        """A Measurement with per-transaction evidence and per-second completion counts."""
        start, lat, labels = self.transactions(level)
        stream = summarize_stream(
            "main", clients=self.mix.clients, shares=self.mix.weights,
            start_s=start, latency_ms=lat, labels=labels,
        )  # fmt: skip
        return Measurement(samples=per_second(start, lat, self.noise.seconds), streams=(stream,))

    def measure(self, level: float) -> Measurement:
        return self.measure_tx(level)


def per_second(
    start: Sequence[float], latency_ms: Sequence[float], seconds: int
) -> tuple[float, ...]:
    """Transactions completed in each second, as pgbench's progress lines count them."""
    ends = np.asarray(start) + np.asarray(latency_ms) / 1000.0
    counts = np.histogram(ends, bins=np.arange(0, seconds + 1))[0]
    return tuple(float(c) for c in counts)


# --- response surfaces --------------------------------------------------------------------


def sat(x: float, mid: float, width: float) -> float:
    """Logistic rise in log2(x) centred on ``mid`` (0 below, 1 above)."""
    if x <= 0:
        return 0.0
    return 1.0 / (1.0 + math.exp(-(math.log2(x) - math.log2(mid)) / width))


def interp_log2(x: float, points: Sequence[tuple[float, float]]) -> float:
    """Piecewise-linear in log2(x) through (x, y) points, flat outside."""
    lx = math.log2(max(x, 1e-12))
    xs = [math.log2(p[0]) for p in points]
    return float(np.interp(lx, xs, [p[1] for p in points]))


Value = float | str


@dataclass(frozen=True)
class Term:
    """A factor of the response that depends on a few knobs (two knobs: an interaction)."""

    knobs: tuple[str, ...]
    fn: Callable[..., float]


@dataclass
class Surface:
    """A known response: true median tps = base * product of terms."""

    name: str
    hardware: Hardware
    names: tuple[str, ...]
    start: Config
    base: float
    terms: tuple[Term, ...]
    grid: int = 160
    hints: DbType = "mixed"  # the PGTune profile the service uses for this kind of workload
    space: list[Knob] = field(init=False)

    def __post_init__(self) -> None:
        self.space = knob_space(list(self.names), self.hardware)
        self._knobs = {k.name: k for k in self.space}

    def values(self, config: Mapping[str, str]) -> dict[str, Value]:
        return {k.name: k.parse(config.get(k.name, k.default)) for k in self.space}

    def true(self, config: Mapping[str, str]) -> float:
        v = self.values(config)
        out = self.base
        for t in self.terms:
            out *= t.fn(*(v[n] for n in t.knobs))
        return out

    def _axis(self, name: str) -> list[Value]:
        k = self._knobs[name]
        if k.kind in ("enum", "bool"):
            return list(k.choices)
        if k.step == "multiplicative":
            lo = max(k.lower, k.floor, 1e-9)
            pts: list[Value] = [float(x) for x in np.geomspace(lo, k.upper, self.grid)]
            return [k.lower, *pts] if k.lower < lo else pts
        return [float(x) for x in np.linspace(k.lower, k.upper, self.grid)]

    @cached_property
    def optimum(self) -> float:
        """True optimum within the search bounds (terms have disjoint knobs: max each)."""
        out = self.base
        for t in self.terms:
            axes = [self._axis(n) for n in t.knobs]
            best = -math.inf
            for combo in itertools.product(*axes):
                best = max(best, t.fn(*combo))
            out *= best
        return out

    def quality(self, config: Mapping[str, str]) -> float:
        """True objective of ``config`` as a fraction of the optimum."""
        return self.true(config) / self.optimum


def _wal_buffers_bytes(pages: Value) -> float:
    p = float(pages)
    return 4 * MB if p < 0 else p * 8192  # -1 = auto: 1/32 of 128MB shared_buffers


def oltp_surface() -> Surface:
    """Write-heavy OLTP: shared_buffers (working set ~2GB) and max_wal_size dominate; the
    checkpoint and WAL-buffer knobs move throughput by 1-2% at most."""
    hw = Hardware(ram_bytes=16 * GB, cpus=4)
    return Surface(
        name="oltp-write",
        hardware=hw,
        names=("shared_buffers", "max_wal_size", "checkpoint_timeout", "wal_buffers",
               "checkpoint_completion_target"),
        start={"shared_buffers": "128MB", "max_wal_size": "1GB", "checkpoint_timeout": "5min",
               "wal_buffers": "-1", "checkpoint_completion_target": "0.9"},
        base=3000.0,
        terms=(
            # hit rate rises up to the working set, then double buffering costs a little
            Term(("shared_buffers",), lambda sb: (1 + 0.45 * sat(float(sb) * 8192, 1 * GB, 1.0))
                 * (1 - 0.05 * sat(float(sb) * 8192, 6 * GB, 0.4))),
            Term(("max_wal_size",), lambda w: 1 + 0.25 * sat(float(w) * MB, 4 * GB, 0.8)),
            Term(("checkpoint_timeout",), lambda s: 1 + 0.015 * sat(float(s), 900, 0.7)),
            Term(("wal_buffers",), lambda p: 1 + 0.01 * sat(_wal_buffers_bytes(p), 8 * MB, 0.7)),
            Term(("checkpoint_completion_target",), lambda c: 1 + 0.01 * (float(c) - 0.5)),
        ),
    )  # fmt: skip


def reporting_surface() -> Surface:
    """Sort-heavy reporting: work_mem with a dip (docs/architecture.md: 6MB -12%, 16MB
    +40%), jit off helps, and an interaction: effective_cache_size pays off mostly once
    random_page_cost is low (the planner then picks index scans)."""
    hw = Hardware(ram_bytes=16 * GB, cpus=4)
    kb = 1024
    wm_curve = [
        (1 * MB / kb, 0.80), (2 * MB / kb, 0.90), (4 * MB / kb, 1.00), (8 * MB / kb, 0.88),
        (11 * MB / kb, 1.10), (16 * MB / kb, 1.44), (24 * MB / kb, 1.46), (40 * MB / kb, 1.46),
    ]  # fmt: skip

    def ecs_rpc(rpc: Value, ecs: Value) -> float:
        low_rpc = 1.0 / (1.0 + math.exp((float(rpc) - 2.0) / 0.4))
        big_ecs = sat(float(ecs) * 8192, 8 * GB, 0.7)
        return 1 + 0.05 * low_rpc + 0.04 * big_ecs + 0.14 * low_rpc * big_ecs

    return Surface(
        name="reporting-interaction",
        hardware=hw,
        names=("work_mem", "jit", "random_page_cost", "effective_cache_size",
               "default_statistics_target"),
        start={"work_mem": "4MB", "jit": "on", "random_page_cost": "4",
               "effective_cache_size": "4GB", "default_statistics_target": "100"},
        base=45.0,
        terms=(
            Term(("work_mem",), lambda v: interp_log2(float(v), wm_curve)),
            Term(("jit",), lambda j: 1.06 if j == "off" else 1.0),
            Term(("random_page_cost", "effective_cache_size"), ecs_rpc),
            Term(("default_statistics_target",), lambda d: 1 + 0.005 * sat(float(d), 300, 0.5)),
        ),
    )  # fmt: skip


def cliff_surface() -> Surface:
    """A small box: shared_buffers past ~2.8GB and work_mem past ~56MB fall off a cliff
    (swapping); max_wal_size helps moderately, the rest barely."""
    hw = Hardware(ram_bytes=8 * GB, cpus=4, max_connections=25)
    return Surface(
        name="cliff",
        hardware=hw,
        names=("shared_buffers", "work_mem", "max_wal_size", "effective_io_concurrency",
               "bgwriter_lru_maxpages", "checkpoint_completion_target"),
        start={"shared_buffers": "128MB", "work_mem": "4MB", "max_wal_size": "1GB",
               "effective_io_concurrency": "1", "bgwriter_lru_maxpages": "100",
               "checkpoint_completion_target": "0.9"},
        base=1500.0,
        terms=(
            Term(("shared_buffers",), lambda sb: (1 + 0.5 * sat(float(sb) * 8192, 512 * MB, 0.9))
                 * (1 - 0.55 * sat(float(sb) * 8192, 2.8 * GB, 0.08))),
            Term(("work_mem",), lambda v: (1 + 0.3 * sat(float(v) * 1024, 12 * MB, 0.8))
                 * (1 - 0.6 * sat(float(v) * 1024, 56 * MB, 0.1))),
            Term(("max_wal_size",), lambda w: 1 + 0.10 * sat(float(w) * MB, 3 * GB, 0.8)),
            Term(("effective_io_concurrency",), lambda e: 1 + 0.015 * sat(float(e) + 1, 16, 1.0)),
            Term(("bgwriter_lru_maxpages",), lambda b: 1 + 0.005 * sat(float(b) + 1, 400, 1.0)),
            Term(("checkpoint_completion_target",), lambda c: 1 + 0.01 * (float(c) - 0.5)),
        ),
    )  # fmt: skip


def analytic_surface() -> Surface:
    """Analytic queries on a 2-CPU box where PGTune's "dw" values hurt (docs/architecture.md: its dw
    config measured ~20% below the defaults). work_mem helps up to ~64MB (hash joins in
    memory), jit off saves compile time; but random_page_cost 1.1 with a large
    effective_cache_size makes the planner choose index nested loops over cold data (-35%),
    and statistics target 500 costs planning time; shared_buffers barely matters (the
    data sits in the OS cache)."""
    hw = Hardware(ram_bytes=24 * GB, cpus=2)

    def plan(rpc: Value, ecs: Value) -> float:
        low_rpc = 1.0 / (1.0 + math.exp((float(rpc) - 2.0) / 0.3))
        big_ecs = sat(float(ecs) * 8192, 8 * GB, 0.5)
        return 1 - 0.35 * low_rpc * big_ecs - 0.04 * low_rpc

    return Surface(
        name="analytic-hints-wrong",
        hardware=hw,
        names=("work_mem", "jit", "random_page_cost", "effective_cache_size",
               "shared_buffers", "default_statistics_target"),
        start={"work_mem": "4MB", "jit": "on", "random_page_cost": "4",
               "effective_cache_size": "4GB", "shared_buffers": "128MB",
               "default_statistics_target": "100"},
        base=100.0,  # tps scale only (the verdict counts transactions: keep it realistic)
        terms=(
            Term(("work_mem",), lambda v: 1 + 0.3 * sat(float(v) * 1024, 24 * MB, 0.6)),
            Term(("jit",), lambda j: 1.08 if j == "off" else 1.0),
            Term(("random_page_cost", "effective_cache_size"), plan),
            Term(("shared_buffers",), lambda sb: 1 + 0.02 * sat(float(sb) * 8192, 1 * GB, 0.8)),
            Term(("default_statistics_target",), lambda d: 1 - 0.03 * sat(float(d), 400, 0.3)),
        ),
        hints="dw",
    )  # fmt: skip


def flat_surface() -> Surface:
    """Five knobs that do nothing: every candidate is a no-op (A/A)."""
    base = oltp_surface()
    return Surface(
        name="flat",
        hardware=base.hardware,
        names=base.names,
        start=base.start,
        base=1000.0,
        terms=(),
    )


def slope_surface(gain: float) -> Surface:
    """One knob (max_wal_size from its lower bound, 256MB); every x2 step is ``gain`` better."""
    hw = Hardware(ram_bytes=16 * GB, cpus=4)
    return Surface(
        name=f"slope{gain:+.0%}",
        hardware=hw,
        names=("max_wal_size",),
        start={"max_wal_size": "256MB"},
        base=1000.0,
        terms=(Term(("max_wal_size",), lambda w: (1 + gain) ** math.log2(float(w) / 256)),),
    )


SURFACES: tuple[Callable[[], Surface], ...] = (
    oltp_surface,
    reporting_surface,
    cliff_surface,
    analytic_surface,
)


# --- drivers ---------------------------------------------------------------------------------


def descent(
    space: Sequence[Knob],
    start: Config,
    *,
    hints: Mapping[str, str] | None = None,
    **settings: Any,
) -> CoordinateDescent:
    """A CoordinateDescent whose DescentSettings are given by name (tests and bench/)."""
    return CoordinateDescent(space, start, DescentSettings(**settings), hints=hints)


def run_descent(
    surface: Surface, bench: Bench, *, max_trials: int = 40, **kwargs: Any
) -> CoordinateDescent:
    """Drive a CoordinateDescent against the simulator until it stops."""
    opt = descent(surface.space, surface.start, max_trials=max_trials, **kwargs)
    while (cand := opt.suggest()) is not None:
        opt.register(cand, bench.measure(surface.true(cand.config)))
    return opt


def _run_median(samples: Sequence[float]) -> float:
    return float(np.median(samples))


def naive_descent(surface: Surface, bench: Bench, *, max_trials: int = 40) -> tuple[Config, int]:
    """The textbook method: one run per config, keep if the median rose, x2 steps, one pass."""
    inc = {k.name: k.parse(surface.start.get(k.name, k.default)) for k in surface.space}

    def cfg(vals: Mapping[str, Value]) -> Config:
        return {k.name: k.format(vals[k.name]) for k in surface.space}

    trials = 1
    best = _run_median(bench.run(surface.true(cfg(inc))))
    for k in surface.space:
        moved = False
        for direction in (1, -1):
            if moved:
                break
            while trials < max_trials:
                nxt = _naive_step(k, inc[k.name], direction)
                if nxt is None:
                    break
                trial = {**inc, k.name: nxt}
                m = _run_median(bench.run(surface.true(cfg(trial))))
                trials += 1
                if m > best:
                    inc, best, moved = trial, m, True
                else:
                    break
    return cfg(inc), trials


def _naive_step(k: Knob, cur: Value, direction: int) -> Value | None:
    if k.kind in ("enum", "bool"):
        i = k.choices.index(str(cur)) + direction
        return k.choices[i] if 0 <= i < len(k.choices) else None
    c = float(cur)
    if k.step == "multiplicative":
        t = max(k.floor, k.lower) if c <= 0 or c < k.lower else c * k.step_size**direction
    else:
        t = c + direction * k.step_size
    t = min(max(t, k.lower), k.upper)
    if k.kind == "integer":
        t = float(round(t))
    return None if t == c or (t - c) * direction <= 0 else t


def sample_config(surface: Surface, rng: np.random.Generator) -> Config:
    """A uniformly random config (log-uniform for multiplicative knobs) within bounds."""
    out: Config = {}
    for k in surface.space:
        if k.kind in ("enum", "bool"):
            out[k.name] = k.choices[int(rng.integers(len(k.choices)))]
            continue
        if k.step == "multiplicative":
            lo = max(k.lower, k.floor, 1e-9)
            v = float(np.exp(rng.uniform(math.log(lo), math.log(k.upper))))
        else:
            v = float(rng.uniform(k.lower, k.upper))
        out[k.name] = k.format(float(round(v)) if k.kind == "integer" else round(v, 3))
    return out


def random_search(
    surface: Surface, bench: Bench, rng: np.random.Generator, *, max_trials: int = 40
) -> tuple[Config, float]:
    """Random configs, one run each (the start first). Returns the best *measured* config and
    the gain it appears to have over the start (inflated by picking the luckiest run)."""
    best: tuple[float, Config] | None = None
    start_m = math.nan
    for i in range(max_trials):
        c = dict(surface.start) if i == 0 else sample_config(surface, rng)
        m = _run_median(bench.run(surface.true(c)))
        start_m = m if i == 0 else start_m
        if best is None or m > best[0]:
            best = (m, c)
    assert best is not None
    return best[1], best[0] / start_m - 1
