"""The role a client's workload runs as: never one that reaches the server's host (issue 40).

A client's scripts, the preflight and a replayed capture run SQL the client chose. As a
superuser, or as a member of ``pg_execute_server_program``, ``pg_read_server_files`` or
``pg_write_server_files``, that SQL runs programs and reads or writes files on the
server's host (``COPY ... TO PROGRAM``, ``pg_read_file``): the host of the service
itself when the server is local. So a DSN target's workload runs as a separate,
least-privileged role (the target's ``workload_dsn``; a sandbox's ``knobtune_bench``),
checked at registration and again before each session, preflight and sweep, since a
role can be granted more later.

A separate DSN rather than ``SET ROLE``: a script runs in the session it is given, and
``RESET ROLE`` (or ``SET ROLE`` back) returns any session to its login role. Only a login
that is itself unprivileged bounds what a script can do.

Before PostgreSQL 16, ``CREATEROLE`` may grant any of those roles to itself, so it counts
as well. The operator acting in-process (the CLI without ``--server``) runs workloads as
the DSN's own user: they chose the SQL and hold the DSN.
"""

from __future__ import annotations

from app.postgres.connect import Conn, Policy, connect_target, current
from app.postgres.dsn import mask_dsn

SERVER_FILE_ROLES = ("pg_execute_server_program", "pg_read_server_files", "pg_write_server_files")

# Every role the login may act as (pg_has_role MEMBER: directly or through others, also
# those reached only by SET ROLE), with what makes it unfit.
_SQL = """
SELECT session_user, r.rolname, r.rolsuper, r.rolcreaterole
FROM pg_roles r
WHERE pg_has_role(session_user, r.oid, 'MEMBER')
  AND (r.rolsuper OR r.rolcreaterole OR r.rolname = ANY(%s))
ORDER BY r.rolname
"""


class WorkloadRoleError(Exception):
    """The workload's role is privileged; the message says what to change."""


def privileges(conn: Conn) -> tuple[str, list[str]]:
    """(the login role, what makes it unfit for a client's SQL: [] when nothing)."""
    rows = conn.execute(_SQL, [list(SERVER_FILE_ROLES)]).fetchall()
    login = str(conn.info.user)
    old = conn.info.server_version < 160000
    found: list[str] = []
    for user, name, superuser, createrole in rows:
        login = str(user)
        if superuser:
            return login, ["a superuser" if name == user else f"a member of superuser {name}"]
        if name in SERVER_FILE_ROLES:
            found.append(f"a member of {name}")
        elif createrole and old:
            found.append(
                "CREATEROLE" if name == user else f"a member of {name}, which has CREATEROLE"
            )
    return login, found


def refusal(user: str, reasons: list[str]) -> str:
    why = ", ".join(reasons)
    return (
        f"the workload would run as {user!r}, {why}: a client's scripts, the preflight and "
        "replays never run as a role that can run programs or read and write files on the "
        "server's host. Give the target a workload_dsn: a DSN of another role of this "
        "server that is no superuser, has no CREATEROLE (before PostgreSQL 16) and is no "
        f"member of {', '.join(SERVER_FILE_ROLES)} (e.g. CREATE ROLE knobtune_bench LOGIN "
        "PASSWORD '...' and GRANT it what the workload needs), or use a managed sandbox"
    )


def check_workload_role(
    dsn: str, *, policy: Policy | None = None, connect_timeout: int = 10
) -> None:
    """Raise WorkloadRoleError when ``dsn``'s role is privileged (see the module doc).

    A connection that fails raises psycopg.Error: the caller decides (the workload's
    own connection fails the same way, with its own message).
    """
    policy = policy or current()
    if policy.operator:
        return
    with connect_target(
        dsn, autocommit=True, connect_timeout=connect_timeout, policy=policy
    ) as conn:
        user, reasons = privileges(conn)
    if reasons:
        raise WorkloadRoleError(refusal(user, reasons))


def cannot_check(dsn: str, exc: BaseException) -> str:
    return f"cannot connect to {mask_dsn(dsn)} to check the workload's role: {exc}"
