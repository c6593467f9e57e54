"""The latency_mean objective (issue 28): a replayed capture's mean latency of its designed
mix, share-weighted, lower is better (optimizer/evidence.py). Pure and fast."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optimizer.evidence import (
    OBJECTIVE_KINDS,
    Objective,
    ScriptStat,
    StreamStat,
    judge_streams,
    run_level,
    stream_level,
    summarize_stream,
)
from optimizer.settings import DescentSettings


def _replay(
    calls: dict[str, int],
    latency: dict[str, float],
    *,
    failed: dict[str, int] | None = None,
    shares: dict[str, float] | None = None,
    sd: float = 0.2,
    seed: int = 0,
) -> StreamStat:
    """One run of a replay: ``calls`` statements per label, lognormal latencies."""
    rng = np.random.default_rng(seed)
    start, lat, labels = [], [], []
    t = 0.0
    for name, n in calls.items():
        for _ in range(n):
            start.append(t)
            lat.append(latency[name] * float(rng.lognormal(0, sd)))
            labels.append(name)
            t += 0.001
    return summarize_stream(
        "replay",
        clients=4,
        shares=shares if shares is not None else {k: float(v) for k, v in calls.items()},
        start_s=start,
        latency_ms=lat,
        labels=labels,
        failed=failed,
    )


def test_latency_mean_is_a_known_lower_is_better_kind() -> None:
    assert "latency_mean" in OBJECTIVE_KINDS
    obj = Objective("latency_mean")
    assert obj.lower_is_better
    # a level 10% higher (log) is a mean latency 1 - 1/1.1 lower
    assert obj.gain(math.log(1.1)) == pytest.approx(1 - 1 / 1.1)
    settings = DescentSettings(objective="latency_mean")
    assert settings.objective.kind == "latency_mean"


def test_the_level_is_the_share_weighted_mean_latency() -> None:
    # 90% of calls at 1 ms, 10% at 50 ms: 5.9 ms per statement
    st = StreamStat(
        "replay",
        4,
        (
            ScriptStat("point read", 0.9, 900, 0, 1.0, 0.0001),
            ScriptStat("report", 0.1, 100, 0, 50.0, 0.25),
        ),
    )
    level, var = stream_level(st, "latency_mean")
    assert math.exp(-level) == pytest.approx(0.9 * 1.0 + 0.1 * 50.0)
    # the delta method: var(log sum p L) = sum p^2 var(L) / (sum p L)^2
    assert var == pytest.approx((0.81 * 0.0001 + 0.01 * 0.25) / 5.9**2)
    # a share-weighted mean: the slow query (10% of the calls) weighs its share of the
    # time, 85%: halving it moves the level by 42%
    faster = StreamStat(
        "replay",
        4,
        (st.scripts[0], ScriptStat("report", 0.1, 100, 0, 25.0, 0.0625)),
    )
    lv2, _ = stream_level(faster, "latency_mean")
    assert math.exp(-lv2) / math.exp(-level) == pytest.approx(3.4 / 5.9)


def test_the_level_does_not_depend_on_how_many_of_each_label_a_run_drew() -> None:
    lat = {"fast": 1.0, "slow": 40.0}
    designed = {"fast": 0.9, "slow": 0.1}
    even = _replay({"fast": 900, "slow": 100}, lat, shares=designed)
    skewed = _replay({"fast": 960, "slow": 40}, lat, shares=designed, seed=1)
    a, _ = stream_level(even, "latency_mean")
    b, _ = stream_level(skewed, "latency_mean")
    assert abs(a - b) < 0.05
    # the plain mean over statements would move by the mix alone
    plain_even = (900 * 1.0 + 100 * 40.0) / 1000
    plain_skew = (960 * 1.0 + 40 * 40.0) / 1000
    assert plain_even / plain_skew > 1.8


def test_a_faster_slow_query_is_kept_and_a_no_op_is_not() -> None:
    calls = {"point read": 2000, "sort": 50}
    before = {"point read": 0.5, "sort": 40.0}
    after = {"point read": 0.5, "sort": 20.0}  # work_mem halves the sort
    inc = [[_replay(calls, before, seed=i)] for i in range(3)]
    cand = [[_replay(calls, after, seed=10 + i)] for i in range(3)]
    v = judge_streams(inc, cand, objective="latency_mean")
    assert v.keep
    # 0.2 * 2000 + 40 * 50 = 3000 ms -> 2000 ms: a third of the time saved
    assert v.gain == pytest.approx(1 / 3, abs=0.06)
    same = [[_replay(calls, before, seed=20 + i)] for i in range(3)]
    assert not judge_streams(inc, same, objective="latency_mean").keep


def test_failures_count_against_a_config() -> None:
    calls = {"q": 1000}
    ok = _replay(calls, {"q": 2.0})
    failing = _replay(calls, {"q": 2.0}, failed={"q": 250})  # a quarter failed too
    a, _ = stream_level(ok, "latency_mean")
    b, _ = stream_level(failing, "latency_mean")
    assert math.exp(-b) == pytest.approx(math.exp(-a) * 1250 / 1000, rel=1e-6)


def test_labels_without_share_are_shown_but_not_judged() -> None:
    # statements that failed in the capture have no share: they may fail again freely
    st = _replay(
        {"q": 1000, "bad": 10},
        {"q": 2.0, "bad": 0.1},
        shares={"q": 1.0, "bad": 0.0},
        failed={"bad": 10},
    )
    bad = next(x for x in st.scripts if x.label == "bad")
    assert bad.share == 0.0
    assert bad.failed == 10
    level, _ = stream_level(st, "latency_mean")
    assert math.exp(-level) == pytest.approx(2.0, rel=0.05)


def test_a_run_level_of_several_streams_combines_like_the_others() -> None:
    a = _replay({"q": 500}, {"q": 2.0})
    b = StreamStat("other", 1, (ScriptStat("x", 1.0, 100, 0, 8.0, 0.01),), weight=1.0)
    lv = run_level([a, b], "latency_mean")
    la, _ = stream_level(a, "latency_mean")
    lb, _ = stream_level(b, "latency_mean")
    assert lv.centre == pytest.approx((la + lb) / 2)
