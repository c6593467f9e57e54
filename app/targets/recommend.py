"""Recommend-only targets: servers knobtune reads but never changes.

Managed services (RDS, Aurora, Cloud SQL, Azure) refuse ALTER SYSTEM and restarts from a
client, so a session cannot tune them in place. Such a server is registered
recommend-only: its settings and hardware are read (pg_settings needs no privilege), and
everything that would change it or load it with a benchmark is refused with a message
that says the way in: tune a twin, a sandbox sized like the instance, on a replay of the
server's own log, and export the result in the service's form.
"""

from __future__ import annotations

from app.errors import ServiceError
from app.models import Target

TWIN_HINT = (
    "tune a twin instead: import the server's log (knobtune captures import), register a "
    "sandbox with the instance's profile (e.g. --profile db.t4g.medium), tune it on a replay "
    "of the capture, and export the result with --format rds|cloudsql|azure|cnpg|patroni"
)


def refuse_if_recommend_only(target: Target, action: str) -> None:
    """409 when ``target`` is recommend-only: ``action`` (e.g. "run a session") would
    change or load it."""
    if target.recommend_only:
        raise ServiceError(
            409,
            f"target {target.name!r} is recommend-only: knobtune never changes it, so it "
            f"cannot {action}; {TWIN_HINT}",
        )
