"""Request and response bodies of targets: a target, its sandbox's hardware profile, its
restart method (the targets routes and the dashboard's forms)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from app.errors import errors_text
from app.postgres.cgroups import PROFILES, Limits, resolve


class SandboxIn(BaseModel):
    """A sandbox with a hardware profile: a named one, explicit limits, or a profile with
    some limits replaced (app/postgres/cgroups.py; docs/profiles.md)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    profile: str | None = Field(
        default=None,
        max_length=64,
        description="A named profile: "
        + ", ".join(f"{n} ({p.models})" for n, p in PROFILES.items()),
    )
    memory: StrictStr | StrictInt | None = Field(
        default=None,
        description="Memory, page cache included: bytes, or '512MB', '1GB' (1024-based); "
        "at least 128MB, at most what the host has.",
    )
    disk_iops: StrictInt | None = Field(
        default=None, description="I/O operations per second, reads and writes each."
    )
    disk_mbps: StrictInt | None = Field(
        default=None, description="MB/s (10^6 bytes), reads and writes each."
    )
    cpus: StrictInt | None = Field(default=None, description="CPUs (a CFS quota).")
    version: StrictInt | None = Field(
        default=None,
        ge=10,
        le=99,
        description="PostgreSQL major version of the sandbox's server (one installed on the "
        "service's host, e.g. 18); default: KNOBTUNE_PG_BINDIR's, else the system's PostgreSQL.",
    )

    @model_validator(mode="after")
    def _valid(self) -> SandboxIn:
        self.limits()  # raises ProfileError (a ValueError): 422 with its message
        return self

    def limits(self) -> Limits | None:
        """The hardware profile's limits; None for a version alone (no limits)."""
        given = (self.profile, self.memory, self.disk_iops, self.disk_mbps, self.cpus)
        if self.version is not None and given == (None,) * len(given):
            return None
        return resolve(
            profile=self.profile,
            memory=self.memory,
            disk_iops=self.disk_iops,
            disk_mbps=self.disk_mbps,
            cpus=self.cpus,
        )


class SandboxLimitsOut(BaseModel):
    """The limits a sandbox runs under (its cgroup)."""

    profile: str | None
    memory_bytes: int | None
    disk_iops: int | None
    disk_mbps: int | None
    cpus: int | None


class ProfileOut(BaseModel):
    name: str
    models: str
    memory_bytes: int
    disk_iops: int
    disk_mbps: int
    cpus: int


class TargetIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\- ]+$")
    dsn: str | None = Field(
        default=None,
        min_length=1,
        max_length=2000,
        description="libpq connection string or URI. Omit with sandbox=true.",
    )
    restart_method: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$",
        description="Name of a restart method the service's operator configured "
        "(KNOBTUNE_RESTART_METHODS; the restart-methods route lists them). Without it, "
        "knobs that need a restart are skipped. Not for sandboxes (they have their own).",
    )
    restart_command: str | None = Field(
        default=None,
        max_length=2000,
        deprecated=True,
        description="No longer accepted: the API never runs a command. Give restart_method.",
    )
    data_dir: str | None = Field(
        default=None,
        max_length=2000,
        description="The target's data directory, when it is on this host (lets knobtune "
        "validate a config with 'postgres -C' before a restart). Accepted only when its "
        "global/pg_control shows the server's system identifier.",
    )
    ram_bytes: int | None = Field(default=None, ge=64 * 1024 * 1024, le=1 << 50)
    cpus: int | None = Field(default=None, ge=1, le=4096)
    workload_dsn: str | None = Field(
        default=None,
        min_length=1,
        max_length=2000,
        description="The DSN the workload runs as (a client's scripts, the preflight, "
        "replays, data loading): a role of the same server that is no superuser and no "
        "member of pg_execute_server_program, pg_read_server_files or "
        "pg_write_server_files. Needed when dsn's user is such a role (it usually is: "
        "ALTER SYSTEM). Not for sandboxes (they have knobtune_bench).",
    )
    sandbox: bool | SandboxIn = Field(
        default=False,
        description="Create a managed local PostgreSQL cluster for this target: true (no "
        'limits), or a hardware profile: {"profile": "small"} or {"memory": "1GB", '
        '"disk_iops": 1000, "disk_mbps": 100, "cpus": 1}; {"version": 18} picks another '
        "installed PostgreSQL version.",
    )
    recommend_only: bool = Field(
        default=False,
        description="A server knobtune never changes (a managed database: RDS, Aurora, Cloud "
        "SQL, Azure refuse ALTER SYSTEM): registered without ALTER SYSTEM rights, its "
        "settings read; sessions, applies, comparisons, sweeps and live captures on it are "
        "refused. Tune a twin sandbox instead. Needs ram_bytes and cpus (the instance's).",
    )

    @field_validator("sandbox", mode="before")
    @classmethod
    def _sandbox(cls, v: Any) -> Any:
        # An object is a profile: its own errors alone (not "should be a valid boolean").
        if isinstance(v, dict):
            try:
                return SandboxIn.model_validate(v)
            except ValidationError as exc:
                raise ValueError(errors_text(exc)) from None
        return v

    @model_validator(mode="after")
    def _dsn_or_sandbox(self) -> TargetIn:
        if self.sandbox and self.dsn:
            raise ValueError("give either dsn or sandbox=true, not both")
        if self.sandbox and self.workload_dsn:
            raise ValueError(
                "a sandbox's workload runs as its own knobtune_bench: omit workload_dsn"
            )
        if not self.sandbox and not self.dsn:
            raise ValueError("dsn is required (or set sandbox=true for a managed local cluster)")
        return self


class TargetOut(BaseModel):
    id: int
    name: str
    dsn: str  # password masked
    restart_method: str | None = None
    # stored before restart methods existed; kept as text, never run (see restart_note)
    restart_command: str | None = None
    # why knobs that need a restart cannot be tuned here, and what to configure
    restart_note: str | None = None
    data_dir: str | None
    ram_bytes: int | None
    cpus: int | None
    sandbox: bool
    sandbox_limits: SandboxLimitsOut | None = None  # a sandbox's hardware profile
    server_version: str | None
    # ram_bytes/cpus were cut to the server's cgroup limits (where they were read)
    hardware_note: str | None = None
    busy_session_id: int | None
    created_at: datetime
    retired_at: datetime | None = None  # set: kept only for its sessions' history
    # where the workload runs when it is not dsn (password masked): a least-privileged role
    workload_dsn: str | None = None
    recommend_only: bool = False  # never changed: tuned through a twin


class TargetPatch(BaseModel):
    """What may change on a registered target: the restart method it uses."""

    model_config = ConfigDict(extra="forbid")

    restart_method: str | None = Field(
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$",
        description="A configured restart method's name, or null for none.",
    )


class RestartMethodOut(BaseModel):
    """A restart method a target may use (what it runs stays in the service's config)."""

    name: str
    kind: str
