"""docs/results/search-order.md's before/after of the search order (bench/search_order.py),
run small once (tests/docs/results_cmds.py). Each of its two sessions is bench/e2e.py's
path (load, settle, a session through the service, the confirmation's rounds), so this
one run is also the small run of bench/e2e.py, the script of every results page's e2e
command: those commands (W1 and W2, TPC-B B1 and D1, TPC-C C1 and C2, TPC-H H1,
CH-benCHmark CH1) differ from it in numbers, workloads and flags and are parsed by the
script's parser (tests/docs/test_results_parse.py); the workloads themselves are tested
in tests/app/workloads/. (A test of its own ran e2e.py's path a third time.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.postgres.cgroups import CGROUP_ROOT
from tests.docs.blocks import command
from tests.docs.results_cmds import E2E_SMALL, run, small
from tests.helpers import NO_CGROUPS, ROOT


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_search_order_command_runs(tmp_path: Path) -> None:
    """bench/search_order.py as docs/results/search-order.md shows it for B1 on profile
    small, small (sessions of 5 runs of 2 s, no final check, one round of three configs,
    each in the cgroup), settled first as the C2 pages' commands are (one 2 s run); where
    the host has no cgroups, its H1 command. A session searching as before issue 29 and
    one as now, each confirmed. --small runs TPC-B's pgbench at 100 tps (-R) throughout,
    the settle, the sessions and the confirmations: nothing here asserts a level."""
    if NO_CGROUPS is None:
        name, out = "results-search-order", "order-B1.json"
    else:
        name, out = "results-search-order-analytic", "order-H1.json"
    # The order is noted after the baseline's two runs. A budget in seconds ended on a
    # loaded host after one run (a 16 s budget; on TPC-H, 30 s): each session gets the
    # fewest trials it may (baseline 2, a first evaluation 3, no final check: the
    # confirmation's round follows), which hold the baseline however slow the host, and a
    # wall budget that never decides.
    options = {**E2E_SMALL, "max_trials": "5", "final_check_runs": "0", "budget_s": "600",
               "settle_s": "2"}  # fmt: skip
    run(small(command(name), tmp_path, **options), timeout=800)
    doc = json.loads((tmp_path / "bench/results" / out).read_text())
    (variants,) = doc["workloads"].values()
    assert set(variants) == {"before", "after"}
    for r in variants.values():
        assert r["trials"] >= 2  # the baseline's, whatever the host's load
        assert r["confirmed_vs_default"]["rounds"] == 1
        _e2e(r["e2e"])
    # only the search as now orders the knobs from the baseline's counters
    notes = {v: " ".join(r["e2e"]["session"]["notes"]) for v, r in variants.items()}
    assert "search order from the baseline's counters" in notes["after"], notes["after"]
    assert "search order from the baseline's counters" not in notes["before"]


def _e2e(result: dict[str, Any]) -> None:
    """What bench/e2e.py's path recorded for one session: the settle, the session, the
    confirmation and, on a profile, the server inside its cgroup throughout."""
    # the server ran the workload before the session (--settle-s), its level recorded
    assert result["data"]["settle_tps"][0] > 0, result["data"]
    assert result["session"]["trials"] >= 1, result["session"]
    assert set(result["confirmation"]) >= {"default", "pgtune", "knobtune"}, result
    if NO_CGROUPS is not None:
        return
    # the server ran in the profile's cgroup through the session and the confirmation,
    # and the cgroup went with the sandbox
    inside = result["server_in_cgroup"]
    assert inside["after_session"]["all_inside"], inside
    assert inside["after_confirmation"]["all_inside"], inside
    name = inside["after_session"]["cgroup"]
    assert not [c for c in ("memory", "blkio", "cpu") if (CGROUP_ROOT / c / name).exists()]
    # the target and PGTune's config were sized for the profile, not the host
    limits = result["profile"]["limits"]
    assert result["session"]["target"]["ram_bytes"] == limits["memory_bytes"]
    assert result["pgtune_hardware"]["ram_bytes"] == limits["memory_bytes"]


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


@pytest.mark.parametrize("out", ["order-B1.json", "order-H1.json"])
def test_the_page_states_what_the_recorded_runs_measured(out: str) -> None:
    """The page's per-variant figures are the recorded output's, not typed by hand."""
    page = (ROOT / "docs/results/search-order.md").read_text()
    doc = json.loads((ROOT / "bench/results" / out).read_text())
    (variants,) = doc["workloads"].values()
    # one table for both workloads: the row holds each variant's count
    (row,) = [x for x in page.splitlines() if x.startswith("| trials in 600 s |")]
    for r in variants.values():
        assert f"| {r['trials']} |" in row, (out, row)
    for r in variants.values():
        conf = r["confirmed_vs_default"]
        assert _pct(conf["gain"]) in page, (out, conf)
        assert f"p={conf['p_value']:.2g}" in page, (out, conf)
    if out == "order-H1.json":
        # the order's one effect: which knob the budget left after the hints went to
        assert variants["before"]["judged"] == ["work_mem"]
        assert variants["after"]["judged"] == ["effective_io_concurrency"]
        assert variants["before"]["kept"] == variants["after"]["kept"]
