"""ORM mapping of the metadata DB. The schema itself is created by Alembic only."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from app import vault
from app.postgres.dsn import remember

# Session states where the session still holds its target.
ACTIVE_STATUSES = ("queued", "running")
FINAL_STATUSES = ("succeeded", "failed", "cancelled")


class UTCDateTime(TypeDecorator[datetime]):
    """Stores naive UTC (SQLite keeps no zone) and always hands back aware UTC."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given; use app.db.utcnow()")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class EncryptedText(TypeDecorator[str]):
    """Text stored encrypted (app/vault.py: Fernet, ``fernet:`` prefix), plain in Python.

    Used for DSNs: their passwords never reach the metadata DB, its WAL or a dump in
    plain text. Every DSN read or written is also remembered by app.postgres.dsn, so
    that error texts are scrubbed of every known password, not only their own target's.
    Rows written before encryption read as they are (and are sealed at the next start).
    """

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        if value is None:
            return None
        remember(value)
        return value if vault.is_encrypted(value) else vault.encrypt(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> str | None:
        if value is None:
            return None
        plain = vault.decrypt(value)
        remember(plain)
        return plain


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime,
        dict[str, Any]: JSON,
        list[Any]: JSON,
    }


class LeaseColumns:
    """The lease of a row that background work holds (app/lease.py): sessions, sweeps,
    captures and comparisons. ``lease_owner`` is the process (``Settings.instance_id``)
    running it, until ``lease_expires_at`` unless its heartbeat renews it;
    ``cancel_requested`` is the flag that heartbeat reads. A mixin: each table has these
    columns of its own (no table of leases)."""

    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None]


class Target(Base):
    __tablename__ = "targets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    # Encrypted at rest (the runner needs the password); never rendered unmasked. For a
    # managed sandbox: its superuser, used by the controller only (ALTER SYSTEM).
    dsn: Mapped[str] = mapped_column(EncryptedText)
    # Where workloads run when it differs from dsn: a sandbox's benchmark role (no
    # superuser, no server files or programs). Encrypted like dsn.
    bench_dsn: Mapped[str | None] = mapped_column(EncryptedText)
    # One of the operator's configured restart methods (Settings.restart_methods), by
    # name; "sandbox" for a managed sandbox's own pg_ctl.
    restart_method: Mapped[str | None] = mapped_column(String(64))
    # A shell command stored before restart methods existed: kept as text, never run.
    restart_command: Mapped[str | None] = mapped_column(Text)
    # Which server this is (app.postgres.target.server_identity): one target per server.
    server_id: Mapped[str | None] = mapped_column(String(100))
    data_dir: Mapped[str | None] = mapped_column(Text)
    ram_bytes: Mapped[int | None] = mapped_column(BigInteger)
    cpus: Mapped[int | None] = mapped_column(Integer)
    sandbox_dir: Mapped[str | None] = mapped_column(Text)  # managed local cluster
    # A sandbox's hardware profile (app.postgres.cgroups.Limits.to_json): the cgroup it
    # runs in, made again at every start of the service. None: no limits.
    sandbox_limits: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    probe: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # Never changed nor benchmarked (app/targets/recommend.py): a managed database whose
    # settings are read; it is tuned through a twin.
    recommend_only: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime]
    # Set instead of deleting a target whose sessions are kept as history.
    retired_at: Mapped[datetime | None]

    sessions: Mapped[list[TuningSession]] = relationship(back_populates="target")

    __table_args__ = (
        # One live target per server: a second registration is refused (409), and this
        # makes two racing registrations unable to both win.
        Index(
            "uq_targets_one_per_server",
            "server_id",
            unique=True,
            sqlite_where=text("retired_at IS NULL AND server_id IS NOT NULL"),
            postgresql_where=text("retired_at IS NULL AND server_id IS NOT NULL"),
        ),
    )

    @property
    def workload_dsn(self) -> str:
        """Where the workload (pgbench, preflight, data loading) connects."""
        return self.bench_dsn or self.dsn


class TuningSession(LeaseColumns, Base):
    __tablename__ = "sessions"
    __table_args__ = (
        # At most one active session per target, enforced by the DB so two
        # service processes racing on POST cannot both win.
        Index(
            "uq_sessions_one_active_per_target",
            "target_id",
            unique=True,
            sqlite_where=text("status IN ('queued', 'running')"),
            postgresql_where=text("status IN ('queued', 'running')"),
        ),
        Index("ix_sessions_status", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="RESTRICT"))
    schedule_id: Mapped[int | None] = mapped_column(ForeignKey("schedules.id", ondelete="SET NULL"))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    phase: Mapped[str] = mapped_column(String(200), default="queued")
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    seed: Mapped[int] = mapped_column(Integer)
    # The target's settings before the first change; written before any change.
    snapshot: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # What the target may be set to right now (recorded before each apply), so
    # a crash leaves a record of the in-progress state.
    applied: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    start_config: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    best_config: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    baseline_tps: Mapped[float | None] = mapped_column(Float)
    best_tps: Mapped[float | None] = mapped_column(Float)
    gain: Mapped[float | None] = mapped_column(Float)
    # confirmed (the final check measured it), unconfirmed (the check was cut: the walk's
    # figure only), or no-change (nothing recommended); None before any verdict
    gain_status: Mapped[str | None] = mapped_column(String(16))
    gain_p_value: Mapped[float | None] = mapped_column(Float)
    gain_ci_low: Mapped[float | None] = mapped_column(Float)  # 95% interval of the gain
    gain_ci_high: Mapped[float | None] = mapped_column(Float)
    # per stream (and per query/script): baseline vs best levels and latencies
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    trials_planned: Mapped[int | None] = mapped_column(Integer)
    benchmark_s: Mapped[float] = mapped_column(Float, default=0.0)
    live: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    notes: Mapped[list[Any]] = mapped_column(JSON, default=list)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]

    target: Mapped[Target] = relationship(back_populates="sessions")
    trials: Mapped[list[Trial]] = relationship(
        back_populates="session", order_by="Trial.index", cascade="all, delete-orphan"
    )


class Trial(Base):
    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("session_id", "index", name="uq_trials_session_index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)  # 1, 2, ... in the order measured
    # baseline, candidate, incumbent, final-baseline, final-incumbent
    role: Mapped[str] = mapped_column(String(16))
    knob: Mapped[str | None] = mapped_column(String(100))
    value: Mapped[str | None] = mapped_column(Text)  # joint hints list several knobs
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    samples: Mapped[list[Any]] = mapped_column(JSON, default=list)
    p95_samples: Mapped[list[Any]] = mapped_column(JSON, default=list)
    median_tps: Mapped[float | None] = mapped_column(Float)
    latency_mean_ms: Mapped[float | None] = mapped_column(Float)
    latency_p95_ms: Mapped[float | None] = mapped_column(Float)
    latency_p99_ms: Mapped[float | None] = mapped_column(Float)
    failed_transactions: Mapped[int] = mapped_column(Integer, default=0)
    verdict: Mapped[str | None] = mapped_column(
        String(16)
    )  # keep, revert, or null (more runs needed)
    gain: Mapped[float | None] = mapped_column(Float)
    p_value: Mapped[float | None] = mapped_column(Float)
    reason: Mapped[str | None] = mapped_column(Text)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # per stream and script: transactions, mean latency and its variance; the run's level
    evidence: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    host: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # load average, CPU (local)
    # the incumbent's own runs moved more than the noise allows around this run
    drift: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    ci_low: Mapped[float | None] = mapped_column(Float)  # 95% interval of the verdict's gain
    ci_high: Mapped[float | None] = mapped_column(Float)
    timings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime]

    session: Mapped[TuningSession] = relationship(back_populates="trials")


class Schedule(Base):
    """A recurring session: a template re-run on a cron or interval trigger."""

    __tablename__ = "schedules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    cron: Mapped[str | None] = mapped_column(String(100))
    interval_s: Mapped[int | None] = mapped_column(Integer)
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    last_fired_at: Mapped[datetime | None]
    last_result: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]


class Sweep(LeaseColumns, Base):
    """A client sweep of a target (issue 16): the workload at increasing client counts.

    It changes no configuration, so there is nothing to restore; it holds its target like
    a session does (one sweep or session at a time) until it ends. Like a session it is
    claimed under a lease by the scheduler and kept alive by a heartbeat; a process that
    dies leaves a lease that runs out, and another claim resumes the sweep.
    """

    __tablename__ = "sweeps"
    __table_args__ = (
        Index("ix_sweeps_target_status", "target_id", "status"),
        Index("ix_sweeps_status", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    phase: Mapped[str] = mapped_column(String(200), default="queued")
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    runs: Mapped[list[Any]] = mapped_column(JSON, default=list)  # one entry per run, in order
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # points, knee, advice
    knee_clients: Mapped[int | None] = mapped_column(Integer)
    best_clients: Mapped[int | None] = mapped_column(Integer)
    best_tps: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    heartbeat_at: Mapped[datetime | None]
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class Apply(Base):
    """A session's recommendation applied to its target, and the way back (issue 27).

    ``before`` is the target's state taken just before the change (ALTER SYSTEM entries
    and effective values): a rollback puts it back. ``after`` is the state right after:
    a rollback that finds the server changed since then shows the difference and waits
    for a confirmation. An apply in progress holds its target (app/targets/holds.py).
    """

    __tablename__ = "applies"
    __table_args__ = (Index("ix_applies_target_status", "target_id", "status"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    # applying, applied, failed, rolling-back, rolled-back
    status: Mapped[str] = mapped_column(String(16))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # knob -> value set by this apply
    changes: Mapped[list[Any]] = mapped_column(JSON, default=list)  # the diff shown before
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # Snapshot.to_json()
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    verified: Mapped[list[Any]] = mapped_column(JSON, default=list)  # pg_settings after
    restarted: Mapped[bool] = mapped_column(Boolean, default=False)
    pending_restart: Mapped[list[Any]] = mapped_column(JSON, default=list)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    rolled_back_at: Mapped[datetime | None]


class Capture(LeaseColumns, Base):
    """A captured workload (issue 28): a target's statement log, or an imported one.

    A live capture is background work under a lease like a sweep (app/captures/runner.py):
    it snapshots the target's logging settings (``snapshot``, committed before the first
    ALTER SYSTEM), logs every statement for ``request.seconds``, always puts the settings
    back, and collects the log lines of its window. ``collect`` holds where the window
    starts in the server's log and the pg_stat_statements counters at its start, so that
    a process taking over after a crash can put the settings back and collect what was
    logged. The log itself (the statements with their values: the user's data) is never
    in the metadata DB: it is a file, compressed and encrypted (app/captures/store.py).
    A live capture holds its target (app/targets/holds.py) until it ends.
    """

    __tablename__ = "captures"
    __table_args__ = (
        Index("uq_captures_name", "name", unique=True),
        # One live capture per target at a time, enforced by the DB against racing POSTs.
        Index(
            "uq_captures_one_active_per_target",
            "target_id",
            unique=True,
            sqlite_where=text("status IN ('queued', 'running')"),
            postgresql_where=text("status IN ('queued', 'running')"),
        ),
        Index("ix_captures_target_status", "target_id", "status"),
        Index("ix_captures_status", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    # None for an import; SET NULL when the target is deleted (the capture stays useful)
    target_id: Mapped[int | None] = mapped_column(ForeignKey("targets.id", ondelete="SET NULL"))
    source: Mapped[str] = mapped_column(String(16))  # live, import
    database: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    phase: Mapped[str] = mapped_column(String(200), default="queued")
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    # the target's logging settings before the capture (Snapshot.to_json()); written and
    # committed before the first change
    snapshot: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # where the window starts in the server's log (app.postgres.serverlog.LogPoint) and the
    # pg_stat_statements counters then; no statement text
    collect: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # what the capture holds: counts, kinds, top queries (normalized, no literal values)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    raw_bytes: Mapped[int | None] = mapped_column(BigInteger)  # log text kept
    stored_bytes: Mapped[int | None] = mapped_column(BigInteger)  # the file, compressed
    truncated: Mapped[bool] = mapped_column(Boolean, default=False)
    notes: Mapped[list[Any]] = mapped_column(JSON, default=list)
    error: Mapped[str | None] = mapped_column(Text)
    heartbeat_at: Mapped[datetime | None]
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class SecretKey(Base):
    """A key that has encrypted secrets in this metadata DB, by its fingerprint only (an
    HMAC keyed by the key: app/vault.py). A process lacking one refuses to start."""

    __tablename__ = "secret_keys"

    fingerprint: Mapped[str] = mapped_column(String(64), primary_key=True)
    first_used_by: Mapped[str] = mapped_column(String(200))  # the process (instance id)
    first_used_at: Mapped[datetime]


class Comparison(LeaseColumns, Base):
    """An independent comparison of named configs on a target (``knobtune compare``).

    Interleaved rounds: every config once per round, in an order shuffled per round from
    ``seed``, each applied over the target's own settings, a discarded warm-up run, then
    the measured run. It changes the target's settings, so it holds its target like a
    session (app/targets/holds.py), takes a ``snapshot`` before the first change and
    puts it back at the end, on a cancel, and after a crash (the process that resumes it
    under the lease restores, like a session's). ``configs`` are the settings as
    resolved when it started (pgtune for the hardware the server has then); ``runs``
    holds every run as measured.
    """

    __tablename__ = "comparisons"
    __table_args__ = (
        # One active comparison per target, enforced by the DB against racing POSTs.
        Index(
            "uq_comparisons_one_active_per_target",
            "target_id",
            unique=True,
            sqlite_where=text("status IN ('queued', 'running')"),
            postgresql_where=text("status IN ('queued', 'running')"),
        ),
        Index("ix_comparisons_status", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    phase: Mapped[str] = mapped_column(String(200), default="queued")
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    seed: Mapped[int] = mapped_column(Integer)
    configs: Mapped[list[Any] | None] = mapped_column(JSON)  # resolved when it starts
    # the target's settings before the first change (Snapshot.to_json()) and the probe's
    # facts; written and committed before any change
    snapshot: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # what the target may be set to right now (recorded before each apply)
    applied: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    runs: Mapped[list[Any]] = mapped_column(JSON, default=list)  # one entry per run, in order
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # levels and gains at the end
    notes: Mapped[list[Any]] = mapped_column(JSON, default=list)
    restored: Mapped[bool | None] = mapped_column(Boolean)
    error: Mapped[str | None] = mapped_column(Text)
    heartbeat_at: Mapped[datetime | None]
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
