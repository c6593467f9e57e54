"""bench/duet.py, run small once (tests/docs/results_cmds.py): two copies of a profile
sandbox, sequential and duet A/A pairs, one pair of the known effect, the summary. What
the output says and how it is built, never which mode is less noisy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.postgres.cgroups import CGROUP_ROOT
from tests.docs.blocks import command
from tests.docs.results_cmds import run, small
from tests.helpers import needs_cgroups


@needs_cgroups
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_duet_command_runs(tmp_path: Path) -> None:
    """About 60 s: copy 2 a file copy of copy 1, each in its own cgroup with the profile's
    limits; every pair measured; the summary and the sd ratio against the 3x rule."""
    run(small(command("results-duet"), tmp_path, small=None), timeout=280)
    doc = json.loads((tmp_path / "bench/results/duet-small.json").read_text())
    assert doc["complete"]
    assert "error" not in doc
    assert doc["profile"]["limits"]["memory_bytes"] == 1024**3
    assert doc["copy"]["bytes"] > 0
    assert "file copy" in doc["copy"]["method"]

    # both servers inside their own cgroups from start to end, the cgroups gone with them
    for when in ("cgroups", "cgroups_after"):
        assert all(c["all_inside"] for c in doc[when].values()), doc[when]
    names = {c["cgroup"] for c in doc["cgroups"].values()}
    assert len(names) == 2
    assert not [
        n for n in names for c in ("memory", "blkio", "cpu") if (CGROUP_ROOT / c / n).exists()
    ]

    pairs = doc["pairs"]
    assert [len(pairs[m]) for m in ("sequential_aa", "duet_aa")] == [2, 2]
    assert [len(pairs[m]) for m in ("sequential_effect", "duet_effect")] == [1, 1]
    for mode, rows in pairs.items():
        for row in rows:
            assert len(row["runs"]) == 2, row
            assert all(r["level"] > 0 for r in row["runs"]), row
            copies = [r["copy"] for r in row["runs"]]
            if mode.startswith("duet"):
                # the two copies at once: their measured runs began together
                assert copies == ["copy1", "copy2"]
                assert all(r["start_skew_s"] < 1.0 for r in row["runs"]), row
            else:
                assert copies == ["copy1", "copy1"]
    # "A" swaps position every other pair
    assert [r["a_is"] for r in pairs["sequential_aa"]] == [0, 1]
    assert [r["a_is"] for r in pairs["duet_aa"]] == [0, 1]
    # the effect's runs ran with the pool PostgreSQL reports; a duet runs both sizes at once
    large = doc["configs"]["large_pool"]["shared_buffers"]
    assert large == "512MB"  # half the profile's memory
    for mode in ("sequential_effect", "duet_effect"):
        (row,) = pairs[mode]
        seen = {r["label"]: r["shared_buffers"] for r in row["runs"]}
        assert seen == {"small_pool": "128MB", "large_pool": large}, row

    s = doc["summary"]
    for mode in ("sequential_aa", "duet_aa"):
        m = s[mode]
        assert m["pairs"] == 2
        assert m["sd_log_ratio"] is not None
        assert m["difference"]["rounds"] == 2
        assert len(m["difference"]["ci95"]) == 2
        assert m["position"]["bias"]["rounds"] == 2
        assert m["level_tps"]["median"] > 0
    ratio = s["sd_ratio"]
    assert ratio["ratio"] > 0
    assert ratio["ci95"][0] < ratio["ratio"] < ratio["ci95"][1]
    assert ratio["against_rule"]
    for mode in ("sequential_effect", "duet_effect"):
        assert s[mode]["gain"]["rounds"] == 1
        assert set(s[mode]["level_tps"]) == {"small_pool", "large_pool"}
