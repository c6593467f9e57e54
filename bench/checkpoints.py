"""Issue 29's 15-minute TPC-B session, simulated: where a short budget goes with and without
the checkpoint rule and the counters' search order (optimizer/checkpoints.py, order.py).

Run: ``.venv/bin/python bench/checkpoints.py [--seeds 20]``. Prints one JSON document.

The surface is the capped server of issue 29 as its 30 s runs saw it: shared_buffers
worth +30% up to the working set, every WAL and checkpoint knob flat (no checkpoint fell
inside a run, so none could show anything), in the catalogue's write-heavy order
(max_wal_size, wal_compression and checkpoint_timeout first). The runs report what such a
server's counters say: 3 MB/s of WAL, no checkpoint, a fifth of the blocks read from
outside shared_buffers. Each session has 20 runs of 28 s (a 10-minute budget of 30 s
runs), no hints; simulated noise as in bench/optimizer.py. Per variant, over the seeds:
the median runs spent on checkpoint knobs, the share of sessions that measured
shared_buffers, and the median true gain of the recommended config over the start.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optimizer.catalogue import GB, MB, Hardware, default_knobs  # noqa: E402
from optimizer.checkpoints import CHECKPOINT_KNOBS  # noqa: E402
from optimizer.counters import ServerCounters  # noqa: E402
from optimizer.descent import CoordinateDescent  # noqa: E402
from optimizer.settings import DescentSettings  # noqa: E402
from tests.optimizer.sim import Bench, Noise, Surface, Term, sat  # noqa: E402

WINDOW_S = 28.0
RUNS = 20


def capped_tpcb() -> Surface:
    names = tuple(default_knobs("write-heavy"))
    start = {"shared_buffers": "128MB", "max_wal_size": "1GB", "wal_compression": "off",
             "checkpoint_timeout": "5min", "checkpoint_completion_target": "0.9",
             "min_wal_size": "80MB", "wal_buffers": "-1",
             "bgwriter_lru_maxpages": "100"}  # fmt: skip
    return Surface(
        name="capped-tpcb",
        hardware=Hardware(ram_bytes=2 * GB, cpus=2),
        names=names,
        start=start,
        base=800.0,
        terms=(Term(("shared_buffers",),
                    lambda sb: 1 + 0.3 * sat(float(sb) * 8192, 256 * MB, 0.8)),),
    )  # fmt: skip


COUNTERS = ServerCounters(
    seconds=WINDOW_S, wal_bytes=3 * MB * WINDOW_S, wal_fpi=100.0, wal_records=1000.0,
    checkpoints_timed=0.0, checkpoints_req=0.0, buffers_checkpoint=0.0, buffers_clean=0.0,
    buffers_backend=500.0, blks_read=2000.0, blks_hit=8000.0, temp_files=0.0, temp_bytes=0.0,
)  # fmt: skip


def session(surface: Surface, settings: DescentSettings, seed: int) -> dict[str, Any]:
    opt = CoordinateDescent(surface.space, surface.start, settings)
    bench = Bench(Noise(seconds=int(WINDOW_S)), seed)
    on_ckpt = 0
    sb_runs = 0
    while (cand := opt.suggest()) is not None:
        m = replace(bench.measure(surface.true(cand.config)), counters=COUNTERS)
        opt.register(cand, m)
        about = cand.knob
        on_ckpt += about in CHECKPOINT_KNOBS
        sb_runs += about == "shared_buffers"
    gain = surface.true(opt.incumbent) / surface.true(surface.start) - 1
    return {"checkpoint_runs": on_ckpt, "shared_buffers_runs": sb_runs, "gain": gain,
            "set_aside": sorted(opt.set_aside), "claim": opt.claim}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seeds", type=int, default=20)
    args = p.parse_args()
    surface = capped_tpcb()
    base = DescentSettings(max_trials=RUNS, run_seconds=WINDOW_S, warmup_seconds=2)
    variants = {
        "before (fixed order, no rule)": replace(
            base, checkpoint_rule=False, order_by_counters=False
        ),
        "rule only": replace(base, order_by_counters=False),
        "order only": replace(base, checkpoint_rule=False),
        "rule and order (default)": base,
    }
    out: dict[str, Any] = {"surface": surface.name, "runs": RUNS, "window_s": WINDOW_S}
    for name, settings in variants.items():
        rows = [session(surface, settings, seed) for seed in range(args.seeds)]
        n = len(rows)
        out[name] = {
            "median_runs_on_checkpoint_knobs":
                statistics.median(r["checkpoint_runs"] for r in rows),
            "sessions_that_measured_shared_buffers":
                sum(r["shared_buffers_runs"] > 0 for r in rows) / n,
            "median_true_gain": round(statistics.median(r["gain"] for r in rows), 3),
            "sessions_with_a_gain_over_10pct": sum(r["gain"] > 0.10 for r in rows) / n,
            "set_aside": rows[0]["set_aside"],
        }  # fmt: skip
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
