"""Knob values are parsed and formatted exactly as PostgreSQL 15 does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optimizer.catalogue import GB, Hardware, knob_space
from optimizer.knobs import Knob, KnobError, KnobValueError, SettingRow, narrow

HW = Hardware(ram_bytes=16 * GB, cpus=4)
SPACE = {
    k.name: k
    for k in knob_space(
        [
            "shared_buffers",
            "work_mem",
            "max_wal_size",
            "checkpoint_timeout",
            "wal_writer_delay",
            "checkpoint_completion_target",
            "jit",
            "wal_compression",
            "commit_delay",
            "synchronous_commit",
        ],
        HW,
        allow_unsafe=True,
    )
}
# wide bounds so parse/format tests are not about the catalogue's safe bounds
SB = Knob("shared_buffers", "integer", "8kB", 16, 1073741823, "128MB", context="postmaster")
WM = Knob("work_mem", "integer", "kB", 64, 2147483647, "4MB")
CT = Knob("checkpoint_timeout", "integer", "s", 30, 86400, "5min")


@pytest.mark.parametrize(
    ("knob", "text", "value"),
    [
        (SB, "128MB", 16384),
        (SB, "16384", 16384),  # bare numbers are in the base unit (8kB pages)
        (SB, "8GB", 1048576),
        (SB, "1TB", 134217728),
        (SB, " 16 MB ", 2048),  # whitespace around the number and the unit
        (SB, "1.5GB", 196608),
        (SB, "12kB", 2),  # 1.5 pages rounds half to even like rint()
        (SB, "8192B", 1),
        (SB, "0x10", 16),  # strtol base 0: hex ...
        (SB, "010", 8),  # ... and octal
        (SB, "1e3", 1000),
        (WM, "16MB", 16384),
        (WM, "4096", 4096),
        (WM, "1GB", 1048576),
        (WM, "30.1GB", 31561728),  # 30822MB: rounded to whole MB, like convert_to_base_unit
        (CT, "30min", 1800),
        (CT, "300", 300),
        (CT, "1h", 3600),
        (CT, "1d", 86400),
        (CT, "1500ms", 2),
        (CT, "2.5min", 150),
        (CT, "90000000us", 90),
    ],
)
def test_parse_integer_with_units(knob: Knob, text: str, value: float) -> None:
    assert knob.parse(text) == value


@pytest.mark.parametrize(
    "text",
    ["16mb", "16Mb", "16 M", "16MBx", "16 MB x", "", " ", "MB", "08", "1e", "nan", "inf",
     "3000000000", "16 megabytes", "1,5GB", "+-1", "1_000", "١٢"],
)  # fmt: skip
def test_garbage_raises_knob_value_error(text: str) -> None:
    with pytest.raises(KnobValueError) as err:
        SB.parse(text)
    msg = str(err.value)
    assert "shared_buffers" in msg
    assert "kB, MB, GB" in msg  # says what is accepted


def test_units_only_where_the_setting_has_one() -> None:
    k = SPACE["commit_delay"]  # microseconds, but no GUC unit: PostgreSQL rejects a suffix
    assert k.parse("100") == 100
    with pytest.raises(KnobValueError, match="takes no unit"):
        k.parse("100us")


def test_time_units_are_rejected_for_memory_and_vice_versa() -> None:
    with pytest.raises(KnobValueError):
        SB.parse("10s")
    with pytest.raises(KnobValueError):
        CT.parse("10MB")


@pytest.mark.parametrize(
    ("text", "value"),
    [("on", "on"), ("off", "off"), ("TRUE", "on"), ("t", "on"), ("tr", "on"), ("false", "off"),
     ("f", "off"), ("yes", "on"), ("y", "on"), ("no", "off"), ("n", "off"), ("1", "on"),
     ("0", "off"), ("of", "off"), ("ON", "on"), ("Off", "off")],
)  # fmt: skip
def test_bool_spellings(text: str, value: str) -> None:
    assert SPACE["jit"].parse(text) == value


@pytest.mark.parametrize("text", ["o", "2", " on", "on ", "onn", "truth", "", "nope", "10"])
def test_bool_garbage(text: str) -> None:
    with pytest.raises(KnobValueError, match="jit"):
        SPACE["jit"].parse(text)


def test_enum_is_case_insensitive_with_hidden_spellings() -> None:
    sc = SPACE["synchronous_commit"]
    assert sc.parse("LOCAL") == "local"
    assert sc.parse("true") == "on"  # hidden boolean spellings, exact words only
    with pytest.raises(KnobValueError, match="one of off, local"):
        sc.parse("loc")
    wc = SPACE["wal_compression"]
    assert wc.parse("on") == "pglz"  # PostgreSQL 15: on is pglz


def test_real_values() -> None:
    cct = SPACE["checkpoint_completion_target"]
    assert cct.parse("0.9") == 0.9
    assert cct.parse(".5") == 0.5
    assert cct.parse("9e-1") == 0.9
    for bad in ("0.9x", "1e999", "inf", "nan", "0,9"):
        with pytest.raises(KnobValueError):
            cct.parse(bad)
    assert cct.format(0.9) == "0.9"


@pytest.mark.parametrize(
    ("knob", "value", "text"),
    [
        (SB, 16384, "128MB"),
        (SB, 1048576, "8GB"),
        (SB, 3, "24kB"),
        (SB, 196608, "1536MB"),
        (WM, 16384, "16MB"),
        (WM, 5632, "5632kB"),
        (WM, 29127, "29127kB"),
        (CT, 1800, "30min"),
        (CT, 150, "150s"),
        (CT, 86400, "1d"),
        (SB, -1, "-1"),
        (SB, 0, "0"),
    ],
)
def test_format_uses_largest_exact_unit(knob: Knob, value: float, text: str) -> None:
    assert knob.format(value) == text
    assert knob.parse(text) == value


def test_validate_checks_bounds() -> None:
    wm = SPACE["work_mem"]
    assert wm.validate("16MB") == 16384
    with pytest.raises(KnobValueError, match="outside the allowed range"):
        wm.validate("1TB")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=24))
def test_fuzz_parser_raises_only_knob_value_error(text: str) -> None:
    for knob in (SB, CT, SPACE["checkpoint_completion_target"], SPACE["jit"],
                 SPACE["synchronous_commit"], SPACE["commit_delay"]):  # fmt: skip
        try:
            value = knob.parse(text)
        except KnobValueError:
            continue
        # whatever is accepted formats to text that parses back to the same value
        assert knob.parse(knob.format(value)) == value


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=0, max_value=2**31 - 1),
    st.sampled_from(["", "B", "kB", "MB", "GB", "TB"]),
    st.sampled_from(["", " "]),
)
def test_fuzz_memory_numbers(n: int, unit: str, space: str) -> None:
    text = f"{n}{space}{unit}"
    if (
        n * {"": 1024, "B": 1, "kB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}[unit]
        >= (2**31 - 0.5) * 1024
    ):
        with pytest.raises(KnobValueError, match="integer range"):
            WM.parse(text)  # too big for a 32-bit kB count, the only legal reason to fail
        return
    v = WM.parse(text)
    assert WM.parse(WM.format(v)) == v


def _row(name: str, unit: str | None, lo: str, hi: str, vartype: str = "integer") -> SettingRow:
    return SettingRow(name, "0", unit, vartype, "user", lo, hi)


def test_narrow_converts_pg_settings_units() -> None:
    sb = SPACE["shared_buffers"]  # pg_settings min/max are in the row's unit: 8kB pages
    got = narrow(sb, _row("shared_buffers", "8kB", "16", "262144"))  # at most 2GB
    assert got.upper == 262144
    assert got.lower == sb.lower
    assert got.format(got.upper) == "2GB"
    wm = narrow(SPACE["work_mem"], _row("work_mem", "kB", "2048", "2147483647"))
    assert wm.lower == 2048
    mws = narrow(SPACE["max_wal_size"], _row("max_wal_size", "MB", "2", "4096"))
    assert mws.upper == 4096
    ct = narrow(SPACE["checkpoint_timeout"], _row("checkpoint_timeout", "s", "30", "600"))
    assert ct.format(ct.upper) == "10min"
    # a server reporting in another unit (e.g. MB instead of kB) is converted, not misread
    wm2 = narrow(SPACE["work_mem"], _row("work_mem", "MB", "2", "8"))
    assert (wm2.lower, wm2.upper) == (2048, 8192)


def test_narrow_takes_the_servers_context_and_enumvals() -> None:
    row = SettingRow(
        "wal_compression", "off", None, "enum", "superuser", enumvals=("pglz", "on", "off")
    )
    got = narrow(SPACE["wal_compression"], row)
    assert got.choices == ("off", "pglz")  # this build has no lz4/zstd
    sb_row = SettingRow("shared_buffers", "16384", "8kB", "integer", "postmaster", "16", "99999999")
    assert narrow(SPACE["shared_buffers"], sb_row).needs_restart


def test_narrow_errors_say_what_to_change() -> None:
    with pytest.raises(KnobError, match="does not overlap"):
        narrow(SPACE["work_mem"], _row("work_mem", "kB", "64", "128"))
    with pytest.raises(KnobError, match="vartype"):
        narrow(SPACE["work_mem"], _row("work_mem", "kB", "64", "128", vartype="real"))
    with pytest.raises(KnobError, match="remove the knob"):
        narrow(
            SPACE["wal_compression"],
            SettingRow("wal_compression", "off", None, "enum", "user", enumvals=("x",)),
        )


def test_a_range_always_holds_the_servers_current_value() -> None:
    # issue 29: on a 2-CPU box the catalogue's max_parallel_workers_per_gather range is 0..1;
    # the server's own 2 must stay in it, or the start config silently becomes 1
    hw = Hardware(ram_bytes=4 * 1024**3, cpus=2)
    assert knob_space(["max_parallel_workers_per_gather"], hw)[0].upper == 1
    row = SettingRow("max_parallel_workers_per_gather", "2", None, "integer", "user", "0", "1024")
    (k,) = knob_space(["max_parallel_workers_per_gather"], hw, {row.name: row})
    assert (k.lower, k.upper) == (0, 2)
    # below the catalogue's floor too, in the row's own unit (8kB pages)
    sb = SettingRow("shared_buffers", "16", "8kB", "integer", "postmaster", "16", "1073741823")
    (s,) = knob_space(["shared_buffers"], hw, {sb.name: sb})
    assert s.lower == 16
    assert s.format(s.lower) == "128kB"
    # a value the server itself would not accept is no reason to widen
    bad = SettingRow("work_mem", "0", "kB", "integer", "user", "64", "2147483647")
    assert narrow(SPACE["work_mem"], bad).lower == SPACE["work_mem"].lower
