"""`knobtune tune`'s progress lines against a service whose session moves between the
CLI's two reads of a poll (a scripted API: the order of the reads is what is tested)."""

from __future__ import annotations

from typing import Any

import pytest

from app.cli import follow as follow_mod


def _trial(index: int) -> dict[str, Any]:
    return {
        "index": index,
        "role": "baseline" if index <= 2 else "candidate",
        "knob": None if index <= 2 else "work_mem",
        "value": None if index <= 2 else "64MB",
        "gain": None,
        "verdict": None,
        "error": None,
        "samples": {"median_tps": 100.0},
    }


def _session(status: str, done: int, planned: int) -> dict[str, Any]:
    return {
        "id": 1,
        "status": status,
        "phase": "done" if status == "succeeded" else "measuring",
        "request": {},
        "live_tps": [],
        "progress": {"trials_done": done, "trials_planned": planned, "eta_s": None},
    }


class _Service:
    """Trial 9 and the session's end are stored together, right after the poll's first
    read (a session that concluded before its planned 11 trials)."""

    def __init__(self) -> None:
        self.ended = False
        self.gets = 0

    def call(self, method: str, path: str, **_kw: Any) -> Any:
        if method == "POST":
            return _session("running", 0, 11)
        self.gets += 1
        if path.endswith("/trials"):
            out: Any = [_trial(i) for i in range(1, 10 if self.ended else 9)]
        else:
            out = _session("succeeded", 9, 9) if self.ended else _session("running", 8, 11)
        if self.gets == 3:  # the second poll's first read
            self.ended = True
        return out


def test_the_last_trial_line_has_the_plan_stored_with_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(follow_mod.time, "sleep", lambda _s: None)
    sess = follow_mod.follow(_Service(), {}, lambda s: f"session {s['id']}")  # type: ignore[arg-type]
    assert sess["status"] == "succeeded"
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("trial")]
    assert len(lines) == 9  # none lost: trial 9 came between the two reads
    assert lines[7].endswith("[8/11 trials]")
    assert lines[8].endswith("[9/9 trials]"), lines[8]
