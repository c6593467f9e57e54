"""Captured logs written by hand, in PostgreSQL's stderr format with the capture's prefix
('%m|%u|%d|%c|', lc_messages C): exact times for the replay's tests (a real server's log
is what tests/app/captures/test_logparse.py reads)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

T0 = datetime(2026, 11, 20, 9, 30, 0, tzinfo=UTC)

# one captured statement: (seconds, sql), or (seconds, sql, params, prepared name) for the
# extended protocol (params: text or None; name None: the unnamed statement)
Captured = tuple[float, str] | tuple[float, str, Sequence[str | None], str | None]


def _ts(t: float) -> str:
    return (T0 + timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _text(s: str) -> str:
    return s.replace("\n", "\n\t")


def _params(values: Sequence[str | None]) -> str:
    return ", ".join(
        f"${i} = NULL" if v is None else f"${i} = '" + v.replace("'", "''") + "'"
        for i, v in enumerate(values, start=1)
    )


def stderr_log(
    sessions: Sequence[Sequence[Captured]],
    *,
    user: str = "app",
    database: str = "shop",
    failed: Sequence[tuple[int, int]] = (),
    starts: Sequence[float] | None = None,
    ends: Sequence[float | None] | None = None,
) -> str:
    """A log of ``sessions`` (each its statements in order). ``failed``: (session,
    statement) pairs that failed in the capture (an ERROR and its STATEMENT follow)."""
    lines: list[tuple[float, int, str]] = []  # (time, order, line)
    n = 0

    def add(t: float, line: str) -> None:
        nonlocal n
        lines.append((t, n, line))
        n += 1

    bad = set(failed)
    for i, stmts in enumerate(sessions):
        sid = f"6b1e{i:04x}.{1000 + i:x}"
        head = f"{user}|{database}|{sid}|"
        start = starts[i] if starts is not None else (stmts[0][0] - 0.01 if stmts else 0.0)
        received = "LOG:  connection received: host=[local]"
        add(start, f"{_ts(start)}|[unknown]|[unknown]|{sid}|{received}")
        authorized = f"LOG:  connection authorized: user={user} database={database}"
        add(start, f"{_ts(start)}|{head}{authorized}")
        last = start
        for j, st in enumerate(stmts):
            t, sql = st[0], st[1]
            if len(st) == 4:
                name = st[3] or "<unnamed>"
                add(t, f"{_ts(t)}|{head}LOG:  execute {name}: {_text(sql)}")
                add(t, f"{_ts(t)}|{head}DETAIL:  parameters: {_text(_params(st[2]))}")
            else:
                add(t, f"{_ts(t)}|{head}LOG:  statement: {_text(sql)}")
            if (i, j) in bad:
                add(t, f'{_ts(t)}|{head}ERROR:  relation "nosuch" does not exist')
                add(t, f"{_ts(t)}|{head}STATEMENT:  {_text(sql)}")
            last = t
        end = ends[i] if ends is not None else last + 0.01
        if end is not None:
            add(
                end,
                f"{_ts(end)}|{head}LOG:  disconnection: session time: 0:00:01.000 "
                f"user={user} database={database} host=[local]",
            )
    # the server writes messages as they happen: sessions interleave by time
    return "\n".join(line for _, _, line in sorted(lines)) + "\n"
