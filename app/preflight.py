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
from dataclasses import dataclass
from pathlib import Path

from app.postgres.dsn import libpq_env, mask_dsn, scrub
from app.postgres.pgbench import PgbenchError, find_pgbench
from app.schemas import BUILTIN_WORKLOADS, WorkloadIn

log = logging.getLogger(__name__)

TRANSACTIONS = 2
TIMEOUT_S = 30.0  # a heavy report may take a while; past this, the dry run proves nothing
_ABORTED = re.compile(r"aborted in command (\d+) query \d+: (.*)")
_PGBENCH_TABLE = re.compile(
    r'relation "(?:public\.)?pgbench_(?:accounts|branches|tellers|history)"'
)
_FILE_LINE = re.compile(r"^(?:\S+\.sql):(\d+): (.*)")


class PreflightError(Exception):
    """The workload cannot run on the target; the message says where and what to change."""


@dataclass(frozen=True)
class _Failure:
    message: str  # PostgreSQL's (or pgbench's) words, first line first
    command: int | None  # pgbench's 0-based command index in the script
    file_line: int | None  # a line pgbench named itself (meta-command syntax errors)
    stmt_line: int | None  # PostgreSQL's "LINE n:" within the statement


def command_lines(sql: str) -> list[int]:
    """The 1-based line where each pgbench command of ``sql`` starts.

    pgbench splits a script into commands: one per backslash meta-command line, one per
    SQL statement ending in ';' (outside quotes). Comments and blank lines are no command.
    """
    starts: list[int] = []
    in_sql = False
    quote: str | None = None
    continued = False
    for n, line in enumerate(sql.splitlines(), start=1):
        if continued:  # a meta-command continued with a trailing backslash
            continued = line.rstrip().endswith("\\")
            continue
        stripped = line.strip()
        if not in_sql and quote is None:
            if not stripped or stripped.startswith("--"):
                continue
            if stripped.startswith("\\"):
                starts.append(n)
                continued = stripped.endswith("\\")
                continue
        i = 0
        while i < len(line):
            ch = line[i]
            if quote is not None:
                if ch == quote:
                    quote = None
            elif ch in "'\"":
                quote = ch
            elif line.startswith("--", i):
                break
            elif ch == ";":
                in_sql = False
            elif not ch.isspace() and not in_sql:
                starts.append(n)
                in_sql = True
            i += 1
    return starts


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
    message = " ".join(" ".join(first).split())
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


def check_workload(dsn: str, workload: WorkloadIn) -> list[str]:
    """Dry-run every script of ``workload`` on ``dsn``; raise PreflightError on the first failure.

    Returns notes on what was not checked (and why).
    """
    if workload.builtin in BUILTIN_WORKLOADS:
        # its scripts are ours and tested; its tables exist only once prepare() loaded them
        return [f"builtin {workload.builtin}: not dry-run (knobtune's own scripts and data)"]
    try:
        pgbench = find_pgbench()
    except PgbenchError as exc:
        # The service's own installation, not the request: the session records it as
        # its error (README, Reliability), as for a pgbench that goes missing later.
        return [f"not dry-run: {exc}"]
    env = libpq_env(dsn)
    env.setdefault("PGAPPNAME", "knobtune-preflight")
    runs: list[tuple[str, list[str], str | None]] = []  # (label, pgbench args, script text)
    notes: list[str] = []
    if workload.builtin is not None:
        if workload.init:
            notes.append(f"builtin {workload.builtin}: not dry-run (its tables come from init)")
        else:
            runs.append((f"builtin script {workload.builtin}", ["-b", workload.builtin], None))
    with tempfile.TemporaryDirectory(prefix="knobtune-preflight-") as tmp:
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
                )
            except subprocess.TimeoutExpired:
                notes.append(f"{label}: {TRANSACTIONS} transactions took over {TIMEOUT_S:.0f} s")
                continue
            except OSError as exc:
                raise PreflightError(f"cannot run pgbench ({pgbench}): {exc}") from None
            if res.returncode == 0:
                continue
            stderr = scrub(res.stderr, dsn)
            if workload.init and _tables_missing(stderr):
                notes.append(f"{label}: uses the pgbench tables, which init creates: not dry-run")
                continue
            raise PreflightError(_explain(label, sql, stderr, workload, dsn))
    return notes


def _explain(label: str, sql: str | None, stderr: str, workload: WorkloadIn, dsn: str) -> str:
    failure = _parse(stderr)
    said = failure.message if failure else " ".join(stderr.split())[-500:] or "no message"
    if "connection to server" in said or "could not connect" in said:
        return f"cannot connect to the target {mask_dsn(dsn)}: {said}"
    where = label
    if sql is not None and failure is not None:
        line = _where(sql, failure)
        if line is not None:
            where += f", line {line}"
    if sql is None and _tables_missing(stderr):
        fix = "the pgbench tables are missing: set workload.init to true (or run pgbench -i)"
    elif "does not exist" in said and "relation" in said:
        fix = "create the table first or fix its name" + (
            " (workload.init is false: knobtune creates no tables)" if not workload.init else ""
        )
    elif "permission denied" in said:
        fix = "GRANT the target's user the privilege, or connect as a user that has it"
    elif "operator does not exist" in said or "could not determine data type" in said:
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
