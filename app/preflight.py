"""Preflight: dry-run a session's workload scripts on the target before the session exists.

Each script runs alone for a few transactions (``pgbench -n -t 2 -c 1``, the session's
protocol), so a script error, a missing table or a missing privilege is a 422 at
``POST /sessions`` quoting PostgreSQL, naming the script and its line, instead of a
session that fails after it started. No configuration is changed and ``pgbench -i`` is
never run. With ``init: true`` the pgbench tables may not exist yet (the session creates
them): then the builtin is not dry-run, and a custom script's "relation pgbench_...
does not exist" is not held against it.
"""

from __future__ import annotations

import logging
import re
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from app.postgres import privilege
from app.postgres.connect import describe_line, libpq_env
from app.postgres.dsn import mask_dsn, password_of, scrub
from app.postgres.errors import bounded, first_line, primary_message
from app.postgres.pgbench import PgbenchError, find_pgbench
from app.postgres.roles import WorkloadRoleError, check_workload_role
from app.postgres.scripts import ScriptError, check_script, command_lines
from app.workloads.kinds import KNOBTUNE_BUILTINS
from app.workloads.schemas import WorkloadIn

log = logging.getLogger(__name__)

TRANSACTIONS = 2
TIMEOUT_S = 30.0  # a heavy report may take a while; past this, the dry run proves nothing
# Connecting to a target while a request waits (registering it, this preflight), unless
# its DSN sets connect_timeout: a target that never answers fails in seconds, not minutes.
CONNECT_TIMEOUT_S = 5
_ABORTED = re.compile(r"aborted in command (\d+) query \d+: (.*)")
_PGBENCH_TABLE = re.compile(
    r'relation "(?:public\.)?pgbench_(?:accounts|branches|tellers|history)"'
)
_FILE_LINE = re.compile(r"^(?:\S+\.sql):(\d+): (.*)")


class PreflightError(Exception):
    """The workload cannot run on the target; the message says where and what to change."""


@dataclass(frozen=True)
class _Failure:
    message: str  # PostgreSQL's (or pgbench's) first line, unbounded: bound before showing
    command: int | None  # pgbench's 0-based command index in the script
    file_line: int | None  # a line pgbench named itself (meta-command syntax errors)
    stmt_line: int | None  # PostgreSQL's "LINE n:" within the statement


def _parse(stderr: str) -> _Failure | None:
    """The first real error in pgbench's stderr.

    In prepared mode pgbench reports PostgreSQL's error first, then a follow-up
    'prepared statement "P_0" does not exist': the first one is what the user needs.
    """
    blocks: list[list[str]] = []
    for line in stderr.splitlines():
        if line.startswith("pgbench: "):
            blocks.append([line.removeprefix("pgbench: ")])
        elif blocks:
            blocks[-1].append(line)
    command: int | None = None
    first: list[str] | None = None
    for block in blocks:
        head = block[0]
        if head.startswith("error: Run was aborted") or head.startswith("hint:"):
            continue
        text = head.removeprefix("error: ")
        m = _ABORTED.search(text)
        if m:
            command = int(m.group(1)) if command is None else command
            text = m.group(2)
        if first is None and 'prepared statement "P_' not in text:
            first = [text, *block[1:]]
    if first is None:
        return None
    file_line = None
    m = _FILE_LINE.match(first[0])
    if m:
        file_line, first[0] = int(m.group(1)), m.group(2)
    stmt = next((re.match(r"LINE (\d+):", ln) for ln in first if ln.startswith("LINE ")), None)
    # Only the primary message's first line: the rest (DETAIL, CONTEXT, a quoted value's
    # further lines) is what a hostile script would use to carry data out.
    message = re.sub(r"^(?:ERROR|FATAL|PANIC):\s+", "", first[0].strip())
    return _Failure(message, command, file_line, int(stmt.group(1)) if stmt else None)


def _where(sql: str, f: _Failure) -> int | None:
    if f.file_line is not None:
        return f.file_line
    if f.command is None:
        return None
    starts = command_lines(sql)
    if f.command >= len(starts):
        return None
    return starts[f.command] + (f.stmt_line - 1 if f.stmt_line else 0)


def _tables_missing(stderr: str) -> bool:
    return "could not count number of branches" in stderr or bool(_PGBENCH_TABLE.search(stderr))


def check_workload(dsn: str, workload: WorkloadIn, *, known_dsns: Iterable[str] = ()) -> list[str]:
    """Dry-run every script of ``workload`` on ``dsn``; raise PreflightError on the first failure.

    Returns notes on what was not checked (and why). The error quotes the target only as
    app/postgres/errors.py allows, with the passwords of ``dsn`` and ``known_dsns`` (the
    service's other targets) masked. A script that fails knobtune's own check (a
    ``\\shell``) is refused before anything runs, whatever its caller checked.
    """
    for i, script in enumerate(workload.scripts or []):
        try:
            check_script(script.sql)
        except ScriptError as exc:
            raise PreflightError(f"workload.scripts[{i}], {exc}") from None
    try:
        # never a role that reaches the server's host (app/postgres/roles.py)
        check_workload_role(dsn, connect_timeout=CONNECT_TIMEOUT_S)
    except WorkloadRoleError as exc:
        raise PreflightError(str(exc)) from None
    except psycopg.Error:
        pass  # unreachable now: the dry run (or the session) fails with its own message
    if workload.builtin in KNOBTUNE_BUILTINS:
        # its scripts are ours and tested; its tables exist only once prepare() loaded them
        return [f"builtin {workload.builtin}: not dry-run (knobtune's own scripts and data)"]
    try:
        pgbench = find_pgbench()
    except PgbenchError as exc:
        # The service's own installation, not the request: the session records it as
        # its error (README, Reliability), as for a pgbench that goes missing later.
        return [f"not dry-run: {exc}"]
    secrets = [pw for pw in map(password_of, [dsn, *known_dsns]) if pw]
    runs: list[tuple[str, list[str], str | None]] = []  # (label, pgbench args, script text)
    notes: list[str] = []
    if workload.builtin is not None:
        if workload.init:
            notes.append(f"builtin {workload.builtin}: not dry-run (its tables come from init)")
        else:
            runs.append((f"builtin script {workload.builtin}", ["-b", workload.builtin], None))
    if not runs and not workload.scripts:
        return notes  # nothing to dry-run: nothing connects
    try:
        env = libpq_env(dsn)
    except psycopg.Error as exc:  # the DSN's check: app/postgres/connect.py
        raise PreflightError(
            f"cannot connect to the target {mask_dsn(dsn)}: {scrub(str(exc), dsn)}"
        ) from None
    env.setdefault("PGAPPNAME", "knobtune-preflight")
    env.setdefault("PGCONNECT_TIMEOUT", str(CONNECT_TIMEOUT_S))
    with tempfile.TemporaryDirectory(prefix="knobtune-preflight-") as tmp:
        privilege.hand_over(Path(tmp))  # pgbench runs as the unprivileged user
        for i, script in enumerate(workload.scripts or []):
            path = Path(tmp) / f"script{i}.sql"
            path.write_text(script.sql if script.sql.endswith("\n") else script.sql + "\n")
            runs.append((f"workload.scripts[{i}]", ["-f", str(path)], script.sql))
        for label, args, sql in runs:
            argv = [
                pgbench,
                "-n",  # no vacuum: custom scripts' tables need not be pgbench's
                "-t",
                str(TRANSACTIONS),
                "-c",
                "1",
                "-M",
                workload.protocol,
                *args,
            ]
            try:
                res = subprocess.run(
                    argv,
                    env=env,
                    cwd=tmp,
                    capture_output=True,
                    text=True,
                    timeout=TIMEOUT_S,
                    stdin=subprocess.DEVNULL,
                    **privilege.child_kwargs(),
                )
            except subprocess.TimeoutExpired:
                notes.append(f"{label}: {TRANSACTIONS} transactions took over {TIMEOUT_S:.0f} s")
                continue
            except OSError as exc:
                raise PreflightError(f"cannot run pgbench ({pgbench}): {exc}") from None
            if res.returncode == 0:
                continue
            if workload.init and _tables_missing(res.stderr):
                notes.append(f"{label}: uses the pgbench tables, which init creates: not dry-run")
                continue
            raise PreflightError(_explain(label, sql, res.stderr, workload, dsn, secrets))
    return notes


def _explain(
    label: str,
    sql: str | None,
    stderr: str,
    workload: WorkloadIn,
    dsn: str,
    secrets: list[str],
) -> str:
    failure = _parse(stderr)
    raw = failure.message if failure else first_line(stderr.removeprefix("pgbench: "))
    said = primary_message(raw, secrets) if raw.strip() else "no message"
    if "connection to server" in raw or "could not connect" in raw:
        # never what the far end sent (app/postgres/connect.py)
        said = bounded(describe_line(raw, dsn), secrets)
        return f"cannot connect to the target {mask_dsn(dsn)}: {said}"
    where = label
    if sql is not None and failure is not None:
        line = _where(sql, failure)
        if line is not None:
            where += f", line {line}"
    if sql is None and _tables_missing(stderr):
        fix = "the pgbench tables are missing: set workload.init to true (or run pgbench -i)"
    elif "does not exist" in raw and "relation" in raw:
        fix = "create the table first or fix its name" + (
            " (workload.init is false: knobtune creates no tables)" if not workload.init else ""
        )
    elif "statement timeout" in raw:
        fix = (
            "the target's statement_timeout (from the DSN's options or the role's settings) "
            "cancels the script's statements: raise it or remove it from the DSN"
        )
    elif "permission denied" in raw:
        fix = "GRANT the target's user the privilege, or connect as a user that has it"
    elif "operator does not exist" in raw or "could not determine data type" in raw:
        fix = (
            "cast the parameter (e.g. :d::int) or use protocol 'simple', pgbench's default"
            if workload.protocol != "simple"
            else "cast the parameter, e.g. :d::int"
        )
    else:
        fix = "fix the script so that plain 'pgbench -f' runs it"
    return (
        f"preflight: {where} fails on the target (pgbench -t {TRANSACTIONS} -c 1 "
        f"-M {workload.protocol}): {said}; {fix}. Nothing on the target was changed"
    )
