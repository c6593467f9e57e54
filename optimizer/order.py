"""The search order from the baseline's counters: busy mechanisms first, idle ones last.

A session's budget buys 15-30 runs over 8-12 knobs, and coordinate descent tunes knobs in
order, so the knob that matters must not come after the budget is spent (issue 29: a
15-minute TPC-B session spent its 25 trials on WAL and checkpoint knobs with no
checkpoint in any run, and never reached shared_buffers). Before the walk, the baseline's
counters (optimizer/counters.py) say which mechanisms the workload exercises:

* temp files: sorts and hashes spill to disk -> work_mem, hash_mem_multiplier;
* parallel workers planned (and launched) -> the parallel knobs;
* JIT time from pg_stat_statements, as a share of statement time -> the jit knobs;
* checkpoints, and buffers the checkpointer, bgwriter and backends wrote -> the
  checkpoint and bgwriter knobs;
* blocks read against blocks hit -> shared_buffers and the read-ahead knobs.

:func:`order_knobs` moves knobs whose mechanism is busy to the front and those whose
mechanism is idle to the back, each with a note; a knob whose counters were not measured
(another version, no pg_stat_statements) keeps its place. Within each group the given
order (the catalogue's expected impact) stands. The descent orders its walk again from the
hints' runs when it keeps them: a kept config can exercise what the start config did not.
Pure and deterministic: a replayed session orders its knobs the same way.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from optimizer.checkpoints import CHECKPOINT_KNOBS
from optimizer.counters import ServerCounters, size_text

JIT_BUSY = 0.01  # JIT compilation at or above this share of statement time
READ_BUSY = 0.01  # blocks read from outside shared_buffers at or above this share
READ_IDLE = 0.001  # below this share nothing is read: the working set fits

TEMP_KNOBS = ("work_mem", "hash_mem_multiplier")
PARALLEL_KNOBS = (
    "max_parallel_workers_per_gather",
    "max_parallel_workers",
    "parallel_setup_cost",
    "parallel_tuple_cost",
)
JIT_KNOBS = ("jit", "jit_above_cost", "jit_inline_above_cost", "jit_optimize_above_cost")
READ_KNOBS = ("shared_buffers", "effective_io_concurrency")
BGWRITER_KNOBS = tuple(k for k in CHECKPOINT_KNOBS if k.startswith("bgwriter_"))


@dataclass(frozen=True)
class Ordering:
    order: tuple[str, ...]
    notes: tuple[str, ...]  # one per knob moved, in the new order


def combine(runs: Sequence[ServerCounters]) -> ServerCounters | None:
    """Several runs' counters as one window (a field is None unless every run has it)."""
    if not runs:
        return None
    values: dict[str, float | None] = {}
    for name in ServerCounters.__dataclass_fields__:
        got = [getattr(r, name) for r in runs]
        values[name] = None if any(v is None for v in got) else float(sum(got))
    return ServerCounters(**values)


def _states(c: ServerCounters, runs: str) -> dict[str, tuple[bool, str]]:
    """Mechanism -> (busy, why) for the mechanisms these counters show; unmeasured: absent.
    ``runs``: whose runs they are, for the notes ("the baseline")."""
    out: dict[str, tuple[bool, str]] = {}
    if c.temp_files is not None:
        if c.temp_files > 0:
            spilled = f" ({size_text(c.temp_bytes)})" if c.temp_bytes else ""
            out["temp"] = (True, f"{c.temp_files:.0f} temp files{spilled} in {runs}")
        else:
            out["temp"] = (False, f"no sort or hash spilled to a temp file in {runs}")
    if c.parallel_planned is not None:
        if c.parallel_planned > 0:
            launched = c.parallel_launched if c.parallel_launched is not None else 0.0
            out["parallel"] = (
                True,
                f"{launched:.0f} of {c.parallel_planned:.0f} planned parallel workers launched",
            )
        else:
            out["parallel"] = (False, f"no parallel worker was planned in {runs}")
    share = c.jit_share
    if share is not None:
        busy = share >= JIT_BUSY
        out["jit"] = (busy, f"{share:.1%} of query time is JIT compilation")
    if c.checkpoints is not None:
        if c.checkpoints > 0:
            out["checkpoint"] = (True, f"{c.checkpoints:.0f} checkpoints in {runs}")
        else:
            out["checkpoint"] = (False, f"no checkpoint in {runs}'s runs")
    if c.buffers_backend is not None and c.buffers_clean is not None:
        written = c.buffers_backend + c.buffers_clean
        if written > 0:
            out["bgwriter"] = (
                True,
                f"the bgwriter wrote {c.buffers_clean:.0f} and backends "
                f"{c.buffers_backend:.0f} buffers in {runs}",
            )
        else:
            out["bgwriter"] = (False, "neither the bgwriter nor a backend wrote a buffer")
    hit = c.hit_ratio
    if hit is not None:
        read = 1.0 - hit
        if read >= READ_BUSY:
            out["reads"] = (True, f"{read:.1%} of blocks read from outside shared_buffers")
        elif read < READ_IDLE:
            out["reads"] = (False, f"{hit:.2%} of blocks found in shared_buffers")
    return out


def mechanism(knob: str) -> str | None:
    """The mechanism whose counters say whether ``knob`` has work to do (None: unknown)."""
    if knob in TEMP_KNOBS:
        return "temp"
    if knob in PARALLEL_KNOBS:
        return "parallel"
    if knob in JIT_KNOBS:
        return "jit"
    if knob in BGWRITER_KNOBS:
        return "bgwriter"
    if knob in CHECKPOINT_KNOBS:
        return "checkpoint"
    if knob in READ_KNOBS:
        return "reads"
    return None


def order_knobs(
    names: Sequence[str],
    counters: ServerCounters | None,
    runs: str = "the baseline",
    unnoted: Collection[str] = (),
) -> Ordering:
    """``names`` with busy mechanisms first and idle ones last (see the module docstring);
    ``runs``: whose counters these are, for the notes. ``unnoted``: knobs ordered like the
    rest but left out of the notes (the session will not try them, e.g. held ones)."""
    if counters is None:
        return Ordering(tuple(names), ())
    states = _states(counters, runs)
    first: list[str] = []
    middle: list[str] = []
    last: list[str] = []
    notes_first: list[str] = []
    notes_last: list[str] = []
    for name in names:
        m = mechanism(name)
        state = states.get(m) if m is not None else None
        if state is None:
            middle.append(name)
        elif state[0]:
            first.append(name)
            if name not in unnoted:
                notes_first.append(f"{name}: {state[1]}, tried first")
        else:
            last.append(name)
            if name not in unnoted:
                notes_last.append(f"{name}: {state[1]}, tried last")
    return Ordering((*first, *middle, *last), (*notes_first, *notes_last))
