"""PGTune-style start configuration (le0pard/pgtune formulas)."""

from __future__ import annotations

import pytest

from optimizer.catalogue import CATALOGUE, GB, MB, Hardware, knob_space
from optimizer.heuristic import db_type_for, pgtune


def test_design_doc_machine() -> None:
    # docs/architecture.md: 24 GiB, 2 CPUs -> shared_buffers 6GB, work_mem ~28MB, max_wal_size 4GB
    cfg = pgtune(Hardware(ram_bytes=24 * GB, cpus=2))
    assert cfg["shared_buffers"] == "6GB"
    assert cfg["effective_cache_size"] == "18GB"
    assert cfg["maintenance_work_mem"] == "1536MB"
    assert cfg["work_mem"] == "29127kB"  # (24GB - 6GB) / ((100 + 8) * 3) / 2
    assert (cfg["min_wal_size"], cfg["max_wal_size"]) == ("1GB", "4GB")
    assert cfg["wal_buffers"] == "16MB"
    assert cfg["checkpoint_completion_target"] == "0.9"
    assert cfg["random_page_cost"] == "1.1"
    assert cfg["effective_io_concurrency"] == "200"
    assert cfg["huge_pages"] == "try"
    assert cfg["jit"] == "off"
    assert "max_parallel_workers_per_gather" not in cfg  # fewer than 4 CPUs


def test_types_storage_and_parallelism() -> None:
    dw = pgtune(Hardware(ram_bytes=64 * GB, cpus=16, storage="hdd"), "dw", connections=40)
    assert dw["default_statistics_target"] == "500"
    assert dw["maintenance_work_mem"] == "8GB"  # RAM/8 capped at 8GB
    assert dw["random_page_cost"] == "4"
    assert dw["effective_io_concurrency"] == "2"
    assert dw["max_parallel_workers_per_gather"] == "8"  # dw is not capped at 4
    assert dw["max_worker_processes"] == "16"
    assert dw["autovacuum_max_workers"] == "4"
    assert dw["autovacuum_work_mem"] == "2GB"
    assert "jit" not in dw  # left at the server default for dw
    web = pgtune(Hardware(ram_bytes=2 * GB, cpus=8), "web", connections=200)
    assert web["max_parallel_workers_per_gather"] == "4"
    assert web["work_mem"] == "4MB"  # floor
    desk = pgtune(Hardware(ram_bytes=8 * GB, cpus=2), "desktop")
    assert desk["shared_buffers"] == "512MB"  # RAM/16
    assert desk["huge_pages"] == "off"
    assert pgtune(Hardware(ram_bytes=8 * GB, cpus=2), pg_version=14)["wal_compression"] == "on"


@pytest.mark.parametrize("db_type", ["web", "oltp", "dw", "mixed", "desktop"])
def test_every_value_is_a_valid_catalogue_setting(db_type: str) -> None:
    hw = Hardware(ram_bytes=32 * GB, cpus=8)
    cfg = pgtune(hw, db_type)  # type: ignore[arg-type]
    space = {k.name: k for k in knob_space(list(cfg), hw)}
    for name, value in cfg.items():
        assert name in CATALOGUE
        space[name].parse(value)
    sb = space["shared_buffers"].parse(cfg["shared_buffers"])
    assert isinstance(sb, float)
    assert sb * 8192 <= 0.40 * hw.ram_bytes


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="db_type"):
        pgtune(Hardware(ram_bytes=8 * GB, cpus=2), "olap")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        pgtune(Hardware(ram_bytes=512 * MB, cpus=1), connections=0)


def test_db_type_follows_the_workload_kind() -> None:
    assert db_type_for("analytics") == "dw"
    assert db_type_for("write-heavy") == "oltp"
    assert db_type_for("read-heavy") == "web"
    assert db_type_for("mixed") == "mixed"
    assert db_type_for("something-new") == "mixed"
    hw = Hardware(ram_bytes=24 * GB, cpus=2)
    dw = pgtune(hw, db_type_for("analytics"))
    assert dw["default_statistics_target"] == "500"
    assert "jit" not in dw  # PGTune leaves JIT on for a data warehouse
    assert pgtune(hw, db_type_for("write-heavy"))["jit"] == "off"
