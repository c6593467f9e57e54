"""docs/results/ commands of the search-quality, neighbour and fault pages, run small
(tests/docs/results_cmds.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.docs.blocks import command
from tests.docs.results_cmds import run, small


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_results_search_quality(tmp_path: Path) -> None:
    res = run(small(command("results-search-quality"), tmp_path, quick=None, no_tpe=None))
    assert json.loads(res.stdout)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_results_neighbour(tmp_path: Path) -> None:
    """--small: one session per condition, 5 trials of 2 s, both pgbenches throttled
    (bench/neighbour.py); the path runs and writes its summary, nothing about a rate."""
    block = command("results-neighbour")
    run(small(block, tmp_path, small=None))
    doc = json.loads((tmp_path / "neighbour.json").read_text())
    assert {c: s["sessions"] for c, s in doc["summary"].items()} == {"quiet": 1, "neighbour": 1}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_results_faults(tmp_path: Path) -> None:
    """The script's shortest scenario, through a `knobtune serve` process: pgbench missing
    fails the session with a clear error and leaves the target as it was (the suite's
    only run of it; tests/e2e/test_faults.py runs the others in-process)."""
    block = command("results-faults")
    run(small(block, tmp_path, runs="1", kinds="pgbench_missing"))
    doc = json.loads((tmp_path / "faults.json").read_text())
    (one,) = doc["runs"]
    assert one["kind"] == "pgbench_missing"
    assert one["ok"], one
    assert one["trials_lost"] == one["trials_duplicated"] == 0, one
    assert not one["target_changed"], one
    assert one["details"]["status"] == "failed", one
    assert one["details"]["error"].startswith("trial 1: benchmark failed: "), one
