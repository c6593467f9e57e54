"""The commands of docs/results/ whose script has one command, run at small sizes: the
scripts that back the manual's figures still run as shown. Each writes into a temporary
directory (never over bench/results/); the figures themselves come only from the full-size
runs. Every command is also parsed (tests/docs/test_results_parse.py)."""

from __future__ import annotations

import ast
import json
import shlex
from pathlib import Path

import pytest

from tests.docs.blocks import command
from tests.docs.results_cmds import run, small
from tests.helpers import ROOT


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_results_sweep(tmp_path: Path) -> None:
    """The page's command on one workload, two counts, up and down (2 repeats: the least a
    sweep takes), 2 s runs: the script's path (the service's own measure(), the chart, the
    JSON) runs once per workload alike, and tests/app/sweeps/test_sweep.py measures both
    workloads through the service."""
    block = command("results-sweep")
    options = {"workloads": "select-only", "clients": "1,2", "duration": "2", "warmup": "1"}
    run(small(block, tmp_path, **options, scale="1"))
    doc = json.loads((tmp_path / "sweep.json").read_text())
    (res,) = doc["workloads"].values()
    assert [p["clients"] for p in res["points"]] == [1, 2]
    assert [r["clients"] for r in res["runs"]] == [1, 2, 2, 1]  # up, then down
    assert res["knee_clients"] in (1, 2)
    assert res["advice"]
    assert (tmp_path / "sweep-select-only.svg").read_text().startswith("<svg")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_results_long_queries(tmp_path: Path) -> None:
    record, replay = command("results-long-queries").strip().splitlines()
    # --small: one client for the long queries, TPC-B at scale 1 (bench/record_long.py)
    options = {"small": None, "runs": "1", "seconds": "3", "tpcb_runs": "1", "tpcb_seconds": "3"}
    script = small(record, tmp_path, **options)
    run(script.replace("--out recordings", f"--out {tmp_path / 'recordings'}"))
    assert list((tmp_path / "recordings").glob("*.json.gz"))
    res = run(small(replay, tmp_path, max_runs="1"))  # the committed recordings, as the page says
    assert json.loads(res.stdout)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_results_api_load(tmp_path: Path) -> None:
    """Pollers on both pages while a session runs; the service answers every request (what
    latency it took on this loaded host is the page's full-size run's to say)."""
    run(small(command("results-api-load"), tmp_path, clients="5", seconds="3"))
    doc = json.loads((tmp_path / "api_load.json").read_text())
    assert doc["session_status_during_load"] == "running"
    assert doc["trials_during_load"] >= 2
    assert set(doc["endpoints"]) == {"/api/v1/sessions/{id}", "/sessions/{id}"}
    for name, figures in doc["endpoints"].items():
        assert figures["requests"] > 0, (name, figures)
        assert figures["errors"] == 0, (name, figures)
        assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"], (name, figures)


def test_results_operations() -> None:
    """The page's tests run in the suite itself (tests/app/postgres/): its command is the
    suite's pytest on test files that exist and hold tests (read, not collected: collecting
    them in a process took 7 s of CPU, 45 s of a worker on a loaded run)."""
    argv = shlex.split(command("results-operations").strip())
    assert argv[:3] == [".venv/bin/python", "-m", "pytest"], argv
    assert argv[3:], "the command names no test file"
    for name in argv[3:]:
        path = ROOT / name
        assert path.parent == ROOT / "tests/app/postgres", name
        assert path.name.startswith("test_"), name
        tree = ast.parse(path.read_text(), filename=name)
        tests = [
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name.startswith("test_")
        ]
        assert tests, f"{name} holds no test"
