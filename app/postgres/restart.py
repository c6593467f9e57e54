"""Restart methods: how the service restarts a target, declared by its operator only.

The REST API never accepts a command. The operator declares named methods in the
service's configuration (``KNOBTUNE_RESTART_METHODS``, JSON: name -> method) and an API
client picks one by name. Each method is an argv list run without a shell, with a
timeout, as an unprivileged OS user when the service is root:

- ``pg_ctl``: ``pg_ctl restart`` of a data directory on this host, as the directory's
  owner (the server binaries refuse root);
- ``systemd``: ``systemctl restart <unit>``;
- ``container``: ``docker|podman restart <name>``;
- ``command``: a fixed argv, e.g. ``["knobtune-restart-target"]`` or
  ``["ssh", "db5", "sudo", "pg_ctlcluster", "15", "main", "restart"]``; ``env`` names the
  variables of the service's environment it receives (children get none otherwise).

Managed sandboxes restart with a pg_ctl method of their own, which clients cannot name.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.postgres import privilege
from app.postgres.binaries import PostgresNotInstalled, find_bindir
from app.postgres.cgroups import NAME_RE, Cgroup, CgroupUnavailable, Host, launcher_argv

# The name under which a managed sandbox's own method is recorded; never configurable.
SANDBOX_METHOD = "sandbox"
METHOD_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
_ARG = r"^[^\-\x00-\x1f][^\x00-\x1f]*$"  # no option-looking names, no control characters


class _Method(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    user: str | None = Field(
        default=None,
        description="OS user it runs as when the service is root (default: the unprivileged "
        "KNOBTUNE_RUN_AS_USER; for pg_ctl the data directory's owner).",
    )
    timeout_s: float = Field(default=120.0, gt=0, le=3600)

    def argv(self) -> list[str]:  # pragma: no cover - every kind overrides it
        raise NotImplementedError

    def identity(self) -> privilege.Identity:
        return privilege.lookup(self.user, with_groups=True) if self.user else _default_identity()

    def env(self) -> dict[str, str]:
        return {}

    def describe(self) -> str:
        return " ".join(self.argv())


def _default_identity() -> privilege.Identity:
    ident = privilege.child_identity()
    # A restart method may need its user's groups (docker, systemd-journal, ...).
    return privilege.lookup(ident.name, with_groups=True)


class PgCtlMethod(_Method):
    kind: Literal["pg_ctl"]
    data_dir: str = Field(description="Absolute path of the data directory on this host.")
    bindir: str | None = Field(
        default=None, description="PostgreSQL's bin directory (default: by PG_VERSION)."
    )
    log_file: str | None = Field(
        default=None,
        description="pg_ctl's -l (the server's stderr); default <data_dir>/knobtune-postmaster.log",
    )
    cgroup: str | None = Field(
        default=None,
        pattern=NAME_RE,
        description="A cgroup (knobtune-*) the restarted server runs in: a sandbox's "
        "hardware profile (app/postgres/cgroups.py).",
    )

    @field_validator("data_dir", "bindir", "log_file")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_absolute():
            raise ValueError(f"{v!r} must be an absolute path")
        return v

    def pg_ctl(self) -> str:
        if self.bindir:
            return str(Path(self.bindir) / "pg_ctl")
        try:
            major = (Path(self.data_dir) / "PG_VERSION").read_text().strip()
            debian = Path(f"/usr/lib/postgresql/{major}/bin/pg_ctl")
            if debian.exists():
                return str(debian)
        except OSError:
            pass
        try:
            return str(find_bindir() / "pg_ctl")
        except PostgresNotInstalled:
            return "pg_ctl"

    def argv(self) -> list[str]:
        log = self.log_file or str(Path(self.data_dir) / "knobtune-postmaster.log")
        wait = str(max(1, int(self.timeout_s) - 5))
        return [self.pg_ctl(), "restart", "-w", "-s", "-m", "fast", "-t", wait, "-l", log]

    def full_argv(self) -> list[str]:
        return [*self.argv(), "-D", self.data_dir]

    def describe(self) -> str:
        return f"pg_ctl restart -D {self.data_dir}"

    def identity(self) -> privilege.Identity:
        if self.user:
            return privilege.lookup(self.user, with_groups=True)
        try:
            owner = Path(self.data_dir).stat().st_uid
            import pwd

            name = pwd.getpwuid(owner).pw_name
        except (OSError, KeyError):
            raise privilege.PrivilegeError(
                f"cannot find the owner of {self.data_dir}: is it the target's data directory?"
            ) from None
        return privilege.lookup(name, with_groups=True)


class SystemdMethod(_Method):
    kind: Literal["systemd"]
    unit: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9:_.@\\\-]*$", max_length=256)

    def argv(self) -> list[str]:
        return ["systemctl", "restart", self.unit]


class ContainerMethod(_Method):
    kind: Literal["container"]
    container: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", max_length=256)
    engine: Literal["docker", "podman"] = "docker"

    def argv(self) -> list[str]:
        return [self.engine, "restart", self.container]


class CommandMethod(_Method):
    kind: Literal["command"]
    argv_: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        alias="argv", min_length=1, max_length=100
    )
    pass_env: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = Field(
        default_factory=list,
        alias="env",
        description="Names of the service's environment variables the command receives.",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("argv_")
    @classmethod
    def _program(cls, v: list[str]) -> list[str]:
        if not v[0] or v[0].startswith("-"):
            raise ValueError("argv[0] must name the program to run")
        return v

    def argv(self) -> list[str]:
        return list(self.argv_)

    def env(self) -> dict[str, str]:
        return {k: os.environ[k] for k in self.pass_env if k in os.environ}


RestartMethod = Annotated[
    PgCtlMethod | SystemdMethod | ContainerMethod | CommandMethod, Field(discriminator="kind")
]


class RestartFailed(Exception):
    """The method failed or timed out; the message has its exit status and output tail."""


def _in_cgroup(name: str, argv: list[str], ident: privilege.Identity) -> list[str]:
    """``argv`` run by the launcher that puts it (and the server it starts) in cgroup
    ``name``; never outside it: a cgroup that is gone fails the restart."""
    try:
        procs = Cgroup(name, Host.detect()).procs_files()
    except CgroupUnavailable as exc:
        raise RestartFailed(f"the server must restart in cgroup {name}, but {exc}") from None
    if not procs:
        raise RestartFailed(
            f"the server must restart in cgroup {name}, which is gone (the host rebooted?): "
            "restart the knobtune service, which makes it again for its sandboxes"
        )
    if privilege.dropping():
        return launcher_argv(procs, argv, uid=ident.uid, gid=ident.gid, groups=ident.groups)
    return launcher_argv(procs, argv)


def run(method: PgCtlMethod | SystemdMethod | ContainerMethod | CommandMethod) -> None:
    """Run ``method`` as argv, without a shell, as its (unprivileged) user; raise on failure.

    stdout/stderr go to a file, not a pipe: a restarted server inherits them and would
    keep a pipe open long after the command returned.
    """
    argv = method.full_argv() if isinstance(method, PgCtlMethod) else method.argv()
    ident = method.identity()
    if privilege.dropping() and ident.uid == 0 and method.user != "root":
        raise RestartFailed(
            f"{method.describe()} would run as root; name an unprivileged user, or set "
            '"user": "root" in the method if the operator means it'
        )
    kwargs: dict[str, Any] = ident.popen_kwargs() if privilege.dropping() else {}
    if isinstance(method, PgCtlMethod) and method.cgroup:
        argv = _in_cgroup(method.cgroup, argv, ident)
        kwargs = {}  # the launcher joins the cgroup as root, then drops to ident itself
    env = privilege.child_env(method.env(), home=ident.home)
    import tempfile

    with tempfile.TemporaryFile("w+") as out:
        try:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd="/",
                start_new_session=True,
                **kwargs,
            )
        except OSError as exc:
            raise RestartFailed(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
        try:
            proc.wait(timeout=method.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RestartFailed(
                f"{method.describe()} did not finish within {method.timeout_s:.0f} s"
            ) from None
        if proc.returncode != 0:
            out.seek(0)
            said = out.read()[-1000:].strip()
            raise RestartFailed(
                f"{method.describe()} exited with {proc.returncode}" + (f": {said}" if said else "")
            )
