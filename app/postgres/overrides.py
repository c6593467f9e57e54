"""Tuned knobs overridden for the workload's sessions (issue 40).

knobtune tunes with ``ALTER SYSTEM``. A value set per database or per role
(``ALTER DATABASE ... SET``, ``ALTER ROLE ... [IN DATABASE ...] SET``, stored in
``pg_db_role_setting``), or in the DSN's ``options``, wins over it in every session of
that database or role: the workload would never run with the values being measured.
Every trial would measure the override, the session would report no gain (or keep a
value on noise) and recommend a config that does not reach that workload. A benchmark
role that may ``ALTER DATABASE knobtune SET work_mem`` steers every later session.

So before a session starts, the workload's own connection is asked where each tuned
knob's value comes from (``pg_settings.source`` is what its sessions get). On a
client's server the settings are the DBA's, and knobtune never changes them: the session
is refused with the statement that removes each one (:func:`refusal`). On a sandbox the
role and the database are knobtune's own: the service removes them as its superuser and
says so in the session's notes (:func:`clear`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from app.postgres.connect import Conn, Policy, connect_target

# pg_settings.source values that come from pg_db_role_setting or the client
SOURCES = ("database", "user", "database user", "global", "client")


@dataclass(frozen=True)
class Override:
    name: str
    value: str
    source: str
    role: str
    database: str

    def where(self) -> str:
        return {
            "database": f"for database {self.database}",
            "user": f"for role {self.role}",
            "database user": f"for role {self.role} in database {self.database}",
            "global": "for all roles (ALTER ROLE ALL)",
            "client": "by the DSN's options (or PGOPTIONS)",
        }.get(self.source, f"by {self.source}")

    def reset(self) -> sql.Composed | None:
        """The statement that removes it (None: it is the client's, not a setting)."""
        name, role, db = (
            sql.Identifier(self.name),
            sql.Identifier(self.role),
            sql.Identifier(self.database),
        )
        if self.source == "database":
            return sql.SQL("ALTER DATABASE {} RESET {}").format(db, name)
        if self.source == "user":
            return sql.SQL("ALTER ROLE {} RESET {}").format(role, name)
        if self.source == "database user":
            return sql.SQL("ALTER ROLE {} IN DATABASE {} RESET {}").format(role, db, name)
        if self.source == "global":
            return sql.SQL("ALTER ROLE ALL RESET {}").format(name)
        return None

    def fix(self) -> str:
        stmt = self.reset()
        if stmt is None:
            return f"remove -c {self.name}=... from the DSN's options"
        return stmt.as_string(None)

    def text(self) -> str:
        return f"{self.name} = {self.value!r} set {self.where()}"


def find(conn: Conn, knobs: Sequence[str]) -> list[Override]:
    """The tuned knobs whose value in this (the workload's) session is not the server's."""
    rows = conn.execute(
        "SELECT name, current_setting(name), source, session_user, current_database()"
        " FROM pg_settings WHERE name = ANY(%s) AND source = ANY(%s) ORDER BY name",
        [[k.strip().lower() for k in knobs], list(SOURCES)],
    ).fetchall()
    return [Override(*(str(v) for v in r)) for r in rows]


def check(dsn: str, knobs: Sequence[str], *, policy: Policy | None = None) -> list[Override]:
    """:func:`find` on a connection of the workload's DSN (raises psycopg.Error)."""
    if not knobs:
        return []
    with connect_target(dsn, autocommit=True, connect_timeout=10, policy=policy) as conn:
        return find(conn, knobs)


def refusal(found: Sequence[Override]) -> str:
    knobs = ", ".join(sorted({o.name for o in found}))
    return (
        f"the tuned knob(s) {knobs} are overridden for the workload's sessions, so the "
        "values knobtune sets with ALTER SYSTEM would never reach them: "
        + "; ".join(o.text() for o in found)
        + ". Remove the override ("
        + "; ".join(o.fix() for o in found)
        + f") or leave {knobs} out of knobs"
    )


def clear(admin_dsn: str, found: Sequence[Override], *, policy: Policy | None = None) -> str:
    """Remove ``found`` as the superuser of knobtune's own sandbox; the note that says so."""
    with connect_target(admin_dsn, autocommit=True, connect_timeout=10, policy=policy) as conn:
        for o in found:
            stmt = o.reset()
            if stmt is not None:
                conn.execute(stmt)
    return (
        "the sandbox's benchmark role or database overrode tuned knob(s) ("
        + "; ".join(o.text() for o in found)
        + "): removed, so the workload runs with the values being tuned"
    )
