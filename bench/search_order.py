"""Issue 29's before/after on real benches: where a short session's runs go, and the gain
it reaches, with the search as it was before issue 29 and as it is now.

    .venv/bin/python bench/search_order.py --workloads B1 --profile small --budget-s 600 \
        --duration 30 --rounds 3 --out bench/results/order-B1.json

Per workload, two sessions on fresh sandboxes, one after the other, each through
bench/e2e.py's path (a ``knobtune serve`` subprocess, the session, then the confirmation
that interleaves the default, PGTune and the session's config):

* **before**: ``search_order: catalogue`` and ``checkpoint_rule: false``, the search as it
  was: the listed order, and checkpoint knobs judged on any run;
* **after**: the defaults, the baseline's counters ordering the knobs and the checkpoint
  rule setting aside what the runs cannot show.

Printed per session: the runs each knob got, the runs on knobs that act through
checkpoints, the knobs judged and those set aside, what it kept, its own claim, and the
confirmed gain over the default (95% CI, p). Takes every option of bench/e2e.py.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import load_average, machine, run_main, shown  # noqa: E402
from bench.e2e import parse_args, parser, run_workload  # noqa: E402
from optimizer.checkpoints import CHECKPOINT_KNOBS  # noqa: E402

VARIANTS = {"before": True, "after": False}  # name -> --as-before


def where_runs_went(result: dict[str, Any]) -> dict[str, Any]:
    """A session's runs by knob (the hints' joint trial as "hints"), from bench/e2e.py's
    output, and what it judged, set aside, kept and claimed."""
    session = result["session"]
    runs: Counter[str] = Counter()
    judged: set[str] = set()
    for _index, role, knob, _tps, verdict, *_ in session["trials_list"]:
        if role != "candidate" or not knob:
            continue
        name = "hints" if knob.startswith("hints:") else knob
        if verdict != "rejected":  # a rejected candidate never ran
            runs[name] += 1
        if verdict in ("keep", "revert"):
            judged.add(name)
    set_aside = [n.split(" not judged")[0] for n in session["notes"] if " not judged:" in n]
    return {
        "trials": session["trials"],
        "runs_by_knob": dict(runs),
        "runs_on_checkpoint_knobs": sum(v for k, v in runs.items() if k in CHECKPOINT_KNOBS),
        "judged": sorted(judged),
        "set_aside": set_aside,
        "kept": session["knobs_changed"],
        "claim": session["claim"],
        "confirmed_vs_default": result["knobtune_vs_default"],
        "pgtune_vs_default": result["pgtune_vs_default"],
    }


def main() -> int:
    p = parser(__doc__)
    args = parse_args(p)
    if args.rounds == 0:
        p.error("the two searches are compared by their confirmations: give --rounds 1 or more")
    started = datetime.now(UTC)
    load_before = load_average()
    doc: dict[str, Any] = {
        "machine": machine(),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "args": {k: v for k, v in vars(args).items() if k != "as_before"},  # set per variant
        "workloads": {},
    }
    for name in args.workloads.split(","):
        doc["workloads"][name] = {}
        for variant, as_before in VARIANTS.items():
            print(f"{name}, {variant}:", file=sys.stderr)
            args.as_before = as_before
            result = run_workload(name, args, chart=f"order-{name}-{variant}-chart.svg")
            doc["workloads"][name][variant] = {"e2e": result, **where_runs_went(result)}
    doc["load_average_1m"] = {"before": load_before, "after": load_average()}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    for name, variants in doc["workloads"].items():
        for variant, r in variants.items():
            claim = r["claim"]
            print(
                f"{name} {variant}: {r['trials']} trials; runs by knob {r['runs_by_knob']}; "
                f"{r['runs_on_checkpoint_knobs']} on checkpoint knobs; set aside "
                f"{r['set_aside'] or 'none'}; kept {r['kept'] or 'nothing'}; claimed "
                f"{claim['text']} ({claim['status']}); confirmed over the default "
                f"{shown(r['confirmed_vs_default'])}; PGTune over the default "
                f"{shown(r['pgtune_vs_default'])}"
            )
    print(f"load average (1 min) {load_before} before, {doc['load_average_1m']['after']} after")
    return 0


if __name__ == "__main__":
    run_main(main)
