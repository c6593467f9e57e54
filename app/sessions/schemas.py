"""Request and response bodies of sessions: a session's request (SessionIn, KnobIn; its
workload is app/workloads/schemas.py's WorkloadIn), a session and its trials as the API
shows them, recurring sessions (ScheduleIn/Out), and applying or rolling back a
recommendation (ApplyIn, RollbackIn, ApplyOut)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from app.workloads.schemas import WorkloadIn
from optimizer.objective import ObjectiveKind

ObjectiveName = ObjectiveKind  # the kinds are optimizer/objective.py's


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
        "query_time_geomean (geometric mean of the mean time per query / transaction type), "
        "query_time_total (their sum) or latency_mean (the mean latency of the mix, each "
        "query weighted by its share of calls). Times: lower is better. Default: throughput; "
        "latency_mean for a replayed capture (its pace is the capture's).",
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
    search_order: Literal["counters", "catalogue"] = Field(
        default="counters",
        description="counters: knobs whose mechanism the baseline's I/O counters show busy "
        "are tried first, idle ones last, each with a note. catalogue: the knobs' listed "
        "order (the workload kind's default order when knobs is not given).",
    )
    checkpoint_rule: bool = Field(
        default=True,
        description="Judge the knobs that act through checkpoints (max_wal_size, "
        "checkpoint_*, bgwriter_*, ...) only on runs long enough to span a checkpoint "
        "cycle, else set them aside with the run length they need. false judges them on "
        "any run, where a short one shows them as no effect: for comparisons only.",
    )
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _even_check(self) -> SessionIn:
        if self.workload.replay is not None and "objective" not in self.model_fields_set:
            # a replay runs on the capture's schedule: its throughput is the capture's
            self.objective = "latency_mean"
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
    # a finished session's outcome: confirmed, no-change, unconfirmed, failed, cancelled
    # (None while queued or running); the CLI's exit status says the same
    outcome: str | None = None
    gain_p_value: float | None
    gain_ci: list[float] | None  # 95% interval of gain
    # what `gain` measures, in words: "throughput +12.0%", "query time -23.0%"
    gain_text: str | None = None
    # the result in the objective's own units, one sign: "query time -23.0% (95% CI ...)"
    headline: str | None = None
    # one plain paragraph: what was found, how sure it is, what to do next
    summary: str | None = None
    target_name: str | None = None
    best_config: dict[str, str] | None
    start_config: dict[str, str] | None = None  # the knobs' values the session started from
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
    # the run's level in the objective's unit for time objectives (ms: query time, p95);
    # None for throughput (read samples.median_tps) or without evidence
    level: float | None = None
    host: dict[str, Any]  # the service host's load while it ran (local targets)
    reason: str | None
    # the server's counters over the run's measured window (differences): WAL bytes and
    # full-page images, checkpoints, buffers written, blocks read and hit, temp files
    metrics: dict[str, Any]
    # the same in one line, as the studies read iostat ("WAL 3.0 MB/s, FPI 40% | ckpt 0
    # timed 1 req | ..."); None when the run measured none of them
    io: str | None = None
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


class ApplyIn(BaseModel):
    """Apply a finished session's recommendation to its target (issue 27)."""

    model_config = ConfigDict(extra="forbid")

    dry_run: bool = Field(
        default=False, description="Only show the diff against the server's current settings."
    )
    restart: bool = Field(
        default=True,
        description="Restart the server where a knob needs it and the target has a restart "
        "method; false (or no method): such knobs are written and flagged as pending a "
        "restart.",
    )
    force: bool = Field(
        default=False,
        description="Apply a gain that is not confirmed by the final check (unconfirmed or "
        "not credible).",
    )


class RollbackIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dry_run: bool = Field(default=False, description="Only show what would be put back.")
    confirm: bool = Field(
        default=False,
        description="Roll back although the server's settings changed since the apply (the "
        "refusal lists what changed).",
    )


# none, the server will restart (dry run), it restarted, or a knob waits for a restart
RestartOutcome = Literal["none", "will-restart", "restarted", "pending"]


class KnobChange(BaseModel):
    knob: str
    current: str | None  # the server's value now (current_setting), None: unknown setting
    new: str  # the value it gets: the recommendation (apply) or the value before (rollback)
    session_start: str | None  # the value the session started from
    needs_restart: bool  # pg_settings.context is postmaster
    changes: bool  # recommended differs from current


class KnobCheck(BaseModel):
    knob: str
    expected: str
    effective: str | None  # current_setting() on a fresh connection after the change
    ok: bool  # took effect (same value, units normalized)
    pending_restart: bool


class ApplyOut(BaseModel):
    id: int | None  # None for a dry run (nothing recorded)
    session_id: int
    target_id: int
    target_name: str
    status: str  # dry-run, nothing-to-do, applied, failed, rolled-back
    message: str  # one plain sentence: what happened and what to do next
    changes: list[KnobChange]
    restart: RestartOutcome
    pending_restart: list[str]
    verified: list[KnobCheck]
    warnings: list[str]
    # rollback: the server's settings that changed since the apply (name -> [after, now])
    changed_since: dict[str, list[str | None]] = Field(default_factory=dict)
    error: str | None = None
    created_at: datetime | None = None
    rolled_back_at: datetime | None = None
