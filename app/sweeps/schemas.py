"""Request and response bodies of client sweeps: what to measure (SweepIn) and a sweep
with its runs, points and knee (SweepOut)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from app.workloads.schemas import Builtin, PgbenchRunIn


class SweepIn(PgbenchRunIn):
    """A client sweep: the workload at increasing client counts (issue 16)."""

    # a workload's fields and rules (PgbenchRunIn), with short runs and whole scales; its
    # clients are the counts to measure

    builtin: Builtin | None = "tpcb-like"
    scale: int = Field(default=10, ge=1, le=100_000)
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
        self._check_run()
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
