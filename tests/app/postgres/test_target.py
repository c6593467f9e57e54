"""TargetController against real sandbox clusters: apply, verify, restart, revert, failures."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import psycopg
import pytest

from app.postgres.sandbox import Sandbox
from app.postgres.target import (
    ApplyError,
    ConnectError,
    RestartUnavailable,
    Snapshot,
    TargetController,
    mask_dsn,
    parse_conf,
    render_auto_conf,
)
from app.postgres.units import same_value
from optimizer.knobs import Knob, KnobValueError, SettingRow

KNOBS = ["work_mem", "max_wal_size", "shared_buffers", "maintenance_work_mem", "random_page_cost"]


def file_settings(dsn: str) -> list[tuple[Any, ...]]:
    """pg_file_settings, all of it: files, lines, order, values, errors."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT sourcefile, sourceline, seqno, name, setting, applied, error "
            "FROM pg_file_settings ORDER BY seqno"
        ).fetchall()


def setting(dsn: str, name: str) -> tuple[str, str]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT setting, current_setting(name) FROM pg_settings WHERE name = %s", [name]
        ).fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


def sql(dsn: str, statement: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)


def table_exists(dsn: str, name: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [name]).fetchone()
    return bool(row and row[0])


@pytest.fixture
def ctl(fresh_sandbox: Sandbox) -> TargetController:
    return TargetController.for_sandbox(fresh_sandbox)


def test_probe(sandbox: Sandbox) -> None:
    ctl = TargetController(sandbox.dsn, restart=sandbox.restart_method)
    p = ctl.probe([*KNOBS, "no_such_knob"])
    assert p.version_num >= 130000
    assert p.version
    assert p.is_superuser
    assert p.can_alter_system
    assert p.local
    assert p.ram_bytes
    assert p.ram_bytes > 2**28
    assert p.cpus
    assert p.cpus >= 1
    assert p.data_directory == str(sandbox.data_dir)
    assert p.missing == ["no_such_knob"]
    sb = p.settings["shared_buffers"]
    assert (sb.unit, sb.vartype, sb.context) == ("8kB", "integer", "postmaster")
    assert sb.min_val == "16"
    assert sb.boot_val is not None
    assert not sb.pending_restart
    assert p.settings["work_mem"].context == "user"
    assert p.settings["random_page_cost"].vartype == "real"
    assert ctl.can_restart


def test_snapshot_is_json(sandbox: Sandbox) -> None:
    ctl = TargetController(sandbox.dsn)
    snap = ctl.snapshot(KNOBS)
    assert snap.effective["work_mem"] == "4MB"
    assert snap.effective["shared_buffers"] == "128MB"
    again = Snapshot.from_json(json.loads(json.dumps(snap.to_json())))
    assert again == snap
    with pytest.raises(ValueError):
        Snapshot.from_json({"auto_conf": []})


def test_apply_reload_knobs_is_verified(ctl: TargetController, fresh_sandbox: Sandbox) -> None:
    t0 = time.monotonic()
    res = ctl.apply({"work_mem": "16MB", "max_wal_size": "2GB"})
    took = time.monotonic() - t0
    assert not res.restarted
    assert res.effective == {"work_mem": "16MB", "max_wal_size": "2GB"}
    assert setting(fresh_sandbox.dsn, "work_mem") == ("16384", "16MB")
    # The same value in other units is the same setting, not a verification failure.
    res = ctl.apply({"work_mem": "16384kB", "max_wal_size": "2048MB"})
    assert res.effective == {"work_mem": "16MB", "max_wal_size": "2GB"}
    print(f"apply+reload+verify: {took * 1000:.0f} ms")
    assert took < 5


def test_apply_restart_knob(ctl: TargetController, fresh_sandbox: Sandbox) -> None:
    res = ctl.apply({"shared_buffers": "256MB", "work_mem": "8MB"})
    assert res.restarted
    assert res.effective == {"shared_buffers": "256MB", "work_mem": "8MB"}
    assert setting(fresh_sandbox.dsn, "shared_buffers") == ("32768", "256MB")
    print(f"apply with restart: {res.seconds:.2f} s")
    # Unchanged postmaster value: no restart.
    assert not ctl.apply({"shared_buffers": "32768"}).restarted


def test_revert_restores_pg_file_settings_exactly(
    ctl: TargetController, fresh_sandbox: Sandbox
) -> None:
    dsn = fresh_sandbox.dsn
    # Entries that existed before the session must come back, in place.
    sql(dsn, "ALTER SYSTEM SET work_mem = '8MB'")
    sql(dsn, "ALTER SYSTEM SET random_page_cost = 1.5")
    sql(dsn, "SELECT pg_reload_conf()")
    auto_conf = fresh_sandbox.data_dir / "postgresql.auto.conf"
    before_text = auto_conf.read_text()
    before_rows = file_settings(dsn)
    snap = ctl.snapshot(KNOBS)
    assert snap.auto_conf == {"work_mem": "8MB", "random_page_cost": "1.5"}

    ctl.apply({"work_mem": "32MB", "max_wal_size": "3GB"})
    ctl.apply({"shared_buffers": "192MB", "random_page_cost": "1.1"})
    assert file_settings(dsn) != before_rows

    res = ctl.revert(snap)
    assert res.restarted  # shared_buffers was running at 192MB
    assert file_settings(dsn) == before_rows
    assert auto_conf.read_text() == before_text
    assert ctl.snapshot(KNOBS) == snap
    assert not ctl.revert(snap).restarted  # nothing left to do


def test_bad_value_changes_nothing(ctl: TargetController, fresh_sandbox: Sandbox) -> None:
    dsn = fresh_sandbox.dsn
    before = file_settings(dsn)
    with pytest.raises(ApplyError, match="banana") as err:
        ctl.apply({"max_wal_size": "2GB", "work_mem": "banana"})
    assert "nothing was changed" in str(err.value)
    with pytest.raises(ApplyError, match="outside the valid range"):
        ctl.apply({"shared_buffers": "10TB"})  # beyond the knob's maximum
    assert file_settings(dsn) == before
    assert setting(dsn, "max_wal_size")[1] == "1GB"


def test_unbootable_shared_buffers_is_rolled_back(
    ctl: TargetController, fresh_sandbox: Sandbox
) -> None:
    dsn = fresh_sandbox.dsn
    ctl.apply({"work_mem": "6MB"})  # an entry of the session that must stay
    before = file_settings(dsn)
    with pytest.raises(ApplyError) as err:
        ctl.apply({"shared_buffers": "1TB"})  # accepted by ALTER SYSTEM, no memory for it
    msg = str(err.value)
    assert "restart failed" in msg
    assert "shared memory" in msg
    assert "previous entries written back" in msg
    assert "accepts connections" in msg
    assert fresh_sandbox.is_running()
    assert ctl.is_up()
    assert file_settings(dsn) == before
    assert setting(dsn, "shared_buffers")[1] == "128MB"
    assert setting(dsn, "work_mem")[1] == "6MB"


def test_invalid_config_file_is_caught_before_restart(
    ctl: TargetController, fresh_sandbox: Sandbox
) -> None:
    dsn = fresh_sandbox.dsn
    conf = fresh_sandbox.data_dir / "knobtune_sandbox.conf"
    conf.write_text(conf.read_text() + "max_connections = 'many'\n")
    sql(dsn, "SELECT pg_reload_conf()")
    before = file_settings(dsn)
    with pytest.raises(ApplyError, match="would not start") as err:
        ctl.apply({"shared_buffers": "256MB"})
    assert "max_connections" in str(err.value)
    assert file_settings(dsn) == before
    assert ctl.is_up()


def test_injection_attempts_change_nothing(ctl: TargetController, fresh_sandbox: Sandbox) -> None:
    dsn = fresh_sandbox.dsn
    sql(dsn, "CREATE TABLE x (id int)")
    before = file_settings(dsn)
    with pytest.raises(ApplyError, match="invalid value"):
        ctl.apply({"work_mem": "16MB'; DROP TABLE x; --"})
    with pytest.raises(ApplyError, match="unknown setting"):
        ctl.apply({"work_mem; DROP TABLE x": "16MB"})
    with pytest.raises(ApplyError, match="unknown setting"):
        ctl.apply({'work_mem" = 1; DROP TABLE x; --': "16MB"})
    assert table_exists(dsn, "x")
    assert file_settings(dsn) == before
    assert setting(dsn, "work_mem")[1] == "4MB"


def test_without_restart_method(fresh_sandbox: Sandbox) -> None:
    ctl = TargetController(fresh_sandbox.dsn, data_dir=fresh_sandbox.data_dir)
    assert not ctl.can_restart
    before = file_settings(fresh_sandbox.dsn)
    with pytest.raises(RestartUnavailable, match="shared_buffers"):
        ctl.apply({"work_mem": "8MB", "shared_buffers": "256MB"})
    assert file_settings(fresh_sandbox.dsn) == before
    assert not ctl.apply({"shared_buffers": "128MB"}).restarted  # no change, no restart needed
    reasons = ctl.skip_reasons(["shared_buffers", "work_mem", "no_such_knob", "block_size"])
    assert set(reasons) == {"shared_buffers", "no_such_knob", "block_size"}
    assert "restart" in reasons["shared_buffers"]


def test_setting_overridden_per_role_fails_verification(
    ctl: TargetController, fresh_sandbox: Sandbox
) -> None:
    dsn = fresh_sandbox.dsn
    sql(dsn, "ALTER ROLE postgres SET work_mem = '1MB'")
    before = file_settings(dsn)
    with pytest.raises(ApplyError, match="did not take effect"):
        ctl.apply({"work_mem": "16MB"})
    assert file_settings(dsn) == before


def test_wait_until_up(fresh_sandbox: Sandbox) -> None:
    ctl = TargetController.for_sandbox(fresh_sandbox)
    assert ctl.is_up()
    fresh_sandbox.stop()
    assert not ctl.is_up()
    t0 = time.monotonic()
    assert not ctl.wait_until_up(0.5)
    assert time.monotonic() - t0 < 5
    threading.Timer(1.0, fresh_sandbox.start).start()
    assert ctl.wait_until_up(30)


def test_connect_error_masks_password() -> None:
    for dsn in (
        "host=127.0.0.1 port=1 user=postgres password=hunter2-x connect_timeout=2",
        "postgresql://postgres:hunter2-x@127.0.0.1:1/postgres?connect_timeout=2",
    ):
        with pytest.raises(ConnectError) as err:
            TargetController(dsn).probe(["work_mem"])
        assert "hunter2-x" not in str(err.value)
        assert "***" in str(err.value)
        assert not TargetController(dsn).wait_until_up(0.1)


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        ("host=h password=secret user=u", "host=h password=*** user=u"),
        ("host=h password = 'se cr\\'et' user=u", "host=h password = *** user=u"),
        ("postgresql://u:secret@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgres://u:secret@h/db?sslmode=require", "postgres://u:***@h/db?sslmode=require"),
        ("postgresql://u@h/db?password=secret&x=1", "postgresql://u@h/db?password=***&x=1"),
        ("host=h user=u", "host=h user=u"),
    ],
)
def test_mask_dsn(dsn: str, masked: str) -> None:
    assert mask_dsn(dsn) == masked


def test_auto_conf_round_trip() -> None:
    entries = {"work_mem": "8MB", "search_path": '"$user", public', "x.y": "it's a \\ path"}
    assert parse_conf(render_auto_conf(entries)) == entries
    assert parse_conf("a = 1 # comment\nb 2\n# c = 3\nd = 'x' \n") == {"a": "1", "b": "2", "d": "x"}


def _row(vartype: str, unit: str | None = None) -> SettingRow:
    return SettingRow(name="k", setting="0", unit=unit, vartype=vartype, context="user")


@pytest.mark.parametrize(
    ("a", "b", "row", "same"),
    [
        ("16MB", "16384", _row("integer", "kB"), True),
        ("16MB", "16384kB", _row("integer", "kB"), True),
        ("1GB", "16MB", _row("integer", "kB"), False),
        ("128MB", "16384", _row("integer", "8kB"), True),
        ("16385B", "16", _row("integer", "kB"), True),  # rounded to the base unit
        ("-1", "-1", _row("integer", "kB"), True),
        ("0x10", "16", _row("integer"), True),
        ("5min", "300", _row("integer", "s"), True),
        ("1.1", "1.10000001", _row("real"), True),
        ("2ms", "2", _row("real", "ms"), True),
        ("yes", "on", _row("bool"), True),
        ("of", "off", _row("bool"), True),
        ("0", "on", _row("bool"), False),
        ("Replica", "replica", _row("enum"), True),
        ("banana", "4096", _row("integer", "kB"), False),
    ],
)
def test_same_value(a: str, b: str, row: SettingRow, same: bool) -> None:
    assert same_value(a, b, row) is same


def test_values_of_the_wrong_type_are_rejected() -> None:
    with pytest.raises(KnobValueError):
        Knob.from_row(_row("integer", "kB")).parse("banana")
    with pytest.raises(KnobValueError):
        Knob.from_row(_row("integer", "kB")).parse("5min")
    with pytest.raises(KnobValueError):
        Knob.from_row(_row("bool")).parse("o")
