"""Managed sandboxes live with the service: started with it, stopped at its shutdown."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from app.db import Database
from app.errors import ServiceError
from app.models import Target
from app.postgres.cgroups import Limits
from app.postgres.restart import SANDBOX_METHOD
from app.postgres.sandbox import (
    BENCH_ROLE_VERSION,
    Sandbox,
    SandboxError,
    free_port,
    remove_socket_dir,
)
from app.settings import Settings
from app.targets.holds import holders
from app.targets.location import owned_by_this_service
from app.targets.service import delete_target, list_targets

log = logging.getLogger(__name__)


def start_sandboxes(db: Database) -> None:
    """Start the managed sandboxes again with the service, or unregister the lost ones.

    A sandbox whose files are gone, or that will not start, is retired (or deleted when it
    has no history): a target listed as idle that nothing can connect to is never left.
    """
    for t in list_targets(db):
        if not t.sandbox_dir:
            continue
        root = Path(t.sandbox_dir)
        try:
            # An earlier version's sandbox (its record writable by the postgres user) is
            # taken back using the DSN stored here, never what its directory says.
            sb = Sandbox.open(root, dsn=t.dsn)
            # The profile stored with the target: its cgroup is made again (gone after a
            # reboot), and a server still running outside it is moved in.
            limits = Limits.from_json(t.sandbox_limits)
            if limits != sb.limits:
                sb.set_limits(limits)
            sb.ensure_cgroup()
            sb.adopt()
            if not sb.is_hardened() or t.bench_dsn is None:
                # Made before issue 25: it trusted every local connection. New random
                # passwords, the benchmark role, and no trust, before it starts again.
                sb.harden()
                with db.session() as s:
                    row = s.get(Target, t.id)
                    if row is not None:
                        row.dsn, row.bench_dsn = sb.dsn, sb.bench_dsn
                        row.restart_method, row.restart_command = SANDBOX_METHOD, None
                        t.dsn, t.bench_dsn = sb.dsn, sb.bench_dsn
            if sb.bench_role < BENCH_ROLE_VERSION:
                # Made before issue 40: its benchmark role could CREATE DATABASE and
                # ALTER DATABASE knobtune SET the knobs being tuned.
                sb.restrict_bench_role()
            try:
                sb.start()
            except SandboxError:
                if "could not bind" not in sb.log_tail(50):
                    raise
                # Someone took its port while the service was down: move it.
                sb.move_to(free_port())
                sb.start()
                with db.session() as s:
                    row = s.get(Target, t.id)
                    if row is not None:
                        row.dsn = with_port(t.dsn, sb.port)
                        row.bench_dsn = with_port(t.bench_dsn or t.dsn, sb.port)
            continue
        except Exception as exc:
            reason = " ".join(str(exc).split())[:500]
        log.warning("sandbox of target %s (%s) cannot start: %s", t.name, root, reason)
        if not root.exists():
            remove_socket_dir(t.dsn)  # its files went; its socket directory in /tmp goes too
        try:
            delete_target(db, t.id, "keep")
        except ServiceError as exc:
            # A session or sweep holds it: it fails on its own, then the target can go.
            log.warning("target %s stays registered: %s", t.name, exc)


def with_port(dsn: str, port: int) -> str:
    params: dict[str, Any] = {k: v for k, v in conninfo_to_dict(dsn).items() if v is not None}
    params["port"] = str(port)
    return make_conninfo("", **params)


def stop_sandboxes(db: Database, settings: Settings) -> None:
    """At shutdown: stop the idle managed sandboxes this service made (app.targets.location).

    Their files stay; start_sandboxes() starts them at the next start. A target with an
    active session or sweep keeps running: a runner thread may still be measuring on it,
    and the holder resumes on it after the restart.
    """
    with db.session() as s:
        busy = set(holders(s))
    for t in list_targets(db):
        if t.id in busy:
            continue
        if t.sandbox_dir and owned_by_this_service(settings, Path(t.sandbox_dir)):
            try:
                Sandbox.open(Path(t.sandbox_dir)).stop()
            except Exception:
                log.warning("could not stop sandbox of target %s", t.name, exc_info=True)
