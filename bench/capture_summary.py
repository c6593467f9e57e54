"""How long a capture's summary takes on a big log (issue 28: a 50 MB log, in seconds).

    .venv/bin/python bench/capture_summary.py [--mb 50]

Writes a synthetic server log of about ``--mb`` MB in the capture's format (prefix
``%m|%u|%d|%c|``, 64 sessions at once, a TPC-B-like mix sent with the extended protocol:
a ``LOG: execute`` line and a ``DETAIL: parameters`` line per statement), then times the
parse (app/captures/logparse.py) and the summary (app/captures/summary.py) on it, the way
an import runs them, and the process's peak memory. Prints one line per step.
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app import vault  # noqa: E402
from app.captures import store, summary  # noqa: E402

MIX = [
    ("UPDATE pgbench_accounts SET abalance = abalance + $1 WHERE aid = $2", 2),
    ("SELECT abalance FROM pgbench_accounts WHERE aid = $1", 1),
    ("UPDATE pgbench_tellers SET tbalance = tbalance + $1 WHERE tid = $2", 2),
    ("UPDATE pgbench_branches SET bbalance = bbalance + $1 WHERE bid = $2", 2),
    (
        "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) "
        "VALUES ($1, $2, $3, $4, CURRENT_TIMESTAMP)",
        4,
    ),
]


def synthetic_log(mb: float, sessions: int = 64, seed: int = 1) -> str:
    rnd = random.Random(seed)
    out: list[str] = []
    size = 0
    ms = 0
    keys = [f"6b0a{i:04x}.{0x1000 + i:x}" for i in range(sessions)]
    for key in keys:
        out.append(
            f"2026-11-27 10:00:00.000 UTC|app|shop|{key}|LOG:  connection authorized: "
            "user=app database=shop\n"
        )
    while size < mb * 1e6:
        key = keys[rnd.randrange(sessions)]
        ms += 1
        hh, mm, ss = 10 + ms // 3_600_000, ms // 60_000 % 60, ms // 1000 % 60
        stamp = f"2026-11-27 {hh:02d}:{mm:02d}:{ss:02d}.{ms % 1000:03d} UTC"
        for sql, n in [("BEGIN", 0), *MIX, ("END", 0)]:
            line = f"{stamp}|app|shop|{key}|LOG:  execute <unnamed>: {sql}\n"
            if n:
                params = ", ".join(f"${i} = '{rnd.randrange(1, 10**6)}'" for i in range(1, n + 1))
                line += f"{stamp}|app|shop|{key}|DETAIL:  parameters: {params}\n"
            out.append(line)
            size += len(line)
    for key in keys:
        out.append(
            f"2026-11-27 11:00:00.000 UTC|app|shop|{key}|LOG:  disconnection: "
            "session time: 1:00:00.000 user=app database=shop host=[local]\n"
        )
    return "".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=50.0, help="size of the log, in MB (default 50)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    text = synthetic_log(args.mb)
    t1 = time.perf_counter()
    print(
        f"log: {len(text.encode()) / 1e6:.1f} MB, {text.count(chr(10)):,} lines, "
        f"written in {t1 - t0:.1f} s"
    )
    before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t1 = time.perf_counter()
    parsed = summary.parse(text, "shop")
    t2 = time.perf_counter()
    # as a live capture's: pg_stat_statements' figures matched by fingerprint
    timing = summary.timing_from((sql, 1000, 50.0) for sql, _n in MIX)
    result = summary.build(parsed, timing)
    t3 = time.perf_counter()
    rendered = summary.render(result)
    t4 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        vault.configure(None, Path(tmp))
        stored = store.write_log(Path(tmp), 1, text)
    t5 = time.perf_counter()
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        f"parse: {t2 - t1:.1f} s: {len(parsed.statements):,} statements, "
        f"{len(parsed.sessions)} sessions"
    )
    print(
        f"peak memory: {peak_kb / 1024:.0f} MB ({before_kb / 1024:.0f} MB with the log "
        f"written, before parsing)"
    )
    print(f"summary: {t3 - t2:.2f} s (build), {t4 - t3:.3f} s (text)")
    print(f"stored (gzip, encrypted): {t5 - t4:.1f} s, {stored / 1e6:.1f} MB")
    print(rendered.splitlines()[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
