"""Throughput-per-trial chart as standalone SVG (no JS, no network).

One function serves the CLI (written next to the exported config) and the
dashboard (inlined in the page). Each trial is one ``<circle class="trial">``
so a browser test can count points.
"""

from __future__ import annotations

import math
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
