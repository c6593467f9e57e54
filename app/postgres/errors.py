"""How much of a target's error text knobtune passes on to an API caller.

What is shown, and why
----------------------
A workload script runs on the target with the privileges of the target's DSN: that is
what a benchmark is. So a script can put what that user may read into an error
message: ``SELECT pg_read_file('/etc/passwd')::int`` fails with the file quoted in
the message, ``COPY t FROM PROGRAM 'id'`` with the program's output, and on a server
that can read the service's files, with another target's stored password. An error
is the only way such a value gets back to the caller (pgbench discards results), so
the error is where the amount that gets back is limited.

What the caller needs to fix a script is PostgreSQL's *primary message* ("relation
"orders" does not exist", "permission denied for table secret", "operator does not
exist: date <= integer"), its SQLSTATE where the client saw one (pgbench does not
print it), and where in the script it failed (knobtune works the line out itself). So:

* only the first line of the primary message is kept; DETAIL, HINT, CONTEXT, QUERY
  and LINE text are dropped (COPY's CONTEXT repeats the row, LINE repeats the query,
  which the caller already has);
* a quoted value in it is cut to :data:`MAX_QUOTED` characters (identifiers have at
  most 63, so names stay whole);
* the whole message is cut to :data:`MAX_MESSAGE` characters;
* every password knobtune knows (the target's own, and the others' where the caller
  passes them) is masked, in plain text and in hex (bytea's output form), and so is
  anything shaped like ``password=...`` or ``user:password@`` (a DSN read from a file).

This bounds the leak, it does not close it: a caller who may run scripts on a target
can still read up to :data:`MAX_QUOTED` characters of what the target's user may read
per failed request. What closes it is who may call the API (the token) and what the
target's user may read (the sandboxes' own passwords and privileges).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from app.postgres.dsn import MASK

MAX_MESSAGE = 200
MAX_QUOTED = 64

_SEVERITY = re.compile(r"^\s*(?:ERROR|FATAL|PANIC|WARNING):\s+")
_PASSWORD_KV = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.|'')*'?|\S+)", re.IGNORECASE)
_USERINFO = re.compile(r"(://[^\s:/@]*):[^\s@/]*@")
_QUOTED = re.compile(r'"([^"]*)("?)')


def first_line(text: str) -> str:
    """The first non-empty line of ``text`` (``\\r`` ends a line too)."""
    for line in re.split(r"[\r\n]", text):
        if line.strip():
            return line
    return ""


def scrub_secrets(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each secret (and its hex form) and password-shaped text masked."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
        text = re.sub(re.escape(secret.encode().hex()), MASK, text, flags=re.IGNORECASE)
    text = _PASSWORD_KV.sub(lambda m: m.group(1) + MASK, text)
    return _USERINFO.sub(lambda m: f"{m.group(1)}:{MASK}@", text)


def bounded(text: str, secrets: Iterable[str] = ()) -> str:
    """One line of a target's (or pgbench's) message, as much as may be shown.

    ``text``'s first line, scrubbed of ``secrets``, each quoted value cut to
    MAX_QUOTED characters and the whole to MAX_MESSAGE.
    """
    line = scrub_secrets(first_line(text), secrets)

    def cut(m: re.Match[str]) -> str:
        value, closing = m.group(1), m.group(2)
        if len(value) > MAX_QUOTED:
            return f'"{value[:MAX_QUOTED]}..."'
        return f'"{value}{closing}'

    line = " ".join(_QUOTED.sub(cut, line).split())
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 3] + "..."


def primary_message(text: str, secrets: Iterable[str] = ()) -> str:
    """PostgreSQL's primary message in ``text`` ("ERROR:  ..." first line), bounded."""
    return bounded(_SEVERITY.sub("", first_line(text)), secrets)
