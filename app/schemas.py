"""Request and response bodies of the REST API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Builtin = Literal["tpcb-like", "simple-update", "select-only"]
# built-in workloads with their own data and scripts (app/workloads/): analytic, OLTP, hybrid
BUILTIN_WORKLOADS = ("tpch", "tpcc", "chbench")
AnyBuiltin = Literal["tpcb-like", "simple-update", "select-only", "tpch", "tpcc", "chbench"]
Isolation = Literal["read committed", "repeatable read", "serializable"]
ObjectiveName = Literal["throughput", "latency_p95", "query_time_geomean", "query_time_total"]


class TargetIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\- ]+$")
    dsn: str | None = Field(
        default=None,
        min_length=1,
        max_length=2000,
        description="libpq connection string or URI. Omit with sandbox=true.",
    )
    restart_command: str | None = Field(
        default=None,
        max_length=2000,
        description="Shell command run on the service's host that restarts the target and "
        "returns when done. Without it, knobs that need a restart are skipped.",
    )
    data_dir: str | None = Field(
        default=None,
        max_length=2000,
        description="The target's data directory, when it is on this host "
        "(lets knobtune validate a config with 'postgres -C' before a restart).",
    )
    ram_bytes: int | None = Field(default=None, ge=64 * 1024 * 1024, le=1 << 50)
    cpus: int | None = Field(default=None, ge=1, le=4096)
    sandbox: bool = Field(
        default=False, description="Create a managed local PostgreSQL cluster for this target."
    )

    @model_validator(mode="after")
    def _dsn_or_sandbox(self) -> TargetIn:
        if self.sandbox and self.dsn:
            raise ValueError("give either dsn or sandbox=true, not both")
        if not self.sandbox and not self.dsn:
            raise ValueError("dsn is required (or set sandbox=true for a managed local cluster)")
        return self


class TargetOut(BaseModel):
    id: int
    name: str
    dsn: str  # password masked
    restart_command: str | None
    data_dir: str | None
    ram_bytes: int | None
    cpus: int | None
    sandbox: bool
    server_version: str | None
    busy_session_id: int | None
    created_at: datetime
    retired_at: datetime | None = None  # set: kept only for its sessions' history


class ScriptIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    sql: str = Field(max_length=100_000)
    weight: int = Field(default=1, ge=1, le=1000)

    @field_validator("sql")
    @classmethod
    def _not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("script is empty: give at least one SQL statement")
        return v


class WorkloadIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    builtin: AnyBuiltin | None = Field(
        default="tpcb-like",
        description="pgbench's builtin script (tpcb-like, simple-update, select-only), or a "
        "built-in workload with its own data: tpch (TPC-H, scale = scale factor), tpcc "
        "(TPC-C, scale = warehouses), chbench (CH-benCHmark: TPC-C clients plus analytic "
        "query clients on the same data, scale = warehouses).",
    )
    builtin_weight: int = Field(default=1, ge=1, le=1000)
    scripts: list[ScriptIn] | None = Field(default=None, max_length=20)
    scale: float = Field(
        default=10,
        gt=0,
        le=100_000,
        description="pgbench's scale (a whole number), TPC-H's scale factor (0.01-10), or "
        "the warehouses of tpcc/chbench (a whole number).",
    )
    init: bool = True
    clients: Annotated[int, Field(ge=1, le=1000)] | Literal["auto"] = Field(
        default=8,
        description='"auto": a client sweep first, then tune at its knee (the smallest count '
        "within a few % of the best throughput).",
    )
    jobs: int = Field(default=2, ge=1, le=1000)
    duration_s: int = Field(default=60, ge=1, le=86_400)
    warmup_s: int = Field(default=5, ge=0, le=3600)
    # pgbench's own default: untyped parameters (`date '1998-12-01' - :d`) work as they
    # do under plain pgbench; "prepared" is faster but an explicit choice.
    protocol: Literal["simple", "extended", "prepared"] = "simple"
    rate: float | None = Field(default=None, gt=0, description="Target tps (pgbench -R).")
    isolation: Isolation | None = Field(
        default=None,
        description="default_transaction_isolation of the benchmark's sessions "
        "(default: the server's).",
    )
    max_tries: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="pgbench --max-tries: tries of a transaction that hit a serialization "
        "failure or deadlock; failures that ran out of tries count against the config. "
        "Default: 1 (pgbench's) for pgbench workloads, 10 for tpcc and chbench.",
    )
    mode: Literal["power", "throughput"] = Field(
        default="power",
        description="tpch: power (one client runs the queries in turn) or throughput "
        "(`clients` clients run them concurrently, each starting at a different query).",
    )
    queries: list[str] | None = Field(
        default=None,
        max_length=22,
        description='tpch/chbench: the queries to run, e.g. ["Q1", "Q6"] (default: the '
        "workload's set).",
    )
    olap_clients: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="chbench: clients of the analytic stream (`clients` is the OLTP stream's).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadIn:
        if self.builtin == "tpch" and "clients" not in self.model_fields_set:
            # TPC-H's power test is one client; its throughput test at least two streams
            self.clients = 1 if self.mode == "power" else 2
        if "jobs" not in self.model_fields_set and isinstance(self.clients, int):
            self.jobs = min(self.jobs, self.clients)
        if isinstance(self.clients, int) and self.jobs > self.clients:
            raise ValueError(f"jobs ({self.jobs}) must not exceed clients ({self.clients})")
        if self.warmup_s >= self.duration_s:
            raise ValueError(
                f"warmup_s ({self.warmup_s}) must be less than duration_s ({self.duration_s}): "
                "warm-up seconds are dropped from the samples"
            )
        if self.builtin is None and not self.scripts:
            raise ValueError("give a builtin script or at least one SQL script")
        if self.builtin in BUILTIN_WORKLOADS:
            if self.scripts:
                raise ValueError(
                    f"builtin {self.builtin!r} brings its own scripts: drop `scripts`, or "
                    "give a pgbench builtin (tpcb-like, simple-update, select-only) to mix "
                    "them with"
                )
            if self.clients == "auto":
                raise ValueError(
                    f'clients "auto" (a client sweep) runs pgbench builtins only; give '
                    f"builtin {self.builtin!r} a number of clients"
                )
            if self.builtin != "tpch" and self.scale != int(self.scale):
                raise ValueError(
                    f"scale is the number of warehouses: a whole number, not {self.scale:g}"
                )
        elif self.scale != int(self.scale):
            raise ValueError(
                f"pgbench's scale must be a whole number, not {self.scale:g} (fractional "
                'scales are TPC-H scale factors: builtin "tpch")'
            )
        return self


class KnobIn(BaseModel):
    """A knob to tune, optionally with narrower bounds (PostgreSQL syntax, e.g. '64MB')."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=100)
    min: str | None = Field(default=None, max_length=100)
    max: str | None = Field(default=None, max_length=100)


class SessionIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    target_id: int
    knobs: list[str | KnobIn] | None = Field(
        default=None, max_length=60, description="Default: the catalogue's set for the workload."
    )
    workload: WorkloadIn = Field(default_factory=WorkloadIn)
    workload_kind: Literal["write-heavy", "read-heavy", "mixed", "analytics"] | None = None
    objective: ObjectiveName = Field(
        default="throughput",
        description="What a run's level is, from its transactions: throughput, latency_p95, "
        "query_time_geomean (geometric mean of the mean time per query / transaction type) "
        "or query_time_total (their sum). Times: lower is better.",
    )
    objective_stream: str | None = Field(
        default=None,
        max_length=100,
        description="With several streams: judge this stream only (default: all, by "
        "stream_weights).",
    )
    stream_weights: dict[str, float] | None = Field(
        default=None,
        max_length=20,
        description="With several streams: weights of the weighted geometric mean of their "
        "levels (default 1 each).",
    )
    p95_limits: dict[str, float] | None = Field(
        default=None,
        max_length=20,
        description="Per stream: the largest fraction its p95 latency may worsen by "
        "(e.g. {'oltp': 0.1}); a candidate beyond it is not kept.",
    )
    min_gain: float = Field(default=0.02, ge=0.0, le=1.0)
    max_p99_worsening: float | None = Field(default=None, ge=0.0, le=10.0)
    max_trials: int = Field(default=30, ge=1, le=1000)
    time_budget_s: float | None = Field(
        default=None,
        gt=0,
        le=7 * 86_400,
        description="Wall-clock limit. The walk stops in time for the final check, which is "
        "never cut: a keep in the last minutes can overrun it by up to the check's 6 runs.",
    )
    max_passes: int = Field(default=2, ge=1, le=6)
    on_finish: Literal["restore", "apply_best"] = "restore"
    allow_unsafe: bool = False
    start: Literal["current", "heuristic"] = "current"
    hints: bool = Field(
        default=True,
        description="Starting from the current values, try PGTune-style values for this "
        "machine first (all together, then per knob), each judged like any candidate.",
    )
    final_check_runs: int = Field(
        default=6,
        ge=0,
        le=20,
        description="Runs of the final check (best config and start side by side, A B B A "
        "A B); max_trials and the time budget must hold them, and the walk leaves room for "
        "them once it has kept something. Even. "
        "0 skips it: any gain the session claims is then marked unconfirmed.",
    )
    evidence: Literal["auto", "transactions", "seconds"] = Field(
        default="auto",
        description="What a run is judged on. auto: its transactions (per-query / per-type "
        "latencies, optimizer/evidence.py) when the workload has several streams or runs "
        "fewer than 20 transactions a second in its first run, else its per-second "
        "throughput samples. Query-time objectives and objectives over streams always use "
        "transactions.",
    )
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _even_check(self) -> SessionIn:
        if self.final_check_runs % 2:
            raise ValueError(
                f"final_check_runs must be even (runs alternate A B B A ...), "
                f"not {self.final_check_runs}"
            )
        if self.objective_stream is not None and self.stream_weights:
            raise ValueError(
                "give objective_stream (judge one stream) or stream_weights (combine them), "
                "not both"
            )
        for name, w in (self.stream_weights or {}).items():
            if not w > 0:
                raise ValueError(f"stream_weights[{name!r}] must be > 0, not {w}")
        for name, x in (self.p95_limits or {}).items():
            if not x >= 0:
                raise ValueError(f"p95_limits[{name!r}] must be >= 0 (a fraction), not {x}")
        return self

    def stream_names_used(self) -> list[str]:
        """Stream names the request refers to (checked against the workload's streams)."""
        named = [self.objective_stream] if self.objective_stream else []
        return [*named, *(self.stream_weights or {}), *(self.p95_limits or {})]


class Progress(BaseModel):
    trials_done: int
    trials_planned: int | None
    elapsed_s: float | None
    eta_s: float | None


class SessionOut(BaseModel):
    id: int
    target_id: int
    status: str
    phase: str
    progress: Progress
    baseline_tps: float | None
    best_tps: float | None
    gain: float | None
    # how sure `gain` is: confirmed (the final check measured it), unconfirmed (the check
    # did not complete: runs minutes apart, may be load drift), no-change, none
    gain_status: str | None
    gain_p_value: float | None
    gain_ci: list[float] | None  # 95% interval of gain
    # what `gain` measures, in words: "throughput +12.0%", "query time -23.0%"
    gain_text: str | None = None
    best_config: dict[str, str] | None
    live_tps: list[float]
    error: str | None
    attempts: int  # times a process started driving it (>1: resumed after a crash)
    notes: list[Any]
    request: dict[str, Any]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    # best config vs the start from the final check's runs, per stream and label:
    # mean latency before -> after, ratio and 95% interval (None before there is a pair)
    per_label: list[dict[str, Any]] | None = None
    # per stream, baseline and best: tps, mean / p95 / p99 latency, failed
    per_stream: list[dict[str, Any]] | None = None
    per_label_status: str | None = None  # "confirmed by the final check" / "not confirmed"


class TrialOut(BaseModel):
    index: int
    role: str
    knob: str | None
    value: str | None
    config: dict[str, str]
    samples: dict[str, Any]
    verdict: str | None
    gain: float | None
    p_value: float | None
    ci: list[float] | None  # 95% interval of gain, when a verdict was reached
    drift: bool  # this run moved against the same config's previous run beyond the noise
    # per stream, from its transactions: tps, mean / p95 / p99 latency, transactions, failed
    streams: list[dict[str, Any]] = Field(default_factory=list)
    host: dict[str, Any]  # the service host's load while it ran (local targets)
    reason: str | None
    metrics: dict[str, Any]
    timings: dict[str, Any]
    error: str | None
    started_at: datetime
    finished_at: datetime


class ScheduleIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    cron: str | None = Field(
        default=None, max_length=100, description="Crontab line, e.g. '0 2 * * sun' (UTC)."
    )
    interval_s: int | None = Field(default=None, ge=60, le=366 * 86_400)
    session: SessionIn

    @model_validator(mode="after")
    def _one_trigger(self) -> ScheduleIn:
        if (self.cron is None) == (self.interval_s is None):
            raise ValueError("give exactly one of cron or interval_s")
        return self


class ScheduleOut(BaseModel):
    id: int
    target_id: int
    cron: str | None
    interval_s: int | None
    enabled: bool
    last_fired_at: datetime | None
    last_result: str | None
    next_fire_at: datetime | None
    request: dict[str, Any]


class SweepIn(BaseModel):
    """A client sweep: the workload at increasing client counts (issue 16)."""

    model_config = ConfigDict(extra="forbid")

    builtin: Builtin | None = "tpcb-like"
    builtin_weight: int = Field(default=1, ge=1, le=1000)
    scripts: list[ScriptIn] | None = Field(default=None, max_length=20)
    scale: int = Field(default=10, ge=1, le=100_000)
    init: bool = True
    protocol: Literal["simple", "extended", "prepared"] = "simple"  # as pgbench
    jobs: int = Field(default=2, ge=1, le=1000, description="pgbench threads, at most clients.")
    clients: list[int] | None = Field(
        default=None,
        min_length=1,
        max_length=24,
        description="Client counts to measure. Default: 1, 2, 4, ... up to a cap from the "
        "server's max_connections and CPUs (8 per CPU).",
    )
    duration_s: int = Field(default=10, ge=2, le=3600, description="Per run, warm-up included.")
    warmup_s: int = Field(default=2, ge=0, le=600)
    repeats: int = Field(default=2, ge=2, le=6, description="Runs per count, up-down order.")
    connect_cost: bool = Field(
        default=True, description="Measure a new connection per transaction (-C) at the knee."
    )
    tolerance: float = Field(
        default=0.05, gt=0.0, lt=0.5, description="'Within this fraction of the best'."
    )

    @field_validator("clients")
    @classmethod
    def _counts(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        bad = [c for c in v if not 1 <= c <= 10_000]
        if bad:
            raise ValueError(f"client counts must be between 1 and 10000, got {bad}")
        return sorted(set(v))

    @model_validator(mode="after")
    def _consistent(self) -> SweepIn:
        if self.warmup_s >= self.duration_s:
            raise ValueError(
                f"warmup_s ({self.warmup_s}) must be less than duration_s ({self.duration_s})"
            )
        if self.builtin is None and not self.scripts:
            raise ValueError("give a builtin script or at least one SQL script")
        return self


class SweepOut(BaseModel):
    id: int
    target_id: int
    status: str
    phase: str
    request: dict[str, Any]
    runs_done: int
    runs_planned: int | None
    elapsed_s: float | None
    runs: list[Any]  # every run in the order measured (tps, latencies, CPU, error)
    points: list[Any]  # per client count: level and interval, p99, CPU, within the best
    knee_clients: int | None
    knee_tps: float | None
    best_clients: int | None
    best_tps: float | None
    latency_climb_clients: int | None
    pool_size: int | None
    connection_cost: dict[str, Any] | None
    advice: list[str]
    warnings: list[str]
    cpu_visible: bool | None
    cpu_note: str | None
    max_connections: int | None
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
