"""A session's plan: adapts its stored request to the optimizer, the same on first run and
on resume.

Everything here is deterministic given the stored request, the stored probe
rows and the stored trials: that is what lets a restarted service rebuild the
optimizer by replaying trials.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.errors import RequestError
from app.objective import objective_of
from app.sessions.schemas import KnobIn, SessionIn
from app.targets.probe_data import hardware_from, rows_from_json
from app.workloads.schemas import kind_for
from optimizer.catalogue import Hardware, default_knobs, knob_space, major_version
from optimizer.counters import ServerCounters
from optimizer.descent import Candidate, CoordinateDescent, Measurement
from optimizer.evidence import StreamStat
from optimizer.heuristic import db_type_for, pgtune
from optimizer.knobs import Config, Knob, KnobError, KnobValueError, SettingRow, current_value
from optimizer.settings import BudgetError, DescentSettings, check_budget


def workload_kind(body: SessionIn) -> str:
    return kind_for(body.workload_kind, body.workload)


def build_space(
    body: SessionIn, rows: Mapping[str, SettingRow], hw: Hardware, version: int | None = None
) -> list[Knob]:
    """The knob space of a request: catalogue knobs narrowed to the server and the user's
    bounds; a knob the server's major ``version`` lacks is refused."""
    entries: Sequence[str | KnobIn] = body.knobs or default_knobs(workload_kind(body))  # type: ignore[arg-type]
    names = [e if isinstance(e, str) else e.name for e in entries]
    if len(set(names)) != len(names):
        raise RequestError(f"a knob is listed twice in knobs: {names}")
    try:
        space = knob_space(names, hw, rows, allow_unsafe=body.allow_unsafe, version=version)
    except KnobError as exc:
        raise RequestError(str(exc)) from exc
    by_name = {k.name: k for k in space}
    for entry in entries:
        if isinstance(entry, KnobIn) and (entry.min is not None or entry.max is not None):
            by_name[entry.name] = _user_bounds(by_name[entry.name], entry, rows.get(entry.name))
    return [by_name[n] for n in names]


def _user_bounds(knob: Knob, entry: KnobIn, row: SettingRow | None = None) -> Knob:
    if knob.kind not in ("integer", "real"):
        raise RequestError(f"{knob.name} is a {knob.kind} knob: min/max do not apply")
    try:
        lo = knob.parse(entry.min) if entry.min is not None else knob.lower
        hi = knob.parse(entry.max) if entry.max is not None else knob.upper
    except KnobValueError as exc:
        raise RequestError(str(exc)) from exc
    if not isinstance(lo, float | int) or not isinstance(hi, float | int):
        raise RequestError(f"{knob.name}: min/max must be numbers")
    allowed = f"{knob.format(knob.lower)}..{knob.format(knob.upper)}"
    if lo < knob.lower or hi > knob.upper:
        raise RequestError(
            f"{knob.name} bounds {entry.min}..{entry.max} leave the allowed range {allowed} "
            "(server's pg_settings and the catalogue's safe bounds for this machine)"
        )
    if lo > hi:
        raise RequestError(f"{knob.name}: min {entry.min} is above max {entry.max}")
    cur = current_value(knob, row) if row is not None else None
    if cur is not None and knob.lower <= cur <= knob.upper:
        # the server's own value stays in the range: the walk starts from it, measured, and
        # steps into the requested bounds (session_optimizer notes it)
        lo, hi = min(lo, cur), max(hi, cur)
    return dataclasses.replace(knob, lower=float(lo), upper=float(hi))


def outside_bounds_notes(
    body: SessionIn, rows: Mapping[str, SettingRow], space: Sequence[Knob]
) -> list[str]:
    """Notes for knobs whose requested min/max leave out the server's own value."""
    notes: list[str] = []
    by_name = {k.name: k for k in space}
    for entry in body.knobs or ():
        if not isinstance(entry, KnobIn) or (entry.min is None and entry.max is None):
            continue
        knob, row = by_name.get(entry.name), rows.get(entry.name)
        if knob is None or row is None:
            continue
        cur = current_value(knob, row)
        lo = knob.parse(entry.min) if entry.min is not None else None
        hi = knob.parse(entry.max) if entry.max is not None else None
        if (
            cur is None
            or not isinstance(lo, float | int | None)
            or not isinstance(hi, float | int | None)
        ):
            continue
        if (lo is not None and cur < lo) or (hi is not None and cur > hi):
            notes.append(
                f"{knob.name}: the server's value {knob.format(cur)} lies outside the requested "
                f"{entry.min or ''}..{entry.max or ''}; the baseline measures it and the walk "
                "steps from it into the range (a value is never replaced without a run)"
            )
    return notes


def canonical(knob: Knob, text: str) -> str:
    return knob.format(knob.parse(text))


def pgtune_for(body: SessionIn, hw: Hardware, version: int | None) -> Config:
    """PGTune's config for this machine and the request's kind of workload."""
    return pgtune(hw, db_type_for(workload_kind(body)), pg_version=version or 15)


def hints_for(
    body: SessionIn, space: Sequence[Knob], hw: Hardware, version: int | None = None
) -> Config | None:
    """PGTune-style values to try first, when starting from the server's current values.

    A rule of thumb is the baseline to beat (docs/architecture.md); tried first, its large effect is
    proven in a few runs and the walk refines it (bench/optimizer.py: 98/98/96% of the
    optimum with hints vs 93/82/92% without, at 40 runs).
    """
    if body.start != "current" or not body.hints:
        return None
    names = {k.name for k in space}
    tuned = pgtune_for(body, hw, version)
    return {k: v for k, v in tuned.items() if k in names}


def start_config(
    body: SessionIn,
    space: Sequence[Knob],
    effective: Mapping[str, str],
    hw: Hardware,
    version: int | None = None,
) -> Config:
    """The config the descent starts from: the server's current values, or PGTune-style."""
    config: Config = {}
    heuristic = pgtune_for(body, hw, version) if body.start == "heuristic" else {}
    for knob in space:
        own = effective.get(knob.name)
        text = heuristic.get(knob.name) or own or knob.default
        value = knob.parse(text)
        if isinstance(value, float | int) and text != own:
            # a rule of thumb or a default is clamped to the range; the server's own value
            # never is (the range holds it: optimizer.knobs.narrow, _user_bounds)
            value = min(max(value, knob.lower), knob.upper)
        config[knob.name] = knob.format(value)
    return config


def make_optimizer(
    body: SessionIn,
    space: Sequence[Knob],
    start: Config,
    seed: int,
    hints: Config | None = None,
    server: Mapping[str, str] | None = None,
) -> CoordinateDescent:
    """``server``: the target's effective settings (the checkpoint rule reads those outside
    the space)."""
    return CoordinateDescent(space, start, descent_settings(body, seed), hints=hints, server=server)


def descent_settings(body: SessionIn, seed: int) -> DescentSettings:
    """The descent's settings from a session request (the rest keep their defaults)."""
    wl = body.workload
    return DescentSettings(
        seed=seed,
        objective=objective_of(body),
        min_gain=body.min_gain,
        max_p99_worsening=body.max_p99_worsening,
        max_trials=body.max_trials,
        max_benchmark_s=body.time_budget_s,
        run_seconds=float(wl.duration_s - wl.warmup_s),
        warmup_seconds=float(wl.warmup_s),
        max_passes=body.max_passes,
        final_runs=body.final_check_runs,
        evidence=body.evidence,
        order_by_counters=body.search_order == "counters",
        checkpoint_rule=body.checkpoint_rule,
    )


def check_streams(body: SessionIn, names: Sequence[str]) -> None:
    """RequestError when the request names a stream its workload does not have."""
    known = list(names)
    for name in body.stream_names_used():
        if name not in known:
            raise RequestError(
                f"unknown stream {name!r} in objective_stream/stream_weights/p95_limits: "
                f"this workload's streams are {', '.join(repr(n) for n in known)}"
            )


def check_session_budget(body: SessionIn) -> None:
    """RequestError naming the minimum when the budget cannot hold the walk and the check."""
    wl = body.workload
    try:
        runs = check_budget(
            max_trials=body.max_trials,
            max_benchmark_s=None,
            run_seconds=float(wl.duration_s - wl.warmup_s),
            final_runs=body.final_check_runs,
        )
    except BudgetError as exc:
        raise RequestError(str(exc)) from exc
    # wall clock: every run is a whole pgbench run, its warm-up included
    need = runs * wl.duration_s
    if body.time_budget_s is not None and body.time_budget_s < need:
        raise RequestError(
            f"time_budget_s={body.time_budget_s:g} cannot hold the {runs} runs a session needs "
            f"at least (baseline, a first evaluation and the final check of "
            f"{body.final_check_runs} runs) of {wl.duration_s} s "
            f"each: give time_budget_s >= {need:g}, or shorter runs (workload.duration_s)"
        )


@dataclass(frozen=True)
class Built:
    optimizer: CoordinateDescent
    space: list[Knob]
    start: Config
    notes: list[str]
    hardware: Hardware
    held: tuple[str, ...] = ()  # knobs held at PGTune's values, not tuned (held_knobs)


HELD = "held at PGTune's value (start: heuristic), not tuned"


def held_knobs(
    body: SessionIn,
    rows: Mapping[str, SettingRow],
    hw: Hardware,
    version: int | None,
    space: Sequence[Knob],
    *,
    can_restart: bool,
) -> list[Knob]:
    """With ``start: heuristic``, the rest of PGTune's config: the knobs it sets that the
    session does not tune. They are applied with the start and held there, so every run,
    the claim and the recommendation are of PGTune's whole config plus what the walk
    changed; without them a session "from PGTune" ran PGTune's values for its own knobs
    only (TPC-C C2: random_page_cost, effective_io_concurrency, effective_cache_size and
    maintenance_work_mem stayed at the server's). A knob the server lacks or refuses, or
    one that needs a restart the target cannot do, is left as the server has it."""
    if body.start != "heuristic":
        return []
    tuned = {k.name for k in space}
    values = pgtune_for(body, hw, version)
    out: list[Knob] = []
    for name in values:
        if name in tuned or name not in rows:
            continue
        try:
            (knob,) = knob_space([name], hw, rows, version=version)
        except KnobError:
            continue
        if knob.needs_restart and not can_restart:
            continue
        out.append(knob)
    return out


def session_optimizer(
    body: SessionIn,
    stored: Mapping[str, Any],
    seed: int,
    *,
    can_restart: bool,
    no_restart: str = "the target has no restart method",
) -> Built:
    """A session's optimizer from its stored request and snapshot data (``sessions.snapshot``).

    The one place that does it: the first run, a resume after a crash and the fault checks
    must build exactly the same optimizer, or replaying the stored trials diverges.
    """
    rows = rows_from_json(stored["rows"])
    hw = hardware_from(stored["hardware"]["ram_bytes"], stored["hardware"]["cpus"])
    version = major_version(stored.get("version"))  # "PostgreSQL 18.6 on ..."
    tuned = build_space(body, rows, hw, version)
    held = held_knobs(body, rows, hw, version, tuned, can_restart=can_restart)
    space = [*tuned, *held]
    start = start_config(body, space, stored["target"]["effective"], hw, version)
    own = stored["target"]["effective"]
    hints = hints_for(body, tuned, hw, version)
    opt = make_optimizer(body, space, start, seed, hints, server=own)
    for knob in held:
        opt.exclude(knob.name, HELD)
    notes: list[str] = outside_bounds_notes(body, rows, tuned)
    if body.start == "heuristic":
        moved = [
            f"{k.name} {own[k.name]} -> {start[k.name]}"
            for k in space
            if k.name in own and canonical(k, own[k.name]) != start[k.name]
        ]
        if moved:
            notes.append(
                "start: heuristic: PGTune-style values replace the server's own ("
                + ", ".join(moved)
                + "); the baseline and every gain are measured against them, not against "
                "the server's config"
            )
    if held:
        notes.append(
            "start: heuristic: PGTune's settings outside the knobs tuned are held at its "
            f"values, not tuned ({', '.join(k.name for k in held)}): the recommendation is "
            "PGTune's whole config plus what the walk keeps"
        )
    if not can_restart:
        for knob in tuned:
            if knob.needs_restart:
                reason = f"needs a restart and {no_restart}"
                opt.exclude(knob.name, reason)
                notes.append(f"{knob.name} skipped: {reason}")
    return Built(opt, space, start, notes, hw, tuple(k.name for k in held))


def measurement(
    samples: Sequence[float],
    *,
    p95_samples: Sequence[float] = (),
    p95: float | None = None,
    p99: float | None = None,
    error: str | None = None,
    streams: Sequence[StreamStat] = (),
    metrics: Mapping[str, Any] | None = None,
) -> Measurement:
    """A run for the optimizer; with ``streams`` its level comes from the transactions;
    ``metrics``: the server's counters over the run (a trial's ``metrics``)."""
    return Measurement(
        samples=tuple(samples),
        latency_p95_ms=p95,
        latency_p99_ms=p99,
        latency_p95_samples=tuple(p95_samples),
        failed=error is not None,
        error=error,
        streams=tuple(streams) if error is None else (),
        counters=ServerCounters.from_metrics(metrics) if error is None else None,
    )


def describe(candidate: Candidate) -> str:
    if candidate.role == "baseline":
        return "baseline"
    if candidate.role == "incumbent":
        return "re-measuring the incumbent"
    if candidate.is_final:  # best and baseline side by side: the session's claimed gain
        which = "baseline" if candidate.role == "final-baseline" else "best config"
        return f"final check: measuring the {which}"
    if candidate.knob is None:  # several knobs at once: the PGTune-style hints
        return f"measuring {candidate.value}"
    return f"measuring {candidate.knob}={candidate.value}"
