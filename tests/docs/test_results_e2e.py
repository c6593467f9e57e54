"""bench/e2e.py, run small once (tests/docs/results_cmds.py): the path every results page's
e2e command shares (load, settle, a session through the service, the confirmation's
rounds), on profile small where the host has cgroups. The pages' other e2e commands (W1
and W2, TPC-B B1 and D1, TPC-C C1 and C2, TPC-H H1, CH-benCHmark CH1) differ from it in
numbers, workloads and flags, and are parsed by the script's parser
(tests/docs/test_results_parse.py); the workloads themselves are tested in
tests/app/workloads/."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.postgres.cgroups import CGROUP_ROOT
from tests.docs.results_cmds import run_e2e
from tests.helpers import NO_CGROUPS


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_e2e_command_runs(tmp_path: Path) -> None:
    """B1 on profile small (about 60 s: a session of 16 s, one round of three configs,
    each in the cgroup), settled first as the C2 pages' commands are (one 2 s run); where
    the host has no cgroups, the 2026-11-21 page's W1 instead."""
    if NO_CGROUPS is None:
        doc = run_e2e(
            "results-tpcb-b1-small", "bench/results/e2e-B1-small-1800.json", tmp_path,
            settle_s="2",
        )  # fmt: skip
    else:
        doc = run_e2e("results-e2e", "e2e.json", tmp_path, workloads="W1", settle_s="2")
    (result,) = doc["workloads"].values()
    # the server ran the workload before the session (--settle-s), its level recorded
    assert result["data"]["settle_tps"][0] > 0, result["data"]
    assert result["session"]["trials"] >= 1, result["session"]
    assert set(result["confirmation"]) >= {"default", "pgtune", "knobtune"}, result
    if NO_CGROUPS is not None:
        return
    # the server ran in the profile's cgroup through the session and the confirmation,
    # and the cgroup went with the sandbox
    inside = result["server_in_cgroup"]
    assert inside["after_session"]["all_inside"], inside
    assert inside["after_confirmation"]["all_inside"], inside
    name = inside["after_session"]["cgroup"]
    assert not [c for c in ("memory", "blkio", "cpu") if (CGROUP_ROOT / c / name).exists()]
    # the target and PGTune's config were sized for the profile, not the host
    limits = result["profile"]["limits"]
    assert result["session"]["target"]["ram_bytes"] == limits["memory_bytes"]
    assert result["pgtune_hardware"]["ram_bytes"] == limits["memory_bytes"]
