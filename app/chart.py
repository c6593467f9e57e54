"""Throughput-per-trial chart as standalone SVG (no JS, no network).

One function serves the CLI (written next to the exported config) and the
dashboard (inlined in the page). Each trial is one ``<circle class="trial">``
so a browser test can count points.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

COLORS = {"keep": "#1a9850", "revert": "#d73027", "failed": "#7b3294", None: "#737373"}


@dataclass(frozen=True)
class Point:
    index: int
    median_tps: float | None
    role: str
    label: str  # e.g. "work_mem=16MB"
    verdict: str | None  # keep, revert, or None (more runs pending / baseline)
    failed: bool = False


def points_of(trials: Iterable[Mapping[str, Any]]) -> list[Point]:
    """Chart points from trials shaped like GET /api/v1/sessions/{id}/trials (TrialOut)."""
    return [
        Point(
            index=t["index"],
            median_tps=t["samples"]["median_tps"],
            role=t["role"],
            label=f"{t['knob']}={t['value']}" if t["knob"] else t["value"] or t["role"],
            verdict=t["verdict"],
            failed=t["error"] is not None,
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


def render_svg(
    points: Sequence[Point],
    *,
    baseline: float | None,
    title: str,
    width: int = 860,
    height: int = 380,
) -> str:
    left, right, top, bottom = 64, 16, 36, 96
    w, h = width - left - right, height - top - bottom
    values = [p.median_tps for p in points if p.median_tps is not None]
    if baseline is not None:
        values.append(baseline)
    lo = min(values) * 0.9 if values else 0.0
    hi = max(values) * 1.05 if values else 1.0
    n = max(len(points), 1)

    def x(i: int) -> float:
        return left + (i - 0.5) / n * w

    def y(v: float) -> float:
        return top + h - (v - lo) / (hi - lo or 1.0) * h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11" role="img">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
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
        'text-anchor="middle">median tps per run</text>'
    )
    if baseline is not None:
        out.append(
            f'<line class="baseline" x1="{left}" x2="{left + w}" y1="{y(baseline):.1f}" '
            f'y2="{y(baseline):.1f}" stroke="#2166ac" stroke-dasharray="6 4"/>'
        )
        out.append(
            f'<text x="{left + w}" y="{y(baseline) - 4:.1f}" text-anchor="end" '
            f'fill="#2166ac">baseline {baseline:.0f}</text>'
        )
    path = [(x(p.index), y(p.median_tps)) for p in points if p.median_tps is not None]
    if len(path) > 1:
        d = " ".join(
            f"{'M' if i == 0 else 'L'}{px:.1f},{py:.1f}" for i, (px, py) in enumerate(path)
        )
        out.append(f'<path d="{d}" fill="none" stroke="#bbb"/>')
    for p in points:
        key = "failed" if p.failed else p.verdict
        color = COLORS.get(key, COLORS[None])
        cy = y(p.median_tps) if p.median_tps is not None else top + h
        tip = f"#{p.index} {p.label}: " + (
            f"{p.median_tps:.0f} tps" if p.median_tps is not None else "failed"
        )
        if p.verdict:
            tip += f" ({p.verdict})"
        shape = 5 if p.role == "candidate" else 3.5
        out.append(
            f'<circle class="trial" data-index="{p.index}" data-verdict="{escape(str(p.verdict))}" '
            f'cx="{x(p.index):.1f}" cy="{cy:.1f}" r="{shape}" fill="{color}">'
            f"<title>{escape(tip)}</title></circle>"
        )
    # The knob path: which knob each trial moved, under the axis.
    for p in points:
        if p.role == "candidate":
            out.append(
                f'<text x="{x(p.index):.1f}" y="{top + h + 14}" text-anchor="end" '
                f'transform="rotate(-55 {x(p.index):.1f} {top + h + 14})" '
                f'font-size="9">{escape(p.label)}</text>'
            )
    legend = [
        ("kept", COLORS["keep"]),
        ("reverted", COLORS["revert"]),
        ("baseline / re-measure / pending", COLORS[None]),
        ("failed", COLORS["failed"]),
    ]
    lx = left
    for name, color in legend:
        out.append(
            f'<circle cx="{lx}" cy="{height - 10}" r="4" fill="{color}"/>'
            f'<text x="{lx + 8}" y="{height - 6}">{name}</text>'
        )
        lx += 40 + 6 * len(name)
    out.append("</svg>")
    return "\n".join(out)
