"""The trial chart draws the evidence as the verdict used it (issue 14)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from app.reports.chart import _incumbent_steps, final_label, points_of, render_svg

SVG = "{http://www.w3.org/2000/svg}"


def trial(index: int, role: str, tps: float | None, **kw: Any) -> dict[str, Any]:
    return {
        "index": index,
        "role": role,
        "knob": kw.get("knob"),
        "value": kw.get("value"),
        "verdict": kw.get("verdict"),
        "error": kw.get("error"),
        "drift": kw.get("drift", False),
        "samples": {"median_tps": tps},
    }


HINTS = "hints: " + ", ".join(f"k{i}=6170912kB" for i in range(6))
TRIALS = [
    trial(1, "baseline", 100),
    trial(2, "baseline", 104),
    trial(3, "candidate", 140, value=HINTS),
    trial(4, "incumbent", 101, drift=True),
    trial(5, "candidate", 143, value=HINTS, verdict="keep"),
    trial(
        6, "candidate", 90, knob="effective_io_concurrency_long_name", value="200", verdict="revert"
    ),
    trial(7, "final-baseline", 99),
    trial(8, "final-incumbent", 141),
    trial(9, "final-incumbent", 139),
    trial(10, "final-baseline", 103),
    trial(11, "final-baseline", None, error="benchmark failed"),
    trial(12, "final-incumbent", 138),
]


def render() -> ET.Element:
    svg = render_svg(
        points_of(TRIALS),
        baseline=101,
        title="t",
        final_label=final_label({"gain": 0.38, "gain_status": "confirmed"}),
    )
    return ET.fromstring(svg)


def test_only_the_incumbent_is_a_line_and_it_steps_at_the_keep() -> None:
    root = render()
    paths = root.findall(f".//{SVG}path")
    assert [p.get("class") for p in paths] == ["incumbent"]
    d = paths[0].get("d") or ""
    levels = {float(v) for v in re.findall(r"V([\d.]+)", d)}
    assert len(levels) >= 2  # the baseline's level, then the kept candidate's


def test_the_final_check_is_marked_and_paired() -> None:
    root = render()
    groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "final-check"]
    assert len(groups) == 1
    assert "final check: +38.0%, confirmed" in "".join(groups[0].itertext())
    pairs = [e for e in root.iter(f"{SVG}line") if e.get("class") == "pair"]
    assert len(pairs) == 2  # the third pair has a failed run


def test_a_keep_decided_on_an_incumbent_rerun_colours_the_candidate() -> None:
    trials = [
        trial(1, "baseline", 200),
        trial(2, "baseline", 210),
        trial(3, "candidate", 450, knob="work_mem", value="28569kB"),
        trial(4, "incumbent", 205),
        trial(5, "incumbent", 208, verdict="keep"),  # C I I: the keep lands on the last I
    ]
    root = ET.fromstring(render_svg(points_of(trials), baseline=205, title="t"))
    verdicts = {
        c.get("data-index"): (c.get("data-verdict"), c.get("fill"))
        for c in root.iter(f"{SVG}circle")
        if c.get("class") == "trial"
    }
    assert verdicts["3"] == ("keep", "#1a9850")  # the candidate shows it was kept
    assert verdicts["5"][1] == "#737373"  # the deciding re-run stays an incumbent run
    # the step line: the old level through the deciding run, the candidate's after it
    after = [*trials, trial(6, "candidate", 300, knob="work_mem", value="64MB")]
    steps = _incumbent_steps(points_of(after))
    assert steps[-2] == (5, 206.5)  # median of 200, 210, 205, 208
    assert steps[-1] == (6, 450)


def test_a_load_shift_is_marked_where_it_was_seen() -> None:
    marks = [e for e in render().iter(f"{SVG}polygon") if e.get("class") == "shift"]
    assert len(marks) == 1


def test_every_point_is_inside_the_plot_and_labels_stay_clear_of_the_legend() -> None:
    root = render()
    plot = next(e for e in root.iter(f"{SVG}rect") if e.get("class") == "plot-area")
    x0, y0 = float(plot.get("x", 0)), float(plot.get("y", 0))
    x1, y1 = x0 + float(plot.get("width", 0)), y0 + float(plot.get("height", 0))
    circles = [c for c in root.iter(f"{SVG}circle") if c.get("class") == "trial"]
    assert len(circles) == len(TRIALS)
    for c in circles:
        assert x0 <= float(c.get("cx", -1)) <= x1
        assert y0 <= float(c.get("cy", -1)) <= y1
    labels = [t for t in root.iter(f"{SVG}text") if t.get("class") == "knob-label"]
    texts = [t.text or "" for t in labels]
    assert "PGTune hints (6 knobs)" in texts
    assert all(len(t) <= 24 for t in texts)
    legend_y = min(
        float(t.get("y", 0))
        for g in root.iter(f"{SVG}g")
        if g.get("class") == "legend"
        for t in g.iter(f"{SVG}text")
    )
    for t in labels:
        # rotated 55 degrees from its anchor: its lowest point is about len * 5.2 * 0.82 below
        assert float(t.get("y", 0)) + len(t.text or "") * 5.2 * 0.82 < legend_y - 10
