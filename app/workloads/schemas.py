"""A workload as a request gives it (WorkloadIn, ScriptIn), each workload's own defaults and
the rules between its fields; sessions, comparisons and sweeps embed these bodies. A client
sweep's body shares a workload's pgbench fields and rules (PgbenchRunIn)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.postgres.pgbench import pgbench_jobs
from app.postgres.scripts import check_script
from app.replay.plan import REPLAY_DATABASE
from app.workloads.kinds import KNOBTUNE_BUILTINS

# The builtin kinds are named in app/workloads/kinds.py. A Literal must spell its values out
# for the type checker, so these repeat them: tests/app/workloads/test_kinds.py holds them
# equal to the registry's tuples (same values, same order: the OpenAPI enums list them so).
Builtin = Literal["tpcb-like", "simple-update", "select-only"]  # kinds.PGBENCH_BUILTINS
# kinds.ALL_BUILTINS: pgbench's, then knobtune's own (kinds.KNOBTUNE_BUILTINS)
AnyBuiltin = Literal["tpcb-like", "simple-update", "select-only", "tpch", "tpcc", "chbench"]
Isolation = Literal["read committed", "repeatable read", "serializable"]

# -- each workload's own defaults: what a request, the CLI or the dashboard leaves unsaid.
# Read by WorkloadIn for every field the request did not set. Front ends send only what the
# user gave, so a workload's defaults are never overridden by a front end's own (TPC-H's
# power test runs one client; a CLI default of 8 clients once made `--builtin tpch` fail).
#
# pgbench's builtins and the user's own scripts
PGBENCH_DEFAULTS: dict[str, Any] = {
    "scale": 10,
    "clients": 8,
    "jobs": 2,
    "duration_s": 60,
    "warmup_s": 5,
    "init": True,  # create pgbench's tables (pgbench -i) for its builtin scripts
}

_WORKLOAD_DEFAULTS: dict[str, dict[str, Any]] = {
    # TPC-H at scale factor 1 (1.7 GB, ~3 min to load here): one pass over the 22 queries
    # took 69 s on this 2-core machine, so a run of 120 s holds every query at least once.
    # Power test: one client runs the queries in turn; throughput test: 2 clients.
    "tpch": {"scale": 1, "clients": 1, "jobs": 1, "duration_s": 120, "warmup_s": 10},
    # TPC-C and CH-benCHmark: warehouses (10: about 1 GB), the OLTP stream's clients
    "tpcc": {"scale": 10, "clients": 8, "jobs": 2, "duration_s": 60, "warmup_s": 5},
    "chbench": {"scale": 10, "clients": 8, "jobs": 2, "duration_s": 60, "warmup_s": 5},
}


def workload_defaults(builtin: str | None, mode: str = "power") -> dict[str, Any]:
    """The defaults of ``builtin`` (None: the user's scripts only, pgbench's defaults)."""
    out = dict(_WORKLOAD_DEFAULTS.get(builtin or "", PGBENCH_DEFAULTS))
    if builtin is None:
        out["init"] = False  # your scripts on your tables: knobtune creates no table
    if builtin == "tpch" and mode == "throughput":
        out.update(clients=2, jobs=2)  # TPC-H's throughput test: at least two streams
    return out


class ScriptIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    sql: str = Field(max_length=100_000)
    weight: int = Field(default=1, ge=1, le=1000)

    @field_validator("sql")
    @classmethod
    def _not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("script is empty: give at least one SQL statement")
        # pgbench's \shell and \setshell would run on the service's host: every script
        # is parsed and its meta-commands allowlisted, here, for every way in
        check_script(v)
        return v


PgbenchProtocol = Literal["simple", "extended", "prepared"]


class PgbenchRunIn(BaseModel):
    """What pgbench runs and how, as a session's workload (WorkloadIn) and a client sweep
    (app/sweeps/schemas.py SweepIn) both give it: the fields they share and their rules,
    stated once. Each body keeps its own defaults and bounds where they differ (a sweep's
    runs are short, a workload's defaults are its own) and calls ``_check_run`` when its
    values are final."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    builtin: AnyBuiltin | None = "tpcb-like"
    builtin_weight: int = Field(default=1, ge=1, le=1000)
    scripts: list[ScriptIn] | None = Field(default=None, max_length=20)
    scale: float = Field(default=10, gt=0, le=100_000)
    init: bool = True
    jobs: int = Field(default=2, ge=1, le=1000, description="pgbench threads, at most clients.")
    duration_s: int = Field(default=60, ge=1, le=86_400)
    warmup_s: int = Field(default=5, ge=0, le=3600)
    # pgbench's own default: untyped parameters (`date '1998-12-01' - :d`) work as they
    # do under plain pgbench; "prepared" is faster but an explicit choice.
    protocol: PgbenchProtocol = "simple"

    def _check_run(self, *, needs_script: bool = True) -> None:
        """The rules of any pgbench run: a warm-up shorter than the run, something to run."""
        if self.warmup_s >= self.duration_s:
            raise ValueError(
                f"warmup_s ({self.warmup_s}) must be less than duration_s ({self.duration_s}): "
                "warm-up seconds are dropped from the samples"
            )
        if needs_script and self.builtin is None and not self.scripts:
            raise ValueError("give a builtin script or at least one SQL script")


class WorkloadIn(PgbenchRunIn):
    builtin: AnyBuiltin | None = Field(
        default="tpcb-like",
        description="pgbench's builtin script (tpcb-like, simple-update, select-only), or a "
        "built-in workload with its own data: tpch (TPC-H, scale = scale factor), tpcc "
        "(TPC-C, scale = warehouses), chbench (CH-benCHmark: TPC-C clients plus analytic "
        "query clients on the same data, scale = warehouses). Default: tpcb-like without "
        "`scripts`; with `scripts`, none (your scripts only: name a builtin to mix it in). "
        "scale, clients, jobs, duration_s and warmup_s default to the workload's own values "
        "(pgbench: 10, 8, 2, 60, 5; tpch: scale factor 1, 1 client in power mode or 2 in "
        "throughput mode, 120 s runs, 10 s warm-up).",
    )
    scale: float = Field(
        default=10,
        gt=0,
        le=100_000,
        description="pgbench's scale (a whole number), TPC-H's scale factor (0.01-10), or "
        "the warehouses of tpcc/chbench (a whole number).",
    )
    init: bool = Field(
        default=True,
        description="Create pgbench's tables (pgbench -i at `scale`) before the session. "
        "Default: true with a pgbench builtin, false for your scripts only (they run on "
        "your tables; give true when they use pgbench's).",
    )
    clients: Annotated[int, Field(ge=1, le=1000)] | Literal["auto"] = Field(
        default=8,
        description='"auto": a client sweep first, then tune at its knee (the smallest count '
        "within a few % of the best throughput).",
    )
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
    replay: int | None = Field(
        default=None,
        ge=1,
        description="Replay a captured workload as the benchmark: the capture's id. Each "
        "run replays the capture's first duration_s * speed seconds, its sessions and "
        "statements on their captured schedule, on a fresh copy of replay_database "
        "(knobtune_replay, made again before every run). No builtin, scripts or rate.",
    )
    speed: float = Field(
        default=1.0,
        ge=0.1,
        le=100.0,
        description="A replay's speed: 2.0 replays the capture twice as fast.",
    )
    replay_database: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=r"^[^\x00]+$",
        description="The database on the target that holds the data the capture started "
        "from (restore the dump taken before the capture into it); copied before every "
        "run, never written. Default: the capture's database.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadIn:
        given = set(self.model_fields_set)
        if self.replay is not None:
            self._replay_only(given)
        elif self.speed != 1.0 or self.replay_database is not None:
            # (a stored request carries every field: only values that do something count)
            raise ValueError("speed and replay_database apply to a replay: give replay too")
        if "builtin" not in given and self.scripts:
            # your scripts, and only them: TPC-B joins them only when asked for by name
            self.builtin = None
        # Every field the request left out takes the workload's own default (TPC-H's
        # power test is one client, its throughput test two; pgbench's is 8).
        for name, value in workload_defaults(self.builtin, self.mode).items():
            if name not in given:
                setattr(self, name, value)
        if isinstance(self.clients, int):
            self.jobs = pgbench_jobs(self.jobs, self.clients, given="jobs" in given)
        if "warmup_s" not in given and "duration_s" in given:
            # a default warm-up never eats a short run the user asked for
            self.warmup_s = min(self.warmup_s, self.duration_s // 4)
        self._check_run(needs_script=self.replay is None)
        if self.builtin in KNOBTUNE_BUILTINS:
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

    def _replay_only(self, given: set[str]) -> None:
        """A replay runs the capture's statements on its schedule: nothing of pgbench's."""
        if self.builtin is not None and "builtin" in given:
            raise ValueError("a replay runs the capture's statements: drop builtin")
        if self.scripts:
            raise ValueError("a replay runs the capture's statements: drop scripts")
        if self.rate is not None:
            raise ValueError("a replay runs on the capture's schedule: drop rate")
        if self.clients == "auto":
            raise ValueError(
                'clients "auto" (a client sweep) does not apply to a replay: its sessions '
                "are the capture's"
            )
        if self.init and "init" in given:
            raise ValueError("a replay creates no pgbench tables: drop init")
        if self.replay_database == REPLAY_DATABASE:
            raise ValueError(
                f"{REPLAY_DATABASE} is the copy knobtune makes before every run: name the "
                "database that holds the capture's starting data"
            )
        self.builtin = None
        self.init = False


def kind_for(given: str | None, wl: WorkloadIn) -> str:
    """The workload kind a request gave, else the one its workload is (a session's knob
    set and hints, a comparison's pgtune)."""
    if given:
        return given
    # TPC-H is analytic; CH-benCHmark runs TPC-C and analytic queries at once; TPC-C is OLTP
    builtin_kinds = {"tpch": "analytics", "chbench": "mixed", "tpcc": "write-heavy"}
    if wl.builtin in builtin_kinds:
        return builtin_kinds[wl.builtin]
    if wl.scripts or wl.replay is not None:  # a replayed capture: the user's own mix
        return "mixed"
    return "read-heavy" if wl.builtin == "select-only" else "write-heavy"
