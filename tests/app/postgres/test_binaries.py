"""Which PostgreSQL binaries a sandbox runs: the default ones, or a major version picked
among those installed (Debian's, $KNOBTUNE_PG_BINDIR's, the builds .ci/fetch-postgres
caches)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.postgres.binaries import PostgresNotInstalled, find_bindir, installed, server_version


def _fake_build(root: Path, major: int) -> Path:
    """A cached build's layout (<root>/<major>/bin) whose postgres reports ``major``."""
    bindir = root / str(major) / "bin"
    bindir.mkdir(parents=True)
    for name in ("initdb", "pg_ctl", "postgres"):
        exe = bindir / name
        exe.write_text(f"#!/bin/sh\necho 'postgres (PostgreSQL) {major}.3'\n")
        exe.chmod(0o755)
    return bindir


def test_a_version_is_picked_from_the_cache_and_the_default_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KNOBTUNE_PG_BINDIR", raising=False)
    default = find_bindir()
    monkeypatch.setenv("KNOBTUNE_PG_CACHE", str(tmp_path))
    cached = _fake_build(tmp_path, 17)
    assert find_bindir(17) == cached
    assert server_version(cached) == 17
    assert installed()[17] == cached
    # a cached build never replaces the default binaries
    assert find_bindir() == default
    assert find_bindir(server_version(default)) == default


def test_a_version_not_installed_says_what_there_is_and_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KNOBTUNE_PG_BINDIR", raising=False)
    monkeypatch.setenv("KNOBTUNE_PG_CACHE", str(tmp_path))
    cached = _fake_build(tmp_path, 17)
    with pytest.raises(PostgresNotInstalled) as exc:
        find_bindir(12)
    msg = str(exc.value)
    assert msg.startswith("PostgreSQL 12 is not installed here (found: ")
    assert f"17 ({cached})" in msg
    assert "KNOBTUNE_PG_BINDIR" in msg


def test_the_bindir_variable_counts_for_its_own_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KNOBTUNE_PG_CACHE", str(tmp_path / "empty"))
    own = _fake_build(tmp_path / "elsewhere", 16)
    monkeypatch.setenv("KNOBTUNE_PG_BINDIR", str(own))
    assert find_bindir() == own
    assert find_bindir(16) == own
