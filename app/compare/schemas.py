"""Request and response bodies of comparisons (``knobtune compare``, its REST routes)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from app.sessions.schemas import ObjectiveName
from app.workloads.schemas import WorkloadIn

NAMED = ("default", "current", "pgtune")
SESSION_REF = re.compile(r"session:([0-9]{1,18})")
# A config's name: what the table shows. No spaces or quotes; "file:" names carry the
# file's name (the CLI reads the file on the client and sends its settings inline).
CONFIG_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:+@/-]{0,99}$"
CONFIG_NAME_RULE = "a letter or digit, then letters, digits and _ . : + @ / - (at most 100)"
MAX_CONFIGS = 8
MAX_ROUNDS = 20
MAX_SETTINGS = 60
MAX_WALL_S = 24 * 3600  # a comparison that would run longer is refused: fewer rounds or runs

KnobName = Annotated[str, StringConstraints(min_length=1, max_length=100)]
KnobValue = Annotated[str, StringConstraints(min_length=1, max_length=200)]


def session_ref(name: str) -> int | None:
    """N of a "session:N" config name, else None."""
    m = SESSION_REF.fullmatch(name)
    return int(m.group(1)) if m else None


class ConfigIn(BaseModel):
    """One config to compare: a named one, or settings given inline."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        min_length=1,
        max_length=100,
        pattern=CONFIG_NAME,
        description="default (PostgreSQL's defaults of the knobs knobtune tunes), "
        "current (the server's settings as they are), pgtune (PGTune's config for the "
        "memory and CPUs the server really has), session:N (session N's recommendation), "
        "or a name of your own with `settings`. " + CONFIG_NAME_RULE + ".",
    )
    settings: dict[KnobName, KnobValue] | None = Field(
        default=None,
        max_length=MAX_SETTINGS,
        description='Your config, inline: {"shared_buffers": "512MB", ...}, applied over the '
        "server's own settings. Catalogue knobs only (the knobs route lists them). The API never "
        "reads a file: the CLI's file:PATH reads it on your machine and sends this.",
    )

    @model_validator(mode="after")
    def _named_or_inline(self) -> ConfigIn:
        named = self.name in NAMED or session_ref(self.name) is not None
        if named and self.settings is not None:
            raise ValueError(
                f"{self.name!r} is a named config: drop its settings, or give your settings "
                "another name"
            )
        if self.name.startswith("session:") and not named:
            raise ValueError(f"{self.name!r}: a session is named session:N, N its id")
        if not named and self.settings is None:
            if self.name.startswith("file:"):
                raise ValueError(
                    f"{self.name!r}: the API takes a file's settings inline (settings: "
                    "{knob: value}) and never reads a path on the service's host; the CLI's "
                    "file:PATH reads the file for you"
                )
            raise ValueError(
                f"{self.name!r} is not a named config (default, current, pgtune, session:N): "
                "give its settings inline"
            )
        if self.settings is not None and not self.settings:
            raise ValueError(
                f"{self.name!r} has no settings: to compare the server's own, name it 'current'"
            )
        return self


class ComparisonIn(BaseModel):
    """Interleaved rounds of named configs on a target (``knobtune compare``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    target_id: int
    configs: list[ConfigIn] = Field(
        min_length=2,
        max_length=MAX_CONFIGS,
        description="The configs, 2 to 8; the first is the reference unless `reference` "
        "names another.",
    )
    reference: str | None = Field(
        default=None,
        max_length=100,
        description="The config every other one is compared with (default: the first).",
    )
    rounds: int = Field(
        default=4,
        ge=2,
        le=MAX_ROUNDS,
        description="Rounds; each runs every config once, in an order shuffled per round.",
    )
    workload: WorkloadIn = Field(default_factory=WorkloadIn)
    warmup_run_s: int | None = Field(
        default=None,
        ge=1,
        le=3600,
        description="A discarded run of the workload after every apply, before the measured "
        "run (default: a quarter of duration_s, 2 to 30 s).",
    )
    objective: ObjectiveName = Field(
        default="throughput",
        description="What a run's level is, as for a session (latency_mean for a replay).",
    )
    workload_kind: Literal["write-heavy", "read-heavy", "mixed", "analytics"] | None = Field(
        default=None, description="pgtune's database type (default: from the workload)."
    )
    allow_unsafe: bool = Field(
        default=False,
        description="Allow durability-unsafe knobs (fsync, synchronous_commit, "
        "full_page_writes) in a config.",
    )
    seed: int | None = Field(
        default=None, ge=0, le=2**31 - 1, description="Seed of the rounds' orders."
    )

    @model_validator(mode="after")
    def _consistent(self) -> ComparisonIn:
        names = [c.name for c in self.configs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"config names must differ: {', '.join(twice)} given twice")
        if self.reference is not None and self.reference not in names:
            raise ValueError(
                f"reference {self.reference!r} is none of the configs ({', '.join(names)})"
            )
        if self.workload.clients == "auto":
            raise ValueError('clients "auto" is for sessions: give a number of clients')
        if self.workload.replay is not None and "objective" not in self.model_fields_set:
            self.objective = "latency_mean"  # a replay runs on the capture's schedule
        wall = self.rounds * len(self.configs) * (self.workload.duration_s + self.warmup_s)
        if wall > MAX_WALL_S:
            raise ValueError(
                f"{self.rounds} rounds of {len(self.configs)} configs, each a "
                f"{self.workload.duration_s} s run after a {self.warmup_s} s warm-up, take "
                f"{wall / 3600:.1f} h; at most {MAX_WALL_S // 3600} h: fewer rounds or "
                "shorter runs"
            )
        return self

    @property
    def warmup_s(self) -> int:
        """The discarded run's length (warmup_run_s, or its default)."""
        if self.warmup_run_s is not None:
            return self.warmup_run_s
        return min(30, max(2, self.workload.duration_s // 4))

    @property
    def reference_name(self) -> str:
        return self.reference or self.configs[0].name


class ComparisonOut(BaseModel):
    id: int
    target_id: int
    target_name: str | None = None
    status: str
    phase: str
    request: dict[str, Any]
    seed: int
    reference: str
    objective: str
    unit: str  # tps, or ms for a time objective
    # the configs as run: name, settings applied over the server's own, and a note
    configs: list[dict[str, Any]]
    orders: list[list[str]]  # per round, the configs in the order they ran
    runs_done: int
    runs_planned: int
    elapsed_s: float | None
    runs: list[dict[str, Any]]  # every run: round, config, settings read, level, error
    # per config: median level (tps or ms), its 95% interval, every run's figure
    levels: list[dict[str, Any]]
    # per config but the reference: gain vs the reference, 95% interval, p-value, text
    gains: list[dict[str, Any]]
    notes: list[str]
    restored: bool | None  # the target's settings were put back (None: not yet)
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
