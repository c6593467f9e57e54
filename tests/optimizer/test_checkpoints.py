"""The checkpoint rule (optimizer/checkpoints.py), the counters' line and the search order,
pure; and the descent setting a checkpoint knob aside on short runs, judging it on long."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from optimizer.catalogue import GB, Hardware, knob_space
from optimizer.checkpoints import (
    CHECKPOINT_KNOBS,
    cycle_seconds,
    idle,
    needed_duration,
    set_aside,
)
from optimizer.counters import ServerCounters, summary
from optimizer.descent import CoordinateDescent, Measurement
from optimizer.order import combine, order_knobs
from optimizer.render import render_conf
from optimizer.settings import DescentSettings
from tests.optimizer.sim import Bench, Noise, oltp_surface

MB = 1024 * 1024
DEFAULTS = {
    "max_wal_size": "1GB",
    "checkpoint_timeout": "5min",
    "checkpoint_completion_target": "0.9",
}


# -- the cycle -------------------------------------------------------------------------------
def test_cycle_is_the_timeout_or_the_wal_distance_whichever_comes_first() -> None:
    # 1 GB / 1.9 = 539 MB of WAL between checkpoints; at 1 MB/s: 539 s > 300 s -> timeout
    assert cycle_seconds(DEFAULTS, 1 * MB) == 300
    # at 3 MB/s: 1024 / 1.9 / 3 = 179.6 s, before the timeout
    assert math.isclose(cycle_seconds(DEFAULTS, 3 * MB), 1024 / 1.9 / 3)
    # checkpoint_completion_target counts: at 0.5, 1024 / 1.5 / 3 = 227.6 s
    half = {**DEFAULTS, "checkpoint_completion_target": "0.5"}
    assert math.isclose(cycle_seconds(half, 3 * MB), 1024 / 1.5 / 3)
    # units as PostgreSQL reads them; missing inputs take its defaults
    assert cycle_seconds({"max_wal_size": "64MB", "checkpoint_timeout": "30s"}, 1 * MB) == 30
    assert math.isclose(cycle_seconds({"max_wal_size": "32MB"}, 1 * MB), 32 / 1.9)
    assert cycle_seconds({}, 1 * MB) == 300
    # no WAL: no checkpoint comes at all (a timed one is skipped when nothing was written)
    assert cycle_seconds(DEFAULTS, 0.0) == math.inf


def test_short_runs_set_a_checkpoint_knob_aside_with_the_length_it_needs() -> None:
    big = {**DEFAULTS, "max_wal_size": "4GB"}
    note = set_aside("max_wal_size", DEFAULTS, big, wal_rate=3 * MB, window_s=30, warmup_s=5)
    # the candidate's cycle (4 GB: min(300, 719) = 300 s) is the longer of the two
    assert note == (
        "max_wal_size not judged: at 3.0 MB/s of WAL a checkpoint comes every 5 min, "
        "and 30 s runs cannot show it; give duration_s >= 305"
    )
    assert "no effect" not in note
    # a run that spans the cycle judges it
    assert set_aside("max_wal_size", DEFAULTS, big, wal_rate=3 * MB, window_s=300) is None
    # a small max_wal_size makes the cycle short: 30 s runs then show it
    small = {**DEFAULTS, "max_wal_size": "32MB"}
    smaller = {**DEFAULTS, "max_wal_size": "16MB"}
    assert set_aside("max_wal_size", small, smaller, wal_rate=3 * MB, window_s=30) is None
    # not a checkpoint knob, or no WAL rate measured: judged as any other knob
    assert set_aside("work_mem", DEFAULTS, DEFAULTS, wal_rate=3 * MB, window_s=30) is None
    assert set_aside("max_wal_size", DEFAULTS, big, wal_rate=None, window_s=30) is None
    # no WAL at all: named as such, never as "no effect"
    idle = set_aside("bgwriter_delay", DEFAULTS, DEFAULTS, wal_rate=0.0, window_s=30)
    assert idle is not None
    assert idle.startswith("bgwriter_delay not judged: the runs wrote no WAL")
    assert needed_duration(300, 5) == 305
    assert needed_duration(301, 0) == 360


def test_a_cycle_under_one_wal_segment_leaves_the_knobs_nothing_to_act_on() -> None:
    # a select-only workload: 25 B/s x 300 s = 7.3 kB per timed cycle, under 16 MB
    assert idle(DEFAULTS, 25.0) == (
        "the latest run wrote 25 B/s of WAL: a checkpoint cycle (5 min) writes 7.3 kB, "
        "under one WAL segment (16.0 MB), so checkpoint and bgwriter knobs have nothing "
        "to act on and longer runs would not show them either"
    )
    # 16 MB per cycle is enough: 16 MB / 300 s
    assert idle(DEFAULTS, 16 * MB / 300) is None
    assert idle(DEFAULTS, 16 * MB / 300 * 0.99) is not None
    assert idle(DEFAULTS, 2 * MB) is None
    # the server's segment size when given (SHOW's text or pg_settings' bytes), and its
    # checkpoint_timeout: 1 kB/s over 30 min is 1.8 MB, under a 64 MB segment
    big = {**DEFAULTS, "checkpoint_timeout": "30min", "wal_segment_size": "64MB"}
    assert idle(big, 1024.0) is not None
    assert "under one WAL segment (64.0 MB)" in (idle(big, 1024.0) or "")
    assert idle({**big, "wal_segment_size": str(1024 * 1024)}, 1024.0) is None
    # no WAL at all is set_aside's own note (no checkpoint comes)
    assert idle(DEFAULTS, 0.0) is None


def test_the_list_holds_the_issues_knobs_and_the_extensions() -> None:
    issue = {"max_wal_size", "min_wal_size", "checkpoint_timeout", "checkpoint_completion_target"}
    assert issue <= set(CHECKPOINT_KNOBS)
    assert {k for k in CHECKPOINT_KNOBS if k.startswith("bgwriter_")} == {
        "bgwriter_delay", "bgwriter_lru_maxpages", "bgwriter_lru_multiplier", "bgwriter_flush_after"
    }  # fmt: skip
    assert {"wal_compression", "full_page_writes", "checkpoint_flush_after"} <= set(
        CHECKPOINT_KNOBS
    )


# -- counters --------------------------------------------------------------------------------
def test_counters_read_from_a_trials_metrics_and_print_in_one_line() -> None:
    c = ServerCounters.from_metrics(
        {"seconds": 10.0, "wal_bytes": 30 * MB, "wal_fpi": 400.0, "wal_records": 1000.0,
         "checkpoints_timed": 0.0, "checkpoints_req": 1.0, "buffers_checkpoint": 1200.0,
         "buffers_clean": 0.0, "buffers_backend": 3400.0, "blks_read": 100.0,
         "blks_hit": 9900.0, "temp_files": 0.0, "temp_bytes": 0.0, "xact_commit": 5.0}
    )  # fmt: skip
    assert c is not None
    assert c.wal_rate == 3 * MB
    assert c.hit_ratio == 0.99
    assert summary(c) == (
        "WAL 3.0 MB/s, FPI 40% | ckpt 0 timed 1 req | written ckpt 1.2k bgw 0 backend 3.4k"
        " | read 100 hit 99.0% | temp 0"
    )
    # stored before issue 29 (or a server that reported none of them): no counters
    assert ServerCounters.from_metrics({"xact_commit": 5.0}) is None
    assert ServerCounters.from_metrics({}) is None
    assert summary(None) is None
    # unmeasured is None, not 0
    part = ServerCounters.from_metrics({"seconds": 2.0, "blks_hit": 5.0, "blks_read": 0.0})
    assert part is not None
    assert part.wal_rate is None
    assert part.temp_files is None


# -- the order ---------------------------------------------------------------------------------
def test_busy_mechanisms_go_first_idle_ones_last_with_notes() -> None:
    names = ["max_wal_size", "wal_compression", "checkpoint_timeout", "shared_buffers",
             "jit", "work_mem", "random_page_cost", "bgwriter_lru_maxpages"]  # fmt: skip
    c = ServerCounters(
        seconds=60.0, wal_bytes=60 * MB, checkpoints_timed=0.0, checkpoints_req=0.0,
        buffers_checkpoint=0.0, buffers_clean=0.0, buffers_backend=5000.0,
        blks_read=20_000.0, blks_hit=80_000.0, temp_files=0.0, temp_bytes=0.0,
        jit_ms=1.0, exec_ms=1000.0,
    )  # fmt: skip
    o = order_knobs(names, c)
    # reads (20% of blocks) and backend writes are busy; checkpoints, temp files, JIT idle
    assert o.order == (
        "shared_buffers", "bgwriter_lru_maxpages", "random_page_cost",
        "max_wal_size", "wal_compression", "checkpoint_timeout", "jit", "work_mem",
    )  # fmt: skip
    assert "jit: 0.1% of query time is JIT compilation, tried last" in o.notes
    assert (
        "shared_buffers: 20.0% of blocks read from outside shared_buffers, tried first" in o.notes
    )
    assert "max_wal_size: no checkpoint in the baseline's runs, tried last" in o.notes
    assert any(n.startswith("work_mem: no sort or hash spilled") for n in o.notes)
    # a knob the session will not try is ordered like the rest but not noted
    quiet = order_knobs(names, c, unnoted={"shared_buffers", "jit"})
    assert quiet.order == o.order
    assert not any(n.startswith(("shared_buffers", "jit")) for n in quiet.notes)
    assert len(quiet.notes) == len(o.notes) - 2
    # nothing measured: the given order, no notes
    assert order_knobs(names, None).order == tuple(names)
    assert order_knobs(names, ServerCounters(seconds=1.0)).order == tuple(names)
    # a spilling, JIT-heavy analytic baseline
    hot = ServerCounters(temp_files=12.0, temp_bytes=300.0 * MB, jit_ms=80.0, exec_ms=1000.0)
    o2 = order_knobs(["shared_buffers", "random_page_cost", "jit", "work_mem"], hot)
    assert o2.order == ("jit", "work_mem", "shared_buffers", "random_page_cost")
    assert "work_mem: 12 temp files (300.0 MB) in the baseline, tried first" in o2.notes


def test_combine_adds_runs_and_keeps_unmeasured_as_none() -> None:
    a = ServerCounters(seconds=10.0, wal_bytes=10.0, jit_ms=None)
    b = ServerCounters(seconds=10.0, wal_bytes=30.0, jit_ms=1.0)
    c = combine([a, b])
    assert c is not None
    assert c.seconds == 20
    assert c.wal_bytes == 40
    assert c.jit_ms is None
    assert combine([]) is None


# -- in the descent ---------------------------------------------------------------------------
HW = Hardware(ram_bytes=8 * GB, cpus=4)


def _run(level: float, wal_rate: float | None, seconds: float, **more: float) -> Measurement:
    rng = np.random.default_rng(int(level * 10) % 1000)
    counters = None
    if wal_rate is not None:
        counters = ServerCounters(seconds=seconds, wal_bytes=wal_rate * seconds, **more)
    return Measurement(tuple(level * (1 + 0.01 * rng.standard_normal(seconds and 10))),
                       counters=counters)  # fmt: skip


SEEN: dict[int, list[str | None]] = {}


RUN_S: dict[int, list[float | None]] = {}


def _walk(
    window_s: float,
    wal_rate: float | None,
    *,
    long_runs: bool = False,
    budget_s: float | None = None,
    **more: float,
) -> CoordinateDescent:
    space = knob_space(["max_wal_size", "shared_buffers"], HW)
    settings = DescentSettings(
        max_trials=40,
        max_benchmark_s=budget_s,
        run_seconds=window_s,
        warmup_seconds=5,
        max_passes=1,
        long_runs=long_runs,
    )
    opt = CoordinateDescent(
        space,
        {"max_wal_size": "1GB", "shared_buffers": "128MB"},
        settings,
        server={"checkpoint_timeout": "5min", "checkpoint_completion_target": "0.9"},
    )
    SEEN[id(opt)] = []
    RUN_S[id(opt)] = []
    while (cand := opt.suggest()) is not None:
        SEEN[id(opt)].append(cand.knob)
        RUN_S[id(opt)].append(cand.run_s)
        # shared_buffers larger is better; max_wal_size does nothing measurable
        level = 1000.0 * (1.3 if cand.config["shared_buffers"] != "128MB" else 1.0)
        opt.register(cand, _run(level, wal_rate, window_s, **more))
    return opt


def test_the_descent_sets_aside_on_short_runs_and_judges_on_long_ones() -> None:
    short = _walk(30, 3 * MB)
    assert set(short.set_aside) == {"max_wal_size"}
    note = short.set_aside["max_wal_size"]
    assert note.startswith("max_wal_size not judged: at 3.0 MB/s of WAL a checkpoint comes")
    assert "give duration_s >= 305" in note
    assert "max_wal_size" not in SEEN[id(short)]  # not one run spent on it
    rec = short.recommendation()
    n = next(n for n in rec.notes if n.name == "max_wal_size")
    assert n.not_judged == note
    assert n.excluded is None
    assert n.trials == 0
    conf = render_conf(rec)
    assert "# unchanged, set aside: max_wal_size not judged" in conf
    assert "no effect" not in conf
    # shared_buffers is still tuned
    assert short.incumbent["shared_buffers"] != "128MB"

    # runs as long as the cycle: judged (measured, not set aside)
    long = _walk(300, 3 * MB)
    assert long.set_aside == {}
    assert any(k == "max_wal_size" for _, k, _, _ in long.verdicts)
    # no WAL rate measured (a server without pg_stat_wal): judged as before
    assert _walk(30, None).set_aside == {}


def test_set_aside_knobs_get_runs_that_span_a_cycle_when_the_budget_holds_them() -> None:
    # 30 s runs show no checkpoint at 3 MB/s of WAL: after the short walk, max_wal_size is
    # judged on runs as long as the 5-minute timed cycle, and the incumbent is measured
    # again at that length (runs of another length are other evidence)
    opt = _walk(30, 3 * MB, long_runs=True, budget_s=4 * 3600)
    assert opt.set_aside == {}
    lengths = RUN_S[id(opt)]
    first_long = next(i for i, r in enumerate(lengths) if r is not None)
    assert all(r is None for r in lengths[:first_long])  # the short walk first
    assert set(lengths[first_long:]) <= {300.0, None}
    knobs = SEEN[id(opt)]
    assert {knobs[i] for i, r in enumerate(lengths) if r == 300.0} <= {"max_wal_size", None}
    assert "max_wal_size" in {knobs[i] for i, r in enumerate(lengths) if r == 300.0}
    assert any(k == "max_wal_size" for _, k, _, _ in opt.verdicts)
    assert opt.phases
    assert opt.phases[0].startswith("long runs: max_wal_size on runs of 5 min")
    # nothing kept on the long runs: the final check is at the session's own length
    assert opt.incumbent["max_wal_size"] == "1GB"
    assert lengths[-1] is None


def test_a_budget_too_small_for_long_runs_says_what_it_needs() -> None:
    opt = _walk(30, 3 * MB, long_runs=True, budget_s=1200)
    note = opt.set_aside["max_wal_size"]
    assert "give duration_s >= 305" in note
    assert "runs of 5 min (a checkpoint cycle at the measured WAL rate) for max_wal_size" in note
    assert all(r is None for r in RUN_S[id(opt)])
    assert opt.phases[0].startswith("long runs not started: max_wal_size")


def _sim_walk(wal_rate: float) -> tuple[CoordinateDescent, list[float | None], list[str | None]]:
    """The write-heavy surface on 30 s runs, no time budget (as the session that found
    the waste), every run reporting ``wal_rate`` bytes/s of WAL."""
    surface = oltp_surface()
    bench = Bench(Noise(seconds=30), seed=3)
    settings = DescentSettings(max_trials=60, run_seconds=30, warmup_seconds=5, max_passes=1)
    opt = CoordinateDescent(
        surface.space,
        surface.start,
        settings,
        server={"checkpoint_timeout": "5min", "checkpoint_completion_target": "0.9"},
    )
    lengths: list[float | None] = []
    knobs: list[str | None] = []
    while (cand := opt.suggest()) is not None:
        lengths.append(cand.run_s)
        knobs.append(cand.knob)
        m = bench.measure(surface.true(cand.config))
        seconds = cand.run_s or 30
        counters = ServerCounters(seconds=seconds, wal_bytes=wal_rate * seconds)
        opt.register(cand, replace(m, counters=counters))
    return opt, lengths, knobs


def test_no_long_runs_when_a_checkpoint_cycle_writes_under_one_wal_segment() -> None:
    # a read-only workload's 25 B/s: a 5-minute cycle writes 7.3 kB, nothing for the
    # checkpoint knobs to act on; the long runs (5 min each) would only spend the budget
    opt, lengths, seen = _sim_walk(25.0)
    assert all(r is None for r in lengths)  # not one long run
    knobs = {"max_wal_size", "checkpoint_timeout", "checkpoint_completion_target"}
    assert set(opt.set_aside) == knobs
    why = (
        "the latest run wrote 25 B/s of WAL: a checkpoint cycle (5 min) writes 7.3 kB, "
        "under one WAL segment (16.0 MB), so checkpoint and bgwriter knobs have nothing to "
        "act on"
    )
    for n in knobs:
        assert opt.set_aside[n].startswith(f"{n} not judged: {why}")
        assert "give duration_s" not in opt.set_aside[n]  # no run length would show it
        assert n not in seen  # not one run spent on them
    assert any(p.startswith("long runs not started: ") and why in p for p in opt.phases)
    rec = opt.recommendation()
    note = next(n for n in rec.notes if n.name == "max_wal_size")
    assert note.not_judged is not None
    assert why in note.not_judged
    assert "no effect" not in render_conf(rec)


def test_long_runs_start_as_before_at_an_ordinary_wal_rate() -> None:
    # 2 MB/s: a checkpoint every 4.5 min (1 GB / 1.9 / 2 MB/s), 600 MB per timed cycle
    opt, lengths, seen = _sim_walk(2 * MB)
    assert 300.0 in lengths
    assert {seen[i] for i, r in enumerate(lengths) if r == 300.0} >= {"max_wal_size"}
    assert opt.phases[0].startswith("long runs: max_wal_size, ")
    assert not any("WAL segment" in p for p in opt.phases)
    assert any(k == "max_wal_size" for _, k, _, _ in opt.verdicts)


def test_the_descent_orders_knobs_from_the_baselines_counters() -> None:
    # the baseline's runs read 20% of their blocks and saw no checkpoint:
    # shared_buffers (second in the given order) is tuned first
    opt = _walk(300, 0.01 * MB, blks_read=200.0, blks_hit=800.0, checkpoints_timed=0.0,
                checkpoints_req=0.0)  # fmt: skip
    assert opt.order_notes[0].startswith("shared_buffers: 20.0% of blocks read")
    first = [k for _, k, _, _ in opt.verdicts if k]
    assert first[0] == "shared_buffers"
    # off: the given order
    space = knob_space(["max_wal_size", "shared_buffers"], HW)
    plain = CoordinateDescent(
        space, {}, replace(DescentSettings(max_trials=40), order_by_counters=False)
    )
    assert plain.order_notes == ()


def test_the_order_notes_leave_out_knobs_held_for_the_session() -> None:
    """A knob excluded for good (start: heuristic holds PGTune's settings outside the tuned
    knobs) is never tried, so the search order does not say it is "tried first"."""
    space = knob_space(["shared_buffers", "effective_io_concurrency", "max_wal_size"], HW)
    start = {"shared_buffers": "128MB", "effective_io_concurrency": "200", "max_wal_size": "1GB"}
    opt = CoordinateDescent(space, start, DescentSettings(max_trials=12, run_seconds=30))
    opt.exclude("effective_io_concurrency", "held")
    while (cand := opt.suggest()) is not None:
        opt.register(cand, _run(1000.0, 0.0, 30, blks_read=200.0, blks_hit=800.0))
    notes = [n for line in opt.orderings for n in line.split("; ")]
    assert any("shared_buffers: 20.0% of blocks read" in n for n in notes)
    assert not any("effective_io_concurrency" in n for n in notes)
    assert "effective_io_concurrency" not in {k for _, k, _, _ in opt.verdicts}


def test_kept_hints_reorder_the_walk_from_their_own_runs() -> None:
    """The baseline spilled nothing, so work_mem goes last; the hints' config spills (found
    on TPC-H: work_mem 28 MB and random_page_cost 1.1 changed the plans), so once the hints
    are kept the walk orders its knobs again from their runs, and work_mem goes first."""
    space = knob_space(["shared_buffers", "random_page_cost", "work_mem"], HW)
    start = {"shared_buffers": "128MB", "random_page_cost": "4", "work_mem": "4MB"}
    hints = {"shared_buffers": "2GB", "random_page_cost": "1.1", "work_mem": "28MB"}
    opt = CoordinateDescent(
        space, start, DescentSettings(max_trials=30, run_seconds=30, max_passes=1), hints=hints
    )
    tuned: list[str] = []
    while (cand := opt.suggest()) is not None:
        hinted = cand.config["random_page_cost"] == "1.1"
        if cand.knob and cand.role == "candidate":
            tuned.append(cand.knob)
        # the hints' config: 30% faster, and its plans spill; the start config's do not
        counters = {"temp_files": 9.0 if hinted else 0.0, "blks_read": 0.0, "blks_hit": 1e6}
        opt.register(cand, _run(1300.0 if hinted else 1000.0, 0.0, 30, **counters))
    first, then = opt.orderings
    assert first.startswith("search order from the baseline's counters: ")
    assert "work_mem: no sort or hash spilled to a temp file in the baseline, tried last" in first
    assert then.startswith(
        "search order after the hints were kept, from their runs: "
        "work_mem: 9 temp files in the hints' config, tried first"
    )
    assert tuned[0] == "work_mem", tuned
