"""A comparison as the CLI prints it: one line per config, its level and its gain.

From the API's JSON (``ComparisonOut``), so that ``knobtune compare --server URL`` and the
in-process CLI print the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _figure(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.1f}" if abs(x) >= 10 else f"{x:,.2f}"


def table_lines(c: Mapping[str, Any]) -> list[str]:
    """The comparison's table and what the user should know beside it."""
    request = c["request"]
    wl = request.get("workload", {})
    lines = [
        f"comparison {c['id']} on {c.get('target_name') or c['target_id']}: {c['status']}; "
        f"{request.get('rounds')} rounds of {len(c['levels'])} configs, "
        f"{wl.get('duration_s')} s runs, order shuffled per round (seed {c['seed']})"
    ]
    gains = {g["name"]: g for g in c["gains"]}
    width = max(6, *(len(x["name"]) for x in c["levels"]))
    unit = f"{c['unit']} (median)"
    lines.append(f"{'config':<{width}}  {unit:>14}  {'95% interval':>19}  vs {c['reference']}")
    for x in c["levels"]:
        low, high = x["ci95"] or (None, None)
        interval = f"{_figure(low)}-{_figure(high)}" if low is not None else "-"
        versus = "reference" if x["name"] == c["reference"] else gains[x["name"]]["text"]
        runs = f" ({x['incomplete_runs']} runs without a level)" if x["incomplete_runs"] else ""
        lines.append(
            f"{x['name']:<{width}}  {_figure(x['median']):>14}  {interval:>19}  {versus}{runs}"
        )
    for cfg in c.get("configs") or []:
        if "left out" in (cfg.get("note") or ""):  # not the whole config: say so
            lines.append(f"{cfg['name']}: {cfg['note']}")
    if c.get("error"):
        lines.append(f"error: {c['error']}")
    if c.get("restored") is True:
        lines.append("the target's settings were restored")
    elif c.get("restored") is False:
        lines.append("WARNING: the target's settings were NOT restored (see the error)")
    return lines
