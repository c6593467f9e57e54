"""What the replay player costs per statement, against pgbench and psql (issue 28).

    .venv/bin/python bench/replay_overhead.py [--statements 5000] [--sessions 1 8]

On a fresh sandbox: N trivial statements (``SELECT 1``) captured back to back in each of
S sessions, replayed at once (every statement is due at time 0 of its session, so the
player runs them as fast as it can), against ``pgbench -n -c S -t N/S`` running the same
statement (simple protocol) and, for one session, ``psql -f`` of the same N lines. Per
tool: the wall time per statement, and (player, pgbench) the mean latency each logged.
The player's overhead is its wall time per statement minus pgbench's; its latency is
measured around the libpq call, as pgbench's is.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.captures.logparse import parse_log, plan_bytes, window  # noqa: E402
from app.postgres.connect import libpq_env  # noqa: E402
from app.postgres.pgbench import find_pgbench, run_bench  # noqa: E402
from app.postgres.sandbox import Sandbox  # noqa: E402
from app.replay.plan import ReplayRun  # noqa: E402
from app.workloads.base import Script, Stream  # noqa: E402
from app.workloads.stream_run import bench_spec  # noqa: E402
from bench.common import run_main  # noqa: E402
from tests.app.replay.logs import stderr_log  # noqa: E402


def _player(dsn: str, sessions: int, n: int) -> tuple[float, float, int]:
    """(span of the statements in s, their mean latency in ms, statements logged)."""
    per = n // sessions
    text = stderr_log([[(0.0, "SELECT 1")] * per for _ in range(sessions)])
    parsed = parse_log(text)
    win = window(parsed, start_s=0.0, end_s=60.0)
    stream = Stream(
        name="replay",
        scripts=(Script("SELECT $1", "SELECT $1", 1),),
        clients=win.peak_sessions,
        replay=ReplayRun(plan_bytes(parsed, start_s=0.0, end_s=60.0), 100.0, "knobtune"),
    )
    spec = bench_spec(stream, duration_s=60, warmup_s=0)
    r = run_bench(dsn, spec)
    assert r.ok, r.error
    assert r.tx is not None
    # the statements' own span (first start to last end): without the player's start-up
    span = float((r.tx.start_s + r.tx.latency_ms / 1000).max() - r.tx.start_s.min())
    return span, float(r.tx.latency_ms.mean()), len(r.tx)


def _pgbench(dsn: str, sessions: int, n: int, tmp: Path) -> tuple[float, float]:
    script = tmp / "one.sql"
    script.write_text("SELECT 1;\n")
    argv = [find_pgbench(), "-n", "-c", str(sessions), "-j", str(sessions)]
    argv += ["-t", str(n // sessions), "-f", str(script)]
    res = subprocess.run(argv, env=libpq_env(dsn), capture_output=True, text=True, check=True)
    lat = float(next(ln for ln in res.stdout.splitlines() if ln.startswith("latency average"))
                .split("=")[1].split()[0])  # fmt: skip
    tps = float(next(ln for ln in res.stdout.splitlines() if ln.startswith("tps"))
                .split("=")[1].split()[0])  # fmt: skip
    return n / tps, lat


def _psql(sb: Sandbox, n: int, tmp: Path) -> float:
    script = tmp / "many.sql"
    script.write_text("SELECT 1;\n" * n)
    env = {**os.environ, **libpq_env(sb.bench_dsn)}
    t = time.perf_counter()
    subprocess.run(
        [str(sb.bindir / "psql"), "-X", "-q", "-o", "/dev/null", "-f", str(script)],
        env=env,
        check=True,
    )
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--statements", type=int, default=5000)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n = args.statements
    with Sandbox.create() as sb, tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        print(f"{n} x SELECT 1; load average {os.getloadavg()[0]:.1f}")
        for s in args.sessions:
            for _ in range(args.repeat):
                span, lat, logged = _player(sb.bench_dsn, s, n)
                pg_wall, pg_lat = _pgbench(sb.bench_dsn, s, n, tmp)
                line = (
                    f"sessions {s}: player {span / logged * 1e6:7.1f} us/statement "
                    f"(latency {lat * 1000:6.1f} us), pgbench {pg_wall / n * 1e6:7.1f} "
                    f"us/statement (latency {pg_lat * 1000:6.1f} us)"
                )
                if s == 1:
                    line += f", psql -f {_psql(sb, n, tmp) / n * 1e6:7.1f} us/statement"
                print(line, flush=True)


if __name__ == "__main__":
    run_main(main)
