"""A simulated world for the session loop: a target and an executor on a response surface.

What is real: the metadata DB (SQLite), the SessionRunner with its store, recovery and
heartbeat, the optimizer, the scheduler when a test uses one. What is simulated: the
PostgreSQL server (:class:`FakeTarget`: its settings, restarts, going down) and the trial
(:class:`FakeExecutor`: a run's per-second samples come from a known response surface of
tests/optimizer/sim.py with its noise model, instead of pgbench). The server's probe is a
recorded real one (data/pg15_target.json: PostgreSQL 15's pg_settings rows for every
knob the service reads), so the knob space and bounds are the service's own.

So a test on it checks the loop's bookkeeping (resume and replay, budgets, the final
check, notes, claims, what is written when) in seconds; it says nothing about
PostgreSQL or pgbench, which keep their tests on real clusters.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app import vault
from app.db import Database, utcnow
from app.models import Target, TuningSession
from app.postgres.pgbench import BenchResult
from app.postgres.target import ApplyResult, ConnectError, PoolFill, Probe, Snapshot
from app.sessions.plan import describe, measurement
from app.sessions.recovery import SessionTarget
from app.sessions.runner import Executor, ExecutorArgs, RunEnv, SessionRunner
from app.sessions.schemas import SessionIn
from app.sessions.trial import TrialOutcome
from app.settings import Settings
from app.targets.probe_data import rows_from_json
from app.workloads.schemas import WorkloadIn
from optimizer.descent import Candidate
from optimizer.knobs import Config
from tests.optimizer.sim import Bench, Noise, Surface

PG15 = json.loads((Path(__file__).parent / "data" / "pg15_target.json").read_text())
GB = 1 << 30


class FakeClock:
    """Time as the session sees it: advanced by each simulated run, not by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeTarget:
    """A PostgreSQL server as the session sees it: settings, restarts, up or down."""

    local = False
    no_restart_reason = "the target has no restart method"

    def __init__(self) -> None:
        self.rows = rows_from_json(PG15["rows"])
        self.effective: dict[str, str] = dict(PG15["effective"])
        self.settings: dict[str, str] = {}  # ALTER SYSTEM entries now in force
        self.applied: list[dict[str, str]] = []  # every apply, in order
        self.reverts = 0
        self.restarts = 0
        self.down_polls = 0  # is_up() answers False this many more times
        self.pool: PoolFill | None = None  # shared_buffers' fill as buffer_pool() reads it
        self.lock = threading.Lock()

    restartable = True  # False: a remote target without a restart method
    recovered = 0  # recover_offline() calls

    @property
    def can_restart(self) -> bool:
        return self.restartable

    def probe(self, names: Sequence[str]) -> Probe:
        return Probe(
            version_num=PG15["version_num"],
            version=PG15["version"],
            is_superuser=True,
            can_alter_system=True,
            settings={n: self.rows[n] for n in names if n in self.rows},
            ram_bytes=None,  # not on this host: the target row declares it
            cpus=None,
            local=False,
            data_directory=None,
        )

    def snapshot(self, names: Sequence[str]) -> Snapshot:
        return Snapshot(
            auto_conf=dict(self.settings),
            effective={n: self.effective[n] for n in names if n in self.effective},
        )

    def apply(
        self, config: Mapping[str, str], *, on_restart: Callable[[], None] | None = None
    ) -> ApplyResult:
        if not self.is_up():
            raise ConnectError("connection refused (the simulated server is down)")
        changed = {k: v for k, v in config.items() if self.current(k) != v}
        restart = any(self.rows[k].context == "postmaster" for k in changed)
        if restart:
            if on_restart is not None:
                on_restart()
            self.restarts += 1
        with self.lock:
            self.settings.update(config)
            self.applied.append(dict(config))
        return ApplyResult(restarted=restart, seconds=0.0, effective=dict(config))

    def current(self, name: str) -> str:
        return self.settings.get(name, self.effective.get(name, ""))

    def revert(self, snapshot: Snapshot) -> ApplyResult:
        if not self.is_up():
            raise ConnectError("connection refused (the simulated server is down)")
        with self.lock:
            self.settings = dict(snapshot.auto_conf)
            self.reverts += 1
        return ApplyResult(restarted=False, seconds=0.0, effective={})

    def is_up(self) -> bool:
        with self.lock:
            if self.down_polls > 0:
                self.down_polls -= 1
                return False
            return True

    def wait_until_up(self, timeout_s: float) -> bool:
        return self.is_up()

    def recover_offline(self, snapshot: Snapshot) -> str:
        with self.lock:
            self.settings = dict(snapshot.auto_conf)
            self.down_polls = 0
            self.recovered += 1
        return "started with the snapshot's entries"

    def terminate_clients(self, application_prefix: str) -> int:
        return 0

    def memory_meter(self) -> None:
        return None  # simulated: the static memory model applies

    def buffer_pool(self) -> PoolFill | None:
        return self.pool

    def pool_counter(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # simulated: no counter, the warm-up ends on throughput


@dataclass
class Faults:
    """What goes wrong, by trial number (1-based, as stored)."""

    down: dict[int, int] = field(default_factory=dict)  # trial -> is_up() False this often
    fail: set[int] = field(default_factory=set)  # pgbench fails (the server is up)
    crash: int | None = None  # the process dies at this trial (before measuring it)
    # the server dies under this trial's config, mid-run, and is down this many polls
    target_crash: dict[int, int] = field(default_factory=dict)
    cancel: int | None = None  # the user cancels during this trial
    # this trial's run lasts until its benchmark is stopped; ``held`` is set meanwhile
    hold: int | None = None
    held: threading.Event = field(default_factory=threading.Event)


class Crash(BaseException):
    """The service process dies here: nothing below catches it (not an Exception)."""


class FakeExecutor:
    """Trials on a response surface: each run's samples are the surface's true level for
    the config with the simulator's noise, seeded by the trial number (a resumed session
    measures what an uninterrupted one would)."""

    def __init__(
        self,
        surface: Surface,
        target: FakeTarget,
        wl: WorkloadIn,
        args: ExecutorArgs,
        clock: FakeClock,
        *,
        seed: int,
        noise: Noise,
        faults: Faults,
        on_trial: Callable[[int], None],
        request_cancel: Callable[[], None],
        metrics: Callable[[Config], dict[str, float]] | None = None,
    ) -> None:
        self.metrics = metrics
        self.surface, self.target, self.wl, self.args = surface, target, wl, args
        self.clock, self.seed, self.noise, self.faults = clock, seed, noise, faults
        self.on_trial, self.request_cancel = on_trial, request_cancel
        self.remembered: list[Config] = []

    def prepare(self) -> str | None:
        return None

    def remember(self, config: Config, samples: list[Any], failed: int) -> None:
        self.remembered.append(dict(config))

    def run(self, cand: Candidate, *, incumbent: Config, remeasuring: bool = False) -> TrialOutcome:
        n = cand.index + 1
        self.on_trial(n)
        if self.faults.crash == n:
            raise Crash
        hooks = self.args.hooks
        out = TrialOutcome(cand, utcnow(), measurement((), error="not measured"))
        hooks.on_phase(f"applying trial {n}")
        hooks.on_applied({"config": cand.config, "trial": n}, None)
        if n in self.faults.down:
            self.target.down_polls = self.faults.down[n]
            out.error = "could not apply: the target is unreachable: connection refused"
            out.down = True
            out.measurement = measurement((), error=out.error)
            return out
        self.target.apply(cand.config)
        hooks.check()
        hooks.on_phase(describe(cand))
        if self.faults.hold == n:
            self.faults.held.set()  # the test acts now (stops the process)
            self.args.stop.wait(30)
        if self.faults.cancel == n:
            self.request_cancel()  # as POST /sessions/{id}/cancel does
            self.args.stop.wait(5)  # the heartbeat sees it within a second, stops the run
        # a run of wl.duration_s seconds, its warm-up dropped
        self.clock.now += self.wl.duration_s
        out.timings = {"apply_s": 0.0, "bench_s": float(self.wl.duration_s)}
        hooks.on_run_start()
        bench = Bench(self.noise, self.seed * 100_003 + n)
        samples = list(bench.run(self.surface.true(cand.config)))
        for i, x in enumerate(samples):
            if hooks.on_sample is not None:
                hooks.on_sample(float(i + 1), x)
        hooks.check()
        if n in self.faults.target_crash:
            self.target.down_polls = self.faults.target_crash[n]
            out.result = BenchResult.failure("pgbench: error: server closed the connection")
            out.error = "benchmark failed: pgbench: error: server closed the connection"
            out.down = True
            out.measurement = measurement((), error=out.error)
            return out
        if n in self.faults.fail:
            out.result = BenchResult.failure("pgbench: error: simulated failure")
            out.error = "benchmark failed: pgbench: error: simulated failure"
            out.measurement = measurement((), error=out.error)
            return out
        counters = self.metrics(cand.config) if self.metrics is not None else {}
        out.result = _result(samples, counters)
        out.measurement = measurement(samples, metrics=counters)
        self.remember(cand.config, samples, 0)
        return out


def _result(samples: list[float], counters: Mapping[str, float] | None = None) -> BenchResult:
    return BenchResult(
        ok=True,
        error=None,
        samples=samples,
        all_samples=samples,
        latency_p95_samples=[],
        tps=sum(samples) / len(samples) if samples else None,
        latency_mean_ms=None,
        latency_p95_ms=None,
        latency_p99_ms=None,
        transactions=int(sum(samples)),
        failed_transactions=0,
        duration_s=float(len(samples)),
        stopped=False,
        db_metrics={"xact_commit": float(sum(samples)), **(counters or {})},
    )


class FakeEnv(RunEnv):
    """The world of a session, simulated: see the module docstring."""

    def __init__(
        self,
        surface: Surface,
        *,
        seed: int = 1,
        noise: Noise | None = None,
        faults: Faults | None = None,
        db: Database | None = None,
        metrics: Callable[[Config], dict[str, float]] | None = None,
    ) -> None:
        # the server's counters of a run of a config (trials.metrics); None: none measured
        self.metrics = metrics
        self.surface, self.seed = surface, seed
        self.noise = noise or Noise(seconds=20)
        self.faults = faults or Faults()
        self.fake_target = FakeTarget()
        self.fake_clock = FakeClock()
        self.db = db
        self.trials_run: list[int] = []
        self.session_id = 0

    def clock(self) -> float:
        return self.fake_clock()

    def target(self, row: Target, settings: Settings) -> SessionTarget:
        return self.fake_target

    def request_cancel(self) -> None:
        assert self.db is not None
        with self.db.session() as s:
            sess = s.get(TuningSession, self.session_id)
            assert sess is not None
            sess.cancel_requested = True

    def executor(self, target: SessionTarget, wl: WorkloadIn, args: ExecutorArgs) -> Executor:
        return FakeExecutor(
            self.surface,
            self.fake_target,
            wl,
            args,
            self.fake_clock,
            seed=self.seed,
            noise=self.noise,
            faults=self.faults,
            on_trial=self.trials_run.append,
            request_cancel=self.request_cancel,
            metrics=self.metrics,
        )


# -- sessions in a metadata DB ---------------------------------------------------------------
def make_db(tmp: Path, work_dir: Path | None = None, key: str | None = None) -> Database:
    """A SQLite metadata DB in ``tmp``. The DSNs written into it are encrypted with the key
    a service on ``work_dir`` (default ``tmp``) generates there: one metadata DB, one key
    (app/vault.py), as a real deployment's processes must share. Without this, rows took
    whichever key this process loaded last, and a service on ``work_dir`` refused the DB.
    ``key``: the key the service is given (KNOBTUNE_SECRET_KEY) instead of its file."""
    from app.db import upgrade

    vault.configure(key, work_dir or tmp)
    url = f"sqlite:///{tmp / 'meta.db'}"
    upgrade(url)
    return Database(url)


def add_target(db: Database, surface: Surface) -> int:
    with db.session() as s:
        t = Target(
            name=f"sim-{surface.name}-{uuid.uuid4().hex[:6]}",
            dsn="host=simulated dbname=postgres password=hidden",
            ram_bytes=surface.hardware.ram_bytes,
            cpus=surface.hardware.cpus,
            probe={"version": PG15["version"], "rows": PG15["rows"]},
            created_at=utcnow(),
        )
        s.add(t)
        s.flush()
        return t.id


def add_session(db: Database, target_id: int, body: dict[str, Any], owner: str = "test") -> int:
    """A session row as POST /sessions stores it, already claimed by ``owner``."""
    req = SessionIn.model_validate({"target_id": target_id, **body})
    with db.session() as s:
        sess = TuningSession(
            target_id=target_id,
            status="queued",
            phase="queued",
            request=req.model_dump(mode="json"),
            seed=req.seed if req.seed is not None else 1,
            benchmark_s=0.0,
            notes=[],
            cancel_requested=False,
            attempts=0,
            lease_owner=owner,
            created_at=utcnow(),
        )
        s.add(sess)
        s.flush()
        return sess.id


def run_session(
    db: Database, tmp: Path, sid: int, env: FakeEnv, owner: str = "test", **settings: Any
) -> TuningSession:
    """Drive the session to its end (or its crash) in this thread; its row afterwards."""
    env.db, env.session_id = db, sid
    cfg = Settings(database_url=db.url, work_dir=tmp, lease_seconds=30, **settings)
    with contextlib.suppress(Crash):
        SessionRunner(db, cfg, sid, owner, env).run()
    return row(db, sid)


def row(db: Database, sid: int) -> TuningSession:
    with db.session() as s:
        sess = s.get(TuningSession, sid)
        assert sess is not None
        s.expunge(sess)
        return sess
