"""PGTune-style starting configuration: rules of thumb from RAM, CPUs, connections and storage.

A port of the formulas in le0pard/pgtune, ``src/features/configuration/configurationSlice.js``
(the selectors selectSharedBuffers, selectEffectiveCacheSize, selectMaintenanceWorkMem,
selectCheckpointSegments, selectWalBuffers, selectDefaultStatisticsTarget,
selectRandomPageCost, selectEffectiveIoConcurrency, selectParallelSettings,
selectWorkMem, selectHugePages, selectJit, selectWalCompression,
selectAutovacuumMaxWorkers, selectAutovacuumWorkMem), for Linux. It serves as a start
point for the search and as the baseline to beat: docs/architecture.md measured +40-60% from such a
config on a sort-heavy query and no clear change on TPC-B.

Differences from PGTune, on purpose: ``max_connections`` is an input here (the server's
setting, ``hw.max_connections`` unless ``connections`` is given) rather than an output,
and the desktop profile's ``wal_level``/``max_wal_senders`` are left out (not tuned by
knobtune). Values are rendered in PostgreSQL syntax with the largest exact unit.
"""

from __future__ import annotations

import math
from typing import Literal

from optimizer.catalogue import CATALOGUE, GB, KB, MB, Hardware, WorkloadKind
from optimizer.knobs import Config

DbType = Literal["web", "oltp", "dw", "mixed", "desktop"]
_DB_TYPES = ("web", "oltp", "dw", "mixed", "desktop")

_DB_TYPE_OF: dict[str, DbType] = {
    # long scans, sorts and hashes at few clients: PGTune's data warehouse (work_mem
    # halved per connection but with 500-row statistics, JIT left on, larger WAL)
    "analytics": "dw",
    # many short writing transactions (TPC-B, TPC-C): OLTP (full work_mem per
    # connection share, 8GB max_wal_size, JIT off)
    "write-heavy": "oltp",
    # many short reads (select-only): PGTune's web profile is the read-mostly one
    # (JIT off, like oltp, but a smaller WAL, which reads do not write)
    "read-heavy": "web",
    "mixed": "mixed",
}


def db_type_for(kind: WorkloadKind | str) -> DbType:
    """PGTune's database type for a knobtune workload kind (unknown kinds: "mixed")."""
    return _DB_TYPE_OF.get(kind, "mixed")


def pgtune(
    hw: Hardware,
    db_type: DbType = "mixed",
    connections: int | None = None,
    pg_version: int = 15,
) -> Config:
    """PGTune's recommendation for ``hw`` and a database type, as a knobtune Config."""
    if db_type not in _DB_TYPES:
        raise ValueError(f"db_type must be one of {', '.join(_DB_TYPES)}, not {db_type!r}")
    if pg_version < 10:
        raise ValueError("pg_version must be 10 or later")
    conns = connections if connections is not None else hw.max_connections
    if conns < 1:
        raise ValueError("connections must be at least 1")
    mem_kb = hw.ram_bytes // KB
    out: dict[str, str] = {}

    sb_kb = mem_kb // 16 if db_type == "desktop" else mem_kb // 4
    out["shared_buffers"] = f"{sb_kb}kB"
    ecs_kb = mem_kb // 4 if db_type == "desktop" else mem_kb * 3 // 4
    out["effective_cache_size"] = f"{ecs_kb}kB"
    mwm_kb = mem_kb // 8 if db_type == "dw" else mem_kb // 16
    mwm_kb = min(mwm_kb, 8 * GB // KB)  # "default cap is 8GB on modern servers"
    out["maintenance_work_mem"] = f"{mwm_kb}kB"

    min_wal, max_wal = {
        "web": (1024, 4096),
        "oltp": (2048, 8192),
        "dw": (4096, 16384),
        "desktop": (100, 2048),
        "mixed": (1024, 4096),
    }[db_type]
    out["min_wal_size"] = f"{min_wal}MB"
    out["max_wal_size"] = f"{max_wal}MB"
    out["checkpoint_completion_target"] = "0.9"

    # wal_buffers: 3% of shared_buffers, at most 16MB (rounded up to it from 14MB), >= 32kB
    wb_kb = 3 * sb_kb // 100
    wb_kb = min(wb_kb, 16 * MB // KB)
    if 14 * MB // KB < wb_kb < 16 * MB // KB:
        wb_kb = 16 * MB // KB
    wb_kb = max(wb_kb, 32)
    out["wal_buffers"] = f"{wb_kb}kB"

    out["default_statistics_target"] = "500" if db_type == "dw" else "100"
    out["random_page_cost"] = "4" if hw.storage == "hdd" else "1.1"
    out["effective_io_concurrency"] = {"hdd": "2", "ssd": "200", "san": "300"}[hw.storage]

    workers_for_work_mem = 8  # PostgreSQL's default max_worker_processes
    if hw.cpus >= 4:
        per_gather = math.ceil(hw.cpus / 2)
        if db_type != "dw":
            per_gather = min(per_gather, 4)
        out["max_worker_processes"] = str(hw.cpus)
        out["max_parallel_workers_per_gather"] = str(per_gather)
        out["max_parallel_workers"] = str(hw.cpus)
        if pg_version >= 11:
            out["max_parallel_maintenance_workers"] = str(min(math.ceil(hw.cpus / 2), 4))
        workers_for_work_mem = hw.cpus

    # (RAM - shared_buffers) / ((connections + workers) * 3), then per-type divisor, >= 4MB
    wm = (mem_kb - sb_kb) / ((conns + workers_for_work_mem) * 3)
    divisor = {"web": 1, "oltp": 1, "dw": 2, "desktop": 6, "mixed": 2}[db_type]
    wm_kb = max(math.floor(wm / divisor), 4 * MB // KB)
    out["work_mem"] = f"{wm_kb}kB"

    out["huge_pages"] = "try" if sb_kb >= 2 * GB // KB else "off"
    if pg_version >= 12 and db_type in ("web", "oltp", "mixed"):
        out["jit"] = "off"
    out["wal_compression"] = "lz4" if pg_version >= 15 else "on"  # 'on' is pglz before 15
    if hw.cpus >= 32:
        out["autovacuum_max_workers"] = "5"
    elif hw.cpus >= 16:
        out["autovacuum_max_workers"] = "4"
    if mwm_kb >= 2 * GB // KB:
        out["autovacuum_work_mem"] = f"{2 * GB // KB}kB"

    # canonical PostgreSQL syntax: '6291456kB' -> '6GB', 8kB-page knobs rounded like PG does
    config: Config = {}
    for name, text in out.items():
        if not CATALOGUE[name].available(pg_version):
            continue  # never a setting this version lacks
        knob = CATALOGUE[name].build(hw)
        numeric = knob.kind in ("integer", "real")
        config[name] = knob.format(knob.parse(text)) if numeric else text
    return config
