"""Per-transaction evidence: a run's level from its transactions (optimizer/evidence.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optimizer.evidence import (
    Objective,
    StreamStat,
    run_level,
    stream_figures,
    stream_level,
    summarize_stream,
)
from tests.optimizer.sim import REPORTING_MIX, Noise, TxBench, per_second


def _stream(
    counts: dict[str, int], latency: dict[str, float], clients: int = 2, seed: int = 0
) -> StreamStat:
    rng = np.random.default_rng(seed)
    start, lat, labels = [], [], []
    t = 0.0
    for name, n in counts.items():
        for _ in range(n):
            start.append(t)
            lat.append(latency[name] * float(rng.lognormal(0, 0.1)))
            labels.append(name)
            t += 0.01
    return summarize_stream(
        "main",
        clients=clients,
        shares={k: 1.0 for k in latency},
        start_s=start,
        latency_ms=lat,
        labels=labels,
    )


def test_the_level_does_not_depend_on_which_scripts_chance_drew() -> None:
    lat = {"fast": 500.0, "slow": 3000.0}
    even = _stream({"fast": 15, "slow": 15}, lat)
    skewed = _stream({"fast": 25, "slow": 5}, lat)  # chance gave few slow transactions
    lv_even, _ = stream_level(even, "throughput")
    lv_skew, _ = stream_level(skewed, "throughput")
    assert abs(lv_even - lv_skew) < 0.05  # same configs: same level
    # raw transactions per second would differ by the mix alone
    raw_even = 30 / (15 * 0.5 + 15 * 3.0)
    raw_skew = 30 / (25 * 0.5 + 5 * 3.0)
    assert raw_skew / raw_even > 1.8


def test_throughput_level_is_clients_over_mean_latency() -> None:
    n = 20_000
    rng = np.random.default_rng(1)
    lat = rng.lognormal(math.log(2.0), 0.3, n)  # ~2 ms TPC-B-like transactions
    st = summarize_stream(
        "main",
        clients=8,
        shares={"builtin:tpcb-like": 1},
        start_s=np.linspace(0, 10, n),
        latency_ms=lat,
        labels=["builtin:tpcb-like"] * n,
    )
    level, var = stream_level(st, "throughput")
    assert math.exp(level) == pytest.approx(8 * 1000 / float(np.mean(lat)), rel=1e-9)
    assert var < 1e-4  # 20,000 transactions: the run's own noise is tiny (drift dominates)
    assert stream_figures(st)["tps"] == pytest.approx(math.exp(level))


def test_warm_up_is_by_start_time_and_long_transactions_count_in_full() -> None:
    st = summarize_stream(
        "main",
        clients=1,
        shares={"q": 1},
        start_s=[0.0, 1.0, 2.5, 4.0],
        latency_ms=[1000.0, 1500.0, 1500.0, 5000.0],  # the last one runs past the end
        labels=["q"] * 4,
        warmup_s=2.0,
    )
    assert st.scripts[0].n == 2
    assert st.scripts[0].mean_ms == pytest.approx(3250.0)


def test_few_transactions_are_never_precise_and_more_make_it_tighter() -> None:
    one = _stream({"q": 1}, {"q": 1000.0})
    many = _stream({"q": 40}, {"q": 1000.0})
    _, v1 = stream_level(one, "throughput")
    _, v40 = stream_level(many, "throughput")
    assert math.sqrt(v1) > 0.3  # the prior: one transaction says little
    assert math.sqrt(v40) < 0.05
    assert v40 < v1 / 10


def test_batch_means_count_correlated_transactions() -> None:
    # first half slow, second half fast (a checkpoint, a neighbour): not 400 independent draws
    lat = np.r_[np.full(200, 1.5), np.full(200, 0.5)] * np.random.default_rng(2).lognormal(
        0, 0.05, 400
    )
    st = summarize_stream(
        "main", clients=1, shares={"q": 1}, start_s=np.arange(400.0), latency_ms=lat,
        labels=["q"] * 400,
    )  # fmt: skip
    iid = float(np.var(lat, ddof=1)) / 400
    assert st.scripts[0].var_mean > 5 * iid


def test_failures_lower_the_level() -> None:
    base = _stream({"a": 100}, {"a": 10.0})
    failing = summarize_stream(
        "main",
        clients=2,
        shares={"a": 1},
        start_s=[s * 0.01 for s in range(100)],
        latency_ms=[10.0] * 100,
        labels=["a"] * 100,
        failed={"a": 25},
    )
    assert stream_level(failing, "throughput")[0] < stream_level(base, "throughput")[0] - 0.2


def test_query_time_objectives_and_latency() -> None:
    st = _stream({"q1": 10, "q2": 10}, {"q1": 100.0, "q2": 400.0})
    geo, _ = stream_level(st, "query_time_geomean")
    total, _ = stream_level(st, "query_time_total")
    assert math.exp(-geo) == pytest.approx(200.0, rel=0.05)  # sqrt(100 * 400)
    assert math.exp(-total) == pytest.approx(500.0, rel=0.05)
    p95, _ = stream_level(st, "latency_p95")
    assert math.exp(-p95) == pytest.approx(st.p95_ms)
    assert Objective("query_time_geomean").gain(math.log(1.25)) == pytest.approx(
        0.2
    )  # 20% less time
    assert Objective("throughput").gain(math.log(1.25)) == pytest.approx(0.25)


def test_a_script_that_never_completed_makes_the_run_unusable() -> None:
    st = _stream({"q1": 10}, {"q1": 100.0, "q2": 400.0})  # q2 designed, never ran
    assert run_level([st], "throughput").centre < -20


def test_streams_combine_by_weighted_geometric_mean_or_primary() -> None:
    oltp = StreamStat("oltp", 4, _stream({"t": 1000}, {"t": 4.0}, clients=4).scripts)
    analytic = StreamStat("analytic", 1, _stream({"q": 20}, {"q": 2000.0}, clients=1).scripts)
    lo, _ = stream_level(oltp, "throughput")
    la, _ = stream_level(analytic, "throughput")
    both = run_level([oltp, analytic], Objective("throughput"))
    assert both.centre == pytest.approx((lo + la) / 2)
    weighted = run_level([oltp, analytic], Objective("throughput", weights={"oltp": 3}))
    assert weighted.centre == pytest.approx((3 * lo + la) / 4)
    assert run_level([oltp, analytic], Objective("throughput", primary="oltp")).centre == lo
    with pytest.raises(ValueError, match="no stream 'x'"):
        run_level([oltp], Objective("throughput", primary="x"))
    with pytest.raises(ValueError, match="objective must be one of"):
        Objective("fastest")  # type: ignore[arg-type]


def test_to_and_from_json_round_trip() -> None:
    st = _stream({"q1": 10, "q2": 3}, {"q1": 100.0, "q2": 400.0})
    again = StreamStat.from_json(st.to_json())
    assert again == st


def test_simulated_long_queries_per_second_samples_say_nothing_transactions_do() -> None:
    bench = TxBench(Noise(seconds=40, drift_sd=0.0, cv=0.0, outlier_p=0.0), 3, REPORTING_MIX)
    start, lat, _labels = bench.transactions(1.0)
    seconds = per_second(start, lat, 40)
    assert float(np.median(seconds)) <= 1.0  # per-second counts of 0, 1, 2
    assert set(seconds) <= {0.0, 1.0, 2.0, 3.0}
    st = bench.measure_tx(1.0).streams[0]
    level, var = stream_level(st, "throughput")
    # 2 clients, mean of (0.5 + 1.5 + 3) / 3 s: 1.2 transactions a second
    assert math.exp(level) == pytest.approx(1.2, rel=0.25)
    assert math.sqrt(var) < 0.15
