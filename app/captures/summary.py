"""What a capture holds, in figures and in one text shared by the API, the CLI and the dashboard.

The summary is computed once from the parsed log (app/captures/logparse.py, shared with
the replay workload) and stored: duration, sessions and the most open at once, statements
and those that failed in the capture, reads / writes / other, the 20 most frequent queries
with their share of the calls and, where pg_stat_statements measured them during the
capture, their mean execution time and share of the time. Queries are shown normalized
(constants as $n), and every literal the normalization might have missed is masked again
here (:func:`mask_literals`): a summary never carries a captured value.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app.captures import logparse, sqlparse

TOP = 20
NOT_INSTALLED = "not measured: pg_stat_statements is not installed"
LITERALS = {"SCONST", "USCONST", "ICONST", "FCONST", "BCONST", "XCONST"}
COMMENTS = {"C_COMMENT", "SQL_COMMENT"}
WITHHELD = "(query text withheld: it could not be checked for literal values)"
NOT_SQL = "(not SQL: text withheld)"


class LogFormatProblem(Exception):
    """The log cannot be read as a PostgreSQL log; the message names a line, never its text."""


def parse(text: str, database: str | None) -> logparse.ParsedLog:
    """The parsed log of one database; LogFormatProblem when the text is no PostgreSQL
    log. The parser's message names a line number only."""
    try:
        return logparse.parse_log(text, database=database)
    except logparse.LogFormatError as exc:
        raise LogFormatProblem(str(exc)) from None


def databases_of(parsed: logparse.ParsedLog) -> list[str]:
    """The databases whose sessions a parsed log holds, most sessions first."""
    counts: dict[str, int] = {}
    for sess in parsed.sessions:
        if sess.database:
            counts[sess.database] = counts.get(sess.database, 0) + 1
    return sorted(counts, key=lambda d: (-counts[d], d))


# -- pg_stat_statements ----------------------------------------------------------------------
def fingerprint(sql: str, parser: sqlparse.Parser | None = None) -> str | None:
    """PostgreSQL's own fingerprint of a statement (constants ignored); None: unparsable.
    A long statement is parsed in a worker process (app/captures/sqlparse.py)."""
    return (parser or sqlparse.Parser()).fingerprint(sql)


def timing_from(rows: Iterable[tuple[str, int, float]]) -> dict[str, Any]:
    """pg_stat_statements' deltas over a capture, by fingerprint: what the summary matches
    its queries against. ``rows``: (normalized query, calls, ms); the text is not kept."""
    queries: dict[str, list[float]] = {}
    total_ms, calls = 0.0, 0
    parser = sqlparse.Parser()  # the server's texts: any of its users' statements
    for text, n, ms in rows:
        total_ms += ms
        calls += n
        fp = fingerprint(text, parser)
        if fp is None:
            continue
        acc = queries.setdefault(fp, [0, 0.0])
        acc[0] += n
        acc[1] += ms
    return {"measured": True, "total_ms": total_ms, "calls": calls, "queries": queries}


def not_measured(reason: str) -> dict[str, Any]:
    return {"measured": False, "note": f"not measured: {reason}"}


# -- the summary -------------------------------------------------------------------------------
def peak_concurrency(sessions: Iterable[Any], end_s: float) -> int:
    """The most sessions open at once (a session ending as another starts is not both)."""
    events: list[tuple[float, int]] = []
    for s in sessions:
        events.append((s.start_s, 1))
        events.append((s.end_s if s.end_s is not None else end_s, -1))
    events.sort()  # at one instant, ends (-1) before starts (+1)
    open_now = peak = 0
    for _t, step in events:
        open_now += step
        peak = max(peak, open_now)
    return peak


def build(
    parsed: logparse.ParsedLog,
    timing: dict[str, Any] | None,
    *,
    truncated: bool = False,
    window_s: float | None = None,
) -> dict[str, Any]:
    """The stored summary of a parsed log; ``timing``: :func:`timing_from` or
    :func:`not_measured` (None: an import, nothing measured). ``window_s``: a live
    capture's window (its duration), else the log's own span."""
    labels = list(parsed.labels)
    statements = parsed.statements
    total = len(statements)
    failed = sum(1 for st in statements if st.failed_in_capture)
    kinds = {"read": 0, "write": 0, "other": 0}
    for lab in labels:
        kinds[lab.kind if lab.kind in kinds else "other"] += lab.calls
    order = sorted(range(len(labels)), key=lambda i: (-labels[i].calls, labels[i].text))[:TOP]
    wanted = set(order)
    first_sql: dict[int, str] = {}
    if timing and timing.get("measured"):
        for st in statements:
            if st.label in wanted and st.label not in first_sql:
                first_sql[st.label] = st.sql
                if len(first_sql) == len(wanted):
                    break
    top: list[dict[str, Any]] = []
    parser = sqlparse.Parser()
    queries = (timing or {}).get("queries", {})
    total_ms = float((timing or {}).get("total_ms") or 0.0)
    for i in order:
        lab = labels[i]
        row: dict[str, Any] = {
            "query": mask_literals(lab.text),
            "kind": lab.kind,
            "calls": lab.calls,
            "share_calls": lab.calls / total if total else 0.0,
            "failed": lab.failed_in_capture,
            "mean_ms": None,
            "share_time": None,
        }
        fp = fingerprint(first_sql[i], parser) if i in first_sql else None
        if fp is not None and fp in queries:
            calls, ms = queries[fp]
            if calls:
                row["mean_ms"] = ms / calls
                row["share_time"] = ms / total_ms if total_ms > 0 else None
        top.append(row)
    if timing is None:
        timing_note = "not measured: an imported log carries no execution times"
    elif timing.get("measured"):
        timing_note = "mean times and shares of time from pg_stat_statements over the capture"
    else:
        timing_note = str(timing.get("note") or NOT_INSTALLED)
    duration = float(window_s if window_s is not None else parsed.duration_s)
    return {
        "started_at": parsed.started_at.isoformat() if parsed.started_at else None,
        "duration_s": duration,
        "sessions": len(parsed.sessions),
        "peak_concurrency": peak_concurrency(parsed.sessions, float(parsed.duration_s)),
        "statements": total,
        "failed_statements": failed,
        "kinds": {
            k: {"statements": n, "share": n / total if total else 0.0} for k, n in kinds.items()
        },
        "queries": len(labels),
        "top": top,
        "timing": {
            "measured": bool(timing and timing.get("measured")),
            "note": timing_note,
            "total_ms": total_ms if timing and timing.get("measured") else None,
        },
        "ignored_lines": int(parsed.ignored_lines),
        "unparsed_statements": int(parsed.unparsed_statements),
        "truncated": truncated,
    }


def render(summary: dict[str, Any] | None) -> str:
    """The summary as plain text (API, CLI, dashboard)."""
    if not summary:
        return "no summary yet"
    if "unavailable" in summary:
        return f"summary not available: {summary['unavailable']}"
    s = summary
    kinds = s["kinds"]
    lines = [
        f"duration {s['duration_s']:.0f} s; {s['sessions']:,} sessions, at most "
        f"{s['peak_concurrency']:,} open at once",
        f"{s['statements']:,} statements ({s['failed_statements']:,} failed in the capture), "
        f"{s['queries']:,} distinct queries",
        ", ".join(
            f"{name} {kinds[k]['statements']:,} ({kinds[k]['share']:.1%})"
            for k, name in (("read", "reads"), ("write", "writes"), ("other", "other"))
        ),
        f"mean times: {s['timing']['note'].removeprefix('mean times: ')}"
        if not s["timing"]["measured"]
        else "mean times: from pg_stat_statements over the capture",
    ]
    if s["top"]:
        lines.append(f"top {len(s['top'])} queries by calls:")
        lines.append(
            f"  {'calls':>9} {'share':>6} {'mean ms':>9} {'of time':>7}  {'kind':<5}  query"
        )
        for q in s["top"]:
            mean = f"{q['mean_ms']:.2f}" if q["mean_ms"] is not None else "-"
            share_t = f"{q['share_time']:.1%}" if q["share_time"] is not None else "-"
            lines.append(
                f"  {q['calls']:>9,} {q['share_calls']:>6.1%} {mean:>9} {share_t:>7}  "
                f"{q['kind']:<5}  {q['query']}"
            )
    lines.append(
        f"ignored lines: {s['ignored_lines']:,}; statements the parser could not read: "
        f"{s['unparsed_statements']:,}"
    )
    if s.get("truncated"):
        lines.append(
            "truncated: the log reached KNOBTUNE_CAPTURE_MAX_BYTES; later statements are not "
            "in the capture"
        )
    return "\n".join(lines)


# -- no literal in what is shown --------------------------------------------------------------
def mask_literals(text: str) -> str:
    """``text`` with every constant replaced by ``?`` and comments dropped, by PostgreSQL's
    own scanner. A normalized query ("... = $1") comes back as it was; text the scanner
    cannot read (cut inside a quoted string) is cut before the quote, or withheld; text
    that does not start like a statement (a psql backslash command, garbage) is withheld."""
    from pglast import parser as pg_parser  # on first use: 0.1 s at every process start

    for candidate in (text, _before_quote(text)):
        if candidate is None:
            continue
        try:
            tokens = pg_parser.scan(candidate)
        except Exception:  # noqa: S112 - its message quotes the text: never passed on
            continue
        tokens = [t for t in tokens if t.name not in COMMENTS]
        if not tokens or (tokens[0].kind == "NO_KEYWORD" and tokens[0].name != "ASCII_40"):
            return NOT_SQL  # a statement starts with a keyword (or "("): this is no SQL
        out: list[str] = []
        prev = 0
        for tok in tokens:
            if tok.start > prev and out:
                out.append(" ")
            out.append("?" if tok.name in LITERALS else candidate[tok.start : tok.end + 1])
            prev = tok.end + 1
        masked = "".join(out)
        return masked + (" …" if candidate is not text else "")
    return WITHHELD


def _before_quote(text: str) -> str | None:
    cut = [i for i in (text.find("'"), text.find('"'), _dollar(text)) if i >= 0]
    return text[: min(cut)].rstrip() if cut else None


def _dollar(text: str) -> int:
    """Where a dollar quote ($$ or $tag$) starts, -1 if none ($1 is a parameter)."""
    i = text.find("$")
    while i >= 0:
        nxt = text[i + 1 : i + 2]
        if not nxt.isdigit():
            return i
        i = text.find("$", i + 1)
    return -1
