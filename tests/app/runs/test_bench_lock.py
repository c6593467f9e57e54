"""One knobtune benchmark per host at a time (issue 29, part 4: no noise of its own).

Two sessions on two sandboxes of one 2-core host once measured each other. Every trial
takes a host-wide turn (app/postgres/benchlock.py: flock files, one slot by default): here
two executors on two real sandboxes of this host run at once, each benchmark's interval is
recorded, and no two overlap; the one that waited says so. The lock itself is checked
across processes and with more slots (``KNOBTUNE_BENCH_PER_HOST``).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import app.sessions.trial as trial_mod
from app.postgres.benchlock import HostBenchLock, host_key
from app.postgres.sandbox import Sandbox
from app.postgres.target import TargetController
from app.sessions.trial import TrialExecutor, TrialOutcome
from app.workloads import workload_for
from app.workloads.schemas import WorkloadIn
from optimizer.descent import Candidate
from tests.conftest import SandboxFactory


def test_the_lock_holds_across_processes_and_names_the_holder(tmp_path: Path) -> None:
    code = (
        "import sys, time; from pathlib import Path; "
        "from app.postgres.benchlock import HostBenchLock; "
        "lock = HostBenchLock(Path(sys.argv[1]), 'local', holder='session 7'); "
        "t = lock.turn(); t.__enter__(); print('held', flush=True); time.sleep(1.0)"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout is not None
        assert other.stdout.readline().strip() == "held"
        with HostBenchLock(tmp_path, "local", holder="session 8").turn() as turn:
            pass
    finally:
        other.wait(10)
    assert turn.waited_s >= 0.5
    assert turn.waited_for == ["session 7"]
    text = turn.text()
    assert text is not None
    assert "waited" in text
    assert "session 7" in text
    # more slots: no wait, but a run beside another one is said
    two = [HostBenchLock(tmp_path, "local", slots=2, holder=f"session {i}") for i in (1, 2)]
    one, other = two[0].turn(), two[1].turn()
    first = one.__enter__()
    second = other.__enter__()
    assert second.waited_s < 0.5
    assert second.beside == ["session 1"]
    one.__exit__(None, None, None)
    other.__exit__(None, None, None)
    assert first.beside == ["session 2"]  # started while it ran
    assert host_key("host=/tmp/sock port=5433") == host_key("host=127.0.0.1 port=5999")
    assert host_key("host=db5.example.com") == "db5.example.com"


def test_two_sessions_on_two_sandboxes_of_one_host_never_benchmark_at_once(
    tmp_path: Path,
    sandbox: Sandbox,
    sandbox_factory: SandboxFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    intervals: dict[str, list[tuple[float, float]]] = {"a": [], "b": []}
    real_run_streams = trial_mod.run_streams
    who = threading.local()

    def recorded(*args: Any, **kwargs: Any) -> Any:
        t0 = time.monotonic()
        try:
            return real_run_streams(*args, **kwargs)
        finally:
            intervals[who.name].append((t0, time.monotonic()))

    monkeypatch.setattr(trial_mod, "run_streams", recorded)
    wl = WorkloadIn(builtin="select-only", scale=1, clients=1, duration_s=1, warmup_s=0)
    outcomes: dict[str, list[TrialOutcome]] = {"a": [], "b": []}
    errors: list[BaseException] = []

    def session(name: str, sb: Sandbox, ready: threading.Barrier) -> None:
        who.name = name
        try:
            workload = workload_for(wl, clients=1)
            workload.prepare(sb.bench_dsn)
            ex = TrialExecutor(
                TargetController.for_sandbox(sb),
                sb.bench_dsn,
                workload,
                duration_s=1,
                warmup_s=0,
                workdir=tmp_path / name,
                bench_lock=HostBenchLock(tmp_path / "locks", host_key(sb.dsn), holder=name),
            )
            ready.wait(60)
            for i in range(2):
                cand = Candidate(i, {"work_mem": "4MB"}, None, None, "baseline")
                outcomes[name].append(ex.run(cand, incumbent={"work_mem": "4MB"}))
        except BaseException as exc:
            errors.append(exc)

    ready = threading.Barrier(2)
    threads = [
        threading.Thread(target=session, args=("a", sandbox, ready)),
        threading.Thread(target=session, args=("b", sandbox_factory(), ready)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    runs = sorted((t0, t1, name) for name, ivs in intervals.items() for t0, t1 in ivs)
    assert len(runs) == 4
    for (_, end, _), (start, _, _) in itertools.pairwise(runs):
        assert start >= end, runs  # never two benchmarks at once
    assert all(o.error is None for outs in outcomes.values() for o in outs)
    # the two interleaved, so at least one run waited for the other, and said so
    waited = [o.turn.text() for outs in outcomes.values() for o in outs if o.turn]
    assert any(t and "waited" in t for t in waited), waited
