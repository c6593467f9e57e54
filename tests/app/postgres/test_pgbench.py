"""pgbench runner against a real sandbox cluster: short runs (2-3 s), scale 1."""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import pytest

from app.postgres.pgbench import (
    BenchSpec,
    PgbenchError,
    build_command,
    init_data,
    pgbench_jobs,
    remove_orphan_rundirs,
    run_bench,
)
from app.postgres.sandbox import Sandbox
from tests.conftest import SandboxFactory


@pytest.fixture(scope="module")
def bench(sandbox: Sandbox) -> str:
    """The session sandbox with pgbench tables at scale 1."""
    init_data(sandbox.dsn, 1)
    return sandbox.dsn


def test_init_skips_existing_scale_and_forces(fresh_sandbox: Sandbox) -> None:
    dsn = fresh_sandbox.dsn
    assert init_data(dsn, 1, foreign_keys=True, unlogged=True) is True
    with psycopg.connect(dsn) as conn:
        persistence = conn.execute(
            "SELECT relpersistence FROM pg_class WHERE relname = 'pgbench_accounts'"
        ).fetchone()
        fks = conn.execute(
            "SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND conrelid::regclass::text "
            "LIKE 'pgbench_%'"
        ).fetchone()
    assert persistence == ("u",)
    assert fks is not None
    assert fks[0] > 0
    assert init_data(dsn, 1) is False  # already at scale 1
    assert init_data(dsn, 2) is True  # another scale
    assert init_data(dsn, 2, force=True) is True


def test_init_error_is_clear_and_masked() -> None:
    dsn = "host=127.0.0.1 port=1 user=postgres password=s3cr3t-pw dbname=postgres"
    with pytest.raises(PgbenchError) as err:
        init_data(dsn, 1)
    assert "s3cr3t-pw" not in str(err.value)
    assert "cannot connect" in str(err.value)


def test_run_samples_callback_and_latencies(bench: str) -> None:
    seen: list[tuple[float, float, float]] = []
    spec = BenchSpec(clients=4, jobs=2, duration_s=3, warmup_s=1, protocol="prepared")
    t0 = time.monotonic()
    res = run_bench(bench, spec, on_sample=lambda t, tps: seen.append((t, tps, time.monotonic())))
    wall = time.monotonic() - t0
    assert res.ok, res.error
    assert res.summary is not None
    assert res.summary.query_mode == "prepared"
    # One callback per progress line, as they arrive (about a second apart).
    assert [(t, tps) for t, tps, _ in seen] == [(p.time_s, p.tps) for p in res.progress]
    assert len(seen) >= 2
    assert seen[1][2] - seen[0][2] == pytest.approx(1.0, abs=0.5)
    assert seen[0][2] - t0 < 2.0
    assert res.all_samples == [tps for _, tps, _ in seen]
    # Exactly the seconds asked for after the warm-up (pgbench runs one extra second
    # because it never reports its last one).
    assert res.samples == [p.tps for p in res.progress if 1.5 <= p.time_s <= 3.5]
    assert len(res.samples) == spec.duration_s - spec.warmup_s
    assert res.tps is not None
    assert res.tps > 0
    assert res.transactions > 0
    assert res.failed_transactions == 0
    assert res.latency_mean_ms is not None
    assert res.latency_p95_ms is not None
    assert res.latency_p99_ms is not None
    assert 0 < res.latency_mean_ms < res.latency_p99_ms
    assert res.latency_p95_ms <= res.latency_p99_ms
    assert 1 <= len(res.latency_p95_samples) <= len(res.samples)
    # the counters' window is the measured one (from the end of the warm-up second on);
    # backends report their counts about once a second, so its edges are that coarse
    assert 0 < res.db_metrics["xact_commit"] < 2 * res.transactions
    assert 1.5 <= res.db_metrics["seconds"] <= 4.0
    assert {"blks_hit", "temp_bytes", "deadlocks", "checkpoints_req", "buffers_backend"} <= set(
        res.db_metrics
    )
    assert res.db_metrics["wal_bytes"] > 0  # select-only writes a little (pgbench's vacuum?)
    assert 3.0 <= wall < 8.0
    assert not res.stopped


def test_custom_scripts_weights_protocol_and_rate(bench: str, tmp_path: Path) -> None:
    spec = BenchSpec(
        builtin="select-only",
        builtin_weight=1,
        scripts=[("SELECT count(*) FROM pgbench_branches;", 3), ("SELECT 1", 1)],
        clients=2,
        jobs=1,
        duration_s=2,
        warmup_s=0,
        protocol="extended",
        rate=400,
    )
    res = run_bench(bench, spec, workdir=tmp_path / "runs")
    assert res.ok, res.error
    assert res.summary is not None
    assert res.summary.transaction_type == "multiple scripts"
    assert res.summary.query_mode == "extended"
    assert res.tps is not None
    # pgbench ran on the -R schedule (its progress reports the schedule's lag), which caps
    # the rate; how close a loaded host gets to 400 tps is not asserted
    assert any(p.lag_ms is not None for p in res.progress), res.progress
    assert 0 < res.tps < 550
    assert list((tmp_path / "runs").iterdir()) == []  # run files cleaned up


def test_stop_within_two_seconds(bench: str) -> None:
    stop = threading.Event()
    seen: list[float] = []

    def on_sample(_t: float, tps: float) -> None:
        seen.append(tps)
        if len(seen) == 1:
            stop.set()
            seen.append(time.monotonic())

    res = run_bench(
        bench,
        BenchSpec(clients=2, jobs=1, duration_s=60, warmup_s=0),
        on_sample=on_sample,
        stop=stop,
    )
    after_stop = time.monotonic() - seen[1]
    assert after_stop < 2.0
    assert res.stopped
    assert not res.ok
    assert res.error == "stopped before completion"
    assert res.all_samples  # what was measured so far is kept


def test_aborted_run_is_a_failed_measurement(bench: str) -> None:
    script = (
        "SELECT 1;\n\\if :client_id = 0\nSELECT pg_terminate_backend(pg_backend_pid());\n\\endif\n"
    )
    res = run_bench(
        bench,
        BenchSpec(builtin=None, scripts=[(script, 1)], clients=2, jobs=1, duration_s=2, warmup_s=0),
    )
    assert not res.ok
    assert not res.stopped
    assert res.error is not None
    assert "status 2" in res.error
    assert "terminating connection" in res.error
    assert res.summary is not None
    assert res.summary.aborted


def test_connection_failure_is_a_failed_result_without_password() -> None:
    dsn = "postgresql://postgres:pa55-secret@127.0.0.1:1/postgres"
    res = run_bench(dsn, BenchSpec(duration_s=1, warmup_s=0))
    assert not res.ok
    assert res.error is not None
    assert "pa55-secret" not in res.error
    assert "***" in res.error


def test_password_travels_in_environment_only() -> None:
    argv = build_command(BenchSpec(rate=100, log_sampling=0.5), "pgbench", Path("/run/x"), [])
    assert not any("password" in a.lower() for a in argv)
    assert not {"-h", "-p", "-U", "--host", "--port", "--username"} & set(argv)
    assert "--sampling-rate=0.5" in argv
    assert "-P" in argv


def test_pgbench_missing_and_unwritable_workdir(
    bench: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    res = run_bench(bench, BenchSpec(duration_s=1, warmup_s=0), workdir=not_a_dir)
    assert not res.ok
    assert res.error is not None
    assert "work directory" in res.error
    monkeypatch.setenv("KNOBTUNE_PGBENCH", str(tmp_path / "no-pgbench"))
    res = run_bench(bench, BenchSpec(duration_s=1, warmup_s=0))
    assert not res.ok
    assert res.error is not None
    assert "pgbench" in res.error


def test_invalid_spec_raises() -> None:
    with pytest.raises(ValueError, match="warmup_s"):
        BenchSpec(duration_s=5, warmup_s=5).validate()
    with pytest.raises(ValueError, match="builtin"):
        BenchSpec(builtin="tpcc").validate()
    with pytest.raises(ValueError, match="protocol"):
        BenchSpec(protocol="binary").validate()
    # more threads than clients: pgbench would quietly run fewer than the spec says
    with pytest.raises(ValueError, match=r"jobs \(3\) must not exceed clients \(2\)"):
        BenchSpec(clients=2, jobs=3).validate()


def test_jobs_never_exceed_clients() -> None:
    """The one rule: a default is capped, a count the user gave is refused saying what to
    change, in the caller's names for the two; the spec's -j is the one it holds."""
    assert pgbench_jobs(2, 8) == 2
    assert pgbench_jobs(8, 8, given=True) == 8
    assert pgbench_jobs(4, 2) == 2
    with pytest.raises(ValueError) as exc:
        pgbench_jobs(4, 2, given=True)
    assert str(exc.value) == (
        "jobs (4) must not exceed clients (2): pgbench runs at most one thread per client; "
        "give jobs 2 or less, or more clients"
    )
    with pytest.raises(ValueError, match=r"^--jobs \(4\) must not exceed --clients \(2\)"):
        pgbench_jobs(4, 2, given=True, names=("--jobs", "--clients"))
    argv = build_command(BenchSpec(clients=4, jobs=3), "pgbench", Path("/run/x"), [])
    assert argv[argv.index("-c") + 1 : argv.index("-j") + 2] == ["4", "-j", "3"]


def test_overhead_of_a_two_second_run(sandbox_factory: SandboxFactory) -> None:
    sb = sandbox_factory()
    init_data(sb.dsn, 1)
    t0 = time.monotonic()
    res = run_bench(
        sb.dsn, BenchSpec(builtin="select-only", clients=2, jobs=1, duration_s=2, warmup_s=0)
    )
    overhead = time.monotonic() - t0 - 2.0  # includes the extra unreported second
    print(f"pgbench overhead for a 2 s run: {overhead:.2f} s")
    assert res.ok, res.error
    assert overhead < 3.0


def test_run_directories_of_a_killed_service_are_removed_and_no_others(tmp_path: Path) -> None:
    """A service killed mid-run leaves pgbench's directory behind; the next start removes
    it, but never one of a process that still runs, nor a symlink or a look-alike name."""
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid now names no process
    dead = tmp_path / f"knobtune-bench-{gone.pid}-abc"
    (dead / "logs").mkdir(parents=True)
    (dead / "logs" / "pgbench_log.1").write_text("1 2 3\n")
    alive = tmp_path / f"knobtune-bench-{os.getpid()}-def"
    alive.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("x")
    link = tmp_path / f"knobtune-bench-{gone.pid}-link"
    link.symlink_to(target)
    odd = tmp_path / "knobtune-bench-notapid-x"
    odd.mkdir()

    assert remove_orphan_rundirs(tmp_path) == 1
    assert not dead.exists()
    assert alive.is_dir()
    assert odd.is_dir()
    assert link.is_symlink()
    assert (target / "keep").read_text() == "x"


def test_a_run_names_its_directory_for_the_process_that_made_it(bench: str, tmp_path: Path) -> None:
    """The sweep above relies on it: a run's directory carries its process's pid (as root
    it is made in the system's temp directory, else in the work directory)."""
    mine = f"knobtune-bench-{os.getpid()}-*"
    seen: set[Path] = set()

    def look(_t: float, _tps: float) -> None:
        for place in (tmp_path / "runs", Path(tempfile.gettempdir())):
            seen.update(place.glob(mine))

    res = run_bench(
        bench, BenchSpec(duration_s=2, warmup_s=0), workdir=tmp_path / "runs", on_sample=look
    )
    assert res.ok, res.error
    assert seen, "no run directory named for this process"
    assert not any(p.exists() for p in seen)  # removed when the run ended
