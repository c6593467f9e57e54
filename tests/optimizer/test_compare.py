"""A comparison's statistics on known numbers, its round orders and its config checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from optimizer.compare import (
    PairedGain,
    check_config,
    gain_text,
    paired_gain,
    round_orders,
    summarize,
)
from optimizer.knobs import KnobError, SettingRow

# per-round log ratios 0.1, 0.2, 0.0, 0.1: mean 0.1, sd sqrt(0.02 / 3), t = 2.449 (3 df)
REF = [100.0, 110.0, 100.0, 118.0]
C = [r * math.exp(d) for r, d in zip(REF, [0.1, 0.2, 0.0, 0.1], strict=True)]


def test_paired_gain_on_known_numbers() -> None:
    g = paired_gain(C, REF)
    sd = math.sqrt(0.02 / 3)
    assert g.rounds == 4
    assert g.gain == pytest.approx(math.expm1(0.1))
    half = stats.t.ppf(0.975, 3) * sd / 2
    assert g.ci95 == pytest.approx((math.expm1(0.1 - half), math.expm1(0.1 + half)))
    # the two-sided p of a paired t test: scipy's, and by hand (t = 0.1 / (sd / 2))
    assert g.p_value == pytest.approx(stats.ttest_1samp(np.log(C) - np.log(REF), 0).pvalue)
    assert g.p_value == pytest.approx(2 * stats.t.sf(0.1 / (sd / 2), 3))
    assert 0.05 < g.p_value < 0.1  # 0.0917
    assert not g.significant
    assert g.to_json() == {
        "gain": 0.1052,
        "ci95": [round(g.ci95[0], 4), round(g.ci95[1], 4)],
        "p_value": 0.09172,
        "rounds": 4,
    }
    assert gain_text(g) == "+10.5% [-2.9%, +25.9%] p=0.092 not significant"


def test_paired_gain_of_a_time_is_the_time_saved_and_symmetric() -> None:
    # levels of a time objective are 1 / time: C's times are 0.8x the reference's
    ref = [1 / 10.0, 1 / 12.0, 1 / 11.0]
    c = [1 / 8.0, 1 / 9.5, 1 / 8.9]
    g = paired_gain(c, ref, lower_is_better=True)
    d = np.log(c) - np.log(ref)
    assert g.gain == pytest.approx(-math.expm1(-float(d.mean())))
    assert 0.18 < g.gain < 0.22
    back = paired_gain(ref, c, lower_is_better=True)
    assert back.p_value == pytest.approx(g.p_value)
    assert back.gain == pytest.approx(-math.expm1(float(d.mean())))


def test_paired_gain_skips_incomplete_rounds_and_says_what_it_lacks() -> None:
    g = paired_gain([110.0, None, 121.0], [100.0, 100.0, None])
    assert g.rounds == 1
    assert g.gain == pytest.approx(0.1)
    assert g.p_value is None  # one round: no spread to test against
    assert gain_text(g) == "+10.0% [+10.0%, +10.0%] (one round)"
    none = paired_gain([None, None], [1.0, 1.0])
    assert none == PairedGain(None, None, None, 0)
    assert gain_text(none) == "not measured"
    same = paired_gain([2.0, 4.0], [1.0, 2.0])  # exactly +100% twice: no spread
    assert same.gain == pytest.approx(1.0)
    assert same.p_value is None
    assert gain_text(same).endswith("(no spread between rounds)")
    with pytest.raises(ValueError, match="round by round"):
        paired_gain([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        paired_gain([0.0], [1.0])


def test_a_clear_gain_is_significant() -> None:
    g = paired_gain([120.0, 131.0, 118.0, 125.0], [100.0, 108.0, 99.0, 104.0])
    assert g.p_value is not None
    assert g.p_value < 0.001
    assert g.significant
    assert "not significant" not in gain_text(g)


def test_summarize_medians_and_intervals() -> None:
    out = summarize({"a": [100.0, 110.0, None, 90.0], "b": [None, None]})
    a = out["a"]
    assert a["unit"] == "tps"
    assert a["median"] == 100.0
    assert a["runs"] == [100.0, 110.0, None, 90.0]
    assert a["incomplete_runs"] == 1
    low, high = a["ci95"]
    assert 90.0 <= low <= 100.0 <= high <= 110.0
    assert out["b"] == {
        "unit": "tps",
        "median": None,
        "ci95": None,
        "runs": [None, None],
        "incomplete_runs": 2,
    }
    # a time objective: levels are 1 / ms, shown as ms
    t = summarize({"q": [1 / 20.0, 1 / 25.0, 1 / 30.0]}, lower_is_better=True)["q"]
    assert t["unit"] == "ms"
    assert t["median"] == 25.0
    assert t["runs"] == [20.0, 25.0, 30.0]
    # reproducible: the bootstrap's seed is fixed
    assert summarize({"a": [1.0, 2.0, 3.0]}) == summarize({"a": [1.0, 2.0, 3.0]})


def test_round_orders_shuffle_every_round_from_the_seed() -> None:
    orders = round_orders(3, 50, seed=11)
    assert orders == round_orders(3, 50, seed=11)  # the recorded seed gives the order back
    assert orders != round_orders(3, 50, seed=12)
    assert all(sorted(o) == [0, 1, 2] for o in orders)  # every config once per round
    firsts = [o[0] for o in orders]
    assert all(firsts.count(i) >= 8 for i in range(3))  # no config always runs first
    assert len({tuple(o) for o in orders}) == 6  # every order occurs in 50 rounds
    assert round_orders(2, 0, 1) == []
    with pytest.raises(ValueError):
        round_orders(0, 2, 1)


# pg_settings rows as PostgreSQL 15 gives them
def _row(
    name: str,
    setting: str,
    unit: str | None,
    vartype: str,
    context: str,
    limits: tuple[str, str] | None = None,
    enumvals: tuple[str, ...] | None = None,
) -> SettingRow:
    low, high = limits or (None, None)
    return SettingRow(name, setting, unit, vartype, context, low, high, enumvals, setting, setting)


ROWS = {
    "work_mem": _row("work_mem", "4096", "kB", "integer", "user", ("64", "2147483647")),
    "shared_buffers": _row(
        "shared_buffers", "16384", "8kB", "integer", "postmaster", ("16", "1073741823")
    ),
    "wal_compression": _row(
        "wal_compression",
        "off",
        None,
        "enum",
        "superuser",
        None,
        ("pglz", "lz4", "zstd", "on", "off"),
    ),
    "synchronous_commit": _row(
        "synchronous_commit", "on", None, "enum", "user", None, ("local", "on", "off")
    ),
    "autovacuum_work_mem": _row(
        "autovacuum_work_mem", "-1", "kB", "integer", "sighup", ("-1", "2147483647")
    ),
}
GIB = 2**30


def test_check_config_accepts_what_postgresql_accepts() -> None:
    ok = check_config(
        {
            "Work_Mem": " 64MB ",
            "shared_buffers": "768MB",  # 75% of 1 GiB: a comparison may try it
            "wal_compression": "lz4",
            "autovacuum_work_mem": "-1",
        },
        ROWS,
        ram_bytes=GIB,
    )
    assert ok == {
        "work_mem": "64MB",
        "shared_buffers": "768MB",
        "wal_compression": "lz4",
        "autovacuum_work_mem": "-1",
    }
    assert check_config({"synchronous_commit": "off"}, ROWS, allow_unsafe=True) == {
        "synchronous_commit": "off"
    }


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (
            {"wrok_mem": "8MB"},
            "'wrok_mem' is not a knob knobtune compares (did you mean work_mem?)",
        ),
        ({"listen_addresses": "*"}, "'listen_addresses' is not a knob knobtune compares"),
        ({"work_mem": "8 furlongs"}, "invalid value for work_mem: '8 furlongs'"),
        ({"work_mem": "32kB"}, "work_mem = '32kB' is outside what the server accepts (64kB to"),
        ({"work_mem": "2GB"}, "work_mem = '2GB' (2.00 GiB) is more than the server's memory"),
        ({"shared_buffers": "1.5GB"}, "more than the server's memory (1.00 GiB)"),
        ({"wal_compression": "brotli"}, "accepted: one of pglz, lz4, zstd, on, off"),
        ({"synchronous_commit": "off"}, "durability-unsafe"),
        ({"work_mem": ""}, "give its value as text"),
        ({"work_mem": "1" * 300}, "give its value as text"),
        ({"random_page_cost": "1.1"}, "the server has no setting random_page_cost"),
        ({"work_mem": "8MB", "WORK_MEM": "9MB"}, "work_mem is given twice"),
    ],
)
def test_check_config_names_every_problem(settings: dict[str, str], says: str) -> None:
    with pytest.raises(KnobError) as exc:
        check_config(settings, ROWS, ram_bytes=GIB)
    assert says in str(exc.value)


def test_check_config_reports_all_problems_at_once() -> None:
    with pytest.raises(KnobError) as exc:
        check_config({"wrok_mem": "1MB", "work_mem": "8 furlongs"}, ROWS)
    assert "wrok_mem" in str(exc.value)
    assert "furlongs" in str(exc.value)
