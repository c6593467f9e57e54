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
    block = command("results-neighbour")
    run(small(block, tmp_path, sessions="1", duration="2", max_trials="11"))
    assert json.loads((tmp_path / "neighbour.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_results_faults(tmp_path: Path) -> None:
    block = command("results-faults")
    run(small(block, tmp_path, runs="1", kinds="pgbench_missing"))
    assert json.loads((tmp_path / "faults.json").read_text())
