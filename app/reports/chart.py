"""The per-trial chart as standalone SVG (no JS, no network), in the objective's units.

Throughput sessions plot each run's median tps; query-time and latency objectives plot
each run's level in milliseconds (from its transactions, as the verdict judged it), with
"lower is better" on the axis.

One function serves the CLI (written next to the exported config) and the
dashboard (inlined in the page). Each trial is one ``<circle class="trial">``
so a browser test can count points.

What it shows is what the verdict used: candidates as points (a line joining runs of
different configs would read as throughput climbing over time), the incumbent's level as
a step line, and the final check as its two sides, paired run by run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from app.postgres.units import readable
from app.sessions.verdicts import judged_runs
from optimizer.objective import in_units, objective_kind

COLORS = {
    "keep": "#1a9850",
    "revert": "#d73027",
    "rejected": "#b35806",  # a guard stopped it (memory, or a collapse in its first seconds)
    "failed": "#7b3294",
    None: "#737373",
}
START, BEST = "#2166ac", "#1a9850"  # the final check's two sides
LABEL_CHARS = 24  # longer knob-path labels are shortened


FINAL_WORDS = {
    "confirmed": "confirmed",
    "not-credible": "not credible",
    "no-change": "below min_gain: no change",
    "unconfirmed": "cut short: UNCONFIRMED",
}


def final_label(session: Mapping[str, Any]) -> str | None:
    """What the final check found, from a session shaped like SessionOut."""
    words = FINAL_WORDS.get(session.get("gain_status") or "")
    if session.get("gain") is None or words is None:
        return None
    # in the chart's own unit: a query time that fell by 20% reads -20.0%
    gain = in_units(objective_kind(session.get("request")), session["gain"])
    return f"{gain:+.1%}, {words}"


def _label(knob: str | None, value: str | None, role: str) -> str:
    if knob:
        text = f"{knob}={readable(value or '')}"
    elif value and value.startswith("hints:"):
        n = value.count("=")  # one per hinted knob
        return f"PGTune hints ({n} knob{'s' if n != 1 else ''})"
    else:
        text = value or role
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "\u2026"


@dataclass(frozen=True)
class Point:
    index: int
    median_tps: float | None  # the run's value in the chart's unit (tps, or ms for times)
    role: str
    label: str  # e.g. "work_mem=16MB"
    verdict: str | None  # keep, revert, or None (more runs pending / baseline)
    failed: bool = False
    drift: bool = False  # this run moved against its config's previous run beyond the noise


def points_of(trials: Iterable[Mapping[str, Any]], *, unit: str = "tps") -> list[Point]:
    """Chart points from trials shaped like GET /api/v1/sessions/{id}/trials (TrialOut).

    ``unit`` "tps": each run's median tps; "ms": its ``level`` (the objective in ms).
    """
    return [
        Point(
            index=t["index"],
            median_tps=t["samples"]["median_tps"] if unit == "tps" else t.get("level"),
            role=t["role"],
            label=_label(t["knob"], t["value"], t["role"]),
            verdict=t["verdict"],
            failed=t["error"] is not None,
            drift=bool(t.get("drift")),
        )
        for t in trials
    ]


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1.0
    step = max(mag * min((m for m in (1, 2, 5, 10) if m * mag >= raw), default=10), 1e-9)
    start = (lo // step) * step
    ticks = []
    v = start
    while v <= hi + step / 2:
        if v >= lo - step / 2:
            ticks.append(round(v, 6))
        v += step
    return ticks


def _outcomes(points: Sequence[Point]) -> dict[int, str | None]:
    """Each candidate run's evaluation outcome (keep, revert, rejected; None while pending).

    An evaluation's verdict lands on the run that decided it, which may be an incumbent
    re-run (C I I: the keep is stored on the last I); every candidate run of that
    evaluation shows the outcome, and the deciding incumbent run stays an incumbent run.
    """
    out: dict[int, str | None] = {p.index: None for p in points if p.role == "candidate"}
    verdict = {p.index: p.verdict for p in points}
    for index, runs in _judged(points).items():
        out.update(dict.fromkeys(runs, verdict[index]))
    return out


def _judged(points: Sequence[Point]) -> dict[int, tuple[int, ...]]:
    return judged_runs((p.index, p.role, p.verdict) for p in points)


def _incumbent_steps(points: Sequence[Point]) -> list[tuple[int, float]]:
    """(trial index, the incumbent's level after it) over the walk, final check excluded.

    The level is the median of the incumbent's runs so far; a kept candidate's runs
    become the incumbent's after the run that decided the keep.
    """
    level = {p.index: p.median_tps for p in points if p.median_tps is not None and not p.failed}
    judged = _judged(points)
    inc: list[float] = []
    steps = []
    for p in points:
        if p.role.startswith("final-"):
            break
        if p.role in ("baseline", "incumbent") and p.index in level:
            inc.append(level[p.index])
        if inc:
            steps.append((p.index, statistics.median(inc)))
        # decided after this run: the kept config is the incumbent from the next trial on
        if p.verdict == "keep":
            inc = [level[i] for i in judged.get(p.index, ()) if i in level] or inc
    return steps


def render_svg(
    points: Sequence[Point],
    *,
    baseline: float | None,
    title: str,
    final_label: str | None = None,
    width: int = 860,
    height: int = 400,
    axis: str = "median tps per run",
    unit: str = "tps",
) -> str:
    """The chart; ``final_label`` says what the final check found (e.g. '+12%, confirmed').

    ``axis`` and ``unit`` name the values' unit (e.g. "query time per run (ms), lower is
    better", "ms"); without a ``baseline`` in that unit, the baseline runs' median is used.
    """
    if baseline is None and unit != "tps":
        base = [p.median_tps for p in points if p.role == "baseline" and p.median_tps]
        baseline = statistics.median(base) if base else None
    longest = max((len(p.label) for p in points if p.role == "candidate"), default=0)
    label_room = 18 + int(longest * 5.2 * 0.82)  # 9px text rotated 55 degrees
    legend_y = height - 10
    left, right, top = 64, 16, 36
    steps = _incumbent_steps(points)
    outcome = _outcomes(points)
    final = [p for p in points if p.role.startswith("final-")]
    legend = _legend(points, outcome, bool(final))
    sizes = [24 + int(6.2 * len(name)) for name, _ in legend]
    # two rows when one does not fit the width (the knob labels keep clear of both)
    split = len(legend)
    if (90 if steps else 0) + sum(sizes) > width - left - right:
        split = (len(legend) + 1) // 2
    bottom = label_room + 26 + (14 if split < len(legend) else 0)
    w, h = width - left - right, height - top - bottom
    values = [p.median_tps for p in points if p.median_tps is not None]
    values += [v for _, v in steps]
    if baseline is not None:
        values.append(baseline)
    lo = min(values) * 0.9 if values else 0.0
    hi = max(values) * 1.08 if values else 1.0
    n = max(len(points), 1)
    first = points[0].index if points else 1

    def x(i: float) -> float:
        return left + (i - first + 0.5) / n * w

    def y(v: float) -> float:
        return top + h - (v - lo) / (hi - lo or 1.0) * h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11" role="img">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
        f'<rect class="plot-area" x="{left}" y="{top}" width="{w}" height="{h}" fill="none"/>',
        f'<text x="{left}" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for t in _nice_ticks(lo, hi):
        if lo <= t <= hi:
            out.append(
                f'<line x1="{left}" x2="{left + w}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#eee"/>'
            )
            out.append(f'<text x="{left - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    out.append(
        f'<text x="14" y="{top + h / 2}" transform="rotate(-90 14 {top + h / 2})" '
        f'text-anchor="middle">{escape(axis)}</text>'
    )
    if final:
        x0, x1 = x(final[0].index - 0.5), x(final[-1].index + 0.5)
        out.append(
            f'<g class="final-check"><rect x="{x0:.1f}" y="{top}" width="{x1 - x0:.1f}" '
            f'height="{h}" fill="#f4f7fb"/>'
            f'<text x="{(x0 + x1) / 2:.1f}" y="{top + 12}" text-anchor="middle" '
            f'font-size="10">final check{": " + escape(final_label) if final_label else ""}'
            "</text></g>"
        )
        # the check runs A B B A A B: each consecutive two is one side-by-side pair
        for a, b in zip(final[::2], final[1::2], strict=False):
            if a.median_tps is None or b.median_tps is None:
                continue
            out.append(
                f'<line class="pair" x1="{x(a.index):.1f}" y1="{y(a.median_tps):.1f}" '
                f'x2="{x(b.index):.1f}" y2="{y(b.median_tps):.1f}" stroke="#999"/>'
            )
    if baseline is not None:
        out.append(
            f'<line class="baseline" x1="{left}" x2="{left + w}" y1="{y(baseline):.1f}" '
            f'y2="{y(baseline):.1f}" stroke="{START}" stroke-dasharray="6 4" opacity="0.7"/>'
        )
        out.append(
            f'<text x="{left + w - 4}" y="{y(baseline) + 13:.1f}" text-anchor="end" '
            f'fill="{START}">baseline {_num(baseline)} {escape(unit)}</text>'
        )
    if steps:
        d = [f"M{x(steps[0][0] - 0.5):.1f},{y(steps[0][1]):.1f}"]
        for i, v in steps:
            d.append(f"V{y(v):.1f}H{x(i + 0.5):.1f}")
        out.append(
            f'<path class="incumbent" d="{"".join(d)}" fill="none" stroke="#333" '
            'stroke-width="1.5"/>'
        )
    for p in points:
        cy = y(p.median_tps) if p.median_tps is not None else top + h
        tip = f"#{p.index} {p.label}: " + (
            f"{_num(p.median_tps)} {unit}" if p.median_tps is not None else "no measurement"
        )
        if p.verdict:
            tip += f" ({p.verdict})"
        if p.failed:
            paint = f'r="4" fill="{COLORS["failed"]}"'
        elif outcome.get(p.index) == "rejected" or p.verdict == "rejected":
            paint = f'r="5" fill="#fff" stroke="{COLORS["rejected"]}" stroke-width="2.5"'
        elif p.role == "final-baseline":
            paint = f'r="4" fill="#fff" stroke="{START}" stroke-width="2"'
        elif p.role == "final-incumbent":
            paint = f'r="4" fill="{BEST}"'
        elif p.role == "candidate":
            paint = f'r="5" fill="{COLORS.get(outcome.get(p.index), COLORS[None])}"'
        else:
            paint = f'r="3.5" fill="{COLORS[None]}"'
        verdict = escape(str(outcome.get(p.index, p.verdict)))
        out.append(
            f'<circle class="trial" data-index="{p.index}" data-role="{p.role}" '
            f'data-verdict="{verdict}" cx="{x(p.index):.1f}" cy="{cy:.1f}" '
            f"{paint}><title>{escape(tip)}</title></circle>"
        )
    # Load shifts: a run that moved against its config's previous run beyond the noise.
    for p in points:
        if p.drift:
            px = x(p.index)
            out.append(
                f'<polygon class="shift" points="{px - 5:.1f},{top + 2} {px + 5:.1f},{top + 2} '
                f'{px:.1f},{top + 10}" fill="#e08214"><title>the server\'s load moved here: '
                "runs of one config differ beyond the noise</title></polygon>"
            )
    # The knob path: which knob each trial moved, under the axis.
    for p in points:
        if p.role == "candidate":
            out.append(
                f'<text class="knob-label" x="{x(p.index):.1f}" y="{top + h + 14}" '
                f'text-anchor="end" transform="rotate(-55 {x(p.index):.1f} {top + h + 14})" '
                f'font-size="9">{escape(p.label)}</text>'
            )
    lx = left
    ly = legend_y - (14 if split < len(legend) else 0)
    out.append('<g class="legend">')
    if steps:
        out.append(
            f'<line x1="{lx - 6}" x2="{lx + 10}" y1="{ly - 4}" y2="{ly - 4}" '
            f'stroke="#333" stroke-width="1.5"/><text x="{lx + 14}" y="{ly}">incumbent'
            "</text>"
        )
        lx += 90
    for i, ((name, paint), size) in enumerate(zip(legend, sizes, strict=True)):
        if i == split:
            lx, ly = left, legend_y
        out.append(
            f'<circle cx="{lx}" cy="{ly - 4}" {paint}/><text x="{lx + 8}" y="{ly}">{name}</text>'
        )
        lx += size
    out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def _legend(
    points: Sequence[Point], outcome: Mapping[int, str | None], final: bool
) -> list[tuple[str, str]]:
    """The legend's entries (name, circle paint), only for what the chart shows."""
    legend = [
        ("kept", f'r="4" fill="{COLORS["keep"]}"'),
        ("reverted", f'r="4" fill="{COLORS["revert"]}"'),
        ("baseline / re-measure / pending", f'r="4" fill="{COLORS[None]}"'),
    ]
    if any(outcome.get(p.index) == "rejected" or p.verdict == "rejected" for p in points):
        legend.append(
            (
                "rejected by a guard",
                f'r="4" fill="#fff" stroke="{COLORS["rejected"]}" stroke-width="2.5"',
            )
        )
    legend.append(("failed", f'r="4" fill="{COLORS["failed"]}"'))
    if any(p.drift for p in points):
        legend.append(("load shift (marker on top)", 'r="4" fill="#e08214"'))
    if final:
        legend += [
            ("final check: start", f'r="4" fill="#fff" stroke="{START}" stroke-width="2"'),
            ("best", f'r="4" fill="{BEST}"'),
        ]
    return legend


def _num(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def render_sweep_svg(
    points: Sequence[Mapping[str, Any]],
    *,
    knee: int | None,
    title: str,
    width: int = 860,
    height: int = 380,
) -> str:
    """Throughput (left axis, with its 95% interval) and p99 latency (right axis) against
    clients on a log2 axis; the knee is a vertical line. ``points`` are the sweep's
    per-count points (GET /api/v1/sweeps/{id}); one ``<circle class="sweep-tps">`` each."""
    left, right, top, bottom = 64, 64, 36, 56
    w, h = width - left - right, height - top - bottom
    pts = [p for p in points if p.get("clients")]
    highs = [float(p.get("tps_high") or p["tps"]) for p in pts if p.get("tps")]
    p99 = [float(p["latency_p99_ms"]) for p in pts if p.get("latency_p99_ms")]
    hi = max(highs) * 1.05 if highs else 1.0
    lat_hi = max(p99) * 1.1 if p99 else 1.0
    xs = [math.log2(int(p["clients"])) for p in pts] or [0.0]
    x_lo, x_hi = min(xs), max(xs)

    def x(clients: int) -> float:
        span = x_hi - x_lo
        # 4% padding each side: the first and last points stay clear of the axes
        return left + (0.5 if span == 0 else 0.04 + 0.92 * (math.log2(clients) - x_lo) / span) * w

    def y(v: float) -> float:
        return top + h - v / hi * h

    def y2(v: float) -> float:
        return top + h - v / lat_hi * h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11" role="img">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
        f'<text x="{left}" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for t in _nice_ticks(0.0, hi):
        if 0 <= t <= hi:
            out.append(
                f'<line x1="{left}" x2="{left + w}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#eee"/>'
            )
            out.append(f'<text x="{left - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for t in _nice_ticks(0.0, lat_hi):
        if 0 <= t <= lat_hi:
            out.append(f'<text x="{left + w + 6}" y="{y2(t) + 4:.1f}" fill="#d6604d">{t:g}</text>')
    out.append(
        f'<text x="14" y="{top + h / 2}" transform="rotate(-90 14 {top + h / 2})" '
        'text-anchor="middle" fill="#2166ac">tps (run level, 95% interval)</text>'
    )
    rx = width - 10
    out.append(
        f'<text x="{rx}" y="{top + h / 2}" transform="rotate(90 {rx} {top + h / 2})" '
        'text-anchor="middle" fill="#d6604d">p99 latency (ms)</text>'
    )
    for p in pts:
        c = int(p["clients"])
        out.append(f'<text x="{x(c):.1f}" y="{top + h + 16}" text-anchor="middle">{c}</text>')
    out.append(f'<text x="{left + w / 2}" y="{top + h + 34}" text-anchor="middle">clients</text>')
    if knee is not None:
        out.append(
            f'<line class="knee" x1="{x(knee):.1f}" x2="{x(knee):.1f}" y1="{top}" '
            f'y2="{top + h}" stroke="#1a9850" stroke-dasharray="6 4"/>'
            f'<text x="{x(knee) + 4:.1f}" y="{top + 12}" fill="#1a9850">knee {knee}</text>'
        )
    tps_path = [(x(int(p["clients"])), y(float(p["tps"]))) for p in pts if p.get("tps")]
    lat_path = [
        (x(int(p["clients"])), y2(float(p["latency_p99_ms"])))
        for p in pts
        if p.get("latency_p99_ms")
    ]
    for path, color, dash in ((tps_path, "#2166ac", ""), (lat_path, "#d6604d", "4 3")):
        if len(path) > 1:
            d = " ".join(
                f"{'M' if i == 0 else 'L'}{px:.1f},{py:.1f}" for i, (px, py) in enumerate(path)
            )
            extra = f' stroke-dasharray="{dash}"' if dash else ""
            out.append(f'<path d="{d}" fill="none" stroke="{color}"{extra}/>')
    for p in pts:
        c = int(p["clients"])
        if p.get("tps"):
            lo, up = float(p.get("tps_low") or p["tps"]), float(p.get("tps_high") or p["tps"])
            out.append(
                f'<line x1="{x(c):.1f}" x2="{x(c):.1f}" y1="{y(lo):.1f}" y2="{y(up):.1f}" '
                'stroke="#2166ac"/>'
            )
            tip = f"{c} clients: {float(p['tps']):.0f} tps"
            if p.get("latency_p99_ms"):
                tip += f", p99 {float(p['latency_p99_ms']):.1f} ms"
            if p.get("cpu_util") is not None:
                tip += f", CPU {float(p['cpu_util']):.0%}"
            fill = "#1a9850" if p.get("within_best") else "#2166ac"
            ring = ""
            if p.get("unsteady"):  # its runs disagreed: level unknown, never the knee
                fill, ring = "#fff", ' stroke="#737373" stroke-width="2"'
                tip += " (unsteady: its runs disagree)"
            out.append(
                f'<circle class="sweep-tps" data-clients="{c}" cx="{x(c):.1f}" '
                f'cy="{y(float(p["tps"])):.1f}" r="4.5" fill="{fill}"{ring}>'
                f"<title>{escape(tip)}</title></circle>"
            )
        if p.get("latency_p99_ms"):
            out.append(
                f'<rect class="sweep-p99" x="{x(c) - 3:.1f}" '
                f'y="{y2(float(p["latency_p99_ms"])) - 3:.1f}" width="6" height="6" '
                'fill="#d6604d"/>'
            )
    legend = [
        ("tps", "#2166ac"),
        ("within the best (given the noise)", "#1a9850"),
        ("p99 latency", "#d6604d"),
        ("unsteady (runs disagree)", "#bbb"),
    ]
    lx = left
    for name, color in legend:
        out.append(
            f'<circle cx="{lx}" cy="{height - 10}" r="4" fill="{color}"/>'
            f'<text x="{lx + 8}" y="{height - 6}">{escape(name)}</text>'
        )
        lx += 40 + 6 * len(name)
    out.append("</svg>")
    return "\n".join(out)
