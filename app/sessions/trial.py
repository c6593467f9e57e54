"""One trial on a target: guard, apply, warm-up, reset, run, stats -> an outcome.

:class:`TrialExecutor` is what a session (and bench/e2e.py) calls to measure a config:

* the **memory guard** first (``optimizer.guard.memory_guard``): a candidate that would
  not fit the target's RAM is never applied (``rejected``, no run);
* **apply** the config (``ALTER SYSTEM``, reload or restart); a restart empties
  shared_buffers, so a **warm-up** load runs until the pool is warm again (the server's
  count of buffers allocated since): a cold run is never compared with a warm one
  (docs/architecture.md: 1,298 vs ~3,700 tps);
* **reset** the workload's data, so that every measured run starts from the same data;
* **run** every stream of the workload at once; a candidate's first stream is watched by
  the **performance guard** (``ThroughputWatch``: collapse or failed transactions against
  the incumbent's recent runs), which stops it early (``rejected``);
* per-stream **stats** from the transaction logs, and the optimizer's ``Measurement``.

It reports through callbacks (:class:`TrialHooks`: phase text, what is applied, live
samples, a checkpoint that may raise to abort) and returns a :class:`TrialOutcome`. It
never registers with the optimizer, writes the metadata DB or recovers the target: the
session does that with the outcome (app/sessions/runner.py), so nothing here calls back up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import psycopg

from app.db import utcnow
from app.postgres.benchlock import BenchTurn, HostBenchLock
from app.postgres.memory import MemoryMeter
from app.postgres.pgbench import BenchResult, BenchSpec, run_streams
from app.postgres.pgbench_output import ProgressSample
from app.postgres.target import ApplyResult, ConnectError, PoolCounter, TargetError
from app.sessions.plan import describe, measurement
from app.workloads.base import Stream, Workload, WorkloadError
from app.workloads.stream_run import bench_spec, stream_stat
from optimizer.descent import Candidate, Measurement
from optimizer.evidence import StreamStat
from optimizer.guard import (
    MemoryUse,
    MemoryWatch,
    ThroughputWatch,
    back_to_level,
    guard_window,
    measured_memory_guard,
    memory_guard,
    pool_refilled,
    warm_up_window,
    warmed_up,
)
from optimizer.knobs import Config

INCUMBENT_RUNS = 3  # recent incumbent runs whose median level the performance guard uses
# A warm-up after a restart lasts at most this many runs: a 768MB pool takes 90 s and more
# to refill from a 1000-IOPS disk, longer than one of a session's 45-60 s runs.
WARM_UP_RUNS = 3


class Applier(Protocol):
    """What a trial needs of a target (TargetController, or a fake in tests)."""

    def apply(
        self, config: Mapping[str, str], *, on_restart: Callable[[], None] | None = None
    ) -> ApplyResult: ...

    def is_up(self) -> bool: ...

    def terminate_clients(self, application_prefix: str) -> int: ...

    def pool_counter(self) -> contextlib.AbstractContextManager[PoolCounter | None]: ...


@dataclass
class TrialHooks:
    """How a trial reports while it runs; the defaults do nothing."""

    # the phase a user sees ("applying work_mem=8MB", "warming up after restart", ...)
    on_phase: Callable[[str], None] = lambda _text: None
    # what the target may be set to now, recorded before an apply (a crash leaves a trace);
    # ``phase`` says what happens next, if anything ("restarting ...")
    on_applied: Callable[[dict[str, Any], str | None], None] = lambda _applied, _phase: None
    on_run_start: Callable[[], None] = lambda: None  # a measured run begins (live view)
    on_sample: Callable[[float, float], None] | None = None  # (second, tps) of the first stream
    # between steps: raise to abort the trial (a cancel, a lost lease)
    check: Callable[[], None] = lambda: None


@dataclass
class TrialOutcome:
    """What one trial measured, for the optimizer and the trial row."""

    candidate: Candidate
    started: datetime
    measurement: Measurement  # a failed one when the trial failed or was rejected
    timings: dict[str, float] = field(default_factory=dict)
    result: BenchResult | None = None  # the measured run (first stream, every failure)
    error: str | None = None  # apply, reset or benchmark failure
    rejected: str | None = None  # a guard's reason: memory (no run) or performance (early stop)
    down: bool = False  # the target stopped answering
    host: dict[str, Any] = field(default_factory=dict)  # the host's load at the end (local)
    turn: BenchTurn | None = None  # how the run got its turn on the host (app/postgres/benchlock)
    warmed: str | None = None  # why the warm-up before the run ended (None: no warm-up)

    @property
    def ran(self) -> bool:
        """A run was attempted (False: rejected before anything was applied)."""
        return self.result is not None or self.error is not None

    @property
    def fatal(self) -> bool:
        """pgbench cannot run on this host at all: no later trial can either."""
        return self.result is not None and self.result.fatal

    @property
    def stopped_early(self) -> bool:
        """The performance guard stopped the run: the incumbent must be applied again."""
        return self.result is not None and self.result.early_stop is not None


class TrialExecutor:
    """Runs trials of one workload on one target (see the module docstring)."""

    def __init__(
        self,
        target: Applier,
        dsn: str,
        workload: Workload,
        *,
        duration_s: int,
        warmup_s: int,
        rate: float | None = None,
        effective: Mapping[str, str] | None = None,
        ram_bytes: int | None = None,
        workdir: Path | None = None,
        app_name: str | None = None,
        warmup_run_s: int | None = None,
        stop: threading.Event | None = None,
        hooks: TrialHooks | None = None,
        scrub: Callable[[str], str] = lambda text: text,
        local: bool = False,
        bench_lock: HostBenchLock | None = None,
        meter: MemoryMeter | None = None,
    ) -> None:
        self.target, self.dsn, self.workload = target, dsn, workload
        # the server's memory, read every second of every run (None: another host's server,
        # whose guard is the static model against its declared RAM)
        self.meter = meter
        self._mem_peak: dict[str, MemoryUse] = {}  # config -> peak seen over its runs
        self._mem_limit: int | None = None  # what the server may use (cgroup limit or RAM)
        self._spilled: dict[str, bool] = {}  # config -> its runs wrote temp files
        self.bench_lock = bench_lock  # one benchmark per host at a time (its slots)
        self.streams: list[Stream] = workload.streams()
        self.specs: list[BenchSpec] = [
            bench_spec(st, duration_s=duration_s, warmup_s=warmup_s, rate=rate)
            for st in self.streams
        ]
        self.effective = dict(effective or {})  # knobs outside the space keep these values
        self.ram_bytes = ram_bytes
        self.workdir, self.app_name = workdir, app_name
        # a discarded run of this many seconds before every measured run (bench/e2e.py's
        # confirmation); None: warm up only after a restart, until the pool is warm
        self.warmup_run_s = warmup_run_s
        self.stop = stop
        self.hooks = hooks or TrialHooks()
        self.scrub = scrub
        self.local = local
        # config -> per-second samples of its successful runs (after the warm-up)
        self._runs: dict[str, list[list[float]]] = {}
        self._failures: dict[str, list[int]] = {}  # config -> failed transactions per run

    # -- the trial ------------------------------------------------------------------------
    def run(self, cand: Candidate, *, incumbent: Config, remeasuring: bool = False) -> TrialOutcome:
        """Measure ``cand`` (``incumbent``: the config the guards compare it with).

        ``remeasuring``: runs of one config just jumped (the load, or its own scatter), and
        the phase says so.
        """
        out = TrialOutcome(cand, utcnow(), measurement((), error="not measured"))
        if self.bench_lock is None:
            self._run(out, incumbent, remeasuring)
        else:
            # the whole trial (apply, warm-up, reset, runs) is the host's load of this session
            with self.bench_lock.turn(self.stop) as turn:
                self._run(out, incumbent, remeasuring)
            out.turn = turn
            out.timings["bench_wait_s"] = round(turn.waited_s, 3)
        out.host = _host_load() if self.local else {}
        return out

    def _run(self, out: TrialOutcome, incumbent: Config, remeasuring: bool) -> None:
        cand, hooks = out.candidate, self.hooks
        # a long run (knobs that act through checkpoints) has its own measured window
        specs = [
            dataclasses.replace(sp, duration_s=int(cand.run_s) + sp.warmup_s) if cand.run_s else sp
            for sp in self.specs
        ]
        spec = specs[0]
        if cand.role == "candidate":
            reason = self.memory_check(cand.config, incumbent)
            if reason is not None:
                out.rejected = reason
                out.measurement = measurement((), error=reason)
                return
        label = _label(cand)
        hooks.on_phase(f"applying {label}")
        applied_at = {"config": cand.config, "at": out.started.isoformat(), "trial": cand.index + 1}
        hooks.on_applied(applied_at, None)

        def restarting() -> None:
            hooks.on_applied(
                {**applied_at, "restarting": True}, f"restarting the target for {label}"
            )

        applied: ApplyResult | None
        t = time.monotonic()
        try:
            applied = self.target.apply(cand.config, on_restart=restarting)
        except ConnectError as exc:
            out.error = f"could not apply: the target is unreachable: {self.scrub(str(exc))}"
            applied, out.down = None, True
        except (TargetError, psycopg.Error) as exc:
            # psycopg.Error: the server went away in the middle of the apply
            out.error = f"could not apply: {self.scrub(str(exc).strip())}"
            applied = None
            out.down = not self.target.is_up()  # also a failed restart whose recovery failed
        out.timings["apply_s"] = round(time.monotonic() - t, 3)
        hooks.check()
        if applied is not None:
            if applied.restarted or self.warmup_run_s:
                # A restart empties shared_buffers; a cold run must never be
                # compared with a warm one (docs/architecture.md: 1,298 vs ~3,700 tps).
                why = "warming up after restart" if applied.restarted else "warming up"
                hooks.on_applied(applied_at, why)
                t = time.monotonic()
                out.warmed = self.warm_up(cand.config)
                out.timings["warmup_s"] = round(time.monotonic() - t, 3)
                hooks.check()
            # a load shift was just seen: say so while the session re-measures
            hooks.on_phase(
                describe(cand)
                + (" (runs of one config jumped: re-measuring)" if remeasuring else "")
            )
            try:
                t = time.monotonic()
                self.workload.reset(self.dsn)  # every measured run on the same data
                out.timings["reset_s"] = round(time.monotonic() - t, 3)
            except WorkloadError as exc:
                out.error = self.scrub(str(exc))
                out.down = not self.target.is_up()
        if applied is None or out.error is not None:
            out.measurement = measurement((), error=out.error or "not measured")
            return
        hooks.on_run_start()
        watch = self._watch(cand, spec, incumbent)
        memory = self._memory_watch(cand.config, live=cand.role == "candidate")
        if memory is not None:
            watch = _both(memory, watch)
        t = time.monotonic()
        results = run_streams(
            self.dsn,
            specs,
            on_sample=hooks.on_sample,
            stop=self.stop,
            workdir=self.workdir,
            watch=watch,
            app_name=self.app_name,
        )
        out.timings["bench_s"] = round(time.monotonic() - t, 3)
        hooks.check()
        result = out.result = combined(self.streams, results)
        temp = (result.db_metrics or {}).get("temp_files")
        if isinstance(temp, int | float):
            key = _key(cand.config)
            self._spilled[key] = self._spilled.get(key, False) or temp > 0
        if result.early_stop is not None:
            if self.app_name:
                # pgbench is gone, but a backend in a long statement runs on (and goes on
                # allocating, when the memory guard stopped it) until it is ended
                with contextlib.suppress(Exception):
                    self.target.terminate_clients(self.app_name)
            out.rejected = result.early_stop
            out.measurement = measurement(result.samples, error=result.early_stop)
            return
        if not result.ok:
            out.error = f"benchmark failed: {self.scrub(result.error or 'unknown error')}"
            out.down = not result.fatal and not self.target.is_up()
            out.measurement = measurement(result.samples, error=out.error)
            return
        stats = stream_stats(self.streams, results, float(spec.warmup_s))
        out.measurement = measurement(
            result.samples,
            p95_samples=result.latency_p95_samples,
            p95=result.latency_p95_ms,
            p99=result.latency_p99_ms,
            streams=stats,
            metrics=result.db_metrics,  # the server's counters: WAL rate, the baseline's order
        )
        self.remember(cand.config, out.measurement.samples, result.failed_transactions)

    def warm_up(self, config: Mapping[str, str] | None = None) -> str:
        """Discarded load after a restart until the server is warm; says why it ended.

        Warm when the server's own counter says the pool is (buffers allocated since the
        restart: the pool full, or no more reads into it: ``optimizer.guard.pool_refilled``)
        and, for a ``config`` measured warm before, once its throughput is back to
        :data:`~optimizer.guard.WARM_SHARE` of that level (the OS page cache refills after
        the pool: on TPC-C under 1 GB an incumbent whose 256MB pool refilled in 9 s after
        a 512MB candidate ran at 144-176 tps against its 311-355), at most
        :data:`WARM_UP_RUNS` runs long. Where the counter cannot be read, when throughput
        levels off, at most one run. With ``warmup_run_s``: a discarded run of exactly that
        long.
        """
        if self.warmup_run_s:
            fixed = [
                dataclasses.replace(spec, duration_s=self.warmup_run_s, warmup_s=0)
                for spec in self.specs
            ]
            run_streams(
                self.dsn, fixed, stop=self.stop, workdir=self.workdir, app_name=self.app_name
            )
            return f"a {self.warmup_run_s} s run"
        run_s = self.specs[0].duration_s
        seen: list[float] = []
        window = warm_up_window(run_s - self.specs[0].warmup_s)
        runs = self._runs.get(_key(config), [])[-INCUMBENT_RUNS:] if config is not None else []
        known = statistics.median(statistics.median(r) for r in runs if r) if runs else None
        with self.target.pool_counter() as pool:
            start = _allocated(pool)
            allocated: list[int] = []
            refilled: list[str] = []  # why the pool counts as warm, once it does

            def level(s: ProgressSample) -> str | None:
                seen.append(s.tps)
                now = _allocated(pool)
                if pool is not None and start is not None and now is not None:
                    allocated.append(now - start)
                    why = refilled[0] if refilled else pool_refilled(allocated, pool.pool_buffers)
                    if why is None:
                        return None
                    refilled[:] = [why]
                    if known is None:
                        return why
                    back = back_to_level(seen, known, window)
                    return f"{why}, then {back}" if back else None
                return "throughput levelled off" if warmed_up(seen, window=window) else None

            cap = run_s * (WARM_UP_RUNS if start is not None else 1)
            results = run_streams(
                self.dsn,
                [dataclasses.replace(spec, duration_s=cap, warmup_s=0) for spec in self.specs],
                stop=self.stop,
                workdir=self.workdir,
                watch=level,
                app_name=self.app_name,
            )
        why = next((r.early_stop for r in results if r.early_stop), None)
        return why or f"not settled after {cap} s" + (f" ({refilled[0]})" if refilled else "")

    # -- guards ---------------------------------------------------------------------------
    def memory_check(self, config: Config, incumbent: Config) -> str | None:
        """Why ``config`` would not fit the memory the server may use, or None.

        Measured where the server is local (its memory under the incumbent, read during the
        incumbent's runs: optimizer.guard.measured_memory_guard); the static worst case
        against the declared RAM otherwise, or before the incumbent was ever measured here
        (a resumed session: then only as the sanity ceiling, the live guard watching).
        """
        cand, inc = {**self.effective, **config}, {**self.effective, **incumbent}
        clients = sum(st.clients for st in self.streams)
        if self.meter is not None and self._mem_limit is not None:
            seen = self._mem_peak.get(_key(incumbent), MemoryUse(0, 0))
            return measured_memory_guard(
                cand,
                inc,
                seen,
                limit_bytes=min(self._mem_limit, self.ram_bytes or self._mem_limit),
                clients=clients,
                spilled=self._spilled.get(_key(incumbent), True),
                ram_bytes=self.ram_bytes,
            )
        if self.ram_bytes is None:
            return None
        return memory_guard(cand, inc, ram_bytes=self.ram_bytes, clients=clients)

    def _memory_watch(self, config: Config, live: bool) -> Callable[[], str | None] | None:
        """Reads the server's memory (called each second of a run): records the peak of
        ``config`` and, with ``live``, says why to stop the run (the live guard)."""
        meter = self.meter
        if meter is None:
            return None
        key = _key(config)

        def check() -> str | None:
            reading = meter.read()
            if reading is None:
                return None
            self._mem_limit = reading.limit_bytes
            limit = min(reading.limit_bytes, self.ram_bytes or reading.limit_bytes)
            self._mem_peak[key] = reading.use.peak(self._mem_peak.get(key))
            why = MemoryWatch(limit).observe(reading.use) if live else None
            if why is not None and self.app_name:
                # A backend in a long statement does not notice pgbench going away, and goes
                # on allocating: ended now, not after pgbench's teardown and the log's
                # parsing (on a loaded host that took longer than the 10% left, and the
                # OOM killer ended it first: a crash restart of the whole server).
                # A thread: the progress reader must not wait on the target.
                threading.Thread(
                    target=self._end_clients, name="memory-guard-stop", daemon=True
                ).start()
            return why

        return check

    def _end_clients(self) -> None:
        """The run's backends ended (the live memory guard's stop); errors are not the
        run's: the trial's own stop ends them again."""
        with contextlib.suppress(Exception):
            self.target.terminate_clients(self.app_name or "")

    def remember(self, config: Mapping[str, str], samples: Sequence[Any], failed: int) -> None:
        """A successful run of ``config``: the performance guard's reference level."""
        if samples:
            self._runs.setdefault(_key(config), []).append([float(x) for x in samples])
            self._failures.setdefault(_key(config), []).append(failed or 0)

    def _watch(
        self, cand: Candidate, spec: BenchSpec, incumbent: Config
    ) -> Callable[[ProgressSample], str | None] | None:
        """The performance guard of a candidate run (baseline and incumbent runs set the level)."""
        if cand.role != "candidate":
            return None
        key = _key(incumbent)
        window = guard_window(spec.duration_s - spec.warmup_s)
        # The incumbent's level over the same seconds the candidate is judged on: a
        # steady load (pgbench) is level anyway, and a replayed capture's pace follows
        # its schedule (a quiet first few seconds are not a collapse).
        levels = [statistics.median(r[:window]) for r in self._runs.get(key, [])[-INCUMBENT_RUNS:]]
        # Failed transactions reject a candidate only when the incumbent had none:
        # a workload that always has some (serialization failures) is not a collapse.
        fail_free = not any(self._failures.get(key, [])[-INCUMBENT_RUNS:])
        w = ThroughputWatch(
            reference=statistics.median(levels) if levels else None,
            warmup_s=spec.warmup_s,
            window=window,
        )

        def observe(s: ProgressSample) -> str | None:
            return w.observe(s.time_s, s.tps, s.failed if fail_free else None)

        return observe


def _key(config: Mapping[str, str]) -> str:
    return repr(sorted(config.items()))


def _both(
    memory: Callable[[], str | None], watch: Callable[[ProgressSample], str | None] | None
) -> Callable[[ProgressSample], str | None]:
    """One watch: the memory reading every second, then the performance guard."""

    def observe(s: ProgressSample) -> str | None:
        return memory() or (watch(s) if watch is not None else None)

    return observe


def _allocated(pool: PoolCounter | None) -> int | None:
    """Buffers allocated so far, or None (no counter, or the server went away)."""
    if pool is None:
        return None
    try:
        return pool.allocated()
    except psycopg.Error:
        return None


def _host_load() -> dict[str, Any]:
    """The service host's load when a run ended (the target is on it): backs drift notes."""
    one, five, _ = os.getloadavg()
    return {"load1": round(one, 2), "load5": round(five, 2), "cpus": os.cpu_count()}


def _label(cand: Candidate) -> str:
    if cand.role in ("baseline", "final-baseline"):
        return "the baseline config"
    if cand.role in ("incumbent", "final-incumbent"):
        return "the incumbent config"
    return f"{cand.knob}={cand.value}" if cand.knob else str(cand.value)


def combined(streams: list[Stream], results: list[BenchResult]) -> BenchResult:
    """One result for the trial row: the first stream's, with every stream's failure.

    A failure of any stream fails the run; streams ended because another one failed or
    was stopped early come back stopped, and only the one that failed says why.
    """
    first = results[0]
    if len(results) == 1:
        return first
    errors = [
        f"stream {st.name!r}: {r.error}"
        for st, r in zip(streams, results, strict=True)
        if not r.ok and not r.stopped and r.early_stop is None
    ]
    out = dataclasses.replace(
        first,
        failed_transactions=sum(r.failed_transactions for r in results),
        fatal=any(r.fatal for r in results),
        db_metrics=first.db_metrics,
    )
    if first.early_stop is not None:
        return out
    if errors:
        out.ok, out.error, out.stopped = False, "; ".join(errors), False
    return out


def stream_stats(
    streams: list[Stream], results: list[BenchResult], warmup_s: float
) -> tuple[StreamStat, ...]:
    """Every stream's transactions; () when a log is empty (the per-second level decides)."""
    stats = []
    for st, r in zip(streams, results, strict=True):
        stat = stream_stat(st, r, warmup_s)
        if stat is None:
            return ()
        stats.append(stat)
    return tuple(stats)
