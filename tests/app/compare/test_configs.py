"""What default, pgtune and the restart check make of a server's pg_settings rows."""

from __future__ import annotations

import pytest

from app.compare.configs import (
    Resolved,
    complete,
    default_config,
    pgtune_config,
    restart_knobs,
)
from app.errors import RequestError
from optimizer.knobs import SettingRow

GIB = 2**30


def row(
    name: str, setting: str, unit: str | None, vartype: str, context: str, boot: str
) -> SettingRow:
    limits = ("-1", "2147483647") if vartype == "integer" else (None, None)
    enums = ("off", "try", "on") if vartype == "enum" else None
    return SettingRow(name, setting, unit, vartype, context, *limits, enums, boot, boot)


def server(**settings: str) -> dict[str, SettingRow]:
    """PostgreSQL 15's rows for a few knobs, with ``settings`` (pg_settings.setting) set."""
    rows = {
        "shared_buffers": row("shared_buffers", "16384", "8kB", "integer", "postmaster", "1024"),
        "wal_buffers": row("wal_buffers", "512", "8kB", "integer", "postmaster", "-1"),
        "work_mem": row("work_mem", "4096", "kB", "integer", "user", "4096"),
        "max_wal_size": row("max_wal_size", "1024", "MB", "integer", "sighup", "1024"),
        "huge_pages": row("huge_pages", "try", None, "enum", "postmaster", "try"),
        "max_connections": row("max_connections", "100", None, "integer", "postmaster", "100"),
        "wal_segment_size": row("wal_segment_size", "16777216", "B", "integer", "internal", ""),
    }
    for name, value in settings.items():
        r = rows[name]
        rows[name] = SettingRow(r.name, value, r.unit, r.vartype, r.context, r.min_val,
                                r.max_val, r.enumvals, r.reset_val, r.boot_val)  # fmt: skip
    return rows


def test_default_is_postgresqls_value_of_what_differs() -> None:
    # shared_buffers: initdb's 128MB (the documented default), not the compiled-in 8MB
    assert default_config(server()) == {}
    tuned = server(shared_buffers="131072", wal_buffers="2048", work_mem="65536")
    # wal_buffers' built-in -1 (auto) is written as what auto gives for 128MB: 16384
    # pages / 32 = 512 pages = 4MB, which pg_settings can confirm afterwards
    assert default_config(tuned) == {
        "shared_buffers": "128MB",
        "wal_buffers": "4MB",
        "work_mem": "4MB",
    }
    assert default_config(server(huge_pages="on")) == {"huge_pages": "try"}


def test_pgtune_for_the_servers_memory_and_cpus() -> None:
    config, note = pgtune_config(server(), 2 * GIB, 2, "write-heavy", 150004)
    assert config["shared_buffers"] == "512MB"  # a quarter of the memory the server has
    assert config["work_mem"]
    assert "oltp config for 2.00 GiB and 2 CPU(s), 100 connections" in note
    # knobs this server lacks (its rows) are left out, and the note names them
    assert "random_page_cost" not in config
    assert "left out, this server does not accept" in note
    assert "random_page_cost" in note
    with pytest.raises(RequestError, match="register it with ram_bytes and cpus"):
        pgtune_config(server(), None, None, "mixed", 150004)


def test_restart_knobs_are_postmaster_knobs_that_change() -> None:
    rows = server()
    assert restart_knobs({"shared_buffers": "256MB", "work_mem": "8MB"}, rows) == ["shared_buffers"]
    assert restart_knobs({"shared_buffers": "128MB"}, rows) == []  # its value already


def test_complete_fills_in_default_current_and_pgtune() -> None:
    given = [
        Resolved("default", "default", None),
        Resolved("current", "current", None),
        Resolved("pgtune", "pgtune", None),
        Resolved("mine", "settings", {"work_mem": "8MB"}),
    ]
    out = complete(given, server(), ram_bytes=GIB, cpus=1, kind="analytics", version_num=150004)
    by = {c.name: c for c in out}
    assert by["default"].settings == {}
    assert by["current"].settings == {}
    assert by["pgtune"].settings is not None
    assert by["pgtune"].settings["shared_buffers"] == "256MB"
    assert "dw config" in (by["pgtune"].note or "")
    assert by["mine"] is given[3]
    assert Resolved.from_json(by["pgtune"].to_json()) == by["pgtune"]


def test_without_a_restart_default_and_pgtune_leave_restart_knobs_out() -> None:
    given = [Resolved("default", "default", None), Resolved("pgtune", "pgtune", None)]
    rows = server(shared_buffers="131072", work_mem="65536")
    out = complete(
        given, rows, ram_bytes=GIB, cpus=1, kind="mixed", version_num=150004,
        no_restart="the target has no restart method",
    )  # fmt: skip
    default, tuned = out
    assert default.settings == {"work_mem": "4MB"}
    assert "left out: shared_buffers (a restart is needed" in (default.note or "")
    assert tuned.settings is not None
    assert not {"shared_buffers", "wal_buffers", "huge_pages"} & set(tuned.settings)
    assert "the target has no restart method" in (tuned.note or "")
