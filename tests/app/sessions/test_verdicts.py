"""Which candidate runs a stored verdict judged: one reading (app/sessions/verdicts.py),
and the dashboard, the export, the chart and the CLI's live view all show it the same."""

from __future__ import annotations

from typing import Any

from app.cli.follow import _trial_cells
from app.models import Trial
from app.reports.chart import _incumbent_steps, _outcomes, points_of
from app.sessions.export import _verdict_rows
from app.sessions.verdicts import judged_runs, moved_verdicts
from app.web.sessions import verdict_rows

START = {"work_mem": "4MB", "shared_buffers": "128MB", "max_wal_size": "1GB"}


def trial(index: int, role: str, tps: float, knob: str | None = None, value: str | None = None,
          verdict: str | None = None, gain: float | None = None) -> dict[str, Any]:  # fmt: skip
    config = {**START, **({knob: value} if knob and value else {})}
    return {
        "index": index, "role": role, "knob": knob, "value": value, "config": config,
        "verdict": verdict, "gain": gain, "p_value": 0.01 if gain is not None else None,
        "error": None, "drift": False, "samples": {"median_tps": tps},
    }  # fmt: skip


# A walk as the session stores it: each verdict on the run that decided it.
TRIALS = [
    trial(1, "baseline", 100),
    trial(2, "baseline", 102),
    trial(3, "candidate", 130, "work_mem", "16MB"),
    trial(4, "incumbent", 101),
    trial(5, "candidate", 134, "work_mem", "16MB"),
    trial(6, "incumbent", 99, verdict="keep", gain=0.3),  # C I C I: decided on the last I
    trial(7, "candidate", 120, "shared_buffers", "1GB", verdict="revert", gain=-0.05),
    trial(8, "candidate", 131, "max_wal_size", "4GB"),
    trial(9, "incumbent", 60, verdict="rejected"),  # a guard stopped the re-run; it goes on
    trial(10, "candidate", 133, "max_wal_size", "4GB"),
    trial(11, "incumbent", 131, verdict="revert", gain=0.01),
    trial(12, "candidate", 20, "work_mem", "64MB", verdict="rejected"),  # refused: ends it
    trial(13, "candidate", 135, "shared_buffers", "256MB"),  # the walk ended before a verdict
    trial(14, "final-baseline", 101),
    trial(15, "final-incumbent", 132),
]


def test_each_verdict_judged_its_evaluations_candidate_runs() -> None:
    judged = judged_runs((t["index"], t["role"], t["verdict"]) for t in TRIALS)
    assert judged == {6: (3, 5), 7: (7,), 11: (8, 10), 12: (12,)}
    # the two decided on an incumbent re-run are shown on their last candidate run
    assert moved_verdicts((t["index"], t["role"], t["verdict"]) for t in TRIALS) == {6: 5, 11: 10}


def test_every_reader_shows_a_verdict_on_the_candidate_it_judged() -> None:
    # the dashboard: on the evaluation's last candidate run; the re-run says which it decided
    rows = {r["index"]: r for r in verdict_rows(TRIALS, "throughput")}
    assert (rows[5]["shown_verdict"], rows[5]["shown_gain"]) == ("keep", 0.3)
    assert (rows[6]["shown_verdict"], rows[6]["decided"]) == (None, 5)
    assert (rows[10]["shown_verdict"], rows[11]["decided"]) == ("revert", 10)
    assert (rows[9]["shown_verdict"], rows[9]["decided"]) == ("rejected", None)
    assert rows[3]["shown_verdict"] is None
    assert rows[13]["shown_verdict"] is None
    # the export: the same rows, so the recommendation credits work_mem with the gain
    fields = ("index", "role", "knob", "value", "config", "verdict", "gain")
    export = _verdict_rows([Trial(**{k: t[k] for k in fields}) for t in TRIALS], START)
    assert export[4] == ("work_mem", "keep", 0.3)
    assert export[5] == (None, None, None)
    assert export[8] == (None, "rejected", None)
    assert export[9] == ("max_wal_size", "revert", 0.01)
    # the chart: every candidate run of the evaluation wears its outcome (trial 8 was
    # "rejected" by its copy of the rule: the re-run the guard stopped did not end it)
    points = points_of(TRIALS)
    outcome = _outcomes(points)
    assert outcome == {3: "keep", 5: "keep", 7: "revert", 8: "revert", 10: "revert",
                       12: "rejected", 13: None}  # fmt: skip
    steps = dict(_incumbent_steps(points))
    assert steps[6] == 100.5  # the baseline's and the incumbent's runs through the keep
    assert steps[7] == 132  # then the kept candidate's runs: median of 130 and 134
    # the CLI's live view: the deciding re-run names the candidate
    cells = {t["index"]: _trial_cells(t, TRIALS)[-1] for t in TRIALS}
    assert cells[6] == "keep work_mem 16MB"
    assert cells[11] == "revert max_wal_size 4GB"
    assert (cells[7], cells[9], cells[12]) == ("revert", "rejected", "rejected")
