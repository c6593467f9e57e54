"""Issue 29, part 3, on a real sandbox: a trial records the server's counters, and the
checkpoint rule sets a checkpoint knob aside on short runs and judges it where a cycle fits.

A few seconds of pgbench per run (about 15 s in all), on the session's sandbox, put back as
it was. Long runs are not needed to test the judging side: the smallest max_wal_size (32MB,
two WAL segments) and a workload that writes WAL fast make the checkpoint cycle shorter
than a 3 s run, and the server's own counters then show the requested checkpoints the rule
predicts.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from app.postgres.pgbench import BenchSpec, run_bench
from app.postgres.sandbox import Sandbox
from app.postgres.target import TargetController
from app.sessions.trial import TrialExecutor
from app.workloads import workload_for
from app.workloads.schemas import WorkloadIn
from optimizer.catalogue import GB, Hardware, knob_space
from optimizer.checkpoints import cycle_seconds, set_aside
from optimizer.counters import ServerCounters, summary
from optimizer.descent import CoordinateDescent
from optimizer.settings import DescentSettings

BULK = "INSERT INTO evidence_bulk SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g;"


NAMES = ["max_wal_size", "min_wal_size", "work_mem", "checkpoint_timeout",
         "checkpoint_completion_target"]  # fmt: skip


@pytest.fixture
def small_wal(sandbox: Sandbox) -> Iterator[Sandbox]:
    """The session's sandbox, its settings put back afterwards (tests/conftest.py)."""
    ctl = TargetController.for_sandbox(sandbox)
    before = ctl.snapshot(NAMES)
    try:
        yield sandbox
    finally:
        ctl.revert(before)


def test_a_trial_records_the_counters_and_short_runs_set_max_wal_size_aside(
    small_wal: Sandbox,
) -> None:
    wl = WorkloadIn.model_validate(
        # pgbench -R: the counters only need to move, and a slower WAL rate only makes the
        # cycle of the first step up of max_wal_size longer
        {"builtin": "tpcb-like", "scale": 1, "clients": 2, "duration_s": 3, "warmup_s": 1,
         "rate": 100}
    )  # fmt: skip
    workload = workload_for(wl)
    workload.prepare(small_wal.dsn)
    ctl = TargetController.for_sandbox(small_wal)
    executor = TrialExecutor(ctl, small_wal.dsn, workload, duration_s=3, warmup_s=1)
    server = ctl.snapshot(NAMES)
    space = knob_space(["max_wal_size", "work_mem"], Hardware(8 * GB, 2))
    start = {"max_wal_size": server.effective["max_wal_size"], "work_mem": "4MB"}
    opt = CoordinateDescent(
        space,
        start,
        DescentSettings(max_trials=20, run_seconds=2, warmup_seconds=1),
        server=server.effective,
    )
    seen = []
    for _ in range(2):  # the baseline
        cand = opt.suggest()
        assert cand is not None
        assert cand.role == "baseline"
        out = executor.run(cand, incumbent=cand.config)
        assert out.error is None, out.error
        assert out.result is not None
        m = out.result.db_metrics  # what the trial row stores (trials.metrics)
        # differences over the measured window, nonzero where TPC-B must move them
        assert 1.0 <= m["seconds"] <= 4.0
        assert m["wal_bytes"] > 0
        assert m["wal_records"] > 0
        assert m["blks_hit"] > 0
        assert m["xact_commit"] > 0
        keys = {"checkpoints_timed", "checkpoints_req", "buffers_checkpoint", "buffers_clean",
                "buffers_backend", "blks_read", "temp_files", "temp_bytes", "wal_fpi"}  # fmt: skip
        assert keys <= set(m)
        c = out.measurement.counters
        assert c is not None
        assert c.wal_rate is not None
        assert c.wal_rate > 0
        line = summary(c)
        assert line is not None
        assert line.startswith("WAL ")
        seen.append(c)
        opt.register(cand, out.measurement)
    # the walk reaches max_wal_size: at TPC-B's WAL rate here (a few MB/s), the first step
    # up (x4) has a cycle of minutes;
    # it sets it aside and goes on to work_mem without a run of it
    nxt = opt.suggest()
    assert nxt is not None
    assert nxt.knob == "work_mem"
    note = opt.set_aside["max_wal_size"]
    assert note.startswith("max_wal_size not judged: at ")
    assert "and 2 s runs cannot show it; give duration_s >= " in note
    assert "no effect" not in note
    # the needed length follows from the measured rate
    rate = opt.wal_rate
    assert rate is not None
    cycle = cycle_seconds({**server.effective, "max_wal_size": "4GB"}, rate)
    assert cycle > 2


def test_a_cycle_shorter_than_the_run_is_judged_and_the_server_agrees(
    small_wal: Sandbox,
) -> None:
    with psycopg.connect(small_wal.dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS evidence_bulk")
        conn.execute("CREATE TABLE evidence_bulk (id int, pad text)")
        conn.execute("ALTER SYSTEM SET max_wal_size = '32MB'")  # 17 MB of WAL: a checkpoint
        conn.execute("ALTER SYSTEM SET min_wal_size = '32MB'")
        conn.execute("SELECT pg_reload_conf()")
        # no checkpoint of the previous test's load left in progress (a spread one ignores
        # the WAL distance until it ends): the window starts between two checkpoints
        conn.execute("CHECKPOINT")
    spec = BenchSpec(builtin=None, scripts=[(BULK, 1)], clients=2, jobs=1, duration_s=4, warmup_s=1)
    res = run_bench(small_wal.dsn, spec)
    assert res.ok, res.error
    c = ServerCounters.from_metrics(res.db_metrics)
    assert c is not None
    rate = c.wal_rate
    assert rate is not None
    assert c.seconds is not None
    window = c.seconds
    # the rule: the sandbox's 32MB gives a cycle of 17 MB of WAL, shorter than the window
    config = {"max_wal_size": "32MB", "checkpoint_timeout": "5min",
              "checkpoint_completion_target": "0.9"}  # fmt: skip
    cycle = cycle_seconds(config, rate)
    assert cycle < window, summary(c)
    judged = set_aside(
        "checkpoint_completion_target",
        config,
        {**config, "checkpoint_completion_target": "0.5"},
        wal_rate=rate,
        window_s=window,
    )
    assert judged is None
    # ... and the server wrote the checkpoints that cycle predicts, requested by WAL volume
    assert c.checkpoints_req is not None
    assert c.checkpoints_req >= 1, summary(c)
    assert c.buffers_checkpoint is not None
    assert c.buffers_checkpoint > 0
    with psycopg.connect(small_wal.dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE evidence_bulk")
