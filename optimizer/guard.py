"""Guardrails around a trial: reject a candidate before it is applied, or stop it early.

Pure: no I/O. The service feeds in settings as PostgreSQL text and per-second samples;
a guard answers with ``None`` (go on) or a reason that says what was wrong. A rejected
candidate is registered with the optimizer as a failed :class:`~optimizer.descent.Measurement`,
so the descent narrows that knob's bound and never tries the value (or beyond) again.

Memory guard
============

A candidate is rejected before it is applied when the memory it lets PostgreSQL
allocate would not fit the target's RAM with headroom::

    need = shared_buffers
         + wal_buffers                       (-1: shared_buffers/32, within [64kB, 16MB])
         + (clients + workers) * work_mem * (sort_nodes + hash_nodes * hash_mem_multiplier)
         + maintenance_work_mem
         + autovacuum_max_workers * min(autovacuum_work_mem or maintenance_work_mem, 1GB)

    rejected when  need > ram * (1 - headroom)  and  need > need(incumbent)

Why each term (PostgreSQL 15 documentation, "Resource Consumption / Memory"):

* work_mem is a limit *per sort or hash node per backend*, not per server: "a complex
  query might perform several sort and hash operations at the same time, with each
  operation generally being allowed to use as much memory as this value specifies ...
  several running sessions could be doing such operations concurrently". Hash nodes may
  use ``work_mem * hash_mem_multiplier`` ("The memory limit for a hash table is computed
  by multiplying work_mem by hash_mem_multiplier"; default 2.0 since PostgreSQL 15).
  ``clients`` is the benchmark's concurrency, and the default hash/sort factor counts one
  sort and one hash node per query: ``1 + hash_mem_multiplier`` (3 by default).
* parallel workers: each worker of a parallel query is a process with its own sorts and
  hashes ("each worker process ... may use as much memory as work_mem", "Resource
  Consumption"; a parallel hash join's shared table is sized for all participants), so
  ``workers = min(clients * max_parallel_workers_per_gather, max_parallel_workers,
  max_worker_processes)`` more backends count the same ``work_mem`` factor. The CPU count
  does not cap them: the planner launches workers whatever the load, so 8 clients on 2
  CPUs with 4 workers per gather can hold 8 + 8 (max_parallel_workers) sets of work_mem.
  Short OLTP statements never go parallel, so for them this over-counts; the guard only
  compares against RAM and against the incumbent, which is counted the same way.
* maintenance_work_mem: one manual VACUUM / CREATE INDEX at a time, plus "when autovacuum
  runs, up to autovacuum_max_workers times this memory may be allocated" (or
  autovacuum_work_mem when set); VACUUM uses at most 1GB of it for dead tuples.
* wal_buffers: "-1 selects a size equal to 1/32nd of shared_buffers, but not less than
  64kB nor more than the size of one WAL segment, typically 16MB".
* headroom (25% by default) is left to the kernel, the page cache PostgreSQL relies on,
  per-backend overhead (catalog caches, plans) and everything else on the machine.

A candidate that needs *less* than the incumbent is never rejected: it cannot be riskier
than the config the server is already running (the baseline itself is never checked).

Performance guard
=================

:class:`ThroughputWatch` follows a candidate's per-second samples. It stops the run when
transactions fail, or when the median of its first ``window`` seconds after the warm-up
(:func:`guard_window`) is below ``floor`` (50%) of the incumbent's level over the same
seconds: a collapse that the full run would only confirm at the cost of its whole
duration on a degraded server.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from optimizer.knobs import Kind, Knob, KnobValueError

KB = 1024
MB = 1024 * KB
GB = 1024 * MB

# How each setting the formula reads is written by PostgreSQL (bare numbers are in `unit`),
# and its default when the server did not tell us (PostgreSQL 15).
_SETTINGS: dict[str, tuple[Kind, str | None, str]] = {
    "shared_buffers": ("integer", "8kB", "128MB"),
    "wal_buffers": ("integer", "8kB", "-1"),
    "work_mem": ("integer", "kB", "4MB"),
    "maintenance_work_mem": ("integer", "kB", "64MB"),
    "autovacuum_work_mem": ("integer", "kB", "-1"),
    "autovacuum_max_workers": ("integer", None, "3"),
    "hash_mem_multiplier": ("real", None, "2.0"),
    "max_parallel_workers_per_gather": ("integer", None, "2"),
    "max_parallel_workers": ("integer", None, "8"),
    "max_worker_processes": ("integer", None, "8"),
}
MEMORY_SETTINGS: tuple[str, ...] = tuple(_SETTINGS)
"""Settings the memory guard reads: the service should snapshot all of them."""

_UNIT_BYTES = {"8kB": 8 * KB, "kB": KB}
_WAL_SEGMENT = 16 * MB
_VACUUM_CAP = 1 * GB


@dataclass(frozen=True)
class MemoryModel:
    """The assumptions of the memory formula (module docstring); change them here only."""

    sort_nodes: float = 1.0  # work_mem-sized sort nodes running at once per query
    hash_nodes: float = 1.0  # hash nodes per query, each up to work_mem * hash_mem_multiplier
    headroom: float = 0.25  # fraction of RAM never planned for PostgreSQL's own allocations

    def __post_init__(self) -> None:
        if self.sort_nodes < 0 or self.hash_nodes < 0 or self.sort_nodes + self.hash_nodes <= 0:
            raise ValueError("sort_nodes and hash_nodes must be >= 0, and not both 0")
        if not 0 <= self.headroom < 1:
            raise ValueError("headroom must be in [0, 1)")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes each term of the formula may allocate, and the budget they must fit."""

    parts: dict[str, int]
    budget: int
    factor: float  # the hash/sort factor applied to work_mem per client
    workers: int = 0  # parallel workers that may run at once, each with its own work_mem

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.budget

    def describe(self) -> str:
        terms = ", ".join(f"{k} {_size(v)}" for k, v in self.parts.items() if v)
        return f"{_size(self.total)} ({terms}) against {_size(self.budget)}"


def _knob(name: str) -> Knob:
    kind, unit, default = _SETTINGS[name]
    return Knob(name, kind, unit, -math.inf, math.inf, default)


def _value(settings: Mapping[str, str], name: str) -> float:
    """A setting in bytes (memory) or as a number; the default when absent or unreadable."""
    knob = _knob(name)
    text = settings.get(name)
    try:
        v = knob.parse(text) if text is not None else knob.parse(knob.default)
    except KnobValueError:
        v = knob.parse(knob.default)
    assert isinstance(v, float)
    unit = _SETTINGS[name][1]
    return v * _UNIT_BYTES[unit] if unit is not None and v > 0 else v  # -1 stays a sentinel


def estimate_memory(
    settings: Mapping[str, str],
    *,
    ram_bytes: int,
    clients: int,
    model: MemoryModel | None = None,
) -> MemoryEstimate:
    """The memory formula of the module docstring for ``settings`` (name -> PostgreSQL text)."""
    if ram_bytes <= 0 or clients < 1:
        raise ValueError("ram_bytes must be > 0 and clients >= 1")
    m = model or MemoryModel()
    sb = max(_value(settings, "shared_buffers"), 0.0)
    wal = _value(settings, "wal_buffers")
    if wal < 0:  # -1: auto
        wal = min(max(sb / 32, 64 * KB), _WAL_SEGMENT)
    wm = max(_value(settings, "work_mem"), 0.0)
    hmm = max(_value(settings, "hash_mem_multiplier"), 1.0)
    factor = m.sort_nodes + m.hash_nodes * hmm
    mwm = max(_value(settings, "maintenance_work_mem"), 0.0)
    avwm = _value(settings, "autovacuum_work_mem")
    per_worker = min(mwm if avwm < 0 else avwm, float(_VACUUM_CAP))
    workers = max(_value(settings, "autovacuum_max_workers"), 0.0)
    per_gather = max(_value(settings, "max_parallel_workers_per_gather"), 0.0)
    pool = min(
        max(_value(settings, "max_parallel_workers"), 0.0),
        max(_value(settings, "max_worker_processes"), 0.0),
    )
    parallel = int(min(clients * per_gather, pool))
    parts = {
        "shared_buffers": int(sb),
        "wal_buffers": int(wal),
        "work_mem": int(clients * wm * factor),
        "parallel_workers": int(parallel * wm * factor),
        "maintenance_work_mem": int(mwm),
        "autovacuum": int(workers * per_worker),
    }
    budget = int(ram_bytes * (1 - m.headroom))
    return MemoryEstimate(parts=parts, budget=budget, factor=factor, workers=parallel)


def memory_guard(
    candidate: Mapping[str, str],
    incumbent: Mapping[str, str],
    *,
    ram_bytes: int,
    clients: int,
    model: MemoryModel | None = None,
) -> str | None:
    """Why ``candidate`` must not be applied (it would not fit the RAM), or None.

    Both configs are complete: the server's effective settings overlaid with the
    session's knobs, as PostgreSQL text.
    """
    cand = estimate_memory(candidate, ram_bytes=ram_bytes, clients=clients, model=model)
    if cand.fits:
        return None
    inc = estimate_memory(incumbent, ram_bytes=ram_bytes, clients=clients, model=model)
    if cand.total <= inc.total:
        return None  # no riskier than what the server runs now
    m = model or MemoryModel()
    return (
        f"memory guard: would need {cand.describe()} "
        f"({100 * (1 - m.headroom):.0f}% of {_size(ram_bytes)} RAM, work_mem counted "
        f"{cand.factor:g}x per client for {clients} clients"
        + (f" and {cand.workers} parallel workers)" if cand.workers else ")")
    )


# --- measured memory ------------------------------------------------------------------------

LIVE_LIMIT = 0.9
"""Fraction of the memory a server may use (its cgroup's limit, else its host's RAM) that its
non-reclaimable memory may reach: beyond it a run is stopped (the live guard), and a candidate
predicted beyond it is not applied."""

SANITY_RAM = 2.0
"""The static worst case (:func:`estimate_memory`) of a candidate may be at most this many
times the RAM when memory is measured: a ceiling against absurd values only."""


@dataclass(frozen=True)
class MemoryUse:
    """Non-reclaimable memory a server was seen to hold, in bytes (one reading or a peak).

    ``private``: its processes' own memory (a cgroup's rss / anon, or the sum of the
    postmaster tree's anonymous PSS); ``shared``: its shared memory (shmem: the buffer pool
    and WAL buffers as far as they were touched, lock tables, ...). Page cache is not
    counted: the kernel reclaims it before it kills anything.
    """

    private: int
    shared: int

    @property
    def total(self) -> int:
        return self.private + self.shared

    def peak(self, other: MemoryUse | None) -> MemoryUse:
        """Each part's larger value of two readings."""
        if other is None:
            return self
        return MemoryUse(max(self.private, other.private), max(self.shared, other.shared))


def _shared_size(settings: Mapping[str, str]) -> float:
    sb = max(_value(settings, "shared_buffers"), 0.0)
    wal = _value(settings, "wal_buffers")
    if wal < 0:
        wal = min(max(sb / 32, 64 * KB), _WAL_SEGMENT)
    return sb + wal


def predict_memory(
    candidate: Mapping[str, str],
    incumbent: Mapping[str, str],
    seen: MemoryUse,
    *,
    clients: int,
    spilled: bool,
) -> dict[str, int]:
    """What ``candidate`` would hold, from what the server held under ``incumbent`` (bytes,
    by part; the sum is the prediction).

    * the private memory seen under the incumbent (backends, their caches and plans, the
      sorts and hashes the workload really ran), as it was;
    * shared memory at the candidate's **full** size (shared_buffers + wal_buffers), plus
      what the server held beyond the incumbent's pool (lock tables and the like): a pool
      that was not full yet is counted full, so a prediction never relies on a cold run;
    * work_mem's change for each client, times the sort/hash factor, only when the
      incumbent's runs spilled to temp files: a sort that fits in work_mem uses what it
      needs, so raising work_mem costs nothing until something spilled;
    * maintenance_work_mem's change for a manual VACUUM and every autovacuum worker.
    """
    sb_inc = _shared_size(incumbent)
    other_shared = max(seen.shared - sb_inc, 0.0)
    factor = 1.0 + max(_value(candidate, "hash_mem_multiplier"), 1.0)
    d_wm = max(_value(candidate, "work_mem"), 0.0) - max(_value(incumbent, "work_mem"), 0.0)
    d_mwm = max(_value(candidate, "maintenance_work_mem"), 0.0) - max(
        _value(incumbent, "maintenance_work_mem"), 0.0
    )
    avw = 1.0 + max(_value(candidate, "autovacuum_max_workers"), 0.0)
    return {
        "private (seen)": seen.private,
        "shared": int(_shared_size(candidate) + other_shared),
        "work_mem": int(max(d_wm, 0.0) * factor * clients) if spilled else 0,
        "maintenance_work_mem": int(max(d_mwm, 0.0) * avw),
    }


def measured_memory_guard(
    candidate: Mapping[str, str],
    incumbent: Mapping[str, str],
    seen: MemoryUse,
    *,
    limit_bytes: int,
    clients: int,
    spilled: bool,
    ram_bytes: int | None = None,
) -> str | None:
    """Why ``candidate`` must not be applied, from the memory measured under ``incumbent``.

    Rejected when its prediction (:func:`predict_memory`) passes :data:`LIVE_LIMIT` of
    ``limit_bytes`` and is more than the incumbent's by the same reckoning (a candidate
    needing less is never riskier), or when its static worst case exceeds
    :data:`SANITY_RAM` times the RAM (absurd values; OtterTune once set max_wal_size to
    28 PB). The live guard (:class:`MemoryWatch`) stays the line that catches what a
    prediction missed.
    """
    if limit_bytes <= 0 or clients < 1:
        raise ValueError("limit_bytes must be > 0 and clients >= 1")
    parts = predict_memory(candidate, incumbent, seen, clients=clients, spilled=spilled)
    need = sum(parts.values())
    now = sum(predict_memory(incumbent, incumbent, seen, clients=clients, spilled=False).values())
    cap = int(LIVE_LIMIT * limit_bytes)
    if need > cap and need > now:
        terms = ", ".join(f"{k} {_size(v)}" for k, v in parts.items() if v)
        return (
            f"memory guard: would hold {_size(need)} ({terms}; measured under the incumbent) "
            f"against {LIVE_LIMIT:.0%} of the {_size(limit_bytes)} the server may use"
        )
    ram = ram_bytes or limit_bytes
    worst = estimate_memory(candidate, ram_bytes=ram, clients=clients)
    if (
        worst.total > SANITY_RAM * ram
        and worst.total > estimate_memory(incumbent, ram_bytes=ram, clients=clients).total
    ):
        return (
            f"memory guard: its worst case, {worst.describe().split(' against ')[0]}, is more "
            f"than {SANITY_RAM:g}x the {_size(ram)} of RAM"
        )
    return None


@dataclass
class MemoryWatch:
    """The live guard: stops a run once the server's non-reclaimable memory passes
    :data:`LIVE_LIMIT` of what it may use, before the OOM killer would act."""

    limit_bytes: int
    fraction: float = LIVE_LIMIT

    def observe(self, use: MemoryUse) -> str | None:
        if use.total > self.fraction * self.limit_bytes:
            return (
                f"memory guard (live): the server held {_size(use.total)} (private "
                f"{_size(use.private)}, shared {_size(use.shared)}), over {self.fraction:.0%} "
                f"of the {_size(self.limit_bytes)} it may use; run stopped"
            )
        return None


def _size(n: float) -> str:
    for unit, size in (("GB", GB), ("MB", MB), ("kB", KB)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}B"


# --- performance guard ---------------------------------------------------------------------


def guard_window(measured_s: float) -> int:
    """Seconds after the warm-up a candidate is judged on, never beyond the run: 3-5 on
    runs up to 50 s, then a tenth of the run up to 30 s.

    A long run's first 5 s are a poor sample of it: on profile ``small`` TPC-C stalled
    under 50 tps for up to 14 s at a time (write-back at the disk's cap), and a 330 s
    candidate run of PGTune's hints, 99 tps in its first 5 s against the incumbent's 262,
    was stopped there (2026-11-27) where its 6-minute runs measured 233-251 tps. A median
    over 30 s outlasts such a stall; a real collapse still costs a tenth of the run.
    """
    n = int(measured_s)
    short = min(5, max(3, n // 4))  # the first seconds of a short run
    return max(1, min(n, max(short, min(30, n // 10))))


@dataclass
class ThroughputWatch:
    """Stops a candidate run whose throughput collapses or whose transactions fail.

    ``reference`` is the incumbent's level (median tps of its recent runs). Feed every
    progress sample to :meth:`observe`; the first non-None answer is the reason to stop.
    """

    reference: float | None
    warmup_s: float
    window: int = 3
    floor: float = 0.5
    _seen: list[float] = field(default_factory=list)
    _judged: bool = False

    def observe(self, time_s: float, tps: float, failed: int | None = None) -> str | None:
        if failed:
            return f"performance guard: {failed} transaction(s) failed at {time_s:g} s"
        if (
            self._judged
            or self.reference is None
            or not math.isfinite(self.reference)
            or self.reference <= 0
            or time_s < self.warmup_s + 0.5  # the same seconds the measurement drops
        ):
            return None
        self._seen.append(tps if math.isfinite(tps) else 0.0)
        if len(self._seen) < self.window:
            return None
        self._judged = True
        level = statistics.median(self._seen)
        if level < self.floor * self.reference:
            return (
                f"performance guard: {level:.4g} tps over the first {self.window} s, "
                f"below {self.floor:.0%} of the incumbent's {self.reference:.4g} tps"
            )
        return None


# --- warm-up after a restart -----------------------------------------------------------------


def warm_up_window(measured_s: float) -> int:
    """The ``window`` of :func:`warmed_up` for runs of ``measured_s``: 3 s, and on runs
    longer than 50 s the guard's (:func:`guard_window`, a tenth of the run up to 30 s).

    On profile ``small`` TPC-C's per-second throughput swings by half and more (80-496 tps
    within one minute): 3 s medians "levelled off" 11 s after a restart with a cold 256MB
    buffer pool, whose run then measured 99 tps where the incumbent's measured 262 (the
    session of docs/results/tpcc-c2-small.md's 330 s runs, 2026-11-27).
    """
    return 3 if measured_s <= 50 else guard_window(measured_s)


POOL_FULL = 0.95
"""Share of shared_buffers allocated since a restart at which the pool counts as refilled."""
POOL_IDLE = 0.01
"""Share of the pool allocated over the last window below which it counts as settled."""


def pool_refilled(allocated: Sequence[int], pool_buffers: int, window: int = 5) -> str | None:
    """Has shared_buffers refilled after a restart? Why it has, or None.

    ``allocated``: buffers allocated since the warm-up began (pg_stat_bgwriter.buffers_alloc
    minus its first reading), one reading a second. Refilled once they reach
    :data:`POOL_FULL` of the pool (it is full: every later read evicts a page, as in the
    incumbent's warm runs), or once the last ``window`` seconds allocated under
    :data:`POOL_IDLE` of it (what the workload reads is in the pool: a pool larger than
    the data never fills).

    Throughput alone said "levelled off" 11 s after a restart with a cold 256MB pool on
    TPC-C, whose run then measured 99 tps against the incumbent's 262 (TPC-C's per-second
    rate swings by half; :func:`warm_up_window`); a 768MB pool takes 90 s and more to fill
    from a 1000-IOPS disk. The counter says when the pool is warm, whatever the noise.
    """
    if pool_buffers < 1 or window < 1 or not allocated:
        return None
    if allocated[-1] >= POOL_FULL * pool_buffers:
        return f"the buffer pool refilled ({allocated[-1]:,} of {pool_buffers:,} buffers)"
    recent = allocated[-1] - allocated[-1 - window] if len(allocated) > window else None
    if recent is not None and recent < POOL_IDLE * pool_buffers:
        return (
            f"reads settled with {allocated[-1]:,} of {pool_buffers:,} buffers in use "
            f"(under {POOL_IDLE:.0%} of the pool allocated in {window} s)"
        )
    return None


WARM_SHARE = 0.9
"""Share of a config's warm level its throughput must be back to before a run after a
restart counts: the OS page cache refills after the buffer pool does."""


def back_to_level(tps: Sequence[float], level: float, window: int) -> str | None:
    """Is throughput back near a config's warm ``level`` (median of its last ``window``
    seconds at least :data:`WARM_SHARE` of it)? Why, or None."""
    if window < 1 or len(tps) < window or not level > 0:
        return None
    now = statistics.median(tps[-window:])
    if now < WARM_SHARE * level:
        return None
    return f"throughput back to {now:.0f} ({WARM_SHARE:.0%} of its warm {level:.0f} or more)"


def warmed_up(tps: Sequence[float], window: int = 3, rise: float = 0.05) -> bool:
    """Has throughput stopped rising after a restart (shared_buffers refilled)?

    True once the median of the last ``window`` seconds is less than ``rise`` above the
    median of the ``window`` before. Measured here (TPC-B scale 20, data in the OS
    cache): 1-5 s to level off after a restart, so a fixed 10 s warm-up wasted most of
    itself; a server reading from disk takes much longer and this waits for it.
    """
    if window < 1 or len(tps) < 2 * window:
        return False
    last = statistics.median(tps[-window:])
    before = statistics.median(tps[-2 * window : -window])
    return last < before * (1 + rise)
