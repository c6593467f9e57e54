"""Files the CLI writes: none unless asked (--out), never into PostgreSQL's directories,
never over a file without --force, whole or not at all (app/outfiles.py).

`knobtune tune` runs on a simulated world (tests/app/cli/world.py): a real session
outcome in seconds; the data directory refused is also a real cluster's."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli import main
from app.outfiles import OutputRefused, check_dir, write_file
from app.postgres.sandbox import Sandbox
from tests.app.cli.world import World
from tests.optimizer.sim import reporting_surface

TUNE = ("--knobs", "work_mem", "--no-hints", "--max-trials", "30", "--seed", "3")


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    return World(tmp_path, monkeypatch, reporting_surface())


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's working directory (empty)."""
    d = tmp_path / "here"
    d.mkdir()
    monkeypatch.chdir(d)
    return d


@pytest.fixture
def umask_077() -> Iterator[None]:
    old = os.umask(0o077)  # a strict umask: the files are still 0644
    yield
    os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


def test_no_file_lands_in_the_working_directory_by_default(
    world: World, here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert world.tune(*TUNE) == 0
    assert list(here.iterdir()) == []
    out = capsys.readouterr().out
    assert "no file written: 'knobtune export 1 > knobtune-session-1.conf'" in out


def test_out_writes_the_session_files_named_for_it(
    world: World, here: Path, umask_077: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert world.tune(*TUNE, "--out", "results") == 0
    files = sorted(p.name for p in (here / "results").iterdir())
    assert files == [f"knobtune-session-1.{ext}" for ext in ("conf", "json", "svg")]  # no temp
    for name in files:
        assert _mode(here / "results" / name) == 0o644
    conf = (here / "results" / "knobtune-session-1.conf").read_text()
    assert conf.startswith("# knobtune recommendation")
    record = json.loads((here / "results" / "knobtune-session-1.json").read_text())
    assert record["outcome"] == world.session(1)["outcome"] == "confirmed"
    out = capsys.readouterr().out
    # where they went, as the user named the directory
    assert "config: results/knobtune-session-1.conf" in out
    assert "chart: results/knobtune-session-1.svg" in out
    assert list(here.iterdir()) == [here / "results"]


def test_an_existing_file_is_replaced_only_with_force_and_never_through_a_symlink(
    world: World, here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = here / "results"
    out.mkdir()
    victim = here / "victim.conf"
    victim.write_text("listen_addresses = '*'\n")
    (out / "knobtune-session-1.conf").symlink_to(victim)
    assert world.tune(*TUNE, "--out", "results") == 1  # the session ran; its files did not
    err = capsys.readouterr().err
    assert "knobtune-session-1.conf exists" in err
    assert "--force" in err
    assert "'knobtune export 1' prints its config" in err  # nothing is lost
    assert sorted(p.name for p in out.iterdir()) == ["knobtune-session-1.conf"]  # all or none
    # session 2, its files exist as a dangling symlink: also refused
    (out / "knobtune-session-2.json").symlink_to(here / "nowhere")
    assert world.tune(*TUNE, "--out", "results") == 1
    assert "knobtune-session-2.json exists" in capsys.readouterr().err
    # --force replaces the name, never the file it points to
    (out / "knobtune-session-3.conf").symlink_to(victim)
    assert world.tune(*TUNE, "--out", "results", "--force") == 0
    assert victim.read_text() == "listen_addresses = '*'\n"
    assert not (out / "knobtune-session-3.conf").is_symlink()
    assert (out / "knobtune-session-3.conf").read_text().startswith("# knobtune recommendation")
    assert sorted(p.name for p in out.iterdir()) == [
        "knobtune-session-1.conf",
        "knobtune-session-2.json",
        *[f"knobtune-session-3.{ext}" for ext in ("conf", "json", "svg")],
    ]
    assert (out / "knobtune-session-1.conf").is_symlink()  # session 1's: left as it was


def test_forced_writes_replace_a_symlink_not_its_target(tmp_path: Path) -> None:
    victim = tmp_path / "postgresql.conf"
    victim.write_text("shared_buffers = 8GB\n")
    link = tmp_path / "out" / "knobtune-session-1.conf"
    link.parent.mkdir()
    link.symlink_to(victim)
    with pytest.raises(OutputRefused, match="exists"):
        write_file(link, b"work_mem = 64MB\n")
    write_file(link, b"work_mem = 64MB\n", force=True)
    assert not link.is_symlink()
    assert link.read_text() == "work_mem = 64MB\n"
    assert victim.read_text() == "shared_buffers = 8GB\n"
    assert [p.name for p in link.parent.iterdir()] == [link.name]  # no temporary file left


def test_an_output_into_a_data_directory_is_refused_before_anything_runs(
    world: World, here: Path, sandbox: Sandbox, capsys: pytest.CaptureFixture[str]
) -> None:
    data = sandbox.data_dir  # a real cluster's: PG_VERSION, postmaster.pid
    before = sorted(p.name for p in data.iterdir())
    for out in (data, data / "log", data / "pg_wal" / "new"):
        for force in ((), ("--force",)):  # --force does not make it right
            assert world.tune(*TUNE, "--out", str(out), *force) == 1
            err = capsys.readouterr().err
            assert "is inside a PostgreSQL data directory" in err
            assert f"{data} holds PG_VERSION" in err
    assert world.next_id() == 1  # no session was started
    assert sorted(p.name for p in data.iterdir()) == before
    assert not (data / "pg_wal" / "new").exists()
    # the demo and the sweep refuse it as early: no sandbox made, no sweep started
    assert main(["demo", "--out", str(data)]) == 1
    err = capsys.readouterr().err
    assert "inside a PostgreSQL data directory" in err
    assert "creating a sandbox" not in err
    assert world.cli("sweep", "--target", world.target, "--out", str(data / "log")) == 1
    assert "inside a PostgreSQL data directory" in capsys.readouterr().err
    assert list(here.iterdir()) == []


def test_a_running_servers_directory_is_refused_by_its_pid_file(tmp_path: Path) -> None:
    d = tmp_path / "pgdata"
    d.mkdir()
    (d / "postmaster.pid").write_text("4242\n")
    with pytest.raises(OutputRefused, match=r"holds postmaster\.pid"):
        check_dir(d / "sub", force=True)


def test_a_configuration_directory_needs_force(
    world: World, here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    etc = here / "etc" / "postgresql" / "15" / "main"  # Debian's layout
    (etc / "conf.d").mkdir(parents=True)
    (etc / "postgresql.conf").write_text("include_dir = 'conf.d'\n")
    for out in (etc, etc / "conf.d"):  # PostgreSQL loads every .conf of conf.d
        assert world.tune(*TUNE, "--out", str(out)) == 1
        err = capsys.readouterr().err
        assert "is a PostgreSQL configuration directory" in err
        assert "--force" in err
    assert world.next_id() == 1
    assert world.tune(*TUNE, "--out", str(etc / "conf.d"), "--force") == 0
    assert (etc / "conf.d" / "knobtune-session-1.conf").is_file()
    assert (etc / "postgresql.conf").read_text() == "include_dir = 'conf.d'\n"
    # a file is not a directory
    assert world.tune(*TUNE, "--out", str(etc / "postgresql.conf"), "--force") == 1
    assert "is not a directory" in capsys.readouterr().err
