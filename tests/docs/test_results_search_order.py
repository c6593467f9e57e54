"""docs/results/search-order.md's before/after of the search order (bench/search_order.py),
run small once (tests/docs/results_cmds.py): its own module, as the suite hands out whole
modules to its workers and this one runs two small sessions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.docs.blocks import command
from tests.docs.results_cmds import E2E_SMALL, run, small
from tests.helpers import ROOT


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_search_order_command_runs(tmp_path: Path) -> None:
    """bench/search_order.py as docs/results/search-order.md shows it for H1, small (on
    any host; B1's command, on profile small, is parsed: tests/docs/test_results_parse.py):
    a session searching as before issue 29 and one as now, each confirmed."""
    name, out = "results-search-order-analytic", "order-H1.json"
    # the order is noted after the baseline's two runs: 16 s held only one of TPC-H's on a
    # CI-like run (restarts and resets included), so the sessions get room for them
    run(small(command(name), tmp_path, **{**E2E_SMALL, "budget_s": "30"}), timeout=800)
    doc = json.loads((tmp_path / "bench/results" / out).read_text())
    (variants,) = doc["workloads"].values()
    assert set(variants) == {"before", "after"}
    for r in variants.values():
        assert r["trials"] >= 1
        assert r["confirmed_vs_default"]["rounds"] == 1
    # only the search as now orders the knobs from the baseline's counters
    notes = {v: " ".join(r["e2e"]["session"]["notes"]) for v, r in variants.items()}
    assert "search order from the baseline's counters" in notes["after"], notes["after"]
    assert "search order from the baseline's counters" not in notes["before"]


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
