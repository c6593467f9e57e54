"""pgbench runner: data init, a run with live per-second samples (process control).

A run never raises for pgbench's own failures (aborted clients, lost connection,
pgbench missing or killed, unwritable log directory): it returns a failed
``BenchResult`` with pgbench's message, so a tuning loop records the trial and goes
on. ``fatal`` marks failures of this host (pgbench missing, log directory
unwritable) that no other config can fix: a tuning loop should stop on them.
Connection parameters reach pgbench through libpq environment variables, so a
password is never on a command line; messages are scrubbed of it too.

Its output is read by app/postgres/pgbench_output.py (progress lines, summary,
per-transaction log): latency percentiles come from the per-transaction log, never from
averages.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import queue
import re
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import psycopg
from psycopg.conninfo import make_conninfo

from app.postgres import privilege
from app.postgres.connect import (
    DestinationRefused,
    DsnRefused,
    connect_target,
    describe_line,
    libpq_env,
)
from app.postgres.dsn import mask_dsn, scrub
from app.postgres.errors import bounded
from app.postgres.pgbench_builtins import PGBENCH_BUILTINS
from app.postgres.pgbench_output import (
    ProgressSample,
    Summary,
    TxLog,
    latency_stats,
    parse_progress_line,
    parse_summary,
    read_tx_log,
)
from app.postgres.sandbox import INSTALL_HINT, PostgresNotInstalled, find_bindir
from app.postgres.scripts import ScriptError, check_script
from app.replay.plan import ReplayRun

log = logging.getLogger(__name__)

BUILTINS = PGBENCH_BUILTINS  # the builtin scripts a run may name (pgbench -b NAME)
PROTOCOLS = ("simple", "extended", "prepared")
ISOLATION_LEVELS = ("read committed", "repeatable read", "serializable")
PGBENCH_ENV = "KNOBTUNE_PGBENCH"
# Runs up to this long log every transaction; longer ones are sampled so the
# log stays about this size (a 60 s full log at 10k tps is ~20 MB).
FULL_LOG_SECONDS = 60
# Stopping: SIGINT at once (pgbench dies on it), SIGTERM after 1 s, SIGKILL after 2 s.
_STOP_SIGNALS = ((0.0, signal.SIGINT), (1.0, signal.SIGTERM), (2.0, signal.SIGKILL))
_FINISH_GRACE_S = 60.0  # beyond -T: connection setup, vacuum, final report
# The replay player (app/replay/player.py) runs instead of pgbench for a replay stream:
# the project's root must be importable by the unprivileged user it runs as.
PLAYER_MODULE = "app.replay.player"
PLAYER_PYTHON_ENV = "KNOBTUNE_PLAYER_PYTHON"  # the interpreter that runs it (see find_player)
# The player's own environment, made by .ci/bootstrap as root: a virtualenv of a system
# Python with psycopg and a copy of knobtune's code, all readable by the unprivileged user
# (a clone and its .venv under /root are not).
PLAYER_DIR = Path("/opt/knobtune/player")
_PROJECT_ROOT = Path(__file__).resolve().parents[2]


class PgbenchError(RuntimeError):
    """pgbench could not be run or failed outside a measurement (e.g. ``pgbench -i``)."""


def pgbench_jobs(
    jobs: int, clients: int, *, given: bool = False, names: tuple[str, str] = ("jobs", "clients")
) -> int:
    """pgbench's -j for ``clients`` clients: never more threads than clients.

    pgbench itself lowers -j to -c without a word, so a request or a spec that said more
    would record threads that never ran. A default is capped; a count the user ``given``
    above ``clients`` is a ValueError that says what to change, in the front end's
    ``names`` for the two (the API's 422, the CLI's usage error, an invalid BenchSpec).
    The one place of the rule: the request's check, the workload's streams, the client
    sweeps, the demo, the CLI and the spec use it."""
    if jobs <= clients:
        return jobs
    if given:
        j, c = names
        raise ValueError(
            f"{j} ({jobs}) must not exceed {c} ({clients}): pgbench runs at most one thread "
            f"per client; give {j} {clients} or less, or more {c}"
        )
    return clients


# -- specification ---------------------------------------------------------------
@dataclass
class BenchSpec:
    """One pgbench run. ``duration_s`` includes ``warmup_s``, whose samples are dropped."""

    builtin: str | None = "tpcb-like"
    scripts: list[tuple[str, int]] | None = None  # (sql, weight), mixed with the builtin
    clients: int = 8
    jobs: int = 2
    duration_s: int = 60
    warmup_s: int = 5
    protocol: str = "simple"  # pgbench's own default; "prepared" only when asked for
    rate: float | None = None  # target tps (-R)
    builtin_weight: int = 1
    log_sampling: float | None = None  # fraction of transactions logged; None: automatic
    defines: dict[str, str] = field(default_factory=dict)  # -D name=value
    max_tries: int = 1  # --max-tries: retries of serialization failures and deadlocks
    isolation: str | None = None  # default_transaction_isolation of its sessions (PGOPTIONS)
    connect_per_transaction: bool = False  # -C: a new connection for every transaction
    # a captured workload's replay (app/replay/): the player runs instead of pgbench, its
    # plan goes to its stdin (never to a file); builtin, scripts and rate do not apply
    replay: ReplayRun | None = None

    def stdin(self) -> bytes | None:
        """What the program reads on its stdin (the replay's plan), or None."""
        return self.replay.plan if self.replay is not None else None

    def validate(self) -> None:
        """Raise ValueError naming what to change."""
        if self.replay is not None:
            self._validate_replay()
            return
        if self.builtin is not None and self.builtin not in BUILTINS:
            raise ValueError(
                f"unknown builtin {self.builtin!r}; choose one of {', '.join(BUILTINS)}"
            )
        if self.builtin is None and not self.scripts:
            raise ValueError("give a builtin script or at least one SQL script")
        for i, (sql_text, weight) in enumerate(self.scripts or []):
            if not sql_text.strip():
                raise ValueError("a script is empty")
            try:
                check_script(sql_text)  # defence in depth: no \shell reaches pgbench
            except ScriptError as exc:
                raise ValueError(f"script {i}: {exc}") from None
            if weight < 1:
                raise ValueError(f"script weights must be >= 1, got {weight}")
        if self.builtin_weight < 1:
            raise ValueError("builtin_weight must be >= 1")
        if self.protocol not in PROTOCOLS:
            raise ValueError(
                f"unknown protocol {self.protocol!r}; choose one of {', '.join(PROTOCOLS)}"
            )
        if self.clients < 1 or self.jobs < 1:
            raise ValueError("clients and jobs must be >= 1")
        # every caller derives jobs with pgbench_jobs; a spec built by hand that asks for
        # more is refused, so that the spec says what ran
        pgbench_jobs(self.jobs, self.clients, given=True)
        if self.duration_s < 1:
            raise ValueError("duration_s must be >= 1")
        if not 0 <= self.warmup_s < self.duration_s:
            raise ValueError("warmup_s must be >= 0 and less than duration_s")
        if self.rate is not None and not self.rate > 0:
            raise ValueError("rate must be > 0")
        if self.log_sampling is not None and not 0 < self.log_sampling <= 1:
            raise ValueError("log_sampling must be in (0, 1]")
        if self.max_tries < 1:
            raise ValueError("max_tries must be >= 1")
        if self.isolation is not None and self.isolation not in ISOLATION_LEVELS:
            raise ValueError(
                f"unknown isolation {self.isolation!r}; choose one of {', '.join(ISOLATION_LEVELS)}"
            )
        for name in self.defines:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"pgbench variable name {name!r} is not a plain identifier")

    def _validate_replay(self) -> None:
        assert self.replay is not None
        if self.builtin is not None or self.scripts:
            raise ValueError("a replay runs its captured statements: no builtin or scripts")
        if self.rate is not None:
            raise ValueError("a replay runs on the capture's schedule: no rate")
        if not (math.isfinite(self.replay.speed) and 0 < self.replay.speed <= 1000):
            raise ValueError("the replay's speed must be in (0, 1000]")
        if not self.replay.database:
            raise ValueError("a replay needs the database it runs in")
        if self.clients < 1:
            raise ValueError("clients must be >= 1")
        if self.duration_s < 1:
            raise ValueError("duration_s must be >= 1")
        if not 0 <= self.warmup_s < self.duration_s:
            raise ValueError("warmup_s must be >= 0 and less than duration_s")
        if self.log_sampling is not None and not 0 < self.log_sampling <= 1:
            raise ValueError("log_sampling must be in (0, 1]")

    def sampling_rate(self) -> float:
        if self.log_sampling is not None:
            return self.log_sampling
        if self.duration_s <= FULL_LOG_SECONDS:
            return 1.0
        return max(0.01, FULL_LOG_SECONDS / self.duration_s)


# -- running ---------------------------------------------------------------------
@dataclass
class BenchResult:
    ok: bool
    error: str | None
    samples: list[float]  # per-second tps after the warm-up
    all_samples: list[float]  # every per-second tps, warm-up included
    latency_p95_samples: list[float]  # per-second p95 (ms) after the warm-up
    tps: float | None
    latency_mean_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    transactions: int
    failed_transactions: int
    duration_s: float
    stopped: bool
    db_metrics: dict[str, float]
    progress: list[ProgressSample] = field(default_factory=list)
    summary: Summary | None = None
    early_stop: str | None = None  # why ``watch`` stopped the run
    fatal: bool = False  # pgbench cannot run on this host at all (see module docstring)
    tx: TxLog | None = None  # every logged transaction (None when nothing was logged)
    log_sampling: float = 1.0  # the fraction of transactions the log holds

    @classmethod
    def failure(cls, error: str, *, duration_s: float = 0.0, fatal: bool = False) -> BenchResult:
        return cls(
            ok=False,
            error=error,
            samples=[],
            all_samples=[],
            latency_p95_samples=[],
            tps=None,
            latency_mean_ms=None,
            latency_p95_ms=None,
            latency_p99_ms=None,
            transactions=0,
            failed_transactions=0,
            duration_s=duration_s,
            stopped=False,
            db_metrics={},
            fatal=fatal,
        )


def find_pgbench() -> str:
    """pgbench's path: $KNOBTUNE_PGBENCH, PATH, then PostgreSQL's bin directory."""
    explicit = os.environ.get(PGBENCH_ENV)
    if explicit:
        if os.access(explicit, os.X_OK):
            return explicit
        raise PgbenchError(f"{PGBENCH_ENV}={explicit} is not an executable pgbench")
    found = shutil.which("pgbench")
    if found:
        return found
    with contextlib.suppress(PostgresNotInstalled):
        candidate = find_bindir() / "pgbench"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    raise PgbenchError(f"pgbench was not found on PATH; install it with: {INSTALL_HINT}")


def build_command(
    spec: BenchSpec, pgbench: str, rundir: Path, script_paths: list[tuple[Path, int]]
) -> list[str]:
    """pgbench's argv (no connection parameters: they travel in the environment).

    A replay's: the player's (``pgbench`` is then the Python interpreter), which takes the
    same -T and log prefix and reads its plan on stdin.
    """
    if spec.replay is not None:
        return _player_command(spec, pgbench, rundir)
    argv = [
        pgbench,
        "-P",
        "1",
        "-T",
        # One extra second: pgbench never prints the progress line of its last second,
        # so -T N gives N-1 samples; the extra second's sample is dropped below.
        str(spec.duration_s + 1),
        "-c",
        str(spec.clients),
        "-j",
        str(spec.jobs),  # at most clients: validate() refused more
        "-M",
        spec.protocol,
        "-l",
        f"--log-prefix={rundir / 'pgbench_log'}",
    ]
    rate = spec.sampling_rate()
    if rate < 1:
        argv.append(f"--sampling-rate={rate:g}")
    if spec.rate is not None:
        argv += ["-R", f"{spec.rate:g}"]
    if spec.max_tries > 1:
        argv.append(f"--max-tries={spec.max_tries}")
    if spec.connect_per_transaction:
        argv.append("-C")
    for name, value in spec.defines.items():
        argv += ["-D", f"{name}={value}"]
    if spec.builtin is not None:
        argv += ["-b", f"{spec.builtin}@{spec.builtin_weight}"]
    for path, weight in script_paths:
        argv += ["-f", f"{path}@{weight}"]
    if script_paths:
        argv.append("-n")  # custom scripts: the pgbench tables to vacuum may not exist
    return argv


def _player_command(spec: BenchSpec, python: str, rundir: Path) -> list[str]:
    assert spec.replay is not None
    argv = [
        python,
        "-P",  # the run directory (its cwd) is not on sys.path
        "-m",
        PLAYER_MODULE,
        "-T",
        str(spec.duration_s + 1),  # as pgbench's: the last second's progress line
        "--speed",
        f"{spec.replay.speed:g}",
        "--database",
        spec.replay.database,
        f"--log-prefix={rundir / 'pgbench_log'}",
    ]
    rate = spec.sampling_rate()
    if rate < 1:
        argv.append(f"--sampling-rate={rate:g}")
    return argv


def player_env(env: dict[str, str], paths: Sequence[str] = ()) -> dict[str, str]:
    """The player's environment: libpq's as pgbench gets it, and the project importable
    (``paths``: this interpreter's site-packages, for another interpreter)."""
    out = dict(env)
    out["PYTHONPATH"] = os.pathsep.join([str(_PROJECT_ROOT), *paths])
    out["PYTHONDONTWRITEBYTECODE"] = "1"
    return out


_players: dict[int | None, tuple[str, tuple[str, ...]]] = {}
_players_lock = threading.Lock()
_PROBE = "import sys; assert sys.version_info[:2] == ({0}, {1}); "
_PROBE_IMPORTS = "import psycopg.pq, app.replay.player"


def find_player() -> tuple[str, tuple[str, ...]]:
    """The interpreter that runs the replay player, and what it needs on its sys.path.

    This service's own interpreter when the run-as user may run it (as pgbench, the
    player never runs as root). A virtualenv under a private home (pyenv's under /root)
    is not: then the player's environment the bootstrap made (PLAYER_DIR, any Python
    version: its packages are its own), then the same Python version elsewhere
    (``python3.11`` on PATH, /usr/bin, /usr/local/bin) with this interpreter's
    site-packages, or $KNOBTUNE_PLAYER_PYTHON.
    Each is tried once, as the run-as user, importing what the player imports; the
    answer is kept for the process. Raises PgbenchError naming what to set.
    """
    key = privilege.child_identity().uid if privilege.dropping() else None
    with _players_lock:
        found = _players.get(key)
        if found is not None:
            return found
        v = sys.version_info
        sites = tuple(
            dict.fromkeys(
                p
                for p in (*site.getsitepackages(), sysconfig.get_path("purelib"))
                if p and os.path.isdir(p)
            )
        )
        explicit = os.environ.get(PLAYER_PYTHON_ENV)
        candidates: list[tuple[str, tuple[str, ...]]] = []
        if explicit:
            candidates.append((explicit, sites))
        else:
            candidates.append((sys.executable, ()))
            candidates.append((str(PLAYER_DIR / "bin" / "python"), ()))
            for name in (f"python{v.major}.{v.minor}", "python3"):
                for path in (
                    shutil.which(name),
                    f"/usr/bin/{name}",
                    f"/usr/local/bin/{name}",
                ):
                    if path and path not in [c for c, _ in candidates]:
                        candidates.append((path, sites))
        for python, paths in candidates:
            # the player's own environment may be another version: it brings its packages
            same = None if python.startswith(f"{PLAYER_DIR}/") else (v.major, v.minor)
            if _runs_player(python, paths, same):
                _players[key] = (python, paths)
                return _players[key]
        who = privilege.child_identity().name if privilege.dropping() else "this user"
        raise PgbenchError(
            f"the replay player needs a Python {v.major}.{v.minor} that {who} may run, with "
            f"psycopg and knobtune importable; none of {', '.join(c for c, _ in candidates)} "
            f"is: set {PLAYER_PYTHON_ENV} to one"
        )


def _runs_player(python: str, paths: Sequence[str], version: tuple[int, int] | None) -> bool:
    if not os.path.isabs(python):
        return False
    probe = (_PROBE.format(*version) if version else "") + _PROBE_IMPORTS
    try:
        res = subprocess.run(
            [python, "-P", "-c", probe],
            env=player_env(privilege.child_env(), paths),
            cwd="/",
            capture_output=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
            **privilege.child_kwargs(),
        )
    except (OSError, subprocess.TimeoutExpired, privilege.PrivilegeError):
        return False
    return res.returncode == 0


def _db_stats(conn: psycopg.Connection[Any]) -> dict[str, float]:
    """The server's cumulative counters (a run stores their differences: issue 29).

    Keys as optimizer/counters.py reads them. A view a version lacks or a role may not
    read leaves its keys out (not measured), never 0.
    """
    version = conn.info.server_version
    out: dict[str, float] = {}
    # 18 counts parallel workers planned and launched per database
    parallel = (
        ", parallel_workers_to_launch, parallel_workers_launched" if version >= 180000 else ""
    )
    row = conn.execute(
        "SELECT xact_commit, xact_rollback, blks_hit, blks_read, temp_files, temp_bytes,"
        f" deadlocks{parallel} FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    if row is not None:
        keys = (
            "xact_commit",
            "xact_rollback",
            "blks_hit",
            "blks_read",
            "temp_files",
            "temp_bytes",
            "deadlocks",
            *(("parallel_planned", "parallel_launched") if parallel else ()),
        )
        out.update({k: float(v or 0) for k, v in zip(keys, row, strict=True)})
    out.update(_wal_and_statements(conn, version))
    if version >= 170000:
        # 17 moved checkpoint counters to pg_stat_checkpointer and backend writes to pg_stat_io.
        row = conn.execute(
            "SELECT c.num_timed, c.num_requested, c.buffers_written, b.buffers_clean,"
            " (SELECT coalesce(sum(writes), 0) FROM pg_stat_io"
            "  WHERE backend_type = 'client backend')"
            " FROM pg_stat_checkpointer c, pg_stat_bgwriter b"
        ).fetchone()
    else:
        row = conn.execute(
            "SELECT checkpoints_timed, checkpoints_req, buffers_checkpoint, buffers_clean,"
            " buffers_backend FROM pg_stat_bgwriter"
        ).fetchone()
    if row is not None:
        keys2 = (
            "checkpoints_timed",
            "checkpoints_req",
            "buffers_checkpoint",
            "buffers_clean",
            "buffers_backend",
        )
        out.update({k: float(v or 0) for k, v in zip(keys2, row, strict=True)})
    return out


def _wal_and_statements(conn: psycopg.Connection[Any], version: int) -> dict[str, float]:
    """WAL written (pg_stat_wal, 14+) and JIT time (pg_stat_statements where installed)."""
    out: dict[str, float] = {}
    if version >= 140000:
        row = conn.execute("SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal").fetchone()
        if row is not None:
            out.update(
                {
                    k: float(v or 0)
                    for k, v in zip(("wal_records", "wal_fpi", "wal_bytes"), row, strict=False)
                }
            )
    if version >= 150000:  # the jit_* columns came with 15
        row = conn.execute(
            "SELECT nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
            " WHERE extname = 'pg_stat_statements'"
        ).fetchone()
        if row is not None:
            view = f'"{row[0]}".pg_stat_statements'
            try:
                with conn.transaction():
                    got = conn.execute(
                        "SELECT coalesce(sum(total_exec_time), 0), coalesce(sum("
                        "jit_generation_time + jit_inlining_time + jit_optimization_time"
                        f" + jit_emission_time), 0) FROM {view}"
                    ).fetchone()
            except psycopg.Error:
                got = None  # not preloaded (shared_preload_libraries): not measured
            if got is not None:
                out.update({"exec_ms": float(got[0]), "jit_ms": float(got[1])})
    return out


def _read_stats(dsn: str, app_name: str | None = None) -> dict[str, float]:
    """Counters of the bench database; waits briefly for pgbench's backends to exit first
    (a backend reports its statistics when it exits)."""
    with connect_target(dsn, autocommit=True, connect_timeout=10) as conn:
        if app_name:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [app_name]
                ).fetchone()
                if not row or not row[0]:
                    break
                time.sleep(0.05)
        return _db_stats(conn)


def _pump(stream: IO[str], name: str, q: queue.Queue[tuple[str, str | None]]) -> None:
    for line in stream:
        q.put((name, line.rstrip("\n")))
    q.put((name, None))


def _connection_line(line: str, dsn: str) -> str:
    """A failed connection's line, without what the far end sent (a banner's first byte
    would tell a port scanner what listens there): app/postgres/connect.py."""
    if "connection to server" not in line and "connection failed" not in line:
        return line
    head, sep, _ = line.partition("error:")
    return (f"{head}{sep} " if sep else "") + describe_line(line, dsn)


def _error_text(
    stderr_lines: list[str], returncode: int, program: str = "pgbench", dsn: str = ""
) -> str:
    keys = ("error", "fatal", "FATAL", "ERROR", "abort", "could not", "connection")
    # pgbench's own lines only, each bounded: a server message's further lines (a quoted
    # file, COPY's CONTEXT) are a script's way to carry data out (app/postgres/errors.py)
    picked = [
        bounded(_connection_line(ln.strip(), dsn))
        for ln in stderr_lines
        if ln.startswith(f"{program}:") and any(k in ln for k in keys)
    ]
    lines = picked[-6:] or [
        bounded(_connection_line(ln, dsn)) for ln in stderr_lines[-3:] if ln.strip()
    ]
    detail = "; ".join(dict.fromkeys(lines)) or "no message"
    if returncode < 0:  # Popen's convention: killed by signal -returncode
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        said = "; ".join(dict.fromkeys(picked[-6:]))  # its progress chatter says nothing here
        return f"{program} was killed by {name} (not by knobtune)" + (f": {said}" if said else "")
    return f"{program} exited with status {returncode}: {detail}"


def run_bench(
    dsn: str,
    spec: BenchSpec,
    *,
    on_sample: Callable[[float, float], None] | None = None,
    stop: threading.Event | None = None,
    workdir: Path | None = None,
    watch: Callable[[ProgressSample], str | None] | None = None,
    app_name: str | None = None,
) -> BenchResult:
    """Run pgbench for ``spec.duration_s`` seconds and measure.

    ``on_sample(t, tps)`` is called from this thread for every per-second
    progress line (warm-up included). Setting ``stop`` ends the run within about
    a second (``stopped=True``, ``ok=False``). ``watch`` sees every progress
    sample too; the first reason it returns stops the run the same way
    (``early_stop`` = the reason, ``ok=False``). ``app_name`` prefixes the
    application_name of pgbench's connections (unless the DSN sets one), so
    they can be found in pg_stat_activity. Raises ValueError for an invalid spec
    only; pgbench failures come back as ``ok=False`` with pgbench's message.
    """
    spec.validate()
    try:
        if spec.replay is not None:
            pgbench, player_paths = find_player()
        else:
            pgbench, player_paths = find_pgbench(), ()
    except (PgbenchError, privilege.PrivilegeError) as exc:
        return BenchResult.failure(str(exc), fatal=True)
    try:
        env = libpq_env(dsn)
    except psycopg.Error as exc:  # the DSN's check (app/postgres/connect.py)
        return BenchResult.failure(
            f"cannot connect to {mask_dsn(dsn)}: {scrub(str(exc), dsn)}",
            # what the DSN says, not the moment: no later run would do better
            fatal=isinstance(exc, DsnRefused | DestinationRefused),
        )
    except privilege.PrivilegeError as exc:
        return BenchResult.failure(str(exc), fatal=True)
    if spec.isolation is not None:
        # libpq's options: spaces inside a value are escaped with a backslash
        level = spec.isolation.replace(" ", "\\ ")
        extra = f"-c default_transaction_isolation={level}"
        env["PGOPTIONS"] = f"{env['PGOPTIONS']} {extra}" if env.get("PGOPTIONS") else extra
    name = env.get("PGAPPNAME")
    if name is None:
        name = env["PGAPPNAME"] = f"{app_name or 'knobtune-pgbench'}-{uuid.uuid4().hex[:8]}"
    if spec.replay is not None:
        env = player_env(env, player_paths)
    try:
        # pgbench's own directory (scripts, logs): writable by the user it runs as
        rundir = privilege.child_dir(f"{RUNDIR_PREFIX}{os.getpid()}-", workdir)
    except OSError as exc:
        where = workdir if workdir is not None else tempfile.gettempdir()
        return BenchResult.failure(
            f"cannot write pgbench's logs in {where}: {exc.strerror or exc}; "
            "give a writable work directory (KNOBTUNE_WORK_DIR)",
            fatal=True,
        )
    try:
        return _run(dsn, spec, pgbench, env, name, rundir, on_sample, stop, watch)
    except OSError as exc:  # e.g. the disk filled up while writing scripts
        return BenchResult.failure(f"cannot write pgbench's files in {rundir}: {exc}", fatal=True)
    finally:
        shutil.rmtree(rundir, ignore_errors=True)


RUNDIR_PREFIX = "knobtune-bench-"  # then the service's pid: whose directory it is


def remove_orphan_rundirs(where: Path | None = None) -> int:
    """Remove pgbench run directories whose service process is gone (a service killed
    mid-run leaves one, with pgbench's logs, in the system's temp directory as root);
    how many went. Ours or the children's user's only (privilege.remove_orphans)."""
    owners = {os.geteuid()}
    if privilege.dropping():
        with contextlib.suppress(privilege.PrivilegeError):
            owners.add(privilege.child_identity().uid)
    place = where if where is not None else Path(tempfile.gettempdir())
    return privilege.remove_orphans(RUNDIR_PREFIX, place, owners)


def run_streams(
    dsn: str,
    specs: Sequence[BenchSpec],
    *,
    on_sample: Callable[[float, float], None] | None = None,
    stop: threading.Event | None = None,
    workdir: Path | None = None,
    watch: Callable[[ProgressSample], str | None] | None = None,
    app_name: str | None = None,
) -> list[BenchResult]:
    """Several pgbench processes at once (a workload's streams), one :func:`run_bench` each.

    The first stream feeds ``on_sample`` and ``watch``. ``stop``, an early stop of the
    first stream, or a failure of any stream ends them all: a stream that was ended
    because of another comes back ``stopped=True`` (the one that failed says why).
    Results are in the order of ``specs``.
    """
    if not specs:
        raise ValueError("a run needs at least one stream")
    for spec in specs:
        spec.validate()
    if len(specs) == 1:
        only = run_bench(
            dsn,
            specs[0],
            on_sample=on_sample,
            stop=stop,
            workdir=workdir,
            watch=watch,
            app_name=app_name,
        )
        return [only]
    end_all = threading.Event()
    results: list[BenchResult | None] = [None] * len(specs)
    done = threading.Event()

    def one(i: int) -> None:
        try:
            r = run_bench(
                dsn,
                specs[i],
                on_sample=on_sample if i == 0 else None,
                stop=end_all,
                workdir=workdir,
                watch=watch if i == 0 else None,
                app_name=app_name,
            )
        except Exception as exc:  # an invalid spec was caught above; anything else: a failure
            log.exception("stream %d of a run failed", i)
            r = BenchResult.failure(f"stream {i + 1}: {exc}")
        results[i] = r
        if not r.ok:
            end_all.set()  # a failed or early-stopped stream ends the run

    threads = [
        threading.Thread(target=one, args=(i,), name=f"pgbench-stream-{i}", daemon=True)
        for i in range(len(specs))
    ]
    for t in threads:
        t.start()

    def relay() -> None:  # the caller's stop ends every stream
        while not done.is_set():
            if stop is not None and stop.wait(0.1):
                end_all.set()
                return
            if stop is None:
                done.wait(0.5)

    relayer = threading.Thread(target=relay, daemon=True)
    relayer.start()
    for t in threads:
        t.join()
    done.set()
    relayer.join(timeout=2)
    out = [r for r in results if r is not None]
    assert len(out) == len(specs)
    return out


def _run(
    dsn: str,
    spec: BenchSpec,
    pgbench: str,
    env: dict[str, str],
    app_name: str,
    rundir: Path,
    on_sample: Callable[[float, float], None] | None,
    stop: threading.Event | None,
    watch: Callable[[ProgressSample], str | None] | None,
) -> BenchResult:
    script_paths: list[tuple[Path, int]] = []
    for i, (sql_text, weight) in enumerate(spec.scripts or []):
        path = rundir / f"script{i}.sql"
        path.write_text(sql_text if sql_text.endswith("\n") else sql_text + "\n")
        script_paths.append((path, weight))
    program = "replay" if spec.replay is not None else "pgbench"
    # the counters of the database the run works in (a replay's: its per-run copy)
    stats_dsn = dsn if spec.replay is None else make_conninfo(dsn, dbname=spec.replay.database)
    try:
        before = _read_stats(stats_dsn)
    except psycopg.Error as exc:
        return BenchResult.failure(
            f"cannot connect to {mask_dsn(dsn)}: {scrub(str(exc).strip(), dsn)}"
        )
    argv = build_command(spec, pgbench, rundir, script_paths)
    t0 = time.monotonic()
    # the counters' window: from the end of the warm-up seconds on, read beside the run
    # (a slow connect must not hold up the progress lines and the guard)
    window: dict[str, Any] = {}
    marker: threading.Thread | None = None

    def mark() -> None:
        at = time.monotonic()
        with contextlib.suppress(psycopg.Error):
            window["before"], window["t0"] = _read_stats(stats_dsn), at

    feed = spec.stdin()
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL if feed is None else subprocess.PIPE,
            env=env,
            cwd=rundir,
            text=True,
            bufsize=1,
            start_new_session=True,
            **privilege.child_kwargs(),  # never root: a client's scripts run inside it
        )
    except OSError as exc:
        return BenchResult.failure(
            f"cannot start {program} ({pgbench}): {exc.strerror or exc}", fatal=True
        )
    assert proc.stdout is not None
    assert proc.stderr is not None
    q: queue.Queue[tuple[str, str | None]] = queue.Queue()
    readers = [
        threading.Thread(target=_pump, args=(proc.stdout, "out", q), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, "err", q), daemon=True),
    ]
    if feed is not None:
        assert proc.stdin is not None
        # from a thread: a plan larger than the pipe's buffer must not hold up the
        # progress lines (the player reads all of it before it starts)
        readers.append(
            threading.Thread(target=_feed, args=(proc.stdin, feed), name="bench-stdin", daemon=True)
        )
    for r in readers:
        r.start()
    progress: list[ProgressSample] = []
    stdout_lines: list[str] = []
    stderr_lines: list[str] = []
    open_streams = 2
    stopped = False
    timed_out = False
    early: str | None = None
    signalled_at: float | None = None
    pending = list(_STOP_SIGNALS)
    limit = spec.duration_s + _FINISH_GRACE_S
    while open_streams:
        now = time.monotonic()
        if signalled_at is None and (
            (stop is not None and stop.is_set()) or early is not None or now - t0 > limit
        ):
            stopped = stop is not None and stop.is_set()
            timed_out = not stopped and early is None
            signalled_at = now
        if signalled_at is not None and pending and now - signalled_at >= pending[0][0]:
            _signal(proc, pending.pop(0)[1])
        try:
            name, line = q.get(timeout=0.1)
        except queue.Empty:
            continue
        if line is None:
            open_streams -= 1
        elif name == "out":
            stdout_lines.append(line)
        else:
            sample = parse_progress_line(line)
            if sample is None:
                stderr_lines.append(line)
                continue
            progress.append(sample)
            if marker is None and spec.warmup_s and sample.time_s >= spec.warmup_s - 0.5:
                # the measured window begins: the counters' differences start here
                marker = threading.Thread(target=mark, name="pgbench-counters", daemon=True)
                marker.start()
            if on_sample is not None:
                try:
                    on_sample(sample.time_s, sample.tps)
                except Exception:  # a display callback must not kill the measurement
                    log.exception("on_sample callback failed")
            if watch is not None and early is None and signalled_at is None:
                try:
                    early = watch(sample)
                except Exception:  # a broken guard must not kill the measurement either
                    log.exception("watch callback failed")
    returncode = proc.wait()
    elapsed = time.monotonic() - t0
    summary = parse_summary("\n".join(stdout_lines))
    summary.aborted = summary.aborted or any("Run was aborted" in ln for ln in stderr_lines)
    tx = _read_logs(rundir)
    lat = latency_stats(tx, spec.warmup_s)
    window_t0 = t0
    if marker is not None:
        marker.join(timeout=15)
        if "before" in window:
            before, window_t0 = window["before"], window["t0"]
    try:
        # After a stop nobody waits for the backends to report; return at once.
        after = _read_stats(stats_dsn, None if stopped or early else app_name)
        metrics = {k: after[k] - before[k] for k in after if k in before}
        metrics["seconds"] = round(t0 + elapsed - window_t0, 3)  # until pgbench ended
    except psycopg.Error:
        metrics = {}  # the server went away: the run's own result says so
    all_samples = [s.tps for s in progress]
    # Exactly the seconds warmup_s+1 .. duration_s: what the caller asked to measure.
    post = [s for s in progress if spec.warmup_s + 0.5 <= s.time_s <= spec.duration_s + 0.5]
    samples = [s.tps for s in post]
    p95_samples = [
        lat.p95_per_second[k] for k in (round(s.time_s) for s in post) if k in lat.p95_per_second
    ]
    error: str | None = None
    if stopped:
        error = "stopped before completion"
    elif early is not None:
        error = f"stopped early: {early}"
    elif timed_out:
        error = f"{program} did not finish within {limit:.0f} s and was killed"
    elif returncode != 0:
        error = scrub(_error_text(stderr_lines, returncode, program, dsn), dsn)
    elif not progress and spec.duration_s >= 3:
        # -P 1 prints a line a second: a run this long without one is not output we can read.
        said = "; ".join(ln.strip() for ln in (stderr_lines + stdout_lines)[:3] if ln.strip())
        error = scrub(
            f"{pgbench} exited normally but printed no progress line knobtune can read "
            f"(is it pgbench 13-17?); its output began: {said[:300] or '(nothing)'}",
            dsn,
        )
    failed = summary.failed if summary.failed is not None else lat.failed
    return BenchResult(
        ok=error is None,
        error=error,
        samples=samples,
        all_samples=all_samples,
        latency_p95_samples=p95_samples,
        tps=(sum(samples) / len(samples)) if samples else summary.tps,
        latency_mean_ms=lat.mean_ms if lat.mean_ms is not None else summary.latency_avg_ms,
        latency_p95_ms=lat.p95_ms,
        latency_p99_ms=lat.p99_ms,
        transactions=summary.transactions or 0,
        failed_transactions=failed,
        duration_s=elapsed,
        stopped=stopped,
        db_metrics=metrics,
        progress=progress,
        summary=summary,
        early_stop=early if not stopped else None,
        tx=tx if len(tx) or tx.failed_script.size else None,
        log_sampling=spec.sampling_rate(),
    )


def _feed(stdin: IO[str], data: bytes) -> None:
    """Write ``data`` to a child's stdin and close it (a child that died first: nothing)."""
    try:
        cast(io.TextIOWrapper, stdin).buffer.write(data)
        stdin.close()
    except (OSError, ValueError):  # BrokenPipeError: the child exited without reading it
        with contextlib.suppress(OSError, ValueError):
            stdin.close()


def _signal(proc: subprocess.Popen[str], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


def _read_logs(rundir: Path) -> TxLog:
    def texts() -> Iterable[str]:
        for path in sorted(rundir.glob("pgbench_log.*")):
            yield path.read_text(errors="replace")

    try:
        return read_tx_log(texts())
    except OSError:
        return TxLog.empty()


# -- data ------------------------------------------------------------------------
def _has_data(dsn: str, scale: int) -> bool:
    try:
        with connect_target(dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT to_regclass('pgbench_accounts') IS NOT NULL"
                " AND to_regclass('pgbench_tellers') IS NOT NULL"
                " AND to_regclass('pgbench_history') IS NOT NULL"
                " AND to_regclass('pgbench_branches') IS NOT NULL"
            ).fetchone()
            if not row or not row[0]:
                return False
            count = conn.execute("SELECT count(*) FROM pgbench_branches").fetchone()
            return bool(count and count[0] == scale)
    except psycopg.Error as exc:
        raise PgbenchError(
            f"cannot connect to {mask_dsn(dsn)}: {scrub(str(exc).strip(), dsn)}"
        ) from None


def init_data(
    dsn: str,
    scale: int,
    *,
    foreign_keys: bool = False,
    unlogged: bool = False,
    force: bool = False,
    timeout_s: float | None = None,
) -> bool:
    """``pgbench -i`` at ``scale``; skipped (False) when the tables already hold that scale.

    Raises PgbenchError with pgbench's message (password scrubbed).
    """
    if scale < 1:
        raise ValueError("scale must be >= 1")
    if not force and _has_data(dsn, scale):
        return False
    argv = [find_pgbench(), "-i", "-q", "-s", str(scale)]
    if foreign_keys:
        argv.append("--foreign-keys")
    if unlogged:
        argv.append("--unlogged-tables")
    try:
        res = subprocess.run(
            argv,
            env=libpq_env(dsn),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            cwd="/",
            **privilege.child_kwargs(),
        )
    except subprocess.TimeoutExpired:
        raise PgbenchError(f"pgbench -i -s {scale} did not finish within {timeout_s} s") from None
    except privilege.PrivilegeError as exc:
        raise PgbenchError(str(exc)) from None
    except psycopg.Error as exc:  # the DSN's check (app/postgres/connect.py)
        raise PgbenchError(f"cannot connect to {mask_dsn(dsn)}: {scrub(str(exc), dsn)}") from None
    if res.returncode != 0:
        detail = _error_text(res.stderr.splitlines(), res.returncode, dsn=dsn)
        raise PgbenchError(scrub(f"pgbench -i -s {scale} failed: {detail}", dsn))
    return True
