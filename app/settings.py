"""Service settings, read from the environment (prefix ``KNOBTUNE_``)."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from app.postgres.privilege import DEFAULT_RUN_AS
from app.postgres.restart import METHOD_NAME, SANDBOX_METHOD, RestartMethod


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KNOBTUNE_", env_file=None)

    database_url: str = Field(
        default="sqlite:///knobtune.db",
        description="Metadata DB (SQLAlchemy URL). SQLite file by default; "
        "postgresql+psycopg://user:pass@host/db for deployments.",
    )
    api_token: SecretStr | None = Field(
        default=None,
        description="When set, every /api route requires 'Authorization: Bearer <token>'.",
    )
    max_parallel_sessions: int = Field(
        default=2, ge=1, description="Sessions and sweeps run at once by this process."
    )
    lease_seconds: float = Field(
        default=30.0,
        gt=0,
        description="A running session's or sweep's lease; another process takes it over "
        "once it expires.",
    )
    poll_seconds: float = Field(
        default=2.0, gt=0, description="How often the claim loop looks for work."
    )
    shutdown_grace_s: float = Field(
        default=60.0,
        ge=0,
        description="On SIGTERM, how long the service waits for its running work to stop and "
        "put each target's settings back (a restart of the target may be part of it) before "
        "it stops its sandboxes; the work resumes at the next start.",
    )
    work_dir: Path = Field(
        default=Path(".knobtune"), description="pgbench scripts and logs, managed sandboxes."
    )
    sandbox_dir: Path | None = Field(
        default=None,
        description="Where managed sandbox clusters live. Default: <work_dir>/sandboxes when "
        "the postgres OS user can enter it, else a directory under the system's temp dir "
        "(a service started in /root or a private directory still gets sandboxes).",
    )
    run_scheduler: bool = Field(
        default=True, description="Run sessions in this process (off: API only)."
    )
    instance_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}",
        description="Identifies this process in session leases.",
    )
    bench_per_host: int = Field(
        default=1,
        ge=1,
        le=64,
        description="knobtune benchmarks that may run at once on targets sharing a host "
        "(sandboxes and local servers are one host; a remote target's host is its DSN's). "
        "1: one at a time, so sessions never measure each other; more only on hosts with "
        "the cores for it (a session notes a run that waited for or ran beside another).",
    )
    bench_lock_dir: Path | None = Field(
        default=None,
        description="Where the host-wide benchmark locks live (flock files). Default: "
        "<work_dir>/locks. Service processes on one host that should take turns share it.",
    )
    target_retry_s: float = Field(
        default=60.0, ge=0, description="How long a session waits for a target that went down."
    )
    restart_methods: dict[str, RestartMethod] = Field(
        default_factory=dict,
        description="How targets are restarted, declared by the operator only (JSON: name -> "
        'method), e.g. {"db5": {"kind": "command", "argv": ["ssh", "db5", "sudo", '
        '"pg_ctlcluster", "15", "main", "restart"]}}. Kinds: pg_ctl (data_dir), systemd '
        "(unit), container (container, engine), command (argv, env). An API client picks "
        "one by name (a target's restart_method); it never sends a command.",
    )
    run_as_user: str = Field(
        default=DEFAULT_RUN_AS,
        min_length=1,
        description="OS user that pgbench and the restart methods run as when the service "
        "runs as root (not root, not postgres). A dedicated user is better than nobody.",
    )
    secret_key: SecretStr | None = Field(
        default=None,
        description="Fernet key(s) that encrypt stored DSN passwords (comma-separated: the "
        "first encrypts, all decrypt). Unset: KNOBTUNE_SECRET_KEY_FILE, else, with the "
        "embedded SQLite metadata DB only, generated into <work_dir>/secret.key (0600). "
        "Processes sharing a metadata DB must share the key: each checks it against the "
        "fingerprint the DB recorded at first use and refuses to start on another.",
    )
    secret_key_file: Path | None = Field(
        default=None,
        description="A file holding the key(s), in KNOBTUNE_SECRET_KEY's format, used when "
        "that is unset: created with a new key (0600) when absent. With a PostgreSQL "
        "metadata DB one of the two is required; copy the file to every process's host.",
    )

    @field_validator("restart_methods")
    @classmethod
    def _method_names(cls, v: dict[str, RestartMethod]) -> dict[str, RestartMethod]:
        for name in v:
            if not re.fullmatch(METHOD_NAME, name):
                raise ValueError(f"restart method name {name!r}: use letters, digits, _ . -")
            if name == SANDBOX_METHOD:
                raise ValueError(f"{SANDBOX_METHOD!r} is reserved for managed sandboxes")
        return v

    @field_validator("secret_key")
    @classmethod
    def _empty_key_is_none(cls, v: SecretStr | None) -> SecretStr | None:
        return v if v is not None and v.get_secret_value().strip() else None

    # -- limits on what a client can make the service do (issue 25) ------------------
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default=["localhost", "127.0.0.1", "[::1]", "testserver"],
        description="Host names the service answers to (the request's Host header, port "
        "ignored), comma-separated; others get 400. Guards a service without a token "
        "against DNS rebinding. The default fits a service reached on loopback ('testserver' "
        "is the in-process CLI's and the tests' name); behind a reverse proxy, give the "
        "name clients use (e.g. knobtune.example.com). '*' accepts any (not recommended).",
    )
    max_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="Largest request body accepted, in bytes; larger ones get 413 "
        "(Content-Length, or counted as a chunked body streams in).",
    )
    target_connects: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Requests that may connect to targets at once (registering a target, "
        "a session's preflight). More get 503 with Retry-After, so slow or unreachable "
        "targets cannot take the threads that serve reads.",
    )
    auth_free_failures: int = Field(
        default=5,
        ge=1,
        description="Wrong tokens a client address may present (at /login, in a Bearer "
        "header or a cookie) before it is locked out: then 1 s, 2 s, 4 s ... up to "
        "auth_lockout_max_s per further failure, answered with 429. Counted in memory, per "
        "process; a right token resets it, 15 minutes without a failure forget it.",
    )
    auth_lockout_max_s: float = Field(
        default=300.0, ge=1.0, description="Longest lockout after repeated wrong tokens."
    )
    auth_global_failures: int = Field(
        default=60,
        ge=1,
        description="Wrong tokens per minute from all addresses together. Beyond it, every "
        "token check answers 429 for a minute, whatever the address, the right token "
        "included: guessing from many addresses gains nothing. In memory, per process.",
    )

    # -- the HTTP front (issue 40) ------------------------------------------------------
    allowed_origins: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="Origins (scheme://host[:port]) besides the service's own whose web pages "
        "may send state-changing requests (POST, PUT, PATCH, DELETE), comma-separated. A "
        "request with another Origin, or with Sec-Fetch-Site: cross-site, gets 403 (CSRF). "
        "Clients that are not browsers send neither header. Needed behind a proxy that "
        "rewrites the Host header: give the public origin, e.g. https://knobtune.example.com.",
    )
    trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="Addresses or networks (CIDR) of reverse proxies whose X-Forwarded-For "
        "and X-Forwarded-Proto `knobtune serve` believes, comma-separated. Default: none, "
        "so a client address is the connection's and cannot be made up by a header (wrong "
        "tokens are counted per address).",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="Seconds a client of `knobtune serve` has to send a request's line and "
        "headers, from the connection (or the previous response); slower ones are "
        "disconnected, so half-sent requests cannot hold connections open.",
    )

    # -- workload captures (issue 28) ---------------------------------------------------
    capture_max_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=64 * 1024,
        description="Largest captured log kept, in bytes of log text (64 MiB). A live capture "
        "that reaches it stops collecting and is marked truncated; an import larger than "
        "it (after gunzip) gets 413.",
    )
    max_parallel_captures: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Live captures driven at once by this process. A capture waits on its "
        "target's log and loads no host, so it does not count against "
        "max_parallel_sessions.",
    )

    # -- where a client's DSN may lead (issue 40; app/postgres/connect.py) --------------
    target_hosts: Annotated[list[str], NoDecode] = Field(
        default=["*"],
        description="Destinations an API client's DSN may reach, comma-separated: '*' (any "
        "address that is not loopback, link-local or unspecified), host names (*.example.com "
        "too), IP addresses or CIDRs (127.0.0.1/32), unix-socket directories "
        "(/var/run/postgresql, and the directories below it). Checked for every host of a "
        "DSN, names resolved at registration and before every connection. Without '*' "
        "only the listed ones. Managed sandboxes are always allowed.",
    )
    target_passfile: Path | None = Field(
        default=None,
        description="A pgpass file of the operator's: its passwords are used for targets "
        "whose DSN has none and no hostaddr. Any API client naming a host listed in it logs "
        "in with that entry: list only servers every token holder may tune.",
    )
    local_operator: bool = Field(
        default=False,
        description="Set by the CLI without --server (the operator on their own machine): "
        "targets may be local servers (loopback, unix sockets) and a DSN target's workload "
        "may run as its DSN's user, superuser too. Never for a service others reach.",
    )

    @field_validator("target_hosts", mode="before")
    @classmethod
    def _target_host_list(cls, v: Any) -> Any:
        import ipaddress

        if isinstance(v, str):
            v = [h.strip() for h in v.split(",")]
        if isinstance(v, list):
            v = [str(h).strip() for h in v if str(h).strip()]
            for h in v:
                if h == "*" or h.startswith(("/", "@")):
                    continue
                try:
                    ipaddress.ip_network(h, strict=False)
                    continue
                except ValueError:
                    pass
                if not re.fullmatch(r"(\*\.)?[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?\.?", h):
                    raise ValueError(
                        f"target host {h!r}: give '*', a host name (db.example.com, "
                        "*.example.com), an address or CIDR (10.0.0.0/8), or a unix-socket "
                        "directory (/var/run/postgresql)"
                    )
        return v

    @field_validator("target_passfile")
    @classmethod
    def _absolute_passfile(cls, v: Path | None) -> Path | None:
        return v.expanduser().resolve() if v is not None else None

    @field_validator("allowed_origins", mode="before")
    @classmethod
    def _origin_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [o for o in (x.strip() for x in v.split(",")) if o]
        if isinstance(v, list):
            v = [normalize_origin(str(o)) for o in v]
        return v

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _proxy_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [p for p in (x.strip() for x in v.split(",")) if p]
        if isinstance(v, list):
            out = []
            for p in map(str, v):
                try:  # canonical: uvicorn takes what it cannot parse as a literal name
                    net = ipaddress.ip_network(p, strict=False)
                except ValueError:
                    raise ValueError(
                        f"trusted proxy {p!r}: give an IP address or network, e.g. 10.0.0.5 "
                        "or 10.0.0.0/24"
                    ) from None
                out.append(str(net) if "/" in p else str(net.network_address))
            v = out
        return v

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _host_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [h.strip() for h in v.split(",")]
        if isinstance(v, list):
            v = [h for h in v if h]
            if not v:
                raise ValueError(
                    "allowed_hosts is empty: give at least one host name, e.g. localhost"
                )
            for h in v:
                if "*" in h[1:] or (h.startswith("*") and h != "*" and not h.startswith("*.")):
                    raise ValueError(f"bad host pattern {h!r}: wildcards look like *.example.com")
        return v

    # Paths are resolved once, here: pgbench runs with its run directory as its cwd and
    # the service may be started from anywhere, so nothing later may depend on the cwd.
    @field_validator("work_dir")
    @classmethod
    def _absolute_work_dir(cls, v: Path) -> Path:
        return v.expanduser().resolve()

    @field_validator("sandbox_dir", "secret_key_file")
    @classmethod
    def _absolute_sandbox_dir(cls, v: Path | None) -> Path | None:
        return v.expanduser().resolve() if v is not None else None

    @field_validator("database_url")
    @classmethod
    def _absolute_sqlite_path(cls, v: str) -> str:
        return absolute_sqlite_url(v)


def normalize_origin(origin: str) -> str:
    """``scheme://host[:port]`` lower-cased, as browsers send Origin; ValueError otherwise."""
    text = origin.strip().rstrip("/").lower()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"origin {origin!r}: give scheme://host[:port], e.g. https://ops.example")
    if parts.path or parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"origin {origin!r}: only scheme://host[:port], no path, query or user")
    return f"{parts.scheme}://{parts.netloc}"


def absolute_sqlite_url(url: str) -> str:
    """``url`` with a relative SQLite file path made absolute against the current directory."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ValueError(
            f"not a SQLAlchemy URL: {exc}; e.g. sqlite:////var/lib/knobtune/knobtune.db "
            "or postgresql+psycopg://user:pass@host/db"
        ) from None
    db = parsed.database
    if not parsed.drivername.startswith("sqlite") or not db or db == ":memory:":
        return url
    if db.startswith("file:") or Path(db).is_absolute():
        return url
    return parsed.set(database=str(Path(db).expanduser().resolve())).render_as_string(
        hide_password=False
    )


@lru_cache
def get_settings() -> Settings:
    return Settings()
