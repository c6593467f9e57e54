"""The catalogue matches PostgreSQL 15 and keeps the search within safe bounds."""

from __future__ import annotations

import pytest

from optimizer.catalogue import CATALOGUE, GB, MB, Hardware, default_knobs, knob_space
from optimizer.knobs import KnobError

HW = Hardware(ram_bytes=16 * GB, cpus=4)

# pg_settings.context, unit and boot value in PostgreSQL 15
PG15 = {
    "shared_buffers": ("postmaster", "8kB", "128MB"),
    "wal_buffers": ("postmaster", "8kB", "-1"),
    "huge_pages": ("postmaster", None, "try"),
    "work_mem": ("user", "kB", "4MB"),
    "maintenance_work_mem": ("user", "kB", "64MB"),
    "effective_cache_size": ("user", "8kB", "4GB"),
    "max_wal_size": ("sighup", "MB", "1GB"),
    "min_wal_size": ("sighup", "MB", "80MB"),
    "checkpoint_timeout": ("sighup", "s", "5min"),
    "checkpoint_completion_target": ("sighup", None, "0.9"),
    "checkpoint_flush_after": ("sighup", "8kB", "256kB"),
    "wal_writer_delay": ("sighup", "ms", "200ms"),
    "wal_writer_flush_after": ("sighup", "8kB", "1MB"),
    "bgwriter_delay": ("sighup", "ms", "200ms"),
    "bgwriter_lru_maxpages": ("sighup", None, "100"),
    "bgwriter_lru_multiplier": ("sighup", None, "2"),
    "bgwriter_flush_after": ("sighup", "8kB", "512kB"),
    "backend_flush_after": ("user", "8kB", "0"),
    "commit_delay": ("superuser", None, "0"),
    "commit_siblings": ("user", None, "5"),
    "random_page_cost": ("user", None, "4"),
    "effective_io_concurrency": ("user", None, "1"),
    "default_statistics_target": ("user", None, "100"),
    "autovacuum_naptime": ("sighup", "s", "1min"),
    "jit": ("user", None, "on"),
    "hash_mem_multiplier": ("user", None, "2"),
    "jit_above_cost": ("user", None, "100000"),
    "jit_inline_above_cost": ("user", None, "500000"),
    "jit_optimize_above_cost": ("user", None, "500000"),
    "parallel_setup_cost": ("user", None, "1000"),
    "parallel_tuple_cost": ("user", None, "0.1"),
    "fsync": ("sighup", None, "on"),
    "synchronous_commit": ("user", None, "on"),
    "full_page_writes": ("sighup", None, "on"),
}


def test_catalogue_covers_the_issue_list_with_pg15_contexts() -> None:
    assert len(CATALOGUE) >= 20
    for name, (context, unit, default) in PG15.items():
        spec = CATALOGUE[name]
        assert (spec.context, spec.unit, spec.default) == (context, unit, default), name


def test_restart_flag_follows_context() -> None:
    space = {k.name: k for k in knob_space(["shared_buffers", "work_mem", "max_wal_size"], HW)}
    assert space["shared_buffers"].needs_restart
    assert not space["work_mem"].needs_restart
    assert not space["max_wal_size"].needs_restart


def test_step_rules() -> None:
    assert CATALOGUE["shared_buffers"].step == "multiplicative"
    assert CATALOGUE["checkpoint_timeout"].step == "multiplicative"
    assert CATALOGUE["checkpoint_completion_target"].step == "additive"
    space = {k.name: k for k in knob_space(["jit", "work_mem"], HW)}
    assert space["jit"].step == "ordered"
    assert space["work_mem"].step_size == 2.0


def test_durability_unsafe_knobs_need_opt_in() -> None:
    unsafe = {n for n, s in CATALOGUE.items() if s.durability_unsafe}
    assert unsafe == {"fsync", "synchronous_commit", "full_page_writes"}
    for name in unsafe:
        with pytest.raises(KnobError, match="allow_unsafe"):
            knob_space(["work_mem", name], HW)
        (k,) = knob_space([name], HW, allow_unsafe=True)
        assert k.durability_unsafe


def test_unknown_knob_lists_close_matches() -> None:
    with pytest.raises(KnobError, match="did you mean shared_buffers"):
        knob_space(["shared_buffer"], HW)
    with pytest.raises(KnobError, match="twice"):
        knob_space(["work_mem", "work_mem"], HW)


def test_bounds_scale_with_the_machine() -> None:
    small = {k.name: k for k in knob_space(["shared_buffers", "work_mem"], Hardware(4 * GB, 2))}
    big = {k.name: k for k in knob_space(["shared_buffers", "work_mem"], Hardware(64 * GB, 16))}
    for space, ram in ((small, 4 * GB), (big, 64 * GB)):
        # <= 90% of RAM: the memory guard decides what fits (optimizer/guard.py)
        assert space["shared_buffers"].upper * 8192 <= 0.90 * ram
    assert big["shared_buffers"].upper > small["shared_buffers"].upper
    many = knob_space(["work_mem"], Hardware(16 * GB, 4, max_connections=1000))[0]
    few = knob_space(["work_mem"], Hardware(16 * GB, 4, max_connections=10))[0]
    assert many.upper < few.upper  # work_mem x connections stays within RAM
    assert many.upper * 1024 * 2 * 1000 <= 16 * GB or many.upper * 1024 == 16 * MB


def test_every_catalogue_default_parses_and_bounds_are_ordered() -> None:
    for k in knob_space(list(CATALOGUE), HW, allow_unsafe=True):
        k.parse(k.default)
        assert k.lower <= k.upper, k.name


@pytest.mark.parametrize("kind", ["write-heavy", "read-heavy", "mixed"])
def test_default_sets(kind: str) -> None:
    names = default_knobs(kind)  # type: ignore[arg-type]
    assert 4 <= len(names) <= 8
    assert all(not CATALOGUE[n].durability_unsafe for n in names)
    knob_space(names, HW)  # builds without errors
    with pytest.raises(KnobError):
        default_knobs("oltp")  # type: ignore[arg-type]


def test_analytics_set_tunes_memory_per_operation_first() -> None:
    names = default_knobs("analytics")
    assert names[:2] == ["work_mem", "hash_mem_multiplier"]
    assert names[-1] == "shared_buffers"  # the only one that needs a restart
    assert "default_statistics_target" not in names  # acts only after ANALYZE
    assert all(not CATALOGUE[n].durability_unsafe for n in names)
    space = {k.name: k for k in knob_space(names, HW)}
    assert [k.name for k in space.values() if k.needs_restart] == ["shared_buffers"]
    # the planner's parallel costs are searched multiplicatively from their defaults
    assert space["parallel_setup_cost"].lower <= 1000 <= space["parallel_setup_cost"].upper
    assert space["parallel_tuple_cost"].lower <= 0.1 <= space["parallel_tuple_cost"].upper
    assert space["hash_mem_multiplier"].lower == 1.0  # PostgreSQL's minimum


def test_describe_is_json_ready() -> None:
    d = CATALOGUE["jit"].describe()
    assert d["choices"] == ["off", "on"]
    assert d["needs_restart"] is False
