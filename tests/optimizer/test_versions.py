"""Knobs per PostgreSQL version: a knob a version lacks is never tuned nor hinted there."""

from __future__ import annotations

import pytest

from optimizer.catalogue import (
    CATALOGUE,
    GB,
    Hardware,
    available_knobs,
    knob_space,
    major_version,
)
from optimizer.heuristic import pgtune
from optimizer.knobs import KnobError

HW = Hardware(ram_bytes=8 * GB, cpus=4)
AIO = ("io_method", "io_workers")
ALL_IO = (*AIO, "io_combine_limit")


def test_major_version_from_what_the_server_reports() -> None:
    assert major_version(180006) == 18
    assert major_version(150013) == 15
    assert major_version("PostgreSQL 18.6 on x86_64-pc-linux-gnu, compiled by gcc") == 18
    assert major_version("15.20 (Debian 15.20-0+deb12u1)") == 15
    assert major_version(None) is None
    assert major_version("") is None


def test_asynchronous_io_knobs_exist_from_18_and_io_combine_limit_from_17() -> None:
    assert CATALOGUE["io_method"].min_version == 18
    assert CATALOGUE["io_method"].context == "postmaster"  # a restart
    assert CATALOGUE["io_workers"].min_version == 18
    assert CATALOGUE["io_combine_limit"].min_version == 17
    for v in (15, 16):
        assert not set(ALL_IO) & set(available_knobs(v))
    assert "io_combine_limit" in available_knobs(17)
    assert not set(AIO) & set(available_knobs(17))
    assert set(ALL_IO) <= set(available_knobs(18))
    # an unknown version: the whole catalogue (nothing refused on a guess)
    assert available_knobs(None) == list(CATALOGUE)


def test_effective_io_concurrency_default_changed_in_18() -> None:
    spec = CATALOGUE["effective_io_concurrency"]
    assert spec.default_for(15) == spec.default_for(17) == "1"
    assert spec.default_for(18) == "16"
    assert spec.describe()["later_defaults"] == {"18": "16"}


@pytest.mark.parametrize("name", ["io_method", "io_workers", "io_combine_limit"])
def test_a_session_on_15_refuses_a_knob_the_version_lacks(name: str) -> None:
    with pytest.raises(
        KnobError, match=f"{name} exists from PostgreSQL 1[78] on; this server runs 15"
    ):
        knob_space([name, "work_mem"], HW, version=15)
    assert [k.name for k in knob_space([name], HW, version=18)] == [name]


def test_io_method_needs_a_restart_and_tries_only_what_the_server_accepts() -> None:
    (knob,) = knob_space(["io_method"], HW, version=18)
    assert knob.needs_restart
    assert knob.choices == ("sync", "worker", "io_uring")


@pytest.mark.parametrize("version", [10, 15, 16, 17, 18])
@pytest.mark.parametrize("db_type", ["web", "oltp", "dw", "mixed", "desktop"])
def test_pgtune_never_emits_a_setting_the_version_lacks(version: int, db_type: str) -> None:
    tuned = pgtune(HW, db_type, pg_version=version)  # type: ignore[arg-type]
    assert set(tuned) <= set(available_knobs(version))
