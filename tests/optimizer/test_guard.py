"""The memory guard counts the work_mem of parallel workers (optimizer/guard.py)."""

from __future__ import annotations

from optimizer.guard import GB, MB, estimate_memory, memory_guard

BASE = {
    "shared_buffers": "128MB",
    "wal_buffers": "4MB",
    "work_mem": "64MB",
    "maintenance_work_mem": "64MB",
    "autovacuum_max_workers": "3",
    "hash_mem_multiplier": "2",
}


def test_each_parallel_worker_has_its_own_work_mem() -> None:
    # 2 clients on a 2-CPU box, 4 workers per gather: 8 workers, the pool allows 8
    est = estimate_memory(
        {**BASE, "max_parallel_workers_per_gather": "4"}, ram_bytes=64 * GB, clients=2
    )
    assert est.workers == 8
    assert est.parts["work_mem"] == 2 * 64 * MB * 3
    assert est.parts["parallel_workers"] == 8 * 64 * MB * 3
    # no parallelism: only the clients' own sorts and hashes
    serial = estimate_memory(
        {**BASE, "max_parallel_workers_per_gather": "0"}, ram_bytes=64 * GB, clients=2
    )
    assert serial.workers == 0
    assert serial.parts["parallel_workers"] == 0
    assert est.total - serial.total == 8 * 64 * MB * 3


def test_workers_are_capped_by_the_pool() -> None:
    settings = {**BASE, "max_parallel_workers_per_gather": "4", "max_parallel_workers": "6"}
    assert estimate_memory(settings, ram_bytes=64 * GB, clients=8).workers == 6
    settings["max_worker_processes"] = "3"  # workers come out of the background slots too
    assert estimate_memory(settings, ram_bytes=64 * GB, clients=8).workers == 3


def test_more_workers_per_gather_can_be_rejected() -> None:
    # 4GB RAM, budget 3GB: 4 clients at work_mem 64MB with 2 workers each fit (2.7GB)
    # ... with 4 workers each (and a larger pool) they would need 3.9GB
    inc = {**BASE, "max_parallel_workers_per_gather": "2"}
    cand = {**inc, "max_parallel_workers_per_gather": "4", "max_parallel_workers": "16",
            "max_worker_processes": "16"}  # fmt: skip
    assert memory_guard(inc, inc, ram_bytes=4 * GB, clients=4) is None
    reason = memory_guard(cand, inc, ram_bytes=4 * GB, clients=4)
    assert reason is not None
    assert "16 parallel workers" in reason
