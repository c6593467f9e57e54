"""How the service reaches a stored target: its restart method, its controller.

A target's restart is never a command from an API client: it is the operator's
configured method the target names (``Settings.restart_methods``), a managed sandbox's
own pg_ctl, or none, with a reason that says what to configure.
"""

from __future__ import annotations

from pathlib import Path

from app.models import Target
from app.postgres.connect import own_sandbox_of
from app.postgres.restart import SANDBOX_METHOD, PgCtlMethod, RestartMethod
from app.postgres.sandbox import Sandbox, SandboxError
from app.postgres.target import TargetController
from app.settings import Settings

CONFIGURE = (
    "the operator declares restart methods in KNOBTUNE_RESTART_METHODS (JSON: name -> "
    '{"kind": "pg_ctl", "data_dir": ...} | {"kind": "systemd", "unit": ...} | '
    '{"kind": "container", "container": ...} | {"kind": "command", "argv": [...]}), '
    "and a target selects one by name"
)


def legacy_note(target: Target) -> str:
    return (
        f"target {target.name!r} has a restart_command stored from an earlier version; "
        "it is never run (the API runs no commands): "
        f"{CONFIGURE}; then set the target's restart_method to that name"
    )


def restart_for(target: Target, settings: Settings) -> tuple[RestartMethod | None, str | None]:
    """The target's restart method, or None and why there is none (a message to show)."""
    if target.sandbox_dir:
        try:
            return Sandbox.open(Path(target.sandbox_dir)).restart_method, None
        except SandboxError:
            return None, "the sandbox's files are gone (register a new sandbox)"
    name = target.restart_method
    if name and name != SANDBOX_METHOD:
        method = settings.restart_methods.get(name)
        if method is not None:
            return method, None
        have = ", ".join(sorted(settings.restart_methods)) or "none"
        return None, (
            f"its restart method {name!r} is not configured on this service "
            f"(KNOBTUNE_RESTART_METHODS has: {have})"
        )
    if target.restart_command:
        return None, legacy_note(target)
    return None, f"the target has no restart method ({CONFIGURE})"


def restart_note(target: Target, settings: Settings) -> str | None:
    """What the target's API output says about restarts: only when something is amiss."""
    method, reason = restart_for(target, settings)
    if method is not None or not (target.restart_method or target.restart_command):
        return None
    return reason


def admin_dsn_for(target: Target) -> str | None:
    """The superuser DSN of a cluster that is knobtune's own, for its fixed statements
    there (a replay's per-run copy, removing overrides of the tuned knobs): a managed
    sandbox's, or a sandbox's that this process made and that was registered by its
    superuser DSN (the demo's, a bench's or a test's: its registration gave the workload
    the sandbox's benchmark role, which may not create databases). None on a client's
    server: its DBA grants the workload's role what it needs (app/workloads/replay.py)."""
    if target.sandbox_dir or own_sandbox_of(target.dsn) is not None:
        return target.dsn
    return None


def controller_for(target: Target, settings: Settings) -> TargetController:
    """The controller of a stored target (its superuser DSN, restart method, data dir)."""
    method, reason = restart_for(target, settings)
    data_dir = Path(target.data_dir) if target.data_dir else None
    # The operator's own configuration (a sandbox, a pg_ctl method's directory) is
    # trusted; a directory a client named must prove itself (global/pg_control).
    trusted = target.sandbox_dir is not None
    if isinstance(method, PgCtlMethod) and (data_dir is None or str(data_dir) == method.data_dir):
        data_dir, trusted = Path(method.data_dir), True
    return TargetController(
        target.dsn,
        restart=method,
        no_restart_reason=reason,
        data_dir=data_dir,
        trust_data_dir=trusted,
    )
