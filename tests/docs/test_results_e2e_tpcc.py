"""bench/e2e.py as the TPC-C pages (C1: a session, then the comparison; C2: on profile
small, and its default against itself) show it, run small
(tests/docs/results_cmds.py).

One module per page group: the suite hands out whole modules to its workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.results_cmds import run_e2e
from tests.helpers import needs_cgroups


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    ("name", "out"),
    [
        ("results-tpcc-c1", "e2e-C1.json"),
        ("results-tpcc-c1-compare", "e2e-C1-compare.json"),
        pytest.param(
            "results-tpcc-c2-small",
            "bench/results/e2e-C2-small-1800.json",
            marks=needs_cgroups,
        ),
        pytest.param(
            "results-tpcc-c2-600",
            "bench/results/e2e-C2-small-600.json",
            marks=needs_cgroups,
        ),
        pytest.param(
            "results-tpcc-c2-spread",
            "bench/results/e2e-C2-small-spread.json",
            marks=needs_cgroups,
        ),
    ],
)
def test_the_page_command_runs(name: str, out: str, tmp_path: Path) -> None:
    run_e2e(name, out, tmp_path)
