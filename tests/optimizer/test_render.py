"""Rendering a recommendation as postgresql.conf, ALTER SYSTEM and JSON."""

from __future__ import annotations

import json

import pytest

from optimizer.render import (
    KnobNote,
    Recommendation,
    quote_literal,
    render_conf,
    render_json,
    render_sql,
)

REC = Recommendation(
    original={"shared_buffers": "128MB", "work_mem": "4MB", "jit": "on"},
    recommended={"shared_buffers": "2GB", "work_mem": "16MB", "jit": "on"},
    notes=(
        KnobNote("shared_buffers", "128MB", "2GB", gain=0.214, trials=9, needs_restart=True),
        KnobNote("work_mem", "4MB", "16MB", gain=0.41, trials=5),
        KnobNote("jit", "on", "on", trials=3),
        KnobNote("random_page_cost", "4", "4", trials=0),
        KnobNote("huge_pages", "try", "try", trials=1, excluded="restart not allowed"),
    ),
    overall_gain=0.55,
    overall_p_value=0.001,
    trials=19,
    header={"target": "staging", "workload": "pgbench tpcb"},
)
UNSAFE = Recommendation(
    original={"synchronous_commit": "on", "work_mem": "4MB"},
    recommended={"synchronous_commit": "off", "work_mem": "4MB"},
    notes=(
        KnobNote("synchronous_commit", "on", "off", gain=0.4, trials=4, durability_unsafe=True),
        KnobNote("work_mem", "4MB", "4MB", trials=2),
    ),
)


def test_conf_fragment() -> None:
    text = render_conf(REC)
    lines = text.splitlines()
    assert "shared_buffers = '2GB'" in lines
    assert "work_mem = '16MB'" in lines
    assert not any(line.startswith("jit =") for line in lines)  # unchanged: listed, not set
    assert "# unchanged (no credible gain): jit" in lines
    assert "# not tried (budget spent first): random_page_cost" in lines
    assert "# excluded: huge_pages (restart not allowed)" in lines
    note = "# shared_buffers: 128MB -> 2GB (+21.4% measured, 9 trials, needs restart)"
    assert note in lines
    assert "# target: staging" in lines
    assert any("+55.0%" in line for line in lines)


def test_alter_system_script_quotes_literals() -> None:
    sql = render_sql(REC)
    assert "ALTER SYSTEM SET shared_buffers = '2GB';" in sql
    assert "SELECT pg_reload_conf();" in sql
    assert "restart the server for shared_buffers" in sql
    assert quote_literal("it's") == "'it''s'"
    evil = Recommendation(
        original={"odd name": "x"}, recommended={"odd name": "a'; DROP TABLE t; --"}
    )
    out = render_sql(evil)
    assert "ALTER SYSTEM SET \"odd name\" = 'a''; DROP TABLE t; --';" in out
    with pytest.raises(ValueError, match="NUL"):
        quote_literal("a\x00b")


def test_json() -> None:
    doc = json.loads(render_json(REC))
    assert doc["recommended"]["work_mem"] == "16MB"
    assert doc["overall_gain"] == pytest.approx(0.55)
    sb = next(k for k in doc["knobs"] if k["name"] == "shared_buffers")
    assert sb == {
        "name": "shared_buffers", "original": "128MB", "recommended": "2GB", "changed": True,
        "gain": 0.214, "trials": 9, "needs_restart": True, "durability_unsafe": False,
        "excluded": None,
        "not_judged": None,
    }  # fmt: skip
    assert doc["warnings"] == []


def test_durability_unsafe_warning_in_every_format() -> None:
    conf, sql, js = render_conf(UNSAFE), render_sql(UNSAFE), json.loads(render_json(UNSAFE))
    for text in (conf, sql):
        assert "DURABILITY-UNSAFE: synchronous_commit = off" in text
        assert "!!!!!!!!!!" in text  # loud
    assert any("DURABILITY-UNSAFE" in w for w in js["warnings"])
    assert next(k for k in js["knobs"] if k["name"] == "synchronous_commit")["durability_unsafe"]
    # a safe recommendation has no such warning
    assert "DURABILITY" not in render_conf(REC) + render_sql(REC)


def test_header_cannot_inject_lines() -> None:
    rec = Recommendation(original={}, recommended={}, header={"target": "x\nfsync = off"})
    assert "\nfsync = off" not in render_conf(rec)


def test_from_trials() -> None:
    rec = Recommendation.from_trials(
        original={"work_mem": "4MB", "fsync": "on"},
        recommended={"work_mem": "16MB", "fsync": "off"},
        trials=[
            (None, None, None),
            ("work_mem", "revert", -0.1),
            ("work_mem", "keep", 0.2),
            ("work_mem", "keep", 0.1),
            ("fsync", "keep", 0.5),
        ],
        overall_gain=0.3,
        header={"session": 3},
    )
    wm = next(n for n in rec.notes if n.name == "work_mem")
    assert wm.trials == 3
    assert wm.gain == pytest.approx(1.2 * 1.1 - 1)
    assert rec.header == {"session": "3"}
    assert "DURABILITY-UNSAFE: fsync = off" in render_conf(rec)


def test_knobs_changed_inside_the_hints_bundle_count_as_tried() -> None:
    rec = Recommendation.from_trials(
        original={"work_mem": "4MB", "random_page_cost": "4", "jit": "on"},
        recommended={"work_mem": "28MB", "random_page_cost": "4", "jit": "on"},
        # the bundle changed work_mem and random_page_cost together and was reverted;
        # then work_mem alone was kept
        trials=[(("work_mem", "random_page_cost"), "revert", None), ("work_mem", "keep", 0.3)],
        overall_gain=0.3,
        gain_status="confirmed",
    )
    lines = render_conf(rec).splitlines()
    assert not any(line.startswith("# not tried") and "random_page_cost" in line for line in lines)
    assert "# not tried (budget spent first): jit" in lines
    assert any(line.startswith("# unchanged") and "random_page_cost" in line for line in lines)


@pytest.mark.parametrize(
    ("status", "says"),
    [
        ("confirmed", "overall measured gain vs original: +55.0%"),
        ("not-credible", "NOT CREDIBLE"),
        ("unconfirmed", "UNCONFIRMED"),
        ("no-change", "no change recommended"),
    ],
)
def test_every_export_says_how_sure_the_claim_is(status: str, says: str) -> None:
    from dataclasses import replace

    rec = replace(REC, gain_status=status, overall_ci=(0.3, 0.8))
    for text in (render_conf(rec), render_sql(rec)):
        assert sum(says in line for line in text.splitlines()[:8]) == 1, text
    assert says in json.loads(render_json(rec))["claim"]
