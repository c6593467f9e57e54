"""Per-transaction evidence of a run's streams, and what it says about the best config.

Glue between pgbench's transaction log (app/postgres/pgbench.py), the workload's streams
(app/workloads/base.py) and optimizer/evidence.py, which stays free of I/O.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.postgres.pgbench import BenchResult, BenchSpec, pgbench_jobs
from app.workloads.base import Stream
from optimizer.counters import ServerCounters
from optimizer.counters import summary as counters_summary
from optimizer.evidence import StreamStat, stream_figures, summarize_stream

Z95 = 1.959963984540054


def bench_spec(
    stream: Stream, *, duration_s: int, warmup_s: int, rate: float | None = None
) -> BenchSpec:
    """The pgbench run of one stream (every stream of a run: same duration and warm-up).

    A replay stream runs the replay player on its plan (no scripts, no rate: the capture
    sets the pace); its scripts only name the labels of what it logs.
    """
    if stream.replay is not None:
        return BenchSpec(
            builtin=None,
            scripts=None,
            clients=stream.clients,
            jobs=stream.clients,
            duration_s=duration_s,
            warmup_s=warmup_s,
            isolation=stream.isolation,
            replay=stream.replay,
            # every statement logged: a label that ran once must not be lost to sampling
            log_sampling=1.0,
        )
    return BenchSpec(
        builtin=stream.builtin,
        builtin_weight=stream.builtin_weight,
        scripts=[(s.sql, s.weight) for s in stream.scripts] or None,
        clients=stream.clients,
        jobs=pgbench_jobs(stream.jobs, stream.clients),
        duration_s=duration_s,
        warmup_s=warmup_s,
        protocol=stream.protocol,
        rate=rate,
        defines=dict(stream.defines),
        max_tries=stream.max_tries,
        isolation=stream.isolation,
        # queries in turn are few and long: keep every one (sampling is for OLTP volume)
        log_sampling=1.0 if stream.sequence else None,
    )


def _labels(stream: Stream, client: np.ndarray, txno: np.ndarray, script: np.ndarray) -> np.ndarray:
    """Each logged transaction's label, as :meth:`Stream.label` gives it (vectorised)."""
    if stream.sequence:
        seq = np.array(stream.sequence, dtype=object)
        idx = (txno.astype(np.int64) - 1 + client.astype(np.int64) * stream.stride) % len(seq)
        picked: np.ndarray = seq[idx]
        return picked
    names = stream.script_names()
    lookup = np.array([*names, "?"], dtype=object)
    s = script.astype(np.int64)
    out = lookup[np.where((s >= 0) & (s < len(names)), s, len(names))]
    bad = out == "?"
    if bad.any():  # a script number pgbench should not log: named as Stream.label names it
        out[bad] = [f"script{int(x)}" for x in s[bad]]
    return out


def stream_stat(stream: Stream, result: BenchResult, warmup_s: float) -> StreamStat | None:
    """A stream's :class:`StreamStat` from its run; None when its log holds nothing."""
    tx = result.tx
    if tx is None or (len(tx) == 0 and tx.failed_script.size == 0):
        return None
    labels = _labels(stream, tx.client, tx.txno, tx.script)
    failed: dict[str, int] = {}
    if tx.failed_script.size:
        # a failed transaction's number is not logged: in-turn streams count it under the
        # script's own name (outside the designed labels, it does not move their means)
        names = stream.script_names()
        for no in tx.failed_script.astype(np.int64):
            if stream.sequence:
                name = names[0] if names else "script0"
            else:
                name = names[no] if 0 <= no < len(names) else f"script{no}"
            failed[name] = failed.get(name, 0) + 1
    shares = stream.design_weights()
    for name in failed:
        shares.setdefault(name, 0.0)
    return summarize_stream(
        stream.name,
        clients=stream.clients,
        shares=shares,
        start_s=tx.start_s,
        latency_ms=tx.latency_ms,
        labels=[str(x) for x in labels],
        failed=failed,
        warmup_s=warmup_s,
        weight=stream.weight,
    )


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


def io_line(metrics: Mapping[str, Any] | None) -> str | None:
    """A trial's server counters in one line, as the studies read iostat (None: none)."""
    return counters_summary(ServerCounters.from_metrics(metrics))
