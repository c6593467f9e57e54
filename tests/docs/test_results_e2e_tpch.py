"""bench/e2e.py as the TPC-H and CH-benCHmark pages shows it, run small
(tests/docs/results_cmds.py).

One module per page group: the suite hands out whole modules to its workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.results_cmds import run_e2e


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    ("name", "out"),
    [
        ("results-tpch-h1", "e2e-H1.json"),
        ("results-chbench-ch1", "e2e-CH1.json"),
    ],
)
def test_the_page_command_runs(name: str, out: str, tmp_path: Path) -> None:
    run_e2e(name, out, tmp_path)
