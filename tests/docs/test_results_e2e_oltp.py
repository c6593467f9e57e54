"""bench/e2e.py as the 2026-11-21 end-to-end page (W1, W2), the TPC-B-on-a-small-server
page (B1 on profile small) and the slow-disk page (D1) show it, run small
(tests/docs/results_cmds.py).

One module per page group: the suite hands out whole modules to its workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.postgres.cgroups import CGROUP_ROOT
from tests.docs.blocks import command
from tests.docs.results_cmds import run, run_e2e, small
from tests.helpers import needs_cgroups


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    ("name", "out", "options"),
    [
        # the page's two workloads go through the same code: the first one shows it runs
        ("results-e2e", "e2e.json", {"workloads": "W1"}),
        # about 60 s: a session of 22 s, one round of three configs, each in the cgroup
        pytest.param(
            "results-tpcb-b1-small",
            "bench/results/e2e-B1-small-1800.json",
            {},
            marks=needs_cgroups,
        ),
        # the profile's memory and CPUs replaced (--memory, --cpus): what the server and
        # PGTune were sized for
        pytest.param(
            "results-tpcb-d1-disk",
            "bench/results/e2e-D1-disk-1800.json",
            {},
            marks=needs_cgroups,
        ),
    ],
)
def test_the_page_command_runs(
    name: str, out: str, options: dict[str, str], tmp_path: Path
) -> None:
    doc = run_e2e(name, out, tmp_path, **options)
    for result in doc["workloads"].values():
        if not result.get("profile"):
            continue
        # the server ran in the profile's cgroup through the session and the confirmation,
        # and the cgroup went with the sandbox
        inside = result["server_in_cgroup"]
        assert inside["after_session"]["all_inside"], inside
        assert inside["after_confirmation"]["all_inside"], inside
        name_ = inside["after_session"]["cgroup"]
        assert not [c for c in ("memory", "blkio", "cpu") if (CGROUP_ROOT / c / name_).exists()]
        # the target and PGTune's config were sized for the profile, not the host
        limits = result["profile"]["limits"]
        assert result["session"]["target"]["ram_bytes"] == limits["memory_bytes"]
        assert result["pgtune_hardware"]["ram_bytes"] == limits["memory_bytes"]


@needs_cgroups
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("name", "out", "configs", "memory"),
    [
        # D1: the default and PGTune's config, sized for the memory given (--memory 2GB)
        ("results-tpcb-d1-steady", "steady-D1.json", {"default", "pgtune"}, 2 * 1024**3),
        # C2: the default alone, on TPC-C (its reset before every run)
        ("results-tpcc-c2-steady", "steady-C2-small.json", {"default"}, 1024**3),
    ],
)
def test_the_steady_state_command_runs(
    name: str, out: str, configs: set[str], memory: int, tmp_path: Path
) -> None:
    """bench/steady_state.py as the D1 and C2 pages show it, small: each config ran on end
    in the profile's cgroup, sized for the profile's memory."""
    run(small(command(name), tmp_path, small=None), timeout=500)
    doc = json.loads((tmp_path / "bench/results" / out).read_text())
    assert set(doc["runs"]) == configs
    for rows in doc["runs"].values():
        assert len(rows) == 1
        assert rows[0]["median_tps"] > 0, rows
    assert doc["profile"]["limits"]["memory_bytes"] == memory
    if "pgtune" in configs:
        assert doc["configs"]["pgtune"]["shared_buffers"] == "512MB"
