"""Catalogue of PostgreSQL knobs worth tuning, with safe bounds relative to the target machine.

Contexts, units, defaults and hard limits are PostgreSQL 15's (``pg_settings``), and the same
in 16, 17 and 18 unless a spec says otherwise: a knob a version lacks has ``min_version``
(:func:`available`), a default a later version changed is in ``later_defaults``, and a context
a version changed comes from the server's own row (:func:`optimizer.knobs.narrow`). The safe
bounds are narrower on purpose: they keep the search away from values that can take a
server down (shared_buffers beyond 40% of RAM, work_mem that multiplied by the connection
count exceeds RAM) or that nobody would recommend.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from optimizer.knobs import Kind, Knob, KnobError, SettingRow, StepRule, narrow

KB = 1024
MB = 1024 * KB
GB = 1024 * MB
PAGE = 8 * KB  # BLCKSZ: unit of shared_buffers, wal_buffers, effective_cache_size, *_flush_after


@dataclass(frozen=True)
class Hardware:
    """The target machine, as far as bounds and heuristics need to know it."""

    ram_bytes: int
    cpus: int
    storage: Literal["ssd", "hdd", "san"] = "ssd"
    max_connections: int = 100

    def __post_init__(self) -> None:
        if self.ram_bytes < 256 * MB:
            raise KnobError(f"ram_bytes={self.ram_bytes}: need at least 256MB of RAM")
        if self.cpus < 1:
            raise KnobError(f"cpus={self.cpus}: need at least one CPU")
        if self.max_connections < 1:
            raise KnobError(f"max_connections={self.max_connections}: must be at least 1")


WorkloadKind = Literal["write-heavy", "read-heavy", "mixed", "analytics"]

Bounds = Callable[[Hardware], tuple[float, float]]


def _fixed(lo: float, hi: float) -> Bounds:
    return lambda hw: (lo, hi)


def _mb_floor(nbytes: float, unit_bytes: int) -> float:
    """A byte count rounded down to whole MB and expressed in ``unit_bytes`` units (nice output)."""
    return float(int(nbytes // MB) * MB // unit_bytes)


@dataclass(frozen=True)
class KnobSpec:
    """How to build a :class:`Knob` for a given machine."""

    name: str
    kind: Kind
    unit: str | None
    context: str
    default: str
    bounds: Bounds
    step: StepRule = "multiplicative"
    step_size: float = 2.0
    choices: tuple[str, ...] = ()
    durability_unsafe: bool = False
    floor: float = 1.0
    description: str = ""
    aliases: tuple[tuple[str, str], ...] = ()
    # the first major version that has the knob (None: every supported version)
    min_version: int | None = None
    # (major version, default) from that version on, oldest first; ``default`` is 15's
    later_defaults: tuple[tuple[int, str], ...] = ()

    def available(self, version: int | None) -> bool:
        """Whether a server of this major version has the knob (unknown version: yes)."""
        return version is None or self.min_version is None or version >= self.min_version

    def default_for(self, version: int | None) -> str:
        """The built-in default on this major version (unknown: 15's)."""
        out = self.default
        for since, value in self.later_defaults:
            if version is not None and version >= since:
                out = value
        return out

    def describe(self) -> dict[str, object]:
        """A JSON-ready description (bounds depend on the machine, see :meth:`build`)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "unit": self.unit,
            "context": self.context,
            "needs_restart": self.context == "postmaster",
            "default": self.default,
            "step": self.step,
            "step_size": self.step_size,
            "choices": list(self.choices or (("off", "on") if self.kind == "bool" else ())),
            "durability_unsafe": self.durability_unsafe,
            "description": self.description,
            "min_version": self.min_version,
            "later_defaults": {str(v): d for v, d in self.later_defaults},
        }

    def build(self, hw: Hardware) -> Knob:
        lo, hi = self.bounds(hw) if self.kind in ("integer", "real") else (0.0, 0.0)
        if self.kind in ("enum", "bool"):
            n = len(self.choices) if self.choices else 2
            lo, hi = 0.0, float(n - 1)
        return Knob(
            name=self.name,
            kind=self.kind,
            unit=self.unit,
            lower=lo,
            upper=max(lo, hi),
            default=self.default,
            choices=self.choices,
            context=self.context,
            step=self.step,
            step_size=self.step_size,
            durability_unsafe=self.durability_unsafe,
            description=self.description,
            floor=self.floor,
            aliases=self.aliases,
        )


def _sb(hw: Hardware) -> tuple[float, float]:
    # up to 90% of RAM: what fits is the memory guard's to say, from the memory the server
    # really holds (optimizer/guard.py). A 40% cap (the rule that double buffering starves
    # the page cache) hid +57% at 75% on TPC-B with data 1.5x a 512 MB server's memory
    # (docs/results/memory.md); where the page cache matters more, the runs show it.
    return 32 * MB / PAGE, max(32 * MB / PAGE, _mb_floor(0.90 * hw.ram_bytes, PAGE))


def _ecs(hw: Hardware) -> tuple[float, float]:
    # a planner hint only (no allocation), so up to 90% of RAM is harmless
    return 64 * MB / PAGE, _mb_floor(0.90 * hw.ram_bytes, PAGE)


def _work_mem(hw: Hardware) -> tuple[float, float]:
    # a query can use several work_mem-sized sorts/hashes per connection: keep 2 per
    # connection within half the RAM, so a busy server cannot be pushed into swap/OOM
    hi = _mb_floor(0.5 * hw.ram_bytes / (2 * hw.max_connections), KB)
    return 1 * MB / KB, min(2 * GB / KB, max(16 * MB / KB, hi))


def _mwm(hw: Hardware) -> tuple[float, float]:
    # autovacuum workers each may use it: RAM/8, capped at 8GB like PGTune
    return 16 * MB / KB, min(8 * GB / KB, max(64 * MB / KB, _mb_floor(hw.ram_bytes / 8, KB)))


def _eic(hw: Hardware) -> tuple[float, float]:
    # prefetch depth: spinning disks gain nothing past a few requests in flight
    return 0.0, 16.0 if hw.storage == "hdd" else 512.0


def _workers(hw: Hardware) -> tuple[float, float]:
    return 0.0, float(max(1, hw.cpus))


def _worker_slots(hw: Hardware) -> tuple[float, float]:
    # slots are cheap and also serve logical replication and extensions: never below 1
    return 1.0, float(max(8, 2 * hw.cpus))


def _gather(hw: Hardware) -> tuple[float, float]:
    return 0.0, float(max(1, hw.cpus // 2))


def _av_workers(hw: Hardware) -> tuple[float, float]:
    return 1.0, float(max(3, min(10, hw.cpus)))


def _io_workers(hw: Hardware) -> tuple[float, float]:
    # I/O workers wait on the disk rather than use a CPU: a few per CPU, PostgreSQL's 32 at most
    return 1.0, float(min(32, max(8, 4 * hw.cpus)))


def _av_work_mem(hw: Hardware) -> tuple[float, float]:
    return 16 * MB / KB, min(2 * GB / KB, max(64 * MB / KB, _mb_floor(hw.ram_bytes / 16, KB)))


_SPECS: tuple[KnobSpec, ...] = (
    # --- memory ---
    KnobSpec("shared_buffers", "integer", "8kB", "postmaster", "128MB", _sb,
             description="PostgreSQL's own page cache"),
    KnobSpec("effective_cache_size", "integer", "8kB", "user", "4GB", _ecs,
             description="planner's estimate of total cache (no allocation)"),
    KnobSpec("work_mem", "integer", "kB", "user", "4MB", _work_mem,
             description="memory per sort/hash before spilling to disk"),
    KnobSpec("hash_mem_multiplier", "real", None, "user", "2", _fixed(1.0, 8.0),
             description="hash tables may use work_mem times this before spilling"),
    KnobSpec("maintenance_work_mem", "integer", "kB", "user", "64MB", _mwm,
             description="memory for VACUUM, CREATE INDEX"),
    KnobSpec("autovacuum_work_mem", "integer", "kB", "sighup", "-1", _av_work_mem,
             floor=64 * MB / KB,
             description="memory per autovacuum worker (-1: use maintenance_work_mem)"),
    KnobSpec("wal_buffers", "integer", "8kB", "postmaster", "-1", _fixed(8, 128 * MB / PAGE),
             floor=16 * MB / PAGE,  # -1 = auto (<= 16MB): the first step up is 16MB
             description="WAL kept in shared memory before being written"),
    KnobSpec("huge_pages", "enum", None, "postmaster", "try", _fixed(0, 0), step="ordered",
             choices=("off", "try", "on"), description="use huge pages for shared memory"),
    # --- WAL and checkpoints ---
    KnobSpec("max_wal_size", "integer", "MB", "sighup", "1GB", _fixed(256, 32 * 1024),
             description="WAL size that triggers a checkpoint (needs that much free disk)"),
    KnobSpec("min_wal_size", "integer", "MB", "sighup", "80MB", _fixed(32, 8 * 1024),
             description="WAL recycled rather than removed"),
    KnobSpec("checkpoint_timeout", "integer", "s", "sighup", "5min", _fixed(60, 3600),
             description="max time between checkpoints (longer: slower crash recovery)"),
    KnobSpec("checkpoint_completion_target", "real", None, "sighup", "0.9", _fixed(0.5, 1.0),
             step="additive", step_size=0.1,
             description="fraction of the interval over which a checkpoint spreads writes"),
    KnobSpec("checkpoint_flush_after", "integer", "8kB", "sighup", "256kB", _fixed(0, 256),
             floor=8, description="writeback hint after this much checkpoint I/O (0: off)"),
    KnobSpec("wal_writer_delay", "integer", "ms", "sighup", "200ms", _fixed(10, 2000),
             description="WAL writer sleep between flushes"),
    KnobSpec("wal_writer_flush_after", "integer", "8kB", "sighup", "1MB", _fixed(0, 2048),
             floor=16, description="WAL writer flushes after this much WAL"),
    KnobSpec("wal_compression", "enum", None, "superuser", "off", _fixed(0, 0), step="ordered",
             choices=("off", "pglz", "lz4", "zstd"), description="compress full-page images",
             aliases=(("on", "pglz"), ("true", "pglz"), ("yes", "pglz"), ("1", "pglz"),
                      ("false", "off"), ("no", "off"), ("0", "off"))),
    KnobSpec("commit_delay", "integer", None, "superuser", "0", _fixed(0, 10_000), floor=10,
             description="microseconds to wait for group commit (0: off)"),
    KnobSpec("commit_siblings", "integer", None, "user", "5", _fixed(1, 100),
             description="concurrent transactions needed before commit_delay applies"),
    # --- background writer and flushing ---
    KnobSpec("bgwriter_delay", "integer", "ms", "sighup", "200ms", _fixed(10, 2000),
             description="background writer sleep between rounds"),
    KnobSpec("bgwriter_lru_maxpages", "integer", None, "sighup", "100", _fixed(0, 10_000),
             floor=25, description="max buffers written per round (0: off)"),
    KnobSpec("bgwriter_lru_multiplier", "real", None, "sighup", "2", _fixed(0.5, 10.0),
             step="additive", step_size=1.0, description="how far ahead the bgwriter cleans"),
    KnobSpec("bgwriter_flush_after", "integer", "8kB", "sighup", "512kB", _fixed(0, 256),
             floor=8, description="writeback hint after this much bgwriter I/O (0: off)"),
    KnobSpec("backend_flush_after", "integer", "8kB", "user", "0", _fixed(0, 256), floor=8,
             description="writeback hint after this much backend I/O (0: off)"),
    # --- planner ---
    KnobSpec("random_page_cost", "real", None, "user", "4", _fixed(1.0, 8.0),
             description="planner cost of a random page read (SSD: close to 1)"),
    KnobSpec("effective_io_concurrency", "integer", None, "user", "1", _eic, floor=2,
             later_defaults=((18, "16"),),
             description="concurrent read-ahead requests of a scan (bitmap heap scans; "
                         "from 18 every read stream)"),
    # --- asynchronous I/O (PostgreSQL 18; io_combine_limit from 17) ---
    KnobSpec("io_method", "enum", None, "postmaster", "worker", _fixed(0, 0), step="ordered",
             choices=("sync", "worker", "io_uring"), min_version=18,
             description="how reads are issued: synchronously, by I/O worker processes, or "
                         "through io_uring (where PostgreSQL was built with it)"),
    KnobSpec("io_workers", "integer", None, "sighup", "3", _io_workers, min_version=18,
             description="I/O worker processes (with io_method=worker)"),
    # 18 silently caps it at io_max_combine_limit (128kB unless changed, a restart): no
    # higher, or a trial would measure a value the server does not use
    KnobSpec("io_combine_limit", "integer", "8kB", "user", "128kB", _fixed(1, 16),
             min_version=17,
             description="largest read combined into one I/O request"),
    KnobSpec("default_statistics_target", "integer", None, "user", "100", _fixed(10, 2000),
             description="histogram detail collected by ANALYZE"),
    KnobSpec("jit", "bool", None, "user", "on", _fixed(0, 0), step="ordered",
             description="JIT-compile expressions of expensive queries"),
    KnobSpec("jit_above_cost", "real", None, "user", "100000", _fixed(10_000, 10_000_000),
             step_size=4.0, description="plan cost above which a query is JIT-compiled"),
    KnobSpec("jit_inline_above_cost", "real", None, "user", "500000",
             _fixed(50_000, 50_000_000), step_size=4.0,
             description="plan cost above which JIT inlines functions"),
    KnobSpec("jit_optimize_above_cost", "real", None, "user", "500000",
             _fixed(50_000, 50_000_000), step_size=4.0,
             description="plan cost above which JIT runs the expensive optimisations"),
    KnobSpec("parallel_setup_cost", "real", None, "user", "1000", _fixed(10.0, 100_000.0),
             step_size=4.0, description="planner cost of starting parallel workers"),
    KnobSpec("parallel_tuple_cost", "real", None, "user", "0.1", _fixed(0.001, 1.0),
             step_size=4.0, description="planner cost of passing a row from a worker"),
    KnobSpec("max_parallel_workers_per_gather", "integer", None, "user", "2", _gather,
             floor=1, description="parallel workers per query node"),
    KnobSpec("max_parallel_workers", "integer", None, "user", "8", _workers, floor=1,
             description="parallel workers in total"),
    KnobSpec("max_parallel_maintenance_workers", "integer", None, "user", "2", _gather,
             floor=1, description="parallel workers per CREATE INDEX / VACUUM"),
    KnobSpec("max_worker_processes", "integer", None, "postmaster", "8", _worker_slots,
             description="background worker slots"),
    # --- vacuum ---
    KnobSpec("autovacuum_naptime", "integer", "s", "sighup", "1min", _fixed(10, 600),
             description="delay between autovacuum runs on a database"),
    KnobSpec("autovacuum_max_workers", "integer", None, "postmaster", "3", _av_workers,
             description="concurrent autovacuum workers"),
    # --- durability: trade crash safety for speed; never tuned unless explicitly allowed ---
    KnobSpec("synchronous_commit", "enum", None, "user", "on", _fixed(0, 0), step="ordered",
             choices=("off", "local", "remote_write", "on", "remote_apply"),
             durability_unsafe=True,
             description="off: a crash can lose recently committed transactions"),
    KnobSpec("fsync", "bool", None, "sighup", "on", _fixed(0, 0), step="ordered",
             durability_unsafe=True, description="off: a crash can corrupt the whole cluster"),
    KnobSpec("full_page_writes", "bool", None, "sighup", "on", _fixed(0, 0), step="ordered",
             durability_unsafe=True, description="off: torn pages after a crash corrupt data"),
)  # fmt: skip

CATALOGUE: Mapping[str, KnobSpec] = MappingProxyType({s.name: s for s in _SPECS})
"""Every knob knobtune knows how to tune, by name."""

_DEFAULT_SETS: Mapping[WorkloadKind, tuple[str, ...]] = MappingProxyType(
    {
        # ordered by expected impact: coordinate descent tunes them in this order
        "write-heavy": (
            # WAL volume and checkpoints first: reload-only, so no restart and warm-up,
            # and with the data in the OS cache (TPC-B) shared_buffers moved little
            # (bench/e2e.py W1: 128MB -> 2GB measured +1.7%).
            "max_wal_size",
            "wal_compression",  # fewer bytes per full-page image (PGTune sets lz4)
            "checkpoint_timeout",
            "shared_buffers",
            "checkpoint_completion_target",
            "min_wal_size",
            "wal_buffers",
            "bgwriter_lru_maxpages",
            # not wal_writer_delay: with synchronous_commit on, commits flush WAL themselves
        ),
        "read-heavy": (
            "shared_buffers",
            "effective_cache_size",
            "random_page_cost",
            "effective_io_concurrency",
            "work_mem",
            "jit",
        ),
        "mixed": (
            "work_mem",
            "shared_buffers",
            "jit",
            "random_page_cost",
            "effective_cache_size",
            "max_wal_size",
            "max_parallel_workers_per_gather",
        ),
        # Long reporting queries (scans, sorts, hashes over millions of rows) at a few
        # clients: memory per operation first, then parallelism, JIT, the planner's
        # costs, and shared_buffers last (a restart and a re-warm per trial).
        "analytics": (
            # spilling sorts and hashes dominate: in the recorded reporting mix
            # (bench/record_long.py) work_mem 1MB -> 64MB took a NOT IN subplan from
            # ~1.5 s to ~0.4 s; docs/architecture.md measured +40-60% on a sort-heavy query
            "work_mem",
            # hash aggregates and hash joins get work_mem x this; more memory for hashes
            # without letting every sort grow too
            "hash_mem_multiplier",
            # a scan over millions of rows scales with workers while CPUs are idle
            "max_parallel_workers_per_gather",
            # whether the planner goes parallel at all for mid-sized plans
            "parallel_setup_cost",
            "parallel_tuple_cost",
            # JIT compiles for 50-500 ms per query: pays on CPU-bound long queries,
            # costs on medium ones; its threshold decides which queries pay it
            "jit",
            "jit_above_cost",
            # index vs sequential scans, bitmap prefetch, the cache the planner assumes
            "random_page_cost",
            "effective_io_concurrency",
            "effective_cache_size",
            # a restart per trial, and large scans largely bypass it (ring buffers)
            "shared_buffers",
            # not default_statistics_target: it acts only after the next ANALYZE, which a
            # trial does not run, so a trial would measure nothing
        ),
    }
)


def major_version(version: int | str | None) -> int | None:
    """A server's major version from ``server_version_num`` (150004, 180006) or the text of
    ``SELECT version()`` ("PostgreSQL 18.6 on x86_64..."); None when unknown."""
    if isinstance(version, int):
        return version // 10000 if version >= 100000 else version
    if not version:
        return None
    match = re.search(r"PostgreSQL (\d+)", version) or re.match(r"\s*(\d+)", version)
    return int(match.group(1)) if match else None


def available_knobs(version: int | None) -> list[str]:
    """The catalogue's knobs a server of this major version has (unknown: all)."""
    return [name for name, spec in CATALOGUE.items() if spec.available(version)]


def default_knobs(kind: WorkloadKind) -> list[str]:
    """Recommended knob set (in tuning order) for a workload kind; never durability-unsafe."""
    try:
        return list(_DEFAULT_SETS[kind])
    except KeyError:
        raise KnobError(
            f"unknown workload kind {kind!r}; use one of {', '.join(_DEFAULT_SETS)}"
        ) from None


def knob_space(
    names: Sequence[str],
    hardware: Hardware,
    rows: Mapping[str, SettingRow] | None = None,
    *,
    allow_unsafe: bool = False,
    version: int | None = None,
) -> list[Knob]:
    """Build the knobs to tune, bounded for ``hardware`` and narrowed by the server's pg_settings.

    ``version``: the server's major version; a knob it lacks is refused (a name absent from
    ``rows`` is not proof: a target probed before the knob joined the catalogue lacks it).
    Raises :class:`KnobError` for an unknown name (with close matches), a duplicate, a knob
    the version lacks, or a durability-unsafe knob without ``allow_unsafe=True``.
    """
    if isinstance(names, str):
        raise KnobError("names must be a list of knob names, not a single string")
    out: list[Knob] = []
    seen: set[str] = set()
    for name in names:
        spec = CATALOGUE.get(name)
        if spec is None:
            close = difflib.get_close_matches(name, list(CATALOGUE), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise KnobError(f"unknown knob {name!r}{hint} (known: {', '.join(sorted(CATALOGUE))})")
        if name in seen:
            raise KnobError(f"knob {name!r} listed twice")
        seen.add(name)
        if not spec.available(version):
            raise KnobError(
                f"{name} exists from PostgreSQL {spec.min_version} on; this server runs "
                f"{version}: remove it from the knobs"
            )
        if spec.durability_unsafe and not allow_unsafe:
            raise KnobError(
                f"{name} is durability-unsafe ({spec.description}); remove it or opt in "
                "explicitly with allow_unsafe"
            )
        knob = spec.build(hardware)
        row = rows.get(name) if rows else None
        if row is not None:
            knob = narrow(knob, row)
        out.append(knob)
    return out
