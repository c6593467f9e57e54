"""A session's per-transaction evidence, over its runs: streams as stored in a trial's
row (``trials.evidence``), one stream's figures for people, and the best config against
the start per stream and per label (the session's evidence table).

A run's ``StreamStat`` comes from app/workloads/stream_run.py; the statistics of one run
are optimizer/evidence.py's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optimizer.evidence import StreamStat, stream_figures

Z95 = 1.959963984540054


def streams_json(stats: Sequence[StreamStat]) -> dict[str, Any] | None:
    return {"streams": [s.to_json() for s in stats]} if stats else None


def streams_from_json(data: Mapping[str, Any] | None) -> tuple[StreamStat, ...]:
    if not data:
        return ()
    return tuple(StreamStat.from_json(s) for s in data.get("streams") or [])


def figures(stat: StreamStat, seconds: float | None = None) -> dict[str, Any]:
    """One stream's figures for people (TrialOut.streams)."""
    return {"stream": stat.name, "clients": stat.clients, **stream_figures(stat, seconds)}


# -- the best config against the start, per label -----------------------------------------
@dataclass(frozen=True)
class LabelChange:
    """Mean latency of one label (transaction type or query), start config vs best."""

    stream: str
    label: str
    before_ms: float | None
    after_ms: float | None
    ratio: float | None  # after / before
    ci: tuple[float, float] | None  # 95% interval of the ratio
    runs: tuple[int, int]  # runs pooled on each side

    def to_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "label": self.label,
            "before_ms": self.before_ms,
            "after_ms": self.after_ms,
            "ratio": self.ratio,
            "change": None if self.ratio is None else self.ratio - 1.0,
            "ci": list(self.ci) if self.ci else None,
            "runs": list(self.runs),
        }

    def text(self) -> str:
        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x:.3g} ms"

        change = "-" if self.ratio is None else f"{self.ratio - 1.0:+.1%}"
        ci = f" [{self.ci[0] - 1:+.1%}, {self.ci[1] - 1:+.1%}]" if self.ci else ""
        where = f"{self.stream}/{self.label}"
        return f"{where}: {ms(self.before_ms)} -> {ms(self.after_ms)} {change}{ci}"


def _pooled(runs: Sequence[StreamStat], stream: str, label: str) -> tuple[float, float, int]:
    """(mean of the runs' mean latency, its variance, runs) of one label; k=0: none.

    Each run counts once. The variance is the larger of the runs' own (var_mean) and the
    spread of the run means: drift between runs is part of what a reader should expect.
    """
    means: list[float] = []
    var: list[float] = []
    for r in runs:
        if r.name != stream:
            continue
        for s in r.scripts:
            if s.label == label and s.mean_ms is not None and s.mean_ms > 0:
                means.append(s.mean_ms)
                var.append(s.var_mean)
    k = len(means)
    if not k:
        return math.nan, math.nan, 0
    mean = statistics.fmean(means)
    v = sum(var) / k**2
    if k >= 2:
        v = max(v, statistics.variance(means) / k)
    return mean, v, k


def per_label(before: Sequence[StreamStat], after: Sequence[StreamStat]) -> list[LabelChange]:
    """Per stream and label: mean latency before -> after, ratio, 95% interval.

    The interval is the delta method on the log ratio: var(log a/b) = var_a/a^2 + var_b/b^2.
    """
    keys: list[tuple[str, str]] = []
    for r in [*before, *after]:
        for s in r.scripts:
            if (r.name, s.label) not in keys and (s.share > 0 or s.n > 0):
                keys.append((r.name, s.label))
    out = []
    for stream, label in keys:
        b, vb, kb = _pooled(before, stream, label)
        a, va, ka = _pooled(after, stream, label)
        ratio = ci = None
        if kb and ka:
            ratio = a / b
            sd = math.sqrt(va / a**2 + vb / b**2)
            lr = math.log(ratio)
            ci = (math.exp(lr - Z95 * sd), math.exp(lr + Z95 * sd))
        out.append(
            LabelChange(
                stream=stream,
                label=label,
                before_ms=b if kb else None,
                after_ms=a if ka else None,
                ratio=ratio,
                ci=ci,
                runs=(kb, ka),
            )
        )
    return out


def per_stream(side: str, runs: Iterable[StreamStat]) -> list[dict[str, Any]]:
    """Per stream: the median over runs of tps, mean / p95 / p99 latency and failures."""
    by: dict[str, list[dict[str, float | None]]] = {}
    for r in runs:
        by.setdefault(r.name, []).append(stream_figures(r))
    rows = []
    for name, figs in by.items():
        row: dict[str, Any] = {"config": side, "stream": name, "runs": len(figs)}
        for key in ("tps", "mean_ms", "p95_ms", "p99_ms", "failed"):
            vals = [f[key] for f in figs if f.get(key) is not None]
            row[key] = statistics.median(v for v in vals if v is not None) if vals else None
        rows.append(row)
    return rows
