"""Targets: register (a server, or a managed sandbox), get, list, delete or retire."""

from __future__ import annotations

import logging
import secrets
import shutil
from pathlib import Path
from typing import Literal

import psycopg
from psycopg.conninfo import make_conninfo
from sqlalchemy import delete, select, text
from sqlalchemy.exc import IntegrityError

from app import vault
from app.db import Database, utcnow
from app.errors import ServiceError, to_id
from app.models import Schedule, Target, TuningSession
from app.postgres.cgroups import CgroupUnavailable
from app.postgres.connect import (
    Policy,
    check_destinations,
    connect_target,
    forget_sandbox,
    own_sandbox,
    own_sandbox_of,
    parse,
    policy_for,
)
from app.postgres.dsn import remember
from app.postgres.restart import SANDBOX_METHOD, PgCtlMethod, RestartMethod
from app.postgres.roles import WorkloadRoleError, check_workload_role
from app.postgres.sandbox import (
    BENCH_DB,
    BENCH_ROLE,
    PostgresNotInstalled,
    Sandbox,
    SandboxError,
    drop_cgroup,
)
from app.postgres.target import (
    ConnectError,
    Probe,
    TargetController,
    TargetError,
    mask_dsn,
)
from app.preflight import CONNECT_TIMEOUT_S
from app.settings import Settings
from app.targets.access import CONFIGURE, controller_for, legacy_note, restart_note
from app.targets.holds import Holder, busy_error, holder, holders, same_server
from app.targets.location import sandbox_parent
from app.targets.probe_data import rows_to_json
from app.targets.schemas import SandboxIn, SandboxLimitsOut, TargetIn, TargetOut
from optimizer.catalogue import CATALOGUE

log = logging.getLogger(__name__)


def _refuse_restart_command(settings: Settings) -> ServiceError:
    have = ", ".join(sorted(settings.restart_methods)) or "none configured yet"
    return ServiceError(
        422,
        "restart_command is not accepted: the API never runs a command. Give restart_method, "
        f"the name of a restart method the operator configured (on this service: {have}); "
        f"{CONFIGURE}",
    )


def _restart_method(settings: Settings, name: str) -> RestartMethod:
    method = settings.restart_methods.get(name)
    if method is None:
        have = ", ".join(sorted(settings.restart_methods)) or "none"
        raise ServiceError(
            422,
            f"no restart method {name!r} on this service (configured: {have}); {CONFIGURE}",
        )
    return method


def _same_server_error(first: Target) -> ServiceError:
    return ServiceError(
        409,
        f"target {first.name!r} (id {first.id}) is this server already (same system "
        "identifier and port): one target per server, so that two sessions never tune it "
        "at once; use that target, or delete it first",
    )


def create_target(db: Database, settings: Settings, body: TargetIn) -> Target:
    with db.session() as s:
        if s.scalar(select(Target.id).where(Target.name == body.name)) is not None:
            raise ServiceError(409, f"a target named {body.name!r} exists; pick another name")
    if body.restart_command is not None:
        raise _refuse_restart_command(settings)
    if body.recommend_only:
        _check_recommend_only(body)
    sandbox: Sandbox | None = None
    policy = policy_for(settings)
    dsn, data_dir = body.dsn or "", body.data_dir
    bench_dsn: str | None = None
    method_name = body.restart_method
    method: RestartMethod | None = None
    trusted_dir = False
    if body.sandbox:
        if method_name is not None:
            raise ServiceError(
                422, "a sandbox restarts with its own pg_ctl: omit restart_method for it"
            )
        limits = body.sandbox.limits() if isinstance(body.sandbox, SandboxIn) else None
        version = body.sandbox.version if isinstance(body.sandbox, SandboxIn) else None
        root = sandbox_parent(settings) / f"{body.name.replace(' ', '_')}-{secrets.token_hex(3)}"
        try:
            sandbox = Sandbox.create(root, limits=limits, version=version)
        except CgroupUnavailable as exc:
            raise ServiceError(
                422, f"the sandbox's hardware profile ({limits}) cannot be set up: {exc}"
            ) from exc
        except (PostgresNotInstalled, SandboxError) as exc:
            raise ServiceError(422, str(exc)) from exc
        dsn, bench_dsn, data_dir = sandbox.dsn, sandbox.bench_dsn, str(sandbox.data_dir)
        method, method_name, trusted_dir = sandbox.restart_method, SANDBOX_METHOD, True
    else:
        # What the DSN may say and where it may lead, before anything connects
        # (app/postgres/connect.py); the same for the workload's DSN.
        for what, given in (("", dsn), ("workload_dsn: ", body.workload_dsn)):
            if given is not None:
                try:
                    check_destinations(given, policy)
                except psycopg.Error as exc:  # DsnRefused, DestinationRefused, ConnectFailed
                    raise ServiceError(422, f"{what}{exc}") from None
        own = own_sandbox_of(dsn)
        # A sandbox this process made (a test's, the demo's): its benchmark role runs the
        # workload, as for the sandboxes the service makes.
        bench_dsn = body.workload_dsn or (_sandbox_workload(own, dsn) if own else None)
        if method_name is not None:
            method = _restart_method(settings, method_name)
            if isinstance(method, PgCtlMethod) and data_dir in (None, method.data_dir):
                data_dir, trusted_dir = method.data_dir, True
        if data_dir is not None and not Path(data_dir).is_absolute():
            raise ServiceError(422, f"data_dir {data_dir!r} must be an absolute path")
        if body.recommend_only:
            bench_dsn = None  # no workload runs on it
    probe = None
    try:
        ctl = TargetController(
            dsn,
            restart=method,
            data_dir=Path(data_dir) if data_dir else None,
            trust_data_dir=trusted_dir,
            connect_timeout_s=CONNECT_TIMEOUT_S,  # unless the DSN says: fail fast
        )
        probe = ctl.probe(sorted(CATALOGUE))
        if not probe.can_alter_system and not body.recommend_only:
            raise ServiceError(
                422,
                "the target's user may not run ALTER SYSTEM: connect as a superuser, or "
                "GRANT ALTER SYSTEM ON PARAMETER <knob> TO <user> for each knob (PostgreSQL 15+); "
                "a managed database (RDS, Cloud SQL, Azure), which refuses ALTER SYSTEM, is "
                "registered with recommend_only and tuned through a twin",
            )
        if data_dir is not None and not ctl.data_dir_verified:
            raise ServiceError(
                422,
                f"data_dir {data_dir} is not this server's data directory (its "
                "global/pg_control does not show the server's system identifier, or this "
                "service cannot read it); give the right one or omit data_dir",
            )
        _check_declared(body, probe)
        if not body.recommend_only:  # no workload ever runs on a recommend-only server
            _check_workload(ctl, bench_dsn or dsn, same_as=bench_dsn is not None, policy=policy)
        ram = body.ram_bytes or probe.ram_bytes
        cpus = body.cpus or probe.cpus
        if not ram or not cpus:
            raise ServiceError(
                422, "the target is not on this host: declare its ram_bytes and cpus"
            )
        with db.session() as s:
            first = same_server(s, probe.server_id)
        if first is not None:
            raise _same_server_error(first)
        target = Target(
            name=body.name,
            dsn=dsn,
            bench_dsn=bench_dsn,
            restart_method=method_name,
            data_dir=data_dir,
            ram_bytes=ram,
            cpus=cpus,
            sandbox_dir=str(sandbox.root) if sandbox else None,
            sandbox_limits=sandbox.limits.to_json() if sandbox and sandbox.limits else None,
            server_id=probe.server_id,
            recommend_only=body.recommend_only,
            probe={
                "version": probe.version,
                "version_num": probe.version_num,
                "local": probe.local,
                "hardware_note": probe.hardware_note,
                "rows": rows_to_json(probe.settings),
            },
            created_at=utcnow(),
        )
        with db.session() as s:
            s.add(target)
        if sandbox is not None:
            own_sandbox(sandbox.dsn)  # its socket and port: always a destination
            sandbox.keep()  # the service starts and stops it from now on
        return target
    except ConnectError as exc:
        _drop_sandbox(sandbox)
        raise ServiceError(422, f"cannot connect to the target: {exc}") from exc
    except TargetError as exc:
        _drop_sandbox(sandbox)
        raise ServiceError(422, str(exc)) from exc
    except IntegrityError as exc:
        _drop_sandbox(sandbox)
        if probe is not None:
            with db.session() as s:
                first = same_server(s, probe.server_id)
            if first is not None:  # lost a race with another registration of this server
                raise _same_server_error(first) from exc
        raise ServiceError(409, f"a target named {body.name!r} exists; pick another name") from exc
    except BaseException:
        _drop_sandbox(sandbox)
        raise


def _check_recommend_only(body: TargetIn) -> None:
    """422 for what a recommend-only server cannot have: it is never restarted, never runs
    a workload, and is not a sandbox (a sandbox is the twin)."""
    given = [
        name
        for name, value in (
            ("sandbox", body.sandbox),
            ("restart_method", body.restart_method),
            ("workload_dsn", body.workload_dsn),
        )
        if value
    ]
    if given:
        raise ServiceError(
            422,
            f"a recommend-only target is never changed, restarted nor benchmarked: omit "
            f"{', '.join(given)} (a sandbox is the twin you tune; register it separately)",
        )
    if body.dsn is None:
        raise ServiceError(422, "a recommend-only target needs the dsn of the server")


def _sandbox_workload(own: Sandbox, dsn: str) -> str:
    """The benchmark role's DSN for a sandbox's superuser DSN: in the DSN's database when
    the role owns it (a copy made for it), else in its own (knobtune)."""
    dbname = parse(dsn).get("dbname")
    if not dbname or dbname == BENCH_DB:
        return own.bench_dsn
    try:
        with connect_target(dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s", [dbname]
            ).fetchone()
    except psycopg.Error:
        return own.bench_dsn  # the registration's own connection says what is wrong
    if row is not None and row[0] == BENCH_ROLE:
        return make_conninfo(own.bench_dsn, dbname=dbname)
    return own.bench_dsn


_SAME_SERVER_SQL = "SELECT pg_postmaster_start_time()::text, current_setting('port')"


def _check_workload(ctl: TargetController, wl_dsn: str, *, same_as: bool, policy: Policy) -> None:
    """422 unless the workload's role is least-privileged (app/postgres/roles.py) and,
    when it has a DSN of its own, on the target's server."""
    try:
        check_workload_role(wl_dsn, policy=policy)
        if same_as:
            with connect_target(wl_dsn, autocommit=True, connect_timeout=10, policy=policy) as conn:
                theirs = conn.execute(_SAME_SERVER_SQL).fetchone()
            with connect_target(
                ctl.dsn, autocommit=True, connect_timeout=10, policy=policy
            ) as conn:
                ours = conn.execute(_SAME_SERVER_SQL).fetchone()
            if theirs != ours:
                raise ServiceError(
                    422,
                    "workload_dsn reaches another server than dsn (another start time or "
                    "port): give a DSN of the same server",
                )
    except WorkloadRoleError as exc:
        raise ServiceError(422, str(exc)) from None
    except psycopg.Error as exc:
        raise ServiceError(422, f"cannot connect to the workload's DSN: {exc}") from None


def _check_declared(body: TargetIn, probe: Probe) -> None:
    """A declared ram_bytes/cpus above the server's cgroup limit is refused (422): hints
    and the memory guard sized for memory the server may not use would crash it."""
    if probe.hardware_note is None:
        return
    for name, said, found in (
        ("ram_bytes", body.ram_bytes, probe.ram_bytes),
        ("cpus", body.cpus, probe.cpus),
    ):
        if said is not None and found is not None and said > found:
            raise ServiceError(
                422,
                f"{name} {said} is more than the server may use ({probe.hardware_note}); "
                f"omit {name}, or give at most {found}",
            )


def set_restart_method(
    db: Database, settings: Settings, target_id: int, name: str | None
) -> Target:
    """Select (or clear) a target's restart method: one of the operator's, by name."""
    if name is not None:
        _restart_method(settings, name)
    with db.session() as s:
        t = s.get(Target, to_id(target_id))
        if t is None or t.retired_at is not None:
            raise ServiceError(404, f"no target {target_id}", fix="list-targets")
        if t.sandbox_dir:
            raise ServiceError(422, "a sandbox restarts with its own pg_ctl; nothing to set")
        held = holder(s, t.id)
        if held is not None:
            raise ServiceError(
                409, busy_error(t.name, held, then="change its restart method afterwards")
            )
        t.restart_method = name
        if name is not None:
            t.restart_command = None  # the legacy text has been replaced by a method
        return t


def ensure_server_id(db: Database, target: Target) -> None:
    """Record the server identity of a target registered before it was (issue 25).

    Raises ServiceError(409) when another live target turns out to be the same server.
    An unreachable target is left as it is: its session fails on its own.
    """
    if target.server_id is not None or target.retired_at is not None:
        return
    try:
        server_id = TargetController(target.dsn).server_id()
    except (TargetError, OSError, psycopg.Error):
        return
    if server_id is None:
        return
    with db.session() as s:
        first = same_server(s, server_id, but=target.id)
        if first is not None:
            raise ServiceError(
                409,
                f"target {target.name!r} and target {first.name!r} (id {first.id}) are the "
                "same server: one target per server; delete one of them",
            )
        row = s.get(Target, target.id)
        if row is not None:
            row.server_id = server_id
    target.server_id = server_id


def _drop_sandbox(sandbox: Sandbox | None) -> None:
    if sandbox is not None:
        sandbox.destroy()


def controller(target: Target, settings: Settings, *, restart: bool = True) -> TargetController:
    """The controller of a registered target (``restart=False``: never restarts it)."""
    if not restart:
        return TargetController(
            target.dsn, data_dir=Path(target.data_dir) if target.data_dir else None
        )
    return controller_for(target, settings)


def get_target(db: Database, target_id: int) -> Target:
    with db.session() as s:
        t = s.get(Target, to_id(target_id))
        if t is None:
            raise ServiceError(404, f"no target {target_id}", fix="list-targets")
        return t


def shown_dsn(dsn: str) -> str:
    """A stored DSN as every front end shows it: password masked, or why it cannot be read."""
    if dsn == vault.UNREADABLE:
        return "(cannot be decrypted with this service's secret key: register the target again)"
    return mask_dsn(dsn)


def target_out(db: Database, target: Target, settings: Settings | None = None) -> TargetOut:
    with db.session() as s:
        held = holder(s, target.id)
    return TargetOut(
        id=target.id,
        name=target.name,
        dsn=shown_dsn(target.dsn),
        restart_method=target.restart_method,
        restart_command=target.restart_command,
        restart_note=(
            restart_note(target, settings)
            if settings is not None
            else (legacy_note(target) if target.restart_command else None)
        ),
        data_dir=target.data_dir,
        ram_bytes=target.ram_bytes,
        cpus=target.cpus,
        sandbox=target.sandbox_dir is not None,
        sandbox_limits=(
            SandboxLimitsOut(**target.sandbox_limits)
            if target.sandbox_limits and target.sandbox_dir
            else None
        ),
        server_version=(target.probe or {}).get("version"),
        hardware_note=(target.probe or {}).get("hardware_note"),
        busy_session_id=held.id if held and held.kind == "session" else None,
        created_at=target.created_at,
        retired_at=target.retired_at,
        workload_dsn=(
            mask_dsn(target.bench_dsn)
            if target.bench_dsn and target.bench_dsn != vault.UNREADABLE
            else None
        ),
        recommend_only=bool(target.recommend_only),
    )


def held_targets(db: Database) -> dict[int, Holder]:
    """Every target a job holds now, and its holder, in one query (the dashboard's list)."""
    with db.session() as s:
        return holders(s)


def list_targets(db: Database, *, include_retired: bool = False) -> list[Target]:
    """Targets one may use; retired ones (kept for their sessions' history) on request."""
    with db.session() as s:
        q = select(Target).order_by(Target.id)
        if not include_retired:
            q = q.where(Target.retired_at.is_(None))
        return list(s.scalars(q).all())


HistoryChoice = Literal["keep", "drop"]


def delete_target(db: Database, target_id: int, history: HistoryChoice | None = None) -> None:
    """Delete a target; one with sessions needs ``history``: keep them (retire) or drop them.

    Never loses tuning history silently: without a choice, a target with sessions is
    refused (409) with both ways out. Retiring hides the target from lists and forms,
    frees its name, and stops and removes a managed sandbox; its sessions stay visible.
    """
    with db.session() as s:
        t = s.get(Target, to_id(target_id))
        if t is None or t.retired_at is not None:
            raise ServiceError(404, f"no target {target_id}", fix="list-targets")
        held = holder(s, t.id)
        if held is not None:
            raise ServiceError(409, f"target {target_id} is busy with {held}; cancel it first")
        sessions = list(s.scalars(select(TuningSession).where(TuningSession.target_id == t.id)))
        if sessions and history is None:
            raise ServiceError(
                409,
                f"target {target_id} has {len(sessions)} session(s) of tuning history: "
                "history=keep retires the target and keeps its sessions and trials; "
                "history=drop deletes them with the target",
                fix="delete-target-history",
                about={"target_id": t.id},
            )
        sandbox_dir = t.sandbox_dir
        if sandbox_dir:
            forget_sandbox(t.dsn)  # its socket directory is no destination any more
        if sessions and history == "keep":
            t.retired_at = utcnow()
            # The name is free for a new target; the suffix keeps it unique and readable.
            t.name = f"{t.name[:180]} (retired #{t.id})"
            t.sandbox_dir = None
        else:
            for sess in sessions:
                s.delete(sess)
            s.flush()  # sessions (and their trials) before the row they point to
            s.delete(t)
        # A retired target must not be tuned again by a recurring schedule either.
        s.execute(delete(Schedule).where(Schedule.target_id == t.id))
    if sandbox_dir:
        _destroy_sandbox_dir(Path(sandbox_dir))


def _destroy_sandbox_dir(root: Path) -> None:
    try:
        Sandbox.open(root).destroy()
    except Exception:
        log.warning("could not stop sandbox %s cleanly; removing its files", root)
        shutil.rmtree(root, ignore_errors=True)
    drop_cgroup(root)  # also when its files were gone: the cgroup goes with the sandbox


def remember_sandboxes(db: Database) -> int:
    """Make the managed sandboxes' sockets destinations of this process (at its start,
    before anything connects): app/postgres/connect.py allows them, whatever
    KNOBTUNE_TARGET_HOSTS says. Their DSNs come from the metadata DB."""
    found = 0
    for t in list_targets(db):
        if t.sandbox_dir and t.dsn != vault.UNREADABLE:
            own_sandbox(t.dsn)
            found += 1
    return found


def seal_stored_secrets(db: Database) -> int:
    """Encrypt DSNs stored in plain text (rows from before issue 25); returns how many.

    Also reads every stored DSN once, so that every target's password is known to the
    scrubber of error texts and logs (app.postgres.dsn.scrub) from the start.
    """
    sealed = 0
    with db.session() as s:
        rows = s.execute(text("SELECT id, dsn, bench_dsn FROM targets")).all()
        for target_id, dsn, bench in rows:
            values: dict[str, str] = {}
            for col, value in (("dsn", dsn), ("bench_dsn", bench)):
                if value is None:
                    continue
                remember(vault.decrypt(value))
                if not vault.is_encrypted(value):
                    values[col] = vault.encrypt(value)
            if values:
                sets = ", ".join(f"{c} = :{c}" for c in values)
                s.execute(
                    text(f"UPDATE targets SET {sets} WHERE id = :id"), {**values, "id": target_id}
                )  # column names are ours, values are parameters
                sealed += 1
    if sealed:
        log.info("encrypted the stored DSNs of %d target(s)", sealed)
    return sealed
