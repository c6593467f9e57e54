"""Coordinate descent: ask/tell, replay, bounds, budgets, failures, search quality."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optimizer.catalogue import GB, Hardware, knob_space
from optimizer.descent import Candidate, CoordinateDescent, Measurement
from optimizer.evidence import ScriptStat, StreamStat
from optimizer.heuristic import pgtune
from optimizer.knobs import Config, KnobError
from optimizer.settings import BudgetError, DescentSettings
from tests.optimizer.sim import (
    SURFACES,
    Bench,
    Noise,
    Surface,
    Term,
    cliff_surface,
    descent,
    flat_surface,
    naive_descent,
    oltp_surface,
    reporting_surface,
    run_descent,
)


def drive(
    opt: CoordinateDescent, surface: Surface, bench: Bench
) -> list[tuple[Candidate, Measurement]]:
    log = []
    while (cand := opt.suggest()) is not None:
        m = bench.measure(surface.true(cand.config))
        opt.register(cand, m)
        log.append((cand, m))
    return log


def test_first_runs_are_the_baseline_and_suggest_is_idempotent() -> None:
    s = oltp_surface()
    opt = CoordinateDescent(s.space, s.start)
    first = opt.suggest()
    assert first is not None
    assert first == opt.suggest()
    assert first.role == "baseline"
    assert first.index == 0
    assert first.knob is None
    assert set(first.config) == set(s.names)  # the full config of every knob
    assert first.config == {k: s.start[k] for k in s.names}


@pytest.mark.parametrize("hinted", [False, True])
@pytest.mark.parametrize("cut", [0, 1, 5, 17, 29])
def test_replay_rebuilds_the_same_state(cut: int, hinted: bool) -> None:
    s = reporting_surface()
    kwargs: dict[str, object] = {"seed": 7, "max_trials": 40}
    if hinted:
        kwargs["hints"] = pgtune(s.hardware, "mixed")
    original = descent(s.space, s.start, **kwargs)  # type: ignore[arg-type]
    bench = Bench(Noise(), 3)
    log = []
    for _ in range(cut):
        cand = original.suggest()
        if cand is None:  # (the hinted session may converge sooner)
            assert hinted
            break
        m = bench.measure(s.true(cand.config))
        original.register(cand, m)
        log.append((cand, m))
    # the service crashed: a new optimizer with the same arguments, stored pairs re-registered
    rebuilt = descent(s.space, s.start, **kwargs)  # type: ignore[arg-type]
    for cand, m in log:
        rebuilt.register(cand, m)
    assert rebuilt.suggest() == original.suggest()
    assert rebuilt.incumbent == original.incumbent
    assert rebuilt.trials_done == original.trials_done == len(log)
    assert len(log) == cut or hinted
    assert rebuilt.verdicts == original.verdicts
    # and both continue identically
    rest_a = drive(original, s, Bench(Noise(), 99))
    rest_b = drive(rebuilt, s, Bench(Noise(), 99))
    assert [c for c, _ in rest_a] == [c for c, _ in rest_b]


def test_register_rejects_a_diverged_replay() -> None:
    s = oltp_surface()
    opt = CoordinateDescent(s.space, s.start)
    cand = opt.suggest()
    assert cand is not None
    wrong = Candidate(cand.index + 1, cand.config, None, None, "baseline")
    with pytest.raises(ValueError, match="does not match"):
        opt.register(wrong, Measurement(samples=(1.0,)))
    opt.register(cand, Measurement(samples=(100.0,) * 10))
    with pytest.raises(ValueError, match="does not match"):
        opt.register(cand, Measurement(samples=(100.0,) * 10))  # registered twice


@pytest.mark.parametrize("make", SURFACES)
def test_candidates_within_bounds_and_never_measured_twice_by_accident(make: object) -> None:
    s = make()  # type: ignore[operator]
    knobs = {k.name: k for k in s.space}
    opt = CoordinateDescent(s.space, s.start, DescentSettings(max_trials=60, max_passes=3))
    bench = Bench(Noise(), 5)
    measured: set[tuple[tuple[str, str], ...]] = set()
    current: tuple[tuple[str, str], ...] | None = None
    while (cand := opt.suggest()) is not None:
        key = tuple(sorted(cand.config.items()))
        if cand.role == "candidate":
            assert cand.knob is not None
            assert cand.value is not None
            k = knobs[cand.knob]
            v = k.parse(cand.value)
            if isinstance(v, float):
                assert k.lower <= v <= k.upper
            else:
                assert v in k.choices
            assert cand.config[cand.knob] == cand.value
            if key != current:  # a new evaluation: its config was never run before
                assert key not in measured, cand
                current = key
        elif cand.role == "incumbent":
            assert cand.config == opt.incumbent
        measured.add(key)
        opt.register(cand, bench.measure(s.true(cand.config)))


def test_trial_and_time_budgets() -> None:
    s = oltp_surface()
    for seed in range(4):
        opt = run_descent(s, Bench(Noise(), seed), max_trials=14)
        # a check uses what the walk left; with nothing kept the walk leaves only A B unused
        assert opt.trials_done == (14 if opt.checked else 12)
        assert opt.suggest() is None
        assert opt.planned_trials() == opt.trials_done
    opt2 = CoordinateDescent(
        s.space, s.start, DescentSettings(max_trials=None, max_benchmark_s=840, run_seconds=60)
    )
    assert opt2.planned_trials() <= 14
    drive(opt2, s, Bench(Noise(), 1))
    assert opt2.trials_done <= 14


def test_a_budget_too_small_for_the_walk_and_the_final_check_is_refused() -> None:
    s = oltp_surface()
    with pytest.raises(BudgetError, match="max_trials >= 11") as exc:
        CoordinateDescent(s.space, s.start, DescentSettings(max_trials=8))
    assert exc.value.minimum == 11
    with pytest.raises(BudgetError, match="at least 660 s"):
        CoordinateDescent(
            s.space, s.start, DescentSettings(max_trials=None, max_benchmark_s=300, run_seconds=60)
        )
    CoordinateDescent(s.space, s.start, DescentSettings(max_trials=11))  # the minimum is accepted


def test_no_op_changes_are_rarely_kept_over_whole_sessions() -> None:
    s = flat_surface()
    kept = total = 0
    for seed in range(12):
        opt = run_descent(s, Bench(Noise(), 100 + seed), max_trials=40)
        kept += sum(v.keep for *_, v in opt.verdicts)
        total += len(opt.verdicts)
    assert total > 100
    assert kept / total <= 0.05


def test_look_ahead_gets_past_the_work_mem_dip() -> None:
    # work_mem 8MB is 12% slower than 4MB, 16MB is 44% faster (the shape in docs/architecture.md)
    # (with x2 steps: the default first pass steps x4, straight over the dip)
    s = reporting_surface()
    with_la = [run_descent(s, Bench(Noise(), sd), max_trials=40, coarse=0) for sd in range(6)]
    without = [
        run_descent(s, Bench(Noise(), sd), max_trials=40, look_ahead=0, max_skips=0, coarse=0)
        for sd in range(6)
    ]
    wm = s.space[0]
    assert sum(float(wm.parse(o.incumbent["work_mem"])) >= 16 * 1024 for o in with_la) >= 5
    assert all(o.incumbent["work_mem"] == "4MB" for o in without)


def test_a_knob_clearly_worse_both_ways_gives_its_place_without_a_second_look_ahead() -> None:
    # max_wal_size at its best where it starts: every x2 step either way costs 15%
    hw = Hardware(ram_bytes=16 * GB, cpus=4)
    peak = Surface(
        name="peak",
        hardware=hw,
        names=("max_wal_size",),
        start={"max_wal_size": "1GB"},
        base=1000.0,
        terms=(Term(("max_wal_size",), lambda w: 0.85 ** abs(math.log2(float(w) / 1024))),),
    )
    opt = descent(peak.space, peak.start, max_trials=40, coarse=0, max_passes=1)
    log = drive(opt, peak, Bench(Noise(), 1))
    steps = [c.config["max_wal_size"] for c, _ in log if c.role == "candidate"]
    ups = [v for v in steps if peak.space[0].parse(v) > peak.space[0].parse("1GB")]
    downs = [v for v in steps if peak.space[0].parse(v) < peak.space[0].parse("1GB")]
    assert len(ups) == 2  # the first direction: a clearly worse step and one look past it
    assert len(downs) == 1  # the second: one clearly worse step ends the knob
    assert opt.incumbent["max_wal_size"] == "1GB"


def test_skipping_climbs_a_slope_of_small_steps() -> None:
    # shared_buffers gains only 2-9% per x2 step: each step alone is hard to prove, so an
    # unproven step is skipped and the value one step further is tried
    s = oltp_surface()
    sb = s.space[0]

    def final_mb(**kw: object) -> list[float]:
        runs = [run_descent(s, Bench(Noise(), sd), max_trials=40, **kw) for sd in range(6)]
        return [float(sb.parse(o.incumbent["shared_buffers"])) * 8 / 1024 for o in runs]

    assert sum(mb >= 1024 for mb in final_mb()) >= 4
    assert sum(mb >= 1024 for mb in final_mb(max_skips=0, coarse=0)) <= 1


def test_search_beats_the_naive_method_and_never_ends_past_a_cliff() -> None:
    ours, naive = [], []
    for make in SURFACES:
        s = make()
        for sd in range(4):
            opt = run_descent(s, Bench(Noise(), 50 + sd), max_trials=40)
            ours.append(s.quality(opt.incumbent))
            naive.append(s.quality(naive_descent(s, Bench(Noise(), 50 + sd))[0]))
            assert s.quality(opt.incumbent) >= s.quality(s.start) * 0.97  # never much worse
    assert np.median(ours) >= 0.78
    assert np.mean(ours) > np.mean(naive) + 0.08


def test_failed_run_narrows_the_bound_for_the_session() -> None:
    # the server does not start with work_mem >= 32MB: that value and beyond are not tried again
    s = reporting_surface()
    opt = CoordinateDescent(s.space, s.start, DescentSettings(max_trials=80, max_passes=3))
    bench = Bench(Noise(), 2)
    wm = s.space[0]
    failed_at: float | None = None
    while (cand := opt.suggest()) is not None:
        v = float(wm.parse(cand.config["work_mem"]))
        if failed_at is not None and cand.role == "candidate" and cand.knob == "work_mem":
            assert v < failed_at
        if v >= 32 * 1024 and cand.role == "candidate":
            failed_at = v if failed_at is None else min(failed_at, v)
            verdict = opt.register(
                cand, Measurement(samples=(), failed=True, error="server did not start")
            )
            assert verdict is not None
            assert not verdict.keep
            assert verdict.p_value is None
            assert "server did not start" in verdict.reason
            continue
        opt.register(cand, bench.measure(s.true(cand.config)))
    assert failed_at is not None
    assert float(wm.parse(opt.incumbent["work_mem"])) < 32 * 1024


def test_exclude_withdraws_the_pending_knob() -> None:
    s = oltp_surface()
    opt = CoordinateDescent(s.space, s.start, DescentSettings(max_trials=40))
    bench = Bench(Noise(), 4)
    while (cand := opt.suggest()) is not None and cand.knob != "shared_buffers":
        opt.register(cand, bench.measure(s.true(cand.config)))
    assert cand is not None
    opt.exclude("shared_buffers", "restarts are not allowed on this target")
    nxt = opt.suggest()
    assert nxt is not None
    assert nxt.knob != "shared_buffers"
    for c, _ in drive(opt, s, bench):
        assert c.knob != "shared_buffers"
        assert c.config["shared_buffers"] == "128MB"
    assert opt.excluded == {"shared_buffers": "restarts are not allowed on this target"}
    with pytest.raises(KnobError):
        opt.exclude("fsync", "not in the space")


def test_latency_objective_and_p99_constraint() -> None:
    hw = Hardware(ram_bytes=16 * GB, cpus=4)
    space = knob_space(["work_mem"], hw)

    def run(cfg: Config, rng: np.random.Generator, p99_factor: float) -> Measurement:
        kb = float(space[0].parse(cfg["work_mem"]))
        level = 20.0 if kb <= 4096 else 12.0  # p95 latency drops from 20 to 12 ms
        p95 = tuple(float(x) for x in level * np.exp(rng.normal(0, 0.1, 60)))
        p99 = 30.0 * (p99_factor if kb > 4096 else 1.0)
        tps = tuple(float(x) for x in 1000 * np.exp(rng.normal(0, 0.1, 60)))
        return Measurement(
            samples=tps, latency_p95_samples=p95, latency_p95_ms=level, latency_p99_ms=p99
        )

    for p99_factor, expect_kept in ((1.0, True), (1.5, False)):
        opt = CoordinateDescent(
            space,
            {"work_mem": "4MB"},
            DescentSettings(objective="latency_p95", max_p99_worsening=0.1),
        )
        rng = np.random.default_rng(1)
        while (cand := opt.suggest()) is not None:
            opt.register(cand, run(cand.config, rng, p99_factor))
        first = opt.verdicts[0][3]
        assert first.keep is expect_kept, first.reason
        if expect_kept:
            assert first.gain == pytest.approx(0.4, abs=0.1)


def test_recommendation_and_best_gain() -> None:
    s = reporting_surface()
    opt = run_descent(s, Bench(Noise(), 1), max_trials=40)
    rec = opt.recommendation({"target": "sim"})
    assert rec.recommended == opt.incumbent
    assert rec.original == {k: s.start[k] for k in s.names}
    assert (
        sum(n.trials for n in rec.notes) + opt.settings.baseline_runs + opt.settings.final_runs
        == opt.trials_done
    )
    changed = [n for n in rec.notes if n.changed]
    assert changed
    assert all(n.gain is not None and n.gain > 0 for n in changed)
    assert opt.best_gain is not None
    assert opt.best_gain > 0.15


def test_steps_from_off_and_auto_values() -> None:
    hw = Hardware(ram_bytes=16 * GB, cpus=4)
    space = knob_space(["commit_delay", "wal_buffers", "effective_io_concurrency"], hw)
    start = {"commit_delay": "0", "wal_buffers": "-1", "effective_io_concurrency": "1"}
    opt = CoordinateDescent(space, start, DescentSettings(max_trials=None, baseline_runs=1))
    first: dict[str, str] = {}
    flat = Measurement(samples=(1000.0,) * 30)
    while (cand := opt.suggest()) is not None:
        if cand.knob is not None:
            first.setdefault(cand.knob, cand.value or "")
        opt.register(cand, flat)
    assert first == {
        "commit_delay": "10",  # x2 from 0 never moves: the first step goes to the floor
        "wal_buffers": "16MB",  # -1 (auto, at most 16MB): up means 16MB
        "effective_io_concurrency": "4",  # x4: the first pass steps coarsely
    }


def test_bad_arguments() -> None:
    s = oltp_surface()
    with pytest.raises(KnobError):
        CoordinateDescent([], {})
    with pytest.raises(ValueError, match="objective"):
        CoordinateDescent(s.space, s.start, DescentSettings(objective="tps"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shared_buffers"):
        CoordinateDescent(s.space, {**s.start, "shared_buffers": "lots"})
    with pytest.raises(ValueError, match="final_runs"):
        CoordinateDescent(s.space, s.start, DescentSettings(final_runs=3))


def test_first_pass_steps_coarsely_then_finer() -> None:
    # x4 in the first pass (a big effect is cheap to prove), x2 in the second
    hw = Hardware(ram_bytes=16 * GB, cpus=4)
    space = knob_space(["shared_buffers"], hw)
    opt = CoordinateDescent(
        space, {"shared_buffers": "128MB"}, DescentSettings(max_trials=None, max_passes=2)
    )
    seen: list[tuple[int, str]] = []
    level = 1000.0
    while (cand := opt.suggest()) is not None:
        if cand.role == "candidate":
            seen.append((opt._pass, cand.value or ""))
        sb = float(space[0].parse(cand.config["shared_buffers"])) * 8 / 1024
        level = 1000.0 if sb != 512 else 2000.0  # only 512MB helps, hugely
        opt.register(
            cand, Measurement(samples=tuple(level * (1 + 0.01 * (i % 3)) for i in range(30)))
        )
    assert seen[0] == (0, "512MB")
    assert opt.incumbent["shared_buffers"] == "512MB"
    second = [v for p, v in seen if p == 1]
    assert second[:2] == ["1GB", "256MB"]  # the second pass refines with x2 around it
    old = CoordinateDescent(space, {"shared_buffers": "128MB"}, DescentSettings(coarse=0))
    first = old.suggest()
    assert first is not None
    assert first.role == "baseline"
    old.register(first, Measurement(samples=(1000.0,) * 30))
    old.register(old.suggest(), Measurement(samples=(1000.0,) * 30))  # type: ignore[arg-type]
    nxt = old.suggest()
    assert nxt is not None
    assert nxt.value == "256MB"


def test_joint_hints_are_proven_first_and_the_walk_goes_on_from_them() -> None:
    s = reporting_surface()
    hints = pgtune(s.hardware, "mixed")
    q, q_plain = [], []
    for sd in range(4):
        opt = CoordinateDescent(s.space, s.start, DescentSettings(max_trials=40), hints=hints)
        log = drive(opt, s, Bench(Noise(), 200 + sd))
        first = next(c for c, _ in log if c.role == "candidate")
        assert first.knob is None
        assert (first.value or "").startswith("hints: ")
        assert first.config["jit"] == "off"
        assert first.config["random_page_cost"] == "1.1"
        q.append(s.quality(opt.incumbent))
        q_plain.append(s.quality(run_descent(s, Bench(Noise(), 200 + sd)).incumbent))
        # the joint verdict is recorded without a knob name; gains stay per knob
        assert opt.verdicts[0][1] == ""
    assert np.median(q) >= 0.93
    assert np.median(q) > np.median(q_plain) + 0.05


def test_bad_hints_are_rejected_and_never_kept_past_a_cliff() -> None:
    s = cliff_surface()
    bad = {"shared_buffers": "3276MB", "work_mem": "100MB"}  # both past their cliff
    for sd in range(3):
        opt = CoordinateDescent(s.space, s.start, DescentSettings(max_trials=40), hints=bad)
        log = drive(opt, s, Bench(Noise(), 300 + sd))
        assert opt.verdicts[0][1] == ""
        assert not opt.verdicts[0][3].keep
        tried = [c.knob for c, _ in log if c.role == "candidate"]
        assert "shared_buffers" in tried  # the walk still tunes the hinted knobs
        assert s.quality(opt.incumbent) >= s.quality(s.start)
        assert float(s.space[0].parse(opt.incumbent["shared_buffers"])) * 8192 < 2.8 * GB


def test_exclude_withdraws_a_joint_run_with_that_knob() -> None:
    s = oltp_surface()
    opt = CoordinateDescent(
        s.space,
        s.start,
        DescentSettings(max_trials=40),
        hints={"shared_buffers": "4GB", "max_wal_size": "4GB"},
    )
    for _ in range(2):
        c = opt.suggest()
        assert c is not None
        assert c.role == "baseline"
        opt.register(c, Measurement(samples=(1000.0,) * 30))
    c = opt.suggest()
    assert c is not None
    assert c.knob is None
    assert c.config["shared_buffers"] == "4GB"
    opt.exclude("shared_buffers", "needs a restart")
    c = opt.suggest()
    assert c is not None
    assert c.config["shared_buffers"] == "128MB"
    assert c.knob == "max_wal_size"
    assert c.value == "4GB"


def _roles(log: list[tuple[Candidate, Measurement]]) -> list[str]:
    return [c.role for c, _ in log]


@pytest.mark.parametrize("seed", [1, 2])
def test_final_check_measures_best_and_baseline_side_by_side_within_budget(seed: int) -> None:
    s = reporting_surface()
    opt = CoordinateDescent(s.space, s.start, DescentSettings(max_trials=40))
    log = drive(opt, s, Bench(Noise(), seed))
    assert opt.trials_done == len(log) <= 40
    assert opt.incumbent != opt.baseline
    final = log[-6:]
    assert all(c.role.startswith("final-") and c.is_final for c, _ in final)
    assert not any(c.is_final for c, _ in log[:-6])
    # A B B A A B: drift mostly cancels; A is what the server ran last (one restart fewer)
    roles = _roles(final)
    a, b = roles[0], roles[1]
    assert a != b
    assert roles == [a, b, b, a, a, b]
    last = log[-7][0].config
    assert roles[0] == ("final-baseline" if last == opt.baseline else "final-incumbent")
    for c, _ in final:
        assert c.config == (opt.baseline if c.role == "final-baseline" else opt.incumbent)
        assert c.knob is None
        assert c.value is None
    assert opt.checked
    ov = opt.overall()
    assert ov is not None
    assert ov.runs == (3, 3)
    assert opt.planned_trials() == opt.trials_done


def _flat(level: float) -> Measurement:
    return Measurement(samples=(level,) * 30)


def test_no_final_check_when_nothing_was_kept() -> None:
    s = oltp_surface()
    opt = CoordinateDescent(s.space, s.start, DescentSettings(max_trials=12))
    roles = []
    while (c := opt.suggest()) is not None:
        roles.append(c.role)
        opt.register(c, _flat(1000.0))  # every config measures the same: nothing is kept
    assert opt.incumbent == opt.baseline
    assert len(roles) == 10  # only the check's first two runs (A B) stay set aside, unused
    assert not any(r.startswith("final-") for r in roles)
    assert opt.claim == "none"
    assert not opt.checked
    assert opt.final_verdict is None


def _helps_work_mem(config: Config) -> Measurement:
    """Any work_mem but 4MB is 30% faster; every other knob does nothing."""
    return _flat(1300.0 if config["work_mem"] != "4MB" else 1000.0)


def _late_keep_session(max_trials: int | None) -> CoordinateDescent:
    hw = Hardware(ram_bytes=16 * GB, cpus=4)
    space = knob_space(["max_wal_size", "bgwriter_lru_maxpages", "work_mem"], hw)
    start = {"max_wal_size": "1GB", "bgwriter_lru_maxpages": "100", "work_mem": "4MB"}
    return CoordinateDescent(space, start, DescentSettings(max_trials=max_trials))


def test_a_keep_late_in_the_walk_gets_the_check_the_budget_still_holds() -> None:
    # where an unlimited walk first keeps work_mem
    free = _late_keep_session(None)
    kept_at = 0
    while free.incumbent == free.baseline:
        c = free.suggest()
        assert c is not None
        free.register(c, _helps_work_mem(c.config))
        kept_at = free.trials_done
    # a budget 3 runs past it: a reserve of the whole check (6) would have ended the walk
    # before the keep; A B leaves room for it, and the check gets the 3 runs left (A B B)
    opt = _late_keep_session(kept_at + 3)
    roles = []
    while (c := opt.suggest()) is not None:
        roles.append(c.role)
        opt.register(c, _helps_work_mem(c.config))
    assert opt.trials_done == kept_at + 3
    assert [r for r in roles if r.startswith("final-")] == roles[kept_at:]
    assert len(roles[kept_at:]) == 3
    assert opt.checked
    ov = opt.overall()
    assert ov is not None
    assert sorted(ov.runs) == [1, 2]
    assert ov.gain == pytest.approx(0.3)
    assert opt.claim in ("confirmed", "not-credible")
    assert opt.incumbent["work_mem"] != "4MB"


def test_end_final_check_judges_the_runs_it_has() -> None:
    opt = _late_keep_session(None)
    while opt.incumbent == opt.baseline:
        c = opt.suggest()
        assert c is not None
        opt.register(c, _helps_work_mem(c.config))
    opt.conclude()
    first = opt.suggest()
    assert first is not None
    assert first.is_final
    opt.end_final_check()  # nothing yet of either config: does nothing
    assert opt.suggest() == first
    opt.register(first, _helps_work_mem(first.config))
    opt.end_final_check()  # one config only: a cut now could not judge anything
    second = opt.suggest()
    assert second is not None
    assert second.is_final
    assert second.role != first.role
    assert opt.final_runs_left == 5
    opt.register(second, _helps_work_mem(second.config))
    opt.end_final_check()
    assert opt.suggest() is None
    assert opt.final_runs_left == 0
    v = opt.final_verdict
    assert v is not None
    assert v.runs == (1, 1)
    assert v.gain == pytest.approx(0.3)


def test_a_best_config_the_final_check_does_not_confirm_is_not_recommended() -> None:
    # work_mem 16MB measures +30% during the walk (drift, say), then nothing side by side
    hw = Hardware(ram_bytes=16 * GB, cpus=4)
    opt = CoordinateDescent(
        knob_space(["work_mem"], hw), {"work_mem": "4MB"}, DescentSettings(max_trials=None)
    )
    while (c := opt.suggest()) is not None:
        lucky = c.config["work_mem"] == "16MB" and not c.is_final
        opt.register(c, _flat(1300.0 if lucky else 1000.0))
    assert opt.checked
    assert opt.final_verdict is not None
    assert opt.final_verdict.gain == pytest.approx(0.0)  # < min_gain
    assert opt.final_rejected == {"work_mem": "16MB"}
    assert opt.claim == "no-change"
    assert opt.incumbent == opt.baseline == {"work_mem": "4MB"}
    assert opt.best_gain == 0.0
    rec = opt.recommendation()
    assert rec.recommended == rec.original


def test_conclude_starts_the_final_check_and_replays() -> None:
    s = reporting_surface()
    hints = pgtune(s.hardware, "mixed")
    opt = CoordinateDescent(s.space, s.start, DescentSettings(max_trials=None), hints=hints)
    bench = Bench(Noise(), 3)
    log = []
    while opt.incumbent == opt.baseline or len(log) < 8:  # the hints are kept early
        c = opt.suggest()
        assert c is not None
        assert not c.is_final
        m = bench.measure(s.true(c.config))
        opt.register(c, m)
        log.append((c, m))
    assert opt.final_runs_left == 6
    opt.conclude()
    assert opt.concluding
    cut = len(log)
    log += drive(opt, s, bench)
    assert [c.is_final for c, _ in log[cut:]] == [True] * 6
    assert opt.final_runs_left == 0
    assert opt.stop_reason == "concluded early"
    # the same state rebuilt from the stored runs, conclude() called where it was
    again = CoordinateDescent(s.space, s.start, DescentSettings(max_trials=None), hints=hints)
    for c, m in log:
        if c.is_final and not again.concluding:
            again.conclude()
        again.register(c, m)
    assert again.suggest() is None
    assert again.overall() == opt.overall()


def test_final_check_removes_the_winners_curse_from_the_claimed_gain() -> None:
    # A keep is more likely when drift flattered the candidate, so "all the incumbent's
    # runs vs the first baseline runs" overstates the gain; fresh side-by-side runs do not.
    s = reporting_surface()
    err: dict[int, list[float]] = {0: [], 6: []}
    for seed in range(12):
        for final in err:
            opt = run_descent(s, Bench(Noise(), 500 + seed), max_trials=40, final_runs=final)
            gain = opt.best_gain
            assert gain is not None
            true = s.true(opt.incumbent) / s.true(opt.baseline) - 1
            err[final].append(math.log1p(gain) - math.log1p(true))
    bias = {final: float(np.mean(e)) for final, e in err.items()}
    assert abs(bias[6]) < 0.04, bias
    assert bias[0] > bias[6], bias


def _stream(mean_ms: float) -> StreamStat:
    script = ScriptStat(label="q", share=1.0, n=40, failed=0, mean_ms=mean_ms, var_mean=1.0)
    return StreamStat(name="main", clients=2, scripts=(script,))


@pytest.mark.parametrize(
    ("tps", "objective", "settled"),
    [
        (2.0, "throughput", "transactions"),  # a slow workload: seconds hold 0-3 transactions
        (500.0, "throughput", "seconds"),  # OLTP: the measured per-second path
        (500.0, "query_time_geomean", "transactions"),  # query times exist per transaction
    ],
)
def test_auto_evidence_settles_on_the_first_run(tps: float, objective: str, settled: str) -> None:
    space = knob_space(["work_mem"], Hardware(ram_bytes=8 * GB, cpus=2))
    opt = CoordinateDescent(
        space, {}, DescentSettings(objective=objective, max_trials=20, final_runs=0)
    )
    assert opt.evidence == ("transactions" if objective != "throughput" else "auto")
    first = opt.suggest()
    assert first is not None
    opt.register(first, Measurement(samples=(tps,) * 10, streams=(_stream(100.0),)))
    assert opt.evidence == settled
    # a run without a transaction log (an old stored trial) is judged per second
    second = opt.suggest()
    assert second is not None
    opt.register(second, Measurement(samples=(tps,) * 10))
    assert opt.trials_done == 2


def _mix(done: dict[str, float | None]) -> StreamStat:
    """An in-turn stream of queries; None: the query never finished within the run."""
    scripts = tuple(
        ScriptStat(label=q, share=1.0, n=0 if ms is None else 10, failed=0, mean_ms=ms,
                   var_mean=1.0)
        for q, ms in done.items()
    )  # fmt: skip
    return StreamStat(name="olap", clients=1, scripts=scripts)


def test_a_query_that_never_finishes_rejects_the_candidate_and_says_so() -> None:
    space = knob_space(["work_mem"], Hardware(ram_bytes=8 * GB, cpus=2))
    opt = CoordinateDescent(
        space,
        {},
        DescentSettings(objective="query_time_geomean", max_trials=20, final_runs=0),
        hints={},
    )
    verdicts = []
    while (c := opt.suggest()) is not None:
        slow = c.role == "candidate"  # every candidate leaves Q9 unfinished
        m = Measurement(
            samples=(1.0,) * 10, streams=(_mix({"Q1": 900.0, "Q9": None if slow else 4000.0}),)
        )
        if (v := opt.register(c, m)) is not None:
            verdicts.append(v)
    assert verdicts
    assert all(not v.keep for v in verdicts)
    assert all("olap/Q9 never finished within the run" in v.reason for v in verdicts), verdicts
    assert opt.incumbent == opt.baseline


def test_a_baseline_that_never_finishes_a_query_stops_saying_what_to_change() -> None:
    space = knob_space(["work_mem"], Hardware(ram_bytes=8 * GB, cpus=2))
    opt = CoordinateDescent(
        space, {}, DescentSettings(objective="query_time_geomean", max_trials=20, final_runs=0)
    )
    while (c := opt.suggest()) is not None:
        opt.register(
            c, Measurement(samples=(1.0,) * 10, streams=(_mix({"Q1": 900.0, "Q9": None}),))
        )
    assert opt.trials_done == 2
    assert opt.stop_reason is not None
    assert "olap/Q9 never finished within a run" in opt.stop_reason
    assert "longer duration_s" in opt.stop_reason


def test_a_walk_cut_mid_evaluation_reports_the_lead_as_undecided() -> None:
    """The budget ends while a candidate leads on too few runs for a verdict: the lead is
    reported, labelled as neither kept nor confirmed, never silently dropped."""
    rng = np.random.default_rng(7)

    def run(level: float) -> Measurement:
        return Measurement(samples=tuple(level * rng.lognormal(0.0, 0.1, 30)))

    opt = CoordinateDescent(
        knob_space(["work_mem"], Hardware(8 * GB, 2)),
        {"work_mem": "4MB"},
        DescentSettings(max_trials=None),
    )
    while (c := opt.suggest()) is not None and c.role == "baseline":
        opt.register(c, run(1000.0))
    assert c is not None
    assert c.role == "candidate"
    opt.register(c, run(1120.0))  # one run: about +12%, short of a verdict
    assert opt.incumbent == opt.baseline
    opt.conclude()
    note = opt.undecided
    assert note is not None
    assert f"work_mem={c.config['work_mem']}" in note
    assert "over 1 run(s)" in note
    assert "Not kept and not confirmed" in note
    gain = float(note.split(" measured ")[1].split("%")[0])
    assert 5.0 < gain < 20.0


def test_a_walk_cut_without_a_lead_has_nothing_undecided() -> None:
    """Cut while a flat candidate is measured (the trial budget): no lead, no note."""
    s = oltp_surface()
    opt = CoordinateDescent(s.space, s.start, DescentSettings(max_trials=12))
    while (c := opt.suggest()) is not None:
        opt.register(c, _flat(1000.0))
    assert opt.undecided is None


def test_a_clear_gain_is_kept_on_i_c_i_after_the_baseline() -> None:
    # one knob worth +50%: baseline, baseline, candidate, incumbent re-run, and the keep is
    # judged on I C I (the first baseline run left out), not after a fifth run
    hw = Hardware(ram_bytes=16 * GB, cpus=4)
    s = Surface(
        name="one-step",
        hardware=hw,
        names=("work_mem",),
        start={"work_mem": "4MB"},
        base=1000.0,
        terms=(Term(("work_mem",), lambda w: 1.5 if float(w) >= 16 * 1024 else 1.0),),
    )
    opt = CoordinateDescent(
        s.space, s.start, DescentSettings(max_trials=12), hints={"work_mem": "16MB"}
    )
    log = drive(opt, s, Bench(Noise(drift_sd=0.02), 7))
    roles = [c.role for c, _ in log[:4]]
    assert roles == ["baseline", "baseline", "candidate", "incumbent"]
    trial, _name, _text, v = opt.verdicts[0]
    assert trial == 3
    assert v.keep
    assert v.adjacent
    assert v.runs == (2, 1)
