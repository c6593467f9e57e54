"""The memory guard counts the work_mem of parallel workers (optimizer/guard.py)."""

from __future__ import annotations

from optimizer.guard import (
    GB,
    MB,
    MemoryUse,
    MemoryWatch,
    back_to_level,
    estimate_memory,
    measured_memory_guard,
    memory_guard,
    pool_refilled,
    predict_memory,
)

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


# -- measured memory (the guard of a local server) ------------------------------------------
MIB = 1024 * 1024
PG15 = {"shared_buffers": "128MB", "wal_buffers": "-1", "work_mem": "4MB",
        "maintenance_work_mem": "64MB", "autovacuum_max_workers": "3",
        "hash_mem_multiplier": "2", "max_parallel_workers_per_gather": "2",
        "max_parallel_workers": "8", "max_worker_processes": "8"}  # fmt: skip
# about what a TPC-B server (8 clients) held under PostgreSQL's defaults in a 512 MiB cgroup
# (memory.stat: rss 15 MiB, shmem 140 MiB once the pool was full): its backends' own memory,
# and the shared memory touched (the pool, WAL buffers, lock tables and the like)
SEEN = MemoryUse(private=20 * MIB, shared=140 * MIB)


def test_the_worst_case_refuses_every_pool_increase_where_the_measured_one_does_not() -> None:
    # the static model: the default config already needs more than 75% of 512 MiB
    static = estimate_memory(PG15, ram_bytes=512 * MIB, clients=8)
    assert not static.fits
    for sb in ("256MB", "384MB"):
        cand = {**PG15, "shared_buffers": sb}
        assert memory_guard(cand, PG15, ram_bytes=512 * MIB, clients=8) is not None
        # measured: half and three quarters of the cgroup fit under its 90%
        assert (
            measured_memory_guard(cand, PG15, SEEN, limit_bytes=512 * MIB, clients=8, spilled=False)
            is None
        )
    # all of it does not: shared memory is counted at its full size
    whole = {**PG15, "shared_buffers": "512MB"}
    reason = measured_memory_guard(
        whole, PG15, SEEN, limit_bytes=512 * MIB, clients=8, spilled=False
    )
    assert reason is not None
    assert reason.startswith("memory guard: would hold")
    assert "against 90% of the 512MB the server may use" in reason


def test_work_mem_counts_only_when_the_workload_spilled() -> None:
    big = {**PG15, "work_mem": "64MB"}
    parts = predict_memory(big, PG15, SEEN, clients=8, spilled=False)
    assert parts["work_mem"] == 0  # sorts that fit in 4MB use no more at 64MB
    parts = predict_memory(big, PG15, SEEN, clients=8, spilled=True)
    assert parts["work_mem"] == 60 * MIB * 3 * 8  # the change, per client, sort + hash
    assert measured_memory_guard(big, PG15, SEEN, limit_bytes=512 * MIB, clients=8,
                                 spilled=True) is not None  # fmt: skip


def test_a_pool_that_was_not_full_is_counted_full() -> None:
    cold = MemoryUse(private=60 * MIB, shared=20 * MIB)  # 20 MiB of a 128 MiB pool touched
    parts = predict_memory(PG15, PG15, cold, clients=8, spilled=False)
    assert parts["shared"] == 128 * MIB + 4 * MIB  # the pool and wal_buffers (auto: 1/32)


def test_less_is_never_refused_and_absurd_values_are() -> None:
    tight = MemoryUse(private=300 * MIB, shared=150 * MIB)  # already near the limit
    smaller = {**PG15, "shared_buffers": "64MB"}
    assert (
        measured_memory_guard(smaller, PG15, tight, limit_bytes=512 * MIB, clients=8, spilled=True)
        is None
    )
    # a work_mem of 8 GB on a 16 GB server whose workload never spilled: nothing to predict
    # from the runs, but its worst case is absurd (the sanity ceiling)
    absurd = {**PG15, "work_mem": "8GB"}
    assert predict_memory(absurd, PG15, SEEN, clients=8, spilled=False)["work_mem"] == 0
    reason = measured_memory_guard(
        absurd, PG15, SEEN, limit_bytes=16 * GB, clients=8, spilled=False
    )
    assert reason is not None
    assert "more than 2x the 16GB of RAM" in reason


def test_the_live_guard_stops_past_90_percent() -> None:
    watch = MemoryWatch(limit_bytes=512 * MIB)
    assert watch.observe(MemoryUse(200 * MIB, 200 * MIB)) is None
    said = watch.observe(MemoryUse(200 * MIB, 270 * MIB))
    assert said is not None
    assert said.startswith("memory guard (live): the server held 470MB")


def test_a_pool_is_warm_when_full_or_when_reads_into_it_stop() -> None:
    pool = 32768  # 256MB of 8kB buffers
    # filling from a slow disk: ~1000 buffers a second, warm at 95% full, not before
    filling = [1000 * (i + 1) for i in range(40)]
    ends = next(n for n in range(1, 41) if pool_refilled(filling[:n], pool))
    assert ends == 32  # 31,130 of 32,768 buffers
    reason = pool_refilled(filling[:ends], pool)
    assert reason is not None
    assert reason.startswith("the buffer pool refilled")
    # data smaller than the pool: the reads stop; warm once 5 s allocated under 1% of it
    small = [2000, 4000, 5000, 5100, 5150, 5170, 5180, 5190, 5195, 5200]
    ends = next(n for n in range(1, 11) if pool_refilled(small[:n], pool))
    assert ends == 8  # 5,180 - 5,000 = 180 < 328 buffers over the last 5 s
    reason = pool_refilled(small[:ends], pool)
    assert reason is not None
    assert reason.startswith("reads settled")
    # the first seconds say nothing yet; a pool of no size is never judged
    assert pool_refilled([0, 0, 0], pool) is None
    assert pool_refilled(filling, 0) is None


def test_a_config_measured_warm_before_must_be_back_near_its_level() -> None:
    # the incumbent ran at ~330 tps warm; after a restart its pool refilled in 9 s, yet the
    # page cache was still cold (144-176 tps for a whole run, TPC-C under 1 GB)
    climbing = [100.0 + 5 * i for i in range(60)]
    ends = next(n for n in range(1, 61) if back_to_level(climbing[:n], 330.0, 5))
    assert climbing[ends - 3] >= 0.9 * 330  # the window's median reached 297
    assert back_to_level(climbing[:20], 330.0, 5) is None
    assert back_to_level([400.0] * 4, 330.0, 5) is None  # a whole window first
    assert back_to_level([400.0] * 5, 0.0, 5) is None  # no level known: not this rule
