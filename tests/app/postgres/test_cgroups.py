"""Hardware profiles: real sandboxes in real cgroups (v1 on the development host).

The parts that read or write cgroup files are also run against a v2 tree laid out in a
temporary directory (this host has no v2 controllers), and the v1 parser against files
like a container's.
"""

from __future__ import annotations

import os
import pwd
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from app.postgres import cgroups
from app.postgres.cgroups import (
    GIB,
    MIB,
    Cgroup,
    CgroupUnavailable,
    Host,
    Limits,
    ProfileError,
    launcher_argv,
    limits_from_files,
    parse_size,
    resolve,
)
from app.postgres.restart import run as run_restart
from app.postgres.sandbox import Sandbox
from app.postgres.target import TargetController, _may_read_files, _read_server_files
from tests.helpers import assert_in_cgroup


def _v1_writable() -> str | None:
    """Why this host cannot run the cgroup tests (None: it can)."""
    if os.geteuid() != 0:
        return "needs root to write cgroups"
    try:
        host = Host.detect()
    except CgroupUnavailable as exc:
        return str(exc)
    if host.version != 1:
        return "the live tests are written for cgroup v1 (this host has v2)"
    for c in ("memory", "blkio", "cpu"):
        if not os.access(cgroups.CGROUP_ROOT / c, os.W_OK):
            return f"/sys/fs/cgroup/{c} is not writable"
    return None


_NO_CGROUPS = _v1_writable()
live = pytest.mark.skipif(_NO_CGROUPS is not None, reason=f"host lacks cgroups: {_NO_CGROUPS}")

CAPPED = Limits(memory_bytes=256 * MIB, disk_iops=50, disk_mbps=20, cpus=1, profile="test")


# -- sizes and profiles (no server) ----------------------------------------------------


def test_sizes_parse_strictly() -> None:
    assert parse_size("1GB") == GIB
    assert parse_size("512MB") == 512 * MIB
    assert parse_size("1.5GiB") == 3 * GIB // 2
    assert parse_size(2 * GIB) == 2 * GIB
    for bad in ("1XB", "-1GB", "GB", "1 G B", "0", "", "1e9"):
        with pytest.raises(ProfileError):
            parse_size(bad)


def test_profiles_and_limits_are_checked_against_the_host() -> None:
    small = resolve(profile="small", host_ram=24 * GIB, host_cpus=2)
    assert small == Limits(GIB, 1000, 100, 1, "small")
    assert resolve(profile="small", disk_iops=200, host_ram=24 * GIB, host_cpus=2).disk_iops == 200
    cases = {
        "below": dict(memory="64MB"),
        "more than this host": dict(memory="1TB"),
        "disk_iops": dict(memory="1GB", disk_iops=0),
        "disk_mbps": dict(memory="1GB", disk_mbps=10**9),
        "more than this host has .2.": dict(cpus=3),
        "cpus must be": dict(cpus=0),
        "no profile 'huge'": dict(profile="huge"),
        '"sandbox": true': {},
    }
    for said, kwargs in cases.items():
        with pytest.raises(ProfileError, match=said):
            resolve(host_ram=24 * GIB, host_cpus=2, **kwargs)  # type: ignore[arg-type]


# -- detection from files (v1 and v2 layouts) ---------------------------------------------


def _files(tree: dict[str, str]) -> object:
    return lambda p: tree.get(p)


def test_v1_limits_take_the_smallest_level_and_ignore_unlimited() -> None:
    proc = "9:cpu,cpuacct:/a/b\n4:memory:/a/b\n3:cpuset:/\n0::/\n"
    tree = {
        "/cg/memory/a/b/memory.limit_in_bytes": "9223372036854771712\n",  # no limit
        "/cg/memory/a/memory.limit_in_bytes": str(300 * MIB),
        "/cg/memory/memory.limit_in_bytes": "9223372036854771712",
        "/cg/cpu,cpuacct/a/b/cpu.cfs_quota_us": "150000",
        "/cg/cpu,cpuacct/a/b/cpu.cfs_period_us": "100000",
        "/cg/cpu,cpuacct/cpu.cfs_quota_us": "-1",
        "/cg/cpuset/cpuset.effective_cpus": "0-3",
    }
    found = limits_from_files(proc, tree.get, "/cg")
    assert found.memory_bytes == 300 * MIB
    assert found.cpus == 2  # 1.5 CPUs of quota can run two processes at once


def test_v2_limits_in_a_container_namespace() -> None:
    tree = {"/cg/memory.max": str(GIB), "/cg/cpu.max": "200000 100000"}
    found = limits_from_files("0::/\n", tree.get, "/cg")
    assert (found.memory_bytes, found.cpus) == (GIB, 2)
    unlimited = {"/cg/x/memory.max": "max\n", "/cg/x/cpu.max": "max 100000"}
    assert limits_from_files("0::/x\n", unlimited.get, "/cg").memory_bytes is None


def test_v2_cgroup_is_written_in_a_v2_tree(tmp_path: Path) -> None:
    """The v2 writer against a v2 layout in a directory (this host has v2 without controllers)."""
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    host = Host.detect(root)
    assert host.version == 2
    cg = Cgroup("kt-test-v2", host)
    cg.create(Limits(512 * MIB, 1000, 100, 1), tmp_path)
    d = root / "kt-test-v2"
    dev = cgroups.block_device(tmp_path)
    assert (d / "memory.max").read_text() == str(512 * MIB)
    assert (d / "io.max").read_text() == (
        f"{dev} riops=1000 wiops=1000 rbps=100000000 wbps=100000000"
    )
    assert (d / "cpu.max").read_text() == "100000 100000"
    # (a real cgroupfs takes "+memory" lines one at a time; the last one written stays here)
    assert (root / "cgroup.subtree_control").read_text().startswith("+")


def test_a_changed_profile_keeps_none_of_the_old_limits_v2(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu io memory\n")
    (root / "cgroup.subtree_control").write_text("")
    cg = Cgroup("kt-test-v2", Host.detect(root))
    cg.create(Limits(512 * MIB, 1000, 100, 1), tmp_path)
    cg.create(Limits(memory_bytes=GIB), tmp_path)
    d = root / "kt-test-v2"
    assert (d / "memory.max").read_text() == str(GIB)
    assert (d / "io.max").read_text().endswith("riops=max wiops=max rbps=max wbps=max")
    assert (d / "cpu.max").read_text() == "max 100000"


@live
def test_a_changed_profile_keeps_none_of_the_old_limits_v1(tmp_path: Path) -> None:
    cg = Cgroup("kt-test-change", Host.detect())
    try:
        cg.create(Limits(256 * MIB, 100, 10, 1), tmp_path)
        assert len(cg.dirs()) == 3
        cg.create(Limits(memory_bytes=GIB, disk_iops=200), tmp_path)
        assert [d.parent.name for d in cg.dirs()] == ["memory", "blkio"]  # cpu's dir went
        blk = cgroups.CGROUP_ROOT / "blkio" / cg.name
        assert " 200" in (blk / "blkio.throttle.write_iops_device").read_text()
        assert (blk / "blkio.throttle.write_bps_device").read_text().strip() == ""
        mem = cgroups.CGROUP_ROOT / "memory" / cg.name / "memory.limit_in_bytes"
        assert int(mem.read_text()) == GIB
    finally:
        assert cg.remove()
    assert not cg.exists()


def test_no_controllers_is_unavailable_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(CgroupUnavailable, match='"sandbox": true'):
        Host.detect(tmp_path)


@live
def test_not_root_is_unavailable_and_says_so() -> None:
    """A service that is not root cannot make cgroups: the message says so (a real attempt,
    with this process's effective uid switched to nobody's for the moment)."""
    nobody = pwd.getpwnam("nobody").pw_uid
    os.seteuid(nobody)
    try:
        with pytest.raises(CgroupUnavailable) as caught:
            Cgroup("kt-test-nonroot", Host.detect()).create(Limits(memory_bytes=GIB), Path("/"))
    finally:
        os.seteuid(0)
    assert "not root" in str(caught.value)
    assert '"sandbox": true' in str(caught.value)
    assert not (cgroups.CGROUP_ROOT / "memory" / "kt-test-nonroot").exists()


# -- live: a sandbox in its cgroup ---------------------------------------------------------


@pytest.fixture
def capped() -> Iterator[Sandbox]:
    with Sandbox.create(limits=CAPPED) as sb:
        yield sb
    # destroy() removed the cgroup (checked in the test that needs it)


def _backend_pid(sb: Sandbox) -> int:
    with psycopg.connect(sb.dsn) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        return int(row[0])


@live
def test_limits_are_in_force_and_survive_restarts(capped: Sandbox) -> None:
    cg = capped.cgroup
    assert cg is not None
    root = cgroups.CGROUP_ROOT
    mem = root / "memory" / cg.name
    assert int((mem / "memory.limit_in_bytes").read_text()) == 256 * MIB
    dev = cgroups.block_device(capped.data_dir)
    blk = root / "blkio" / cg.name
    assert f"{dev} 50" in (blk / "blkio.throttle.write_iops_device").read_text()
    assert f"{dev} 20000000" in (blk / "blkio.throttle.read_bps_device").read_text()
    assert (root / "cpu" / cg.name / "cpu.cfs_quota_us").read_text().strip() == "100000"
    assert_in_cgroup(capped, capped.dsn)
    first = capped._postmaster_pid()

    # the service's restart path: the sandbox's own pg_ctl method (as the data dir's owner)
    run_restart(capped.restart_method)
    assert capped._postmaster_pid() != first
    assert_in_cgroup(capped, capped.dsn)

    # Sandbox.restart() and stop/start
    capped.restart()
    assert_in_cgroup(capped, capped.dsn)
    capped.stop()
    capped.start()
    assert_in_cgroup(capped, capped.dsn)

    capped.destroy()
    for c in ("memory", "blkio", "cpu"):
        assert not (root / c / cg.name).exists()


@live
def test_a_running_server_outside_its_cgroup_is_moved_in(capped: Sandbox) -> None:
    cg = capped.cgroup
    assert cg is not None
    pm = capped._postmaster_pid()
    for c in ("memory", "blkio", "cpu"):  # out, as if started by hand
        (cgroups.CGROUP_ROOT / c / "cgroup.procs").write_text(str(pm))
    assert pm not in cg.pids()
    assert capped.adopt() >= 1
    assert_in_cgroup(capped, capped.dsn)


def _fdatasync_ms(procs: list[Path], where: Path, n: int = 15) -> float:
    """Median ms of write+fdatasync of 8 kB, run by a process inside the cgroup ``procs``."""
    code = (
        "import os, sys, time, statistics\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)\n"
        "ts = []\n"
        f"for i in range({n}):\n"
        "    os.pwrite(fd, os.urandom(8192), i * 8192)\n"
        "    t = time.perf_counter(); os.fdatasync(fd); ts.append(time.perf_counter() - t)\n"
        "print(statistics.median(ts) * 1000)\n"
    )
    argv = [sys.executable, "-c", code, str(where)]
    if procs:
        argv = launcher_argv(procs, argv)
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return float(res.stdout.strip())


@live
def test_fsync_latency_rises_under_the_iops_cap(capped: Sandbox, tmp_path: Path) -> None:
    """fdatasync waits for the disk's IOPS cap: at 50 IOPS each write takes >= 20 ms.

    Uncapped, this shared box gave 0.3-3 ms (medians, under other suites' load)."""
    cg = capped.cgroup
    assert cg is not None
    where = capped.root / "fsync-probe"  # on the sandbox's disk (the throttled device)
    capped_ms = _fdatasync_ms(cg.procs_files(), where, n=8)
    free_ms = statistics.median(_fdatasync_ms([], where) for _ in range(3))
    print(f"fdatasync median: {capped_ms:.2f} ms capped at 50 IOPS, {free_ms:.2f} ms uncapped")
    assert capped_ms > 15.0
    assert capped_ms > 3 * free_ms


@live
def test_detected_hardware_follows_the_limit(capped: Sandbox) -> None:
    probe = TargetController.for_sandbox(capped).probe([])
    assert probe.ram_bytes == 256 * MIB
    assert probe.cpus == 1
    assert probe.hardware_note is not None
    assert "cgroup" in probe.hardware_note
    # The other-host path (pg_read_file of the server's own /proc and cgroup files),
    # tried on the same server: the same figure.
    with psycopg.connect(capped.dsn, autocommit=True) as conn:
        ram, _cpus, found = _read_server_files(conn)  # type: ignore[arg-type]
    assert ram is not None
    assert ram > 256 * MIB
    assert found.memory_bytes == 256 * MIB
    assert found.cpus == 1
    # Only a role that may read server files gets there: the benchmark role may not...
    with psycopg.connect(capped.bench_dsn, autocommit=True) as conn:
        assert not _may_read_files(conn, is_superuser=False)  # type: ignore[arg-type]
    # ...nor with pg_read_server_files alone (pg_read_file's EXECUTE is not PUBLIC's)...
    with psycopg.connect(capped.dsn, autocommit=True) as conn:
        conn.execute("GRANT pg_read_server_files TO knobtune_bench")
    with psycopg.connect(capped.bench_dsn, autocommit=True) as conn:
        assert not _may_read_files(conn, is_superuser=False)  # type: ignore[arg-type]
    # ...until it may also execute pg_read_file (a privilege of each database's catalog).
    in_bench_db = capped.dsn.replace("dbname=postgres", "dbname=knobtune")
    with psycopg.connect(in_bench_db, autocommit=True) as conn:
        conn.execute(
            "GRANT EXECUTE ON FUNCTION pg_read_file(text, bigint, bigint, boolean) "
            "TO knobtune_bench"
        )
    with psycopg.connect(capped.bench_dsn, autocommit=True) as conn:
        assert _may_read_files(conn, is_superuser=False)  # type: ignore[arg-type]
        _ram, _cpus, found = _read_server_files(conn)  # type: ignore[arg-type]
    assert found.memory_bytes == 256 * MIB


@live
def test_a_sandbox_without_limits_gets_the_host(sandbox: Sandbox) -> None:
    probe = TargetController.for_sandbox(sandbox).probe([])
    host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    # the tests' own process may sit in a memory cgroup of its own: never more than the host
    assert probe.ram_bytes is not None
    assert probe.ram_bytes <= host
    assert sandbox.cgroup is None
