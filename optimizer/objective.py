"""The objectives' vocabulary: their kinds, which are times, and what they are in words.

The one place that says it (issue 43): the request schema and the CLI take these kinds,
optimizer.evidence.Objective judges by them, and every page, export and summary words a
result with them. A gain is "fraction better" everywhere in the optimizer; for a time
(lower is better) the user reads it as the time's own change: "query time -23.0%".
Pure: no I/O, no numpy, so the CLI can import it without the optimizer's weight.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

ObjectiveKind = Literal[
    "throughput", "latency_p95", "query_time_geomean", "query_time_total", "latency_mean"
]
OBJECTIVE_KINDS: tuple[ObjectiveKind, ...] = get_args(ObjectiveKind)
DEFAULT_OBJECTIVE: ObjectiveKind = "throughput"
# times (every kind but throughput): a run's level is a duration, a gain the fraction saved
TIME_OBJECTIVES: tuple[ObjectiveKind, ...] = tuple(k for k in OBJECTIVE_KINDS if k != "throughput")
# what each kind is in words, as a result reads: "p95 latency -12.0%"
OBJECTIVE_WORDS: dict[str, str] = {
    "throughput": "throughput",
    "latency_p95": "p95 latency",
    "query_time_geomean": "query time (geometric mean)",
    "query_time_total": "query time (total)",
    "latency_mean": "mean latency",
}
# each kind as a chooser offers it (the dashboard's session form), in the chooser's order
CHOICE_WORDS: dict[ObjectiveKind, str] = {
    "throughput": "throughput",
    "query_time_geomean": "query time, geometric mean (TPC-H Power)",
    "query_time_total": "query time, total",
    "latency_p95": "p95 latency",
    "latency_mean": "mean latency (a replay's default)",
}
# a session chart's axis: what one run's point is
_AXIS: dict[str, str] = {
    "throughput": "median tps per run",
    "latency_p95": "p95 latency per run (ms), lower is better",
    "query_time_geomean": "query time per run, geometric mean (ms), lower is better",
    "query_time_total": "query time per run, total (ms), lower is better",
    "latency_mean": "mean latency per run (ms), lower is better",
}


def objective_kind(request: Mapping[str, Any] | None) -> str:
    """The kind a stored request (a session's or a comparison's, as JSON) names; one
    that names none (from before objectives) is judged by throughput."""
    return str((request or {}).get("objective", DEFAULT_OBJECTIVE))


def lower_is_better(kind: str) -> bool:
    """A time (latency, query time): lower is better."""
    return kind in TIME_OBJECTIVES


def unit(kind: str) -> str:
    """A run's level in: "ms" for a time, "tps" for throughput."""
    return "ms" if lower_is_better(kind) else "tps"


def in_units(kind: str, gain: float) -> float:
    """A gain ("fraction better") as the objective's own relative change: a time that
    fell by 20% is -0.2."""
    return -gain if lower_is_better(kind) else gain


def gain_words(kind: str, gain: float) -> str:
    """A gain in words, in the objective's units: "throughput +12.0%", "query time
    (total) -23.0%" (an unknown kind is named as it is)."""
    return f"{OBJECTIVE_WORDS.get(kind, kind)} {in_units(kind, gain):+.1%}"


def chart_axis(kind: str) -> tuple[str, str]:
    """(axis title, unit) of a session's chart: tps, or milliseconds for a time."""
    return _AXIS.get(kind, _AXIS[DEFAULT_OBJECTIVE]), unit(kind)
