"""The commands of docs/results/ whose script has one command, run at small sizes: the
scripts that back the manual's figures still run as shown. Each writes into a temporary
directory (never over bench/results/); the figures themselves come only from the full-size
runs. Every command is also parsed (tests/docs/test_results_parse.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.docs.blocks import command
from tests.docs.results_cmds import run, small


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_results_sweep(tmp_path: Path) -> None:
    block = command("results-sweep")
    # both workloads, two counts, up and down (2 repeats: the least a sweep takes), 2 s runs
    run(small(block, tmp_path, clients="1,2", duration="2", warmup="1", scale="1"))
    assert json.loads((tmp_path / "sweep.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_results_long_queries(tmp_path: Path) -> None:
    record, replay = command("results-long-queries").strip().splitlines()
    script = small(record, tmp_path, runs="1", seconds="4", tpcb_runs="1", tpcb_seconds="4")
    run(script.replace("--out recordings", f"--out {tmp_path / 'recordings'}"))
    assert list((tmp_path / "recordings").glob("*.json.gz"))
    res = run(small(replay, tmp_path, max_runs="1"))  # the committed recordings, as the page says
    assert json.loads(res.stdout)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_results_api_load(tmp_path: Path) -> None:
    run(small(command("results-api-load"), tmp_path, clients="5", seconds="3"))
    assert json.loads((tmp_path / "api_load.json").read_text())


def test_results_operations(tmp_path: Path) -> None:
    """The page's tests run in the suite itself (tests/app/postgres/): here the command
    only collects them, so that it names test files that exist and hold tests."""
    res = run(small(command("results-operations"), tmp_path) + " -q -n 0 --collect-only")
    assert " tests collected" in res.stdout, res.stdout[-2000:]
