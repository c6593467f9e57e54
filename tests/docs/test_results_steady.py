"""bench/steady_state.py, run small once (tests/docs/results_cmds.py): D1's command, the
default and PGTune's config each run on end in the profile's cgroup. C2's command (one
config given as JSON, TPC-C) is parsed (tests/docs/test_results_parse.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.docs.blocks import command
from tests.docs.results_cmds import run, small
from tests.helpers import needs_cgroups


@needs_cgroups
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_steady_state_command_runs(tmp_path: Path) -> None:
    """Each config the page names ran, on the profile's memory given (--memory 2GB)."""
    run(small(command("results-tpcb-d1-steady"), tmp_path, small=None), timeout=500)
    doc = json.loads((tmp_path / "bench/results/steady-D1-heuristic.json").read_text())
    assert set(doc["runs"]) == {"pgtune", "knobtune"}
    for rows in doc["runs"].values():
        assert len(rows) == 1
        assert rows[0]["median_tps"] > 0, rows
    assert doc["profile"]["limits"]["memory_bytes"] == 2 * 1024**3
    assert doc["configs"]["pgtune"]["shared_buffers"] == "512MB"
    assert doc["configs"]["knobtune"]["shared_buffers"] == "1GB"
