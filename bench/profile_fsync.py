"""fdatasync latency in a sandbox's cgroup against the same disk uncapped (docs/profiles.md).

Creates one sandbox per IOPS cap (profile limits, app/postgres/cgroups.py), runs
PostgreSQL's own pg_test_fsync inside its cgroup (the launcher the postmaster starts
through), and once outside any cap, on the same disk. Prints one line per case with
pg_test_fsync's "one 8kB write" fdatasync figure. Needs root and writable cgroups.

    python bench/profile_fsync.py [--iops 1000 200] [--secs 2]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.postgres.binaries import find_bindir
from app.postgres.cgroups import Limits, launcher_argv
from app.postgres.sandbox import Sandbox
from bench.common import run_main

LINE = re.compile(r"^\s*fdatasync\s+([\d.,]+) ops/sec\s+([\d.,]+) usecs/op", re.M)


def fdatasync_ms(argv: list[str]) -> tuple[float, float]:
    """(ms per fdatasync, ops/s) from pg_test_fsync's first section (one 8kB write)."""
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True).stdout
    m = LINE.search(out)
    if m is None:
        raise SystemExit(f"no fdatasync line in pg_test_fsync's output:\n{out}")
    return float(m.group(2).replace(",", "")) / 1000, float(m.group(1).replace(",", ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iops", type=int, nargs="+", default=[1000, 200])
    ap.add_argument("--secs", type=int, default=2, help="pg_test_fsync -s (seconds per test)")
    args = ap.parse_args()
    tool = str(find_bindir() / "pg_test_fsync")
    for iops in args.iops:
        with Sandbox.create(limits=Limits(disk_iops=iops, profile=f"{iops}-iops")) as sb:
            cg = sb.cgroup
            assert cg is not None
            probe = [tool, "-f", str(sb.root / "fsync.probe"), "-s", str(args.secs)]
            ms, ops = fdatasync_ms(launcher_argv(cg.procs_files(), probe))
            print(f"capped at {iops:>5} IOPS: fdatasync {ms:7.3f} ms/op ({ops:8.1f} ops/s)")
            ms, ops = fdatasync_ms(probe)
            print(f"uncapped, same disk:   fdatasync {ms:7.3f} ms/op ({ops:8.1f} ops/s)")
    return 0


if __name__ == "__main__":
    run_main(main)
