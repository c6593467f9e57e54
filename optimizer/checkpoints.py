"""Knobs that act through checkpoints, and the run length that can show them (issue 29).

A checkpoint writes every dirty buffer, and the first change of a page after it writes the
whole page to WAL (a full-page image). Knobs that set how often that happens, how it is
spread, or what it costs act once per checkpoint cycle. A run in which no checkpoint
begins cannot show them: issue 29's session spent 25 trials of 30 s runs on max_wal_size,
wal_compression and checkpoint_timeout with no checkpoint in any run, and recommended no
change. So such a knob is judged only on runs that span at least one checkpoint cycle of
the configs compared (the incumbent's and the candidate's); otherwise it is set aside with
a note that names the run length it needs. It is never reported as "no effect".

When a checkpoint begins (PostgreSQL 15, "WAL Configuration",
https://www.postgresql.org/docs/15/wal-configuration.html): "every checkpoint_timeout
seconds, or if max_wal_size is about to be exceeded, whichever comes first". The WAL
distance that triggers one is not max_wal_size itself: since PostgreSQL 11 the server
keeps the WAL of one cycle, and while a checkpoint spreads its writes over
checkpoint_completion_target of the cycle, the next cycle's WAL accumulates too, so the
checkpointer starts one after ``max_wal_size / (1 + checkpoint_completion_target)`` of
WAL (src/backend/access/transam/xlog.c, CalculateCheckpointSegments: "b) during
checkpoint, we consume checkpoint_completion_target * number of segments consumed between
checkpoints"). At a measured WAL rate R (bytes/s) the cycle is therefore::

    cycle = min(checkpoint_timeout, max_wal_size / ((1 + checkpoint_completion_target) * R))

A timed checkpoint is skipped when no WAL was written since the last one, so at R = 0 no
checkpoint comes at all. At a rate so low that a whole timed cycle writes less than one WAL
segment (a read-only workload: 25 B/s writes 7.3 kB in 5 min) these knobs have nothing to
act on, and runs of any length cannot show them (:func:`idle`).

Pure: the app supplies the WAL rate from the run's counters (optimizer/counters.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from optimizer.counters import size_text
from optimizer.knobs import Knob, KnobValueError

_BGWRITER = (
    "the bgwriter cleans buffers ahead of the backends that need them; how many are dirty "
    "follows the checkpoint cycle (all clean right after one, most dirty before the next), "
    "so its steady state needs a whole cycle"
)
_FPI = (
    "full-page images are written for a page's first change after each checkpoint: their "
    "volume is a per-cycle quantity, large right after a checkpoint and near zero late in "
    "a cycle"
)

CHECKPOINT_KNOBS: Mapping[str, str] = MappingProxyType(
    {
        "max_wal_size": "the WAL between checkpoints: only a checkpoint it triggers shows it",
        "min_wal_size": "WAL files recycled, not removed, at each checkpoint",
        "checkpoint_timeout": "the time between timed checkpoints",
        "checkpoint_completion_target": "how a checkpoint's writes are spread over the cycle",
        # extensions to the list (docs/evidence.md gives the reasons)
        "checkpoint_flush_after": "writeback hints for the checkpoint's own writes",
        "bgwriter_delay": _BGWRITER,
        "bgwriter_lru_maxpages": _BGWRITER,
        "bgwriter_lru_multiplier": _BGWRITER,
        "bgwriter_flush_after": _BGWRITER,
        "wal_compression": _FPI,
        "full_page_writes": _FPI,
    }
)
"""Knobs judged only on runs that span a checkpoint cycle, with the mechanism why."""

_INPUTS = {
    "max_wal_size": Knob("max_wal_size", "integer", "MB", -math.inf, math.inf, "1GB"),
    "checkpoint_timeout": Knob("checkpoint_timeout", "integer", "s", -math.inf, math.inf, "5min"),
    "checkpoint_completion_target": Knob(
        "checkpoint_completion_target", "real", None, -math.inf, math.inf, "0.9"
    ),
    # fixed at initdb (--wal-segsize); SHOW prints it as "16MB", pg_settings in bytes
    "wal_segment_size": Knob("wal_segment_size", "integer", "B", -math.inf, math.inf, "16MB"),
}
MB = 1024.0 * 1024.0

IDLE_CYCLE_SEGMENTS = 1.0
"""A timed checkpoint cycle (checkpoint_timeout at the measured WAL rate) that writes less
WAL than this many segments gives the checkpoint knobs nothing to act on: they get no long
runs. WAL is allocated, recycled and removed in whole segments (max_wal_size and
min_wal_size count them), so with less than one per cycle no value of either triggers,
recycles or saves anything and every checkpoint is timed. With full_page_writes a page's
first change after a checkpoint writes its image to WAL, so such a cycle dirties on the
order of 16 MB / 8 kB = 2048 pages: too few for how a checkpoint spreads its writes or how
the bgwriter cleans ahead to show in throughput. (A select-only session measured 25 B/s of
WAL, 7.3 kB per 5-minute cycle, and planned about 75 min of 5-minute runs for them.)"""


def _value(config: Mapping[str, str], name: str) -> float:
    knob = _INPUTS[name]
    try:
        v = knob.parse(config.get(name, knob.default))
    except KnobValueError:
        v = knob.parse(knob.default)
    assert isinstance(v, float)
    return v


def cycle_seconds(config: Mapping[str, str], wal_rate: float) -> float:
    """Seconds between checkpoints of ``config`` at ``wal_rate`` bytes/s (inf: none come).

    ``config`` in PostgreSQL syntax; missing inputs take PostgreSQL's defaults.
    """
    timeout = _value(config, "checkpoint_timeout")
    if wal_rate <= 0:
        return math.inf
    distance = (
        _value(config, "max_wal_size") * MB / (1.0 + _value(config, "checkpoint_completion_target"))
    )
    return min(timeout, distance / wal_rate)


def timeout_seconds(config: Mapping[str, str]) -> float:
    """checkpoint_timeout of ``config`` in seconds (PostgreSQL's default when absent)."""
    return _value(config, "checkpoint_timeout")


def idle(config: Mapping[str, str], wal_rate: float) -> str | None:
    """Why the checkpoint knobs have nothing to act on at ``wal_rate`` bytes/s, or None.

    A timed cycle of ``config`` (its checkpoint_timeout) writes ``wal_rate`` x timeout
    bytes of WAL; under :data:`IDLE_CYCLE_SEGMENTS` segments (``config``'s
    wal_segment_size, 16 MB when absent) the reason, with the figures. None at a rate of
    0 (no checkpoint comes: :func:`set_aside` says so).
    """
    if wal_rate <= 0:
        return None
    timeout = timeout_seconds(config)
    segment = _value(config, "wal_segment_size")
    cycle_wal = wal_rate * timeout
    if cycle_wal >= IDLE_CYCLE_SEGMENTS * segment:
        return None
    return (
        f"the latest run wrote {size_text(wal_rate)}/s of WAL: a checkpoint cycle "
        f"({duration_text(timeout)}) writes {size_text(cycle_wal)}, under one WAL segment "
        f"({size_text(segment)}), so checkpoint and bgwriter knobs have nothing to act on "
        "and longer runs would not show them either"
    )


def duration_text(seconds: float) -> str:
    """30 s, 5 min, 1.5 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        m = seconds / 60
        return f"{m:.0f} min" if abs(m - round(m)) < 0.05 or m >= 10 else f"{m:.1f} min"
    return f"{seconds / 3600:.1f} h"


def needed_duration(cycle: float, warmup_s: float = 0.0) -> int:
    """A ``duration_s`` whose measured window spans ``cycle``: whole minutes, plus warm-up."""
    return math.ceil(warmup_s + math.ceil(cycle / 60.0) * 60.0)


def set_aside(
    knob: str,
    incumbent: Mapping[str, str],
    candidate: Mapping[str, str],
    *,
    wal_rate: float | None,
    window_s: float,
    warmup_s: float = 0.0,
) -> str | None:
    """Why ``knob`` cannot be judged between these configs on runs of ``window_s``, or None.

    None also when the knob does not act through checkpoints, or when the WAL rate was not
    measured (nothing to estimate from: the knob is judged as any other).
    """
    if knob not in CHECKPOINT_KNOBS or wal_rate is None:
        return None
    cycle = max(cycle_seconds(incumbent, wal_rate), cycle_seconds(candidate, wal_rate))
    if cycle <= window_s:
        return None
    runs = f"{duration_text(window_s)} runs"
    if (why := idle(incumbent, wal_rate)) is not None:
        return f"{knob} not judged: {why}"  # not "give duration_s": no length would show it
    if math.isinf(cycle):
        return (
            f"{knob} not judged: the runs wrote no WAL, so no checkpoint comes and "
            f"{runs} (or longer ones) cannot show it ({CHECKPOINT_KNOBS[knob]})"
        )
    return (
        f"{knob} not judged: at {size_text(wal_rate)}/s of WAL a checkpoint comes every "
        f"{duration_text(cycle)}, and {runs} cannot show it; give duration_s >= "
        f"{needed_duration(cycle, warmup_s)}"
    )
