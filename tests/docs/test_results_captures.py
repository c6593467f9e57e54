"""docs/results/ commands of the capture pages (what a capture costs the server, whether a
replay predicts the original), run small (tests/docs/results_cmds.py): every step runs and
the output holds what the pages' figures come from. The figures need the full-size runs.

One module per page group: the suite hands out whole modules to its workers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.docs.blocks import command
from tests.docs.results_cmds import run, small
from tests.helpers import needs_cgroups


def _overhead(name: str, out: str, tmp: Path) -> dict[str, Any]:
    # the page ran 4 rounds: one here
    res = run(small(command(name), tmp, small=None, rounds="1"), timeout=300)
    doc: dict[str, Any] = json.loads((tmp / out).read_text())
    cells = {(c["workload"], c["clients"]) for c in doc["cells"]}
    assert cells == {("tpcb-like", 2), ("select-only", 2)}
    for cell in doc["cells"]:
        on = [r for r in cell["runs"] if r["logging"] == "on"]
        assert on
        assert all(r["log_bytes"] > 0 and r["statements"] > 0 for r in on), cell["runs"]
        assert cell["throughput_change"]["rounds"] == 1
        assert cell["log_volume"]["on"]["bytes_per_1000_statements"] > 0
    assert "kB per 1,000 statements" in res.stdout
    return doc


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_results_capture_overhead(tmp_path: Path) -> None:
    doc = _overhead("results-capture-overhead", "bench/results/capture-overhead.json", tmp_path)
    assert doc["profile"] is None


@needs_cgroups
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_results_capture_overhead_on_a_capped_disk(tmp_path: Path) -> None:
    doc = _overhead(
        "results-capture-overhead-small", "bench/results/capture-overhead-small.json", tmp_path
    )
    assert doc["profile"]["name"] == "small"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_results_replay_fidelity(tmp_path: Path) -> None:
    # the page's rounds, run length and budget set back to --small's
    block = small(
        command("results-replay-fidelity"),
        tmp_path,
        small=None,
        rounds="1",
        duration="2",
        budget_s="10",
    )
    res = run(block, timeout=500)
    doc = json.loads((tmp_path / "bench/results/replay-fidelity-4clients.json").read_text())
    explain = doc["report_query"]["explain"]
    assert explain["spills_at_4MB"], explain
    assert explain["fits_at_64MB"], explain
    assert doc["capture"]["summary"]["statements"] > 0
    assert not doc["capture"]["truncated"]
    for side in ("original", "replay"):
        runs = doc["fidelity"][side]["runs"]
        assert {r["pair"] for r in runs} == {"work_mem", "no-op"}
        # the reporting query ran in every run, on both sides
        assert all(r["report_ms"] is not None and r["report_n"] > 0 for r in runs), runs
        for pair in ("work_mem", "no-op"):
            est = doc["fidelity"][side]["pairs"][pair]["report_latency_change"]
            assert est["rounds"] == 1
    assert set(doc["checks"]["no-op"]["holds_zero"]) == {"original", "replay"}
    assert doc["session"]["trials"] >= 1
    assert doc["confirmation"]["runs"]  # --small confirms even an unchanged config
    assert "same sign" in res.stdout
    assert set(doc["timings"]) >= {"capture_s", "session_s", "confirmation_s"}
