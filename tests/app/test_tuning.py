"""How a stored request becomes an optimizer: hints, start config, descriptions."""

from __future__ import annotations

from app.schemas import SessionIn
from app.tuning import (
    build_space,
    descent_settings,
    describe,
    hints_for,
    make_optimizer,
    outside_bounds_notes,
    start_config,
)
from optimizer.catalogue import Hardware
from optimizer.descent import Measurement
from optimizer.heuristic import pgtune
from optimizer.knobs import SettingRow

HW = Hardware(ram_bytes=24 * 2**30, cpus=2)
KNOBS = ["work_mem", "shared_buffers", "random_page_cost"]


def session(**kw: object) -> SessionIn:
    return SessionIn.model_validate({"target_id": 1, "knobs": KNOBS, **kw})


def test_hints_are_the_pgtune_values_of_the_tuned_knobs() -> None:
    body = session()  # the default workload, TPC-B, is write-heavy: PGTune's oltp
    space = build_space(body, {}, HW)
    hints = hints_for(body, space, HW)
    expected = pgtune(HW, "oltp")
    assert hints == {k: expected[k] for k in KNOBS}
    assert hints["work_mem"] != pgtune(HW, "mixed")["work_mem"]  # oltp: twice mixed's


def test_start_config_takes_pgtune_of_the_workload_kind() -> None:
    body = session(start="heuristic", workload_kind="read-heavy")
    space = build_space(body, {}, HW)
    start = start_config(body, space, {}, HW)
    web = pgtune(HW, "web")
    assert start["work_mem"] == web["work_mem"]


def test_no_hints_when_asked_or_when_starting_from_the_heuristic() -> None:
    for body in (session(hints=False), session(start="heuristic")):
        assert hints_for(body, build_space(body, {}, HW), HW) is None


def test_the_first_candidate_after_the_baseline_tries_the_hints_together() -> None:
    body = session(seed=1)
    space = build_space(body, {}, HW)
    start = start_config(body, space, {}, HW)
    opt = make_optimizer(body, space, start, 1, hints_for(body, space, HW))
    samples = Measurement(samples=tuple([100.0] * 10))
    cand = opt.suggest()
    while cand is not None and cand.role == "baseline":
        opt.register(cand, samples)
        cand = opt.suggest()
    assert cand is not None
    assert cand.knob is None  # several knobs at once
    assert describe(cand).startswith("measuring hints: ")
    hints = hints_for(body, space, HW)
    assert hints is not None
    for name in KNOBS:
        assert space[KNOBS.index(name)].parse(cand.config[name]) == space[KNOBS.index(name)].parse(
            hints[name]
        )


def test_user_bounds_that_leave_out_the_servers_value_keep_it_as_the_start_with_a_note() -> None:
    row = SettingRow("work_mem", "4096", "kB", "integer", "user", "64", "2147483647")
    body = session(knobs=[{"name": "work_mem", "min": "16MB", "max": "32MB"}])
    space = build_space(body, {"work_mem": row}, HW)
    (wm,) = space
    assert wm.format(wm.lower) == "4MB"
    assert wm.format(wm.upper) == "32MB"
    assert start_config(body, space, {"work_mem": "4MB"}, HW)["work_mem"] == "4MB"
    (note,) = outside_bounds_notes(body, {"work_mem": row}, space)
    assert "work_mem: the server's value 4MB lies outside the requested 16MB..32MB" in note


def test_a_heuristic_start_says_which_of_the_servers_values_it_replaces() -> None:
    from app.tuning import rows_to_json, session_optimizer

    body = session(start="heuristic", knobs=["work_mem"])
    row = SettingRow("work_mem", "4096", "kB", "integer", "user", "64", "2147483647")
    stored = {
        "rows": rows_to_json({"work_mem": row}),
        "hardware": {"ram_bytes": HW.ram_bytes, "cpus": HW.cpus},
        "target": {"effective": {"work_mem": "4MB"}},
    }
    built = session_optimizer(body, stored, 1, can_restart=True)
    (note,) = [n for n in built.notes if n.startswith("start: heuristic")]
    assert f"work_mem 4MB -> {built.start['work_mem']}" in note


def test_the_search_order_and_the_checkpoint_rule_reach_the_descent() -> None:
    # the defaults: issue 29's search (the counters' order, the checkpoint rule)
    s = descent_settings(session(), 1)
    assert s.order_by_counters
    assert s.checkpoint_rule
    # the search as before it, for a before/after (bench/e2e.py --as-before)
    s = descent_settings(session(search_order="catalogue", checkpoint_rule=False), 1)
    assert not s.order_by_counters
    assert not s.checkpoint_rule
