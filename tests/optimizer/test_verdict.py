"""The verdict on recorded pgbench samples and on simulated noise."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from optimizer.verdict import (
    Run,
    RunStat,
    adjacent_pairs,
    balanced_window,
    compare,
    compare_paired,
    detectable_gain,
    judge,
    run_stat,
)
from tests.optimizer.sim import Bench, Noise

DATA = Path(__file__).resolve().parent.parent / "data" / "pgbench-noise.json"
WARMUP = 2  # the first 2 per-second samples of each recorded run are warm-up


def recorded() -> dict[str, list[list[float]]]:
    runs: dict[str, list[list[float]]] = {}
    for r in json.loads(DATA.read_text())["runs"]:
        runs.setdefault(r["case"], []).append(r["tps_per_second"][WARMUP:])
    return runs


def test_identical_recorded_configs_are_never_kept() -> None:
    same = recorded()["tpcb_default"]
    assert len(same) == 8
    # every ordered pair of runs, and every pair of consecutive-run pairs
    for a, b in itertools.permutations(same, 2):
        v = judge([a], [b])
        assert not v.keep, v.reason
    for i, j in itertools.permutations(range(0, 8, 2), 2):
        assert not judge(same[i : i + 2], same[j : j + 2]).keep
    # the naive rule on the same data keeps a no-op about half the time
    naive = [np.median(b) > np.median(a) for a, b in itertools.permutations(same, 2)]
    assert 0.3 < np.mean(naive) < 0.7


def test_recorded_work_mem_effect_is_kept() -> None:
    runs = recorded()
    wm4, wm16 = runs["sort_wm4MB"], runs["sort_wm16MB"]
    v = judge(wm4, wm16)
    assert v.keep
    assert 0.3 < v.gain < 0.6  # docs/architecture.md: ~39-48 tps -> 57-80 tps
    assert v.p_value is not None
    assert v.p_value < 0.001
    kept_1v1 = [judge([a], [b]).keep for a, b in itertools.product(wm4, wm16)]
    assert np.mean(kept_1v1) >= 0.6  # a single run each is often enough for +40%
    assert not judge(wm16, wm4).keep  # and the reverse is never a gain


def test_sim_false_keep_rate_and_power_fixed_design() -> None:
    noise = Noise()
    bench = Bench(noise, 11)
    false_keeps = kept_15 = 0
    n = 150
    for _ in range(n):
        inc = [bench.run(1000.0) for _ in range(3)]
        same = [bench.run(1000.0) for _ in range(3)]
        better = [bench.run(1300.0) for _ in range(3)]
        false_keeps += judge(inc, same).keep
        kept_15 += judge(inc, better).keep
    assert false_keeps / n <= 0.05
    assert kept_15 / n >= 0.8  # +30% with 3 runs a side


def test_pooled_seconds_would_be_fooled_but_the_verdict_is_not() -> None:
    # two runs of the same config whose levels differ by drift only (+10%), with many
    # seconds: a test on pooled seconds finds this "significant", the run-level test not
    rng = np.random.default_rng(3)
    a = list(1000 * np.exp(rng.normal(0, 0.05, 300)))
    b = list(1100 * np.exp(rng.normal(0, 0.05, 300)))
    v = judge([a], [b])
    assert not v.keep
    assert v.gain == pytest.approx(0.10, abs=0.01)


def test_min_gain_is_required_even_when_credible() -> None:
    a = [[1000.0 + i % 3 for i in range(60)] for _ in range(6)]
    b = [[1010.0 + i % 3 for i in range(60)] for _ in range(6)]
    v = judge(a, b, run_sd=0.001)
    assert v.p_value is not None
    assert v.p_value < 0.001
    assert not v.keep
    assert "min_gain" in v.reason
    assert judge(a, b, run_sd=0.001, min_gain=0.005).keep


def test_latency_objective_lower_is_better() -> None:
    inc = [[10.0, 10.5, 9.5, 10.2] * 10 for _ in range(3)]
    cand = [[6.0, 6.3, 5.9, 6.1] * 10 for _ in range(3)]
    v = judge(inc, cand, objective="latency_p95")
    assert v.keep
    assert v.gain == pytest.approx(0.4, abs=0.02)  # 40% lower p95 = 0.4 better
    assert not judge(cand, inc, objective="latency_p95").keep


def test_p99_constraint() -> None:
    inc = [[1000.0] * 30 for _ in range(3)]
    cand = [[1300.0] * 30 for _ in range(3)]
    assert judge(inc, cand).keep
    v = judge(inc, cand, max_p99_worsening=0.1, incumbent_p99=[5, 5, 5], candidate_p99=[8, 8, 8])
    assert not v.keep
    assert "p99" in v.reason
    ok = judge(inc, cand, max_p99_worsening=0.1, incumbent_p99=[5, 5, 5], candidate_p99=[5, 5, 5])
    assert ok.keep


def test_outlier_seconds_do_not_flip_the_verdict() -> None:
    rng = np.random.default_rng(5)
    runs = [list(1000 * np.exp(rng.normal(0, 0.1, 60))) for _ in range(4)]
    stalled = [list(r) for r in runs[2:]]
    for r in stalled:
        r[10] = 0.0  # a checkpoint stall
        r[40] = 50.0
    base = judge(runs[:2], runs[2:])
    hit = judge(runs[:2], stalled)
    assert abs(base.gain - hit.gain) < 0.02
    assert run_stat([0.0] * 10).centre < -20  # a run that did nothing is far below anything


@pytest.mark.parametrize(
    ("inc", "cand"),
    [([], [[1.0]]), ([[1.0]], []), ([[]], [[1.0]]), ([[1.0, float("nan")]], [[1.0]]),
     ([[1.0, -2.0]], [[1.0]]), ([["x"]], [[1.0]])],
)  # fmt: skip
def test_malformed_runs_raise_value_error(inc: list[list[float]], cand: list[list[float]]) -> None:
    with pytest.raises(ValueError):
        judge(inc, cand)


def _drifting(effect: float, seed: int, pairs: int = 3) -> tuple[list[Run], list[Run]]:
    """A B, A B, ... runs where the host's speed moves between pairs (sd 12%) and runs next
    to each other move together (4% apart): the long-query recordings' shape."""
    rng = np.random.default_rng(seed)
    inc: list[Run] = []
    cand: list[Run] = []
    for i in range(pairs):
        host = float(rng.normal(0, 0.12))
        for side, runs in ((0, inc), (1, cand)):
            y = host + side * float(np.log1p(effect)) + float(rng.normal(0, 0.04))
            runs.append(Run(float(2 * i + side), RunStat(y, 0.03**2, 40)))
    return inc, cand


def test_paired_verdict_sees_through_drift_that_the_unpaired_one_cannot() -> None:
    real = [_drifting(0.20, s) for s in range(300)]
    noop = [_drifting(0.0, s + 1000) for s in range(300)]
    paired_real = np.mean([compare_paired(i, c).keep for i, c in real])
    unpaired_real = np.mean([compare(i, c).keep for i, c in real])
    assert paired_real > 0.9 > unpaired_real
    assert np.mean([compare_paired(i, c).keep for i, c in noop]) < 0.05


def test_pairs_are_runs_next_to_each_other() -> None:
    inc, cand = _drifting(0.0, 1)
    far = Run(20.0, cand[0].stat)
    pairs = adjacent_pairs(inc, [*cand, far])
    assert [(a.t, b.t) for a, b in pairs] == [(0.0, 1.0), (2.0, 3.0), (4.0, 5.0)]
    # nothing adjacent: the unpaired verdict decides
    v = compare_paired(inc[:1], [far])
    assert v == compare(inc[:1], [far])


def _runs(centres: list[float], start: int = 0, within: float = 1e-4) -> list[Run]:
    return [Run(float(start + i), RunStat(c, within, 30)) for i, c in enumerate(centres)]


@pytest.mark.parametrize("lower_is_better", [False, True])
def test_the_detectable_gain_is_where_compare_starts_keeping(lower_is_better: bool) -> None:
    """A candidate whose runs scatter as the incumbent's do, shifted by just over the
    detectable gain, is kept; shifted by just under it, it is not."""
    scatter = [0.0, 0.12, -0.09, 0.05, -0.08]
    inc = _runs(scatter)
    g = detectable_gain(inc, len(scatter), min_gain=0.0, lower_is_better=lower_is_better)
    d = -np.log1p(-g) if lower_is_better else np.log1p(g)
    for factor, kept in ((1.02, True), (0.98, False)):
        # levels are "higher is better" for every objective (a time's is the log of 1/time)
        cand = _runs([c + factor * d for c in scatter], start=len(scatter))
        v = compare(inc, cand, min_gain=0.0, lower_is_better=lower_is_better)
        assert v.keep is kept, (factor, v)


def test_more_scatter_or_fewer_runs_hide_larger_effects() -> None:
    quiet = _runs([0.0, 0.02, -0.02, 0.01])
    noisy = _runs([0.0, 0.2, -0.2, 0.1])
    assert detectable_gain(noisy, 3) > detectable_gain(quiet, 3)
    assert detectable_gain(quiet, 1) > detectable_gain(quiet, 3) > detectable_gain(quiet, 6)
    # never below min_gain, however quiet
    assert detectable_gain(_runs([0.0] * 8), 6, min_gain=0.05, run_sd=0.001) == 0.05
    with pytest.raises(ValueError):
        detectable_gain(quiet, 0)


def _at(times: list[int]) -> list[Run]:
    return [Run(float(t), RunStat(0.0, 1e-4, 30)) for t in times]


@pytest.mark.parametrize(
    ("inc", "cand", "judged", "adjacent"),
    [
        ([0, 1, 3], [2], [1, 3], True),  # I I C I: its balanced part I C I
        ([1, 3], [2], [1, 3], True),  # I C I: balanced already
        ([0, 1, 3, 4], [2], [0, 1, 3, 4], True),  # I I C I I: balanced already
        # I I C I C: no trim balances it and leaves an incumbent run before the first C
        ([0, 1, 3], [2, 4], [0, 1, 3], False),
        ([0, 1, 3, 5], [2, 4], [1, 3, 5], True),  # I I C I C I: I C I C I
        ([0, 1], [2], [0, 1], False),  # not interleaved: nothing to trim towards
    ],
)
def test_the_balanced_window_drops_only_its_earliest_incumbent_runs(
    inc: list[int], cand: list[int], judged: list[int], adjacent: bool
) -> None:
    window = balanced_window(_at(inc), _at(cand), 0.5)
    assert [int(r.t) for r in window] == judged
    assert compare(window, _at(cand)).adjacent == adjacent
