"""docs/results/ commands of the capture pages (what a capture costs the server, whether a
replay predicts the original), one per script run small (tests/docs/results_cmds.py):
every step runs and the output holds what the pages' figures come from. The figures need
the full-size runs; the other commands are parsed (tests/docs/test_results_parse.py).

One module per page group: the suite hands out whole modules to its workers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.docs.blocks import command
from tests.docs.results_cmds import run, small
from tests.helpers import needs_cgroups

SIDES = ("original", "replay")


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
    """The page's command on the host; its profile small one (the same path, in a cgroup)
    is parsed (tests/docs/test_results_parse.py)."""
    doc = _overhead("results-capture-overhead", "bench/results/capture-overhead.json", tmp_path)
    assert doc["profile"] is None


@needs_cgroups
@pytest.mark.slow
@pytest.mark.timeout(600)  # about 145 s on this 2-core host
def test_results_replay_fidelity(tmp_path: Path) -> None:
    """The fidelity experiment's fresh-copy command, small: on a capped disk, the known
    effect (synchronous_commit off) and a no-op pair measured on the original and on its
    replay, every run from a fresh copy of the loaded data, then a session on the replay
    and its confirmation. Which way the effect went in a 2 s run is not asserted (a
    benchmark effect on a shared 2-core host; the page's full-size runs measure it): the
    output holds both sides' estimates and checks, from runs that did what was asked.
    --small throttles the captured mix (bench/replay_fidelity.py SMALL): a smaller capture
    and cheaper replay runs; the original's runs stay flat out.

    The four commands are one script: the flat-out ones are one command but for the flag
    (--original-checkpoint, --original-fresh or neither), its budget and its output file
    (checked here); the paced one differs in numbers. All four are parsed
    (tests/docs/test_results_parse.py)."""
    paced_cmd, flat_cmd, checkpointed_cmd, fresh_cmd = command(
        "results-replay-fidelity"
    ).splitlines()

    def args(line: str) -> list[str]:
        words = line.replace(" --original-checkpoint", "").replace(" --original-fresh", "")
        kept = [w for w in words.split() if not w.startswith("bench/results/")]
        budget = kept.index("--budget-s") + 1
        return kept[:budget] + kept[budget + 1 :]

    assert "--original-checkpoint" in checkpointed_cmd
    assert "--original-fresh" in fresh_cmd
    assert args(flat_cmd) == args(checkpointed_cmd) == args(fresh_cmd)
    assert "--speed" not in paced_cmd  # the paced one replays at the captured pace
    # the page's capture, rounds, run length and budget set back to --small's
    block = small(
        fresh_cmd,
        tmp_path,
        small=None,
        minutes="0.17",
        rounds="1",
        duration="2",
        warmup="0",  # at speed 16 a 1 s warm-up is 16 s of the capture: all of a small one
        budget_s="10",
    )
    res = run(block, timeout=550)
    assert "same sign" in res.stdout
    _fidelity(tmp_path / "bench/results/replay-fidelity-fresh.json")


def _fidelity(out: Path) -> None:
    """What every fidelity run's output holds: each pair's runs on both sides with the
    settings asked for, the server's counters, the estimates and their checks."""
    doc = json.loads(out.read_text())
    explain = doc["report_query"]["explain"]
    assert explain["spills_at_4MB"], explain
    assert explain["fits_at_64MB"], explain
    assert doc["capture"]["summary"]["statements"] > 0
    assert not doc["capture"]["truncated"]
    for side in SIDES:
        runs = doc["fidelity"][side]["runs"]
        assert {r["pair"] for r in runs} == {"synchronous_commit", "no-op"}
        # the known effect's runs ran the default and the changed setting, one of each
        sync_configs = sorted(r["config"] for r in runs if r["pair"] == "synchronous_commit")
        assert sync_configs == ["synchronous_commit=off", "synchronous_commit=on"], runs
        # the reporting query ran in every run, on both sides
        assert all(r["report_ms"] is not None and r["report_n"] > 0 for r in runs), runs
        # nothing failed on replay
        assert not [r["failed_by_label"] for r in runs if r["failed"]]
        # each run's server counters: was there a checkpoint in it, how much WAL
        assert all((r["counters"] or {}).get("wal_bytes", 0) > 0 for r in runs), runs
        for pair in ("synchronous_commit", "no-op"):
            est = doc["fidelity"][side]["pairs"][pair]["report_latency_change"]
            assert est["rounds"] == 1
    # the effect's sign compared on both sides (what the page reports), whichever it was
    checks = doc["checks"]["synchronous_commit"]
    for compared in ("level", "rate_like_for_like"):
        assert isinstance(checks[compared]["same_sign"], bool), checks
    assert set(doc["checks"]["no-op"]["holds_zero"]) == {"original", "replay"}
    assert doc["session"]["trials"] >= 1
    assert doc["confirmation"]["runs"]  # --small confirms even an unchanged config
    assert set(doc["timings"]) >= {"capture_s", "session_s", "confirmation_s"}
