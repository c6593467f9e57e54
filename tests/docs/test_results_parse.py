"""Every command of docs/results/ that runs a bench script (or the suite) parses against
that script's own argparse parser (tests/docs/results_cmds.py: parse): an option renamed,
removed or given a bad value fails here, in a second, not after a 30-minute run.

Running each at its smallest size took a third of the suite's time, and its commands of
one script mostly differ in numbers. So ONE test per script runs its shared path small
(test_results_steady.py, test_results_search_order.py: bench/e2e.py's path in both its
sessions, test_results_captures.py, test_results_commands.py, test_results_quality.py,
test_results_duet.py) and every command is parsed here; a page's figures come only from
its full-size runs."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from bench.e2e import WORKLOADS
from tests.docs.blocks import blocks_of, command
from tests.docs.results_cmds import parse
from tests.helpers import ROOT


def _configs(text: str) -> dict[str, dict[str, str]]:
    """A --compare / --configs value: JSON {"label": {knob: value}}."""
    doc = json.loads(text)
    assert isinstance(doc, dict), text
    for label, config in doc.items():
        assert isinstance(config, dict), (label, config)
        assert all(isinstance(v, str) for v in config.values()), (label, config)
    return doc


@pytest.mark.parametrize(
    "name",
    [
        # bench/e2e.py (test_results_search_order.py runs its path: two sessions)
        "results-e2e",
        "results-tpcb-b1-small",
        "results-tpcb-b2-headroom",
        "results-tpcb-b2-micro",
        "results-tpcb-d1-disk",
        "results-tpch-h1",
        "results-chbench-ch1",
        "results-tpcc-c1",
        "results-tpcc-c1-compare",
        "results-tpcc-c2-headroom",
        "results-tpcc-c2-small",
        # bench/steady_state.py (test_results_steady.py runs D1)
        "results-tpcb-d1-steady",
        # bench/search_order.py (test_results_search_order.py runs B1, or H1)
        "results-search-order",
        "results-search-order-analytic",
        # bench/capture_overhead.py, bench/replay_fidelity.py (test_results_captures.py)
        "results-capture-overhead",
        "results-capture-overhead-small",
        "results-replay-fidelity",
        # each run small by test_results_commands.py or test_results_quality.py
        "results-sweep",
        "results-long-queries",
        "results-api-load",
        "results-search-quality",
        "results-neighbour",
        "results-faults",
        # bench/duet.py (test_results_duet.py runs it small)
        "results-duet",
    ],
)
def test_the_command_parses(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # e2e.py's checks make --out's folder
    lines = [x for x in command(name).splitlines() if "bench/" in x]
    assert lines, f"{name} runs no bench script"
    for line in lines:
        script, args = parse(line)
        for option in ("compare", "configs"):
            if getattr(args, option, None) is not None:
                _configs(getattr(args, option))
        if script in ("bench/e2e.py", "bench/search_order.py", "bench/steady_state.py"):
            unknown = set(args.workloads.split(",")) - set(WORKLOADS)
            assert not unknown, f"{name}: no workload {sorted(unknown)} in bench/e2e.py"
        assert "--small" not in shlex.split(line), f"{name}: a page shows a full-size run"


def test_every_results_command_is_parsed() -> None:
    """A command added to a results page is parsed too (not only run, or neither)."""
    (mark,) = test_the_command_parses.pytestmark  # type: ignore[attr-defined]
    listed = set(mark.args[1])
    shown = {
        b.name
        for page in sorted((ROOT / "docs/results").glob("*.md"))
        for b in blocks_of(page)
        if b.name and "bench/" in b.text
    }
    missing = sorted(shown - listed)
    assert not missing, (
        f"results commands nobody parses: {missing}; add each to test_the_command_parses' "
        "list (and to tests/docs/registry.py, unless the one test that runs its script "
        "small names it): docs/contributing.md"
    )
    assert sorted(listed - shown) == [], "commands parsed here that no results page shows"
