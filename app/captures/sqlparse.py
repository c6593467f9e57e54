"""PostgreSQL's parser for captured statements, where a statement cannot crash the service.

pglast hands a statement to libpg_query (PostgreSQL's parser, in C) and builds Python
objects from its tree by recursing in C. A left-deep tree overflows the stack: a 120 KB
``CREATE VIEW v AS SELECT 1+1+...`` (60,000 terms) made the service process exit with
SIGSEGV, and any user of a captured server can run such a statement during a capture.
Measured on pglast 8.8 (8 MB stacks, main thread or not): ``parse_sql`` crashes from
about 24,000 nested ``+`` (48 KB of text) or 15,000 ``UNION`` (230 KB); parenthesised
nesting ends at 10,000 levels with a ParseError (bison's stack), and
``fingerprint``/``normalize`` did not crash up to 400,000 terms.

So a statement is parsed in this process only when it is short: at most
``IN_PROCESS_MAX_CHARS`` characters, so at most half as many levels of any nesting (two
characters a level at least: ``1+``), a twelfth of the shortest chain that crashed. A
longer one goes to a long-lived worker process (``python -m app.captures.sqlparse``)
with no core dumps and an address-space limit, one statement per request,
``WORKER_TIMEOUT_S`` each: if the worker dies or hangs, that statement is unparsed and
the next long one starts a new worker. A statement over ``MAX_CHARS``, or any long one
after ``MAX_WORKER_DEATHS`` deaths within one log, is unparsed without trying. Unparsed
is what the parser's own refusals always were: the statement gets an "unparsed statement
<hash>" label, kind ``other``, and is counted in ``unparsed_statements``.

Cost, measured on the shared 2-core dev box at load 8-10 (10,000-20,000 distinct
statements of about 70 characters, logparse's labelling, 4 runs): 212-485 us a statement
in this process, where the unguarded calls took 195-283 us in the same runs; 417-1149 us
when every statement went to the worker (two round trips of JSON over pipes each), about
twice the in-process cost. So only long statements, rare in a capture, pay the trip; a
log of many equal statements parses each shape once either way.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

IN_PROCESS_MAX_CHARS = 4_000
MAX_CHARS = 1_000_000
WORKER_TIMEOUT_S = 10.0
WORKER_MEMORY_BYTES = 2 << 30  # the worker's address space (RLIMIT_AS)
MAX_WORKER_DEATHS = 3

LABEL_MAX = 120  # characters of a label's text ("..." at the end when cut)
Kind = Literal["read", "write", "other"]
Op = Literal["fingerprint", "describe"]


# -- what is computed (in this process for short statements, in the worker otherwise) -----
_CONSTS = {"SCONST", "ICONST", "FCONST", "BCONST", "XCONST", "USCONST"}
_COMMENTS = {"SQL_COMMENT", "C_COMMENT"}
_PARAM_REF = re.compile(r"\$(\d+)")


def label_text(sql: str) -> str:
    """The label of a parsable statement: normalized, every constant a $n, no comment,
    white space collapsed, at most LABEL_MAX characters. Raises pglast's ParseError.
    Calls the C parser unguarded: captured text goes through :func:`describe`."""
    from pglast import parser as pg

    norm = pg.normalize(sql)
    raw = norm.encode()
    n = max((int(x) for x in _PARAM_REF.findall(norm)), default=0)
    parts: list[bytes] = []
    last = 0
    for tok in pg.scan(norm):  # offsets in bytes, end inclusive
        if tok.name in _CONSTS:
            n += 1
            parts += [raw[last : tok.start], f"${n}".encode()]
            last = tok.end + 1
        elif tok.name in _COMMENTS:
            parts += [raw[last : tok.start], b" "]
            last = tok.end + 1
    parts.append(raw[last:])
    text = " ".join(b"".join(parts).decode(errors="replace").split())
    return cut(text[:-1].rstrip() if text.endswith(";") else text)


def cut(text: str) -> str:
    return text if len(text) <= LABEL_MAX else text[: LABEL_MAX - 3].rstrip() + "..."


_READ = {"SelectStmt", "VariableShowStmt", "FetchStmt", "DeclareCursorStmt"}
_OTHER = {
    "TransactionStmt",
    "VariableSetStmt",
    "DiscardStmt",
    "PrepareStmt",
    "ExecuteStmt",
    "DeallocateStmt",
    "LockStmt",
    "ListenStmt",
    "NotifyStmt",
    "UnlistenStmt",
    "ClosePortalStmt",
    "CheckPointStmt",
    "LoadStmt",
    "ConstraintsSetStmt",
}
_DML = {"InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt"}


def _stmt_kind(node: object) -> Kind:
    name = type(node).__name__
    if name == "ExplainStmt":
        analyze = any(
            getattr(o, "defname", None) == "analyze"
            and getattr(getattr(o, "arg", None), "sval", "true") not in ("false", "off", "0")
            and getattr(getattr(o, "arg", None), "boolval", True) is not False
            for o in (getattr(node, "options", None) or ())
        )
        return _stmt_kind(getattr(node, "query", None)) if analyze else "read"
    if name == "SelectStmt":
        if getattr(node, "intoClause", None) is not None:
            return "write"  # SELECT INTO creates a table
        return "write" if _modifying_cte(node) else "read"
    if name == "DeclareCursorStmt":
        return _stmt_kind(getattr(node, "query", None))
    if name == "CopyStmt":
        return "write" if getattr(node, "is_from", False) else "read"
    if name in _READ:
        return "read"
    if name in _OTHER:
        return "other"
    return "write"  # DML, DDL, CALL, DO: they change data or schema


def _modifying_cte(node: object) -> bool:
    """Whether a SELECT (its UNION arms and CTEs included) holds a data-modifying CTE.
    Iterative: a UNION of thousands of arms is as deep as it is long."""
    todo = [node]
    while todo:
        cur = todo.pop()
        todo += [s for s in (getattr(cur, "larg", None), getattr(cur, "rarg", None)) if s]
        with_clause = getattr(cur, "withClause", None)
        for cte in getattr(with_clause, "ctes", None) or ():
            q = getattr(cte, "ctequery", None)
            if type(q).__name__ in _DML:
                return True
            if type(q).__name__ == "SelectStmt":
                todo.append(q)
    return False


def statement_kind_unguarded(sql: str) -> Kind:
    """read, write or other (SELECT ... FOR UPDATE reads). Raises ParseError."""
    from pglast import parser as pg

    kinds = {_stmt_kind(s.stmt) for s in pg.parse_sql(sql) or ()}
    if "write" in kinds:
        return "write"
    return "read" if "read" in kinds else "other"


def _compute(op: Op, sql: str) -> Any:
    """fingerprint: its text; describe: [label, kind]; None when the parser refuses."""
    from pglast import parser as pg

    try:
        if op == "fingerprint":
            return str(pg.fingerprint(sql))
        return [label_text(sql), statement_kind_unguarded(sql)]
    except Exception:  # ParseError (its message quotes the statement), RecursionError...
        return None


# -- the guard ---------------------------------------------------------------------------
class _Worker:
    """The child process that parses long statements; one for the service, made on demand."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()

    def _start(self) -> subprocess.Popen[bytes]:
        # a clean environment (no token, key or DSN of the service's); app importable
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        return subprocess.Popen(
            [sys.executable, "-m", "app.captures.sqlparse", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd="/",
            env=env,
            start_new_session=True,  # a Ctrl-C of the service's terminal is not its
        )

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
            for f in (proc.stdin, proc.stdout):
                if f is not None:
                    with contextlib.suppress(OSError):
                        f.close()

    def ask(self, op: Op, sql: str, timeout_s: float) -> tuple[bool, Any]:
        """(answered, result); (False, None) when the worker died or took too long."""
        with self.lock:
            try:
                if self.proc is None or self.proc.poll() is not None:
                    self.stop()
                    self.proc = self._start()
                proc = self.proc
                assert proc.stdin is not None
                assert proc.stdout is not None
                proc.stdin.write(json.dumps([op, sql]).encode() + b"\n")
                proc.stdin.flush()
                line = _read_line(proc.stdout.fileno(), time.monotonic() + timeout_s)
            except (OSError, ValueError):
                line = None
            if line is None:
                self.stop()
                return False, None
            try:
                return True, json.loads(line)
            except ValueError:
                self.stop()
                return False, None


def _read_line(fd: int, deadline: float) -> bytes | None:
    """One line from ``fd`` by ``deadline``; None at its end or past the deadline."""
    buf = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return None
        buf += chunk
        if buf.endswith(b"\n"):  # one request, one answer: nothing follows its newline
            return bytes(buf)


_worker = _Worker()
atexit.register(_worker.stop)


class Parser:
    """One log's parsing: short statements here, long ones in the worker, a budget of
    worker deaths (see the module docstring). Never raises for a statement."""

    def __init__(self) -> None:
        self.deaths = 0
        self._warned = False

    def _run(self, op: Op, sql: str) -> Any:
        if len(sql) <= IN_PROCESS_MAX_CHARS:
            return _compute(op, sql)
        if len(sql) > MAX_CHARS or self.deaths >= MAX_WORKER_DEATHS:
            return None
        answered, result = _worker.ask(op, sql, WORKER_TIMEOUT_S)
        if not answered:
            self.deaths += 1
            log.warning(
                "the SQL parser's worker died or timed out on a statement of %d characters "
                "(%d of %d allowed in this log): left unparsed",
                len(sql),
                self.deaths,
                MAX_WORKER_DEATHS,
            )
        return result

    def fingerprint(self, sql: str) -> str | None:
        """PostgreSQL's fingerprint of ``sql`` (constants ignored); None: unparsed."""
        got = self._run("fingerprint", sql)
        return got if isinstance(got, str) else None

    def describe(self, sql: str) -> tuple[str, Kind] | None:
        """``sql``'s label text and kind; None: unparsed."""
        got = self._run("describe", sql)
        if isinstance(got, list) and len(got) == 2 and got[1] in ("read", "write", "other"):
            return str(got[0]), got[1]
        return None


def fingerprint(sql: str) -> str | None:
    return Parser().fingerprint(sql)


def describe(sql: str) -> tuple[str, Kind] | None:
    return Parser().describe(sql)


# -- the worker's side -------------------------------------------------------------------
def _worker_main() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file behind
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    from pglast import parser  # noqa: F401 - loaded before the first request

    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        try:
            op, sql = json.loads(line)
            result = _compute(op, sql) if op in ("fingerprint", "describe") else None
        except (ValueError, TypeError):
            result = None
        out.write(json.dumps(result).encode() + b"\n")
        out.flush()


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    _worker_main()
